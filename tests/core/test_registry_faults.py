"""Issue 28, the registry under faults: the ledger's `registered` event only after MLflow registered the
version, a registration resumed after a kill finds its version instead of making a second, the store's
schema created whole (never half-migrated), and the promotion gate checked at load — whoever moved a
gated alias (MLflow's own API moves one without asking Veil)."""
from __future__ import annotations

import pytest

from components.core.errors import VeilError
from components.registry import list_models, load_model, register_model, verify_model

from test_registry import _W, _plan_and_cert, tiny_adapter, tiny_base  # noqa: F401 (module fixtures)


def _reserved(settings):
    from components.ledger import Ledger, reserve_release
    from components.renyi import rdp as R

    one = R.sampled_gaussian_rdp(0.05, 1.0, 30)
    # a budget a few releases deep: its size is all that matters here (the weighted conversion's weights
    # exist only once a ledger has a budget, so it is sized under the uniform one)
    eps = 3 * R.epsilon_of_spend(one, 1e-5, conversion=R.HOCKEY_STICK)
    plan, cert = _plan_and_cert(lifetime_budget={"epsilon": eps, "delta": 1e-5})
    res = reserve_release(settings, plan, {f"u{i}": 2 for i in range(5)})
    led = Ledger.open(settings)
    return plan, cert, res.release_id, led


def test_registered_event_only_after_mlflow_registered_and_once_on_resume(settings, tiny_base, monkeypatch):
    import mlflow

    from components.registry import mlflow_registry as reg

    plan, cert, rid, led = _reserved(settings)
    kw = dict(name="r", certificate=cert, plan=plan, base_model_dir=tiny_base, adapter_dir=_W["adapter"],
              ledger_release_id=rid)
    real = mlflow.register_model

    def dies(*a, **k):
        raise RuntimeError("killed before MLflow registered the version")

    monkeypatch.setattr(mlflow, "register_model", dies)
    with pytest.raises(RuntimeError):
        register_model(settings, **kw)
    # the ledger says nothing of a version that does not exist (it used to say `registered` first)
    assert [e["status"] for e in led.events(rid)] == ["reserved"]
    monkeypatch.setattr(mlflow, "register_model", real)

    # killed after MLflow registered it, before the ledger's event: the next registration finds the
    # plan's version (its run's veil.plan_sha256 tag) instead of registering a second one
    monkeypatch.setattr(reg, "_record_registered", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        register_model(settings, **kw)
    assert [e["status"] for e in led.events(rid)] == ["reserved"]
    monkeypatch.undo()
    again = register_model(settings, **kw)
    assert again.model_uri == "models:/r/1"
    assert [(r["name"], r["version"]) for r in list_models(settings)] == [("r", "1")]
    assert [e["status"] for e in led.events(rid)] == ["reserved", "registered"]
    register_model(settings, **kw)          # and once more: still one version, one event
    assert [(r["name"], r["version"]) for r in list_models(settings)] == [("r", "1")]
    assert [e["status"] for e in led.events(rid)] == ["reserved", "registered"]
    led.dispose()


def test_half_migrated_store_is_refused_in_one_line(settings):
    """A store whose creation was killed holds some of MLflow's tables: MLflow then re-ran its migrations
    over it and every later command died with `table … already exists` (60 lines)."""
    import sqlalchemy
    from mlflow.store.db.base_sql_model import Base

    from components.registry.mlflow_registry import check_store

    path = settings.home / "mlflow.db"
    assert settings.mlflow_registry_uri == f"sqlite:///{path}"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    some = [t for name, t in Base.metadata.tables.items() if name in ("experiments", "runs", "latest_metrics")]
    Base.metadata.create_all(engine, tables=some)       # what a kill part-way through the migrations leaves
    engine.dispose()
    with pytest.raises(VeilError) as e:
        list_models(settings)
    msg = str(e.value)
    assert "\n" not in msg and "half-created" in msg and str(path) in msg
    with pytest.raises(VeilError, match="half-created"):
        check_store(settings)


def test_store_is_created_aside_and_moved_into_place_whole(settings, monkeypatch):
    import mlflow.store.db.utils as dbu

    from components.registry.mlflow_registry import check_store

    path = settings.home / "mlflow.db"
    assert not path.exists()

    def killed(engine):
        dbu.InitialBase.metadata.create_all(engine)     # part of the schema, then the process dies
        raise KeyboardInterrupt

    import components.registry.mlflow_registry as reg

    monkeypatch.setattr(reg, "_EMPTY_STORE", None)        # migrate, not copy this process' first store
    monkeypatch.setattr(dbu, "_initialize_tables", killed)
    with pytest.raises(KeyboardInterrupt):
        check_store(settings)
    assert not path.exists()                            # no half-made store where MLflow looks
    assert reg._EMPTY_STORE is None                     # and nothing half-made kept to copy later
    monkeypatch.undo()
    monkeypatch.setattr(reg, "_EMPTY_STORE", None)
    check_store(settings)
    assert path.exists() and list_models(settings) == []
    assert not list(settings.home.glob(".mlflow.db.*"))
    # a second store in this process is a copy of the migrated bytes: the same file, and a working registry
    other = settings.home / "second" / "mlflow.db"
    reg.create_store_aside(other)
    assert other.read_bytes() == reg._EMPTY_STORE
    reg._check_complete_schema(other)
    import sqlalchemy
    from mlflow.store.db.utils import _all_tables_exist

    engine = sqlalchemy.create_engine(f"sqlite:///{other}")
    try:
        assert _all_tables_exist(engine)
    finally:
        engine.dispose()


def test_alias_gate_rules():
    from components.registry.gate import alias_gate

    plan = {"release": {"required_certificate_fields": ["epsilon"], "promoters": []},
            "audit": {"sizing": {"require": "passed"}}}
    cert = {"epsilon": 1.0}
    passed = {"verdict": "passed", "gate": {"require": "passed"}, "reasons": []}
    assert "never audited" in alias_gate("production", cert, plan)
    assert alias_gate("production", {**cert, "audit": passed}, plan) is None
    assert "fails the policy's promotion gate" in alias_gate(
        "production", {**cert, "audit": {**passed, "verdict": "inconclusive", "reasons": ["too few"]}}, plan)
    assert "required field" in alias_gate("production", {"audit": passed}, plan)
    with_promoters = {**plan, "release": {**plan["release"], "promoters": ["ana"]}}
    assert "no promoter approved" in alias_gate("production", {**cert, "audit": passed}, with_promoters)
    assert "no promoter approved" in alias_gate("production", {**cert, "audit": passed}, with_promoters,
                                                {"veil.approval.decision": "approved", "veil.approval.by": "eve"})
    assert alias_gate("production", {**cert, "audit": passed}, with_promoters,
                      {"veil.approval.decision": "approved", "veil.approval.by": "ana"}) is None
    # latest-certified: a certified version whose audit did not fail
    assert alias_gate("latest-certified", cert, plan) is None
    assert "failed" in alias_gate("latest-certified", {**cert, "audit": {**passed, "verdict": "failed"}}, plan)
    assert alias_gate("staging", cert, plan) is None        # not a gated alias


def test_production_moved_to_an_unaudited_version_is_refused_at_load(settings, tiny_base):
    """`production` moved with MLflow's own API to a version never audited: refused by `veil verify`,
    Veil's load_model and a plain `mlflow.pyfunc.load_model`, with the reason in one line."""
    import mlflow

    plan, cert = _plan_and_cert()
    reg = register_model(settings, name="g", certificate=cert, plan=plan, base_model_dir=tiny_base,
                         adapter_dir=_W["adapter"], policy_max_epsilon=8.0, alias=None)
    assert verify_model("models:/g/1", settings).valid
    mlflow.MlflowClient().set_registered_model_alias("g", "production", reg.version)

    v = verify_model("models:/g@production", settings)
    assert not v.valid and v.reason.startswith("promotion_gate: production is on a version that was never audited")
    assert not verify_model("models:/g/1", settings).valid       # the version carries the alias: said either way
    with pytest.raises(VeilError) as e:
        load_model("models:/g@production", settings)
    assert "\n" not in str(e.value) and "never audited" in str(e.value)
    with pytest.raises(Exception) as e:
        mlflow.pyfunc.load_model("models:/g@production")
    assert "never audited" in str(e.value) and "\n" not in str(e.value)
    rows = list_models(settings)
    assert rows[0]["certificate_status"].startswith("INVALID: promotion_gate")
    # the audit loads it by version (it is how the version gets audited), and latest-certified is no gate
    # on a certified, unaudited version
    assert load_model("models:/g/1", settings).version == "1"
    mlflow.MlflowClient().delete_registered_model_alias("g", "production")
    mlflow.MlflowClient().set_registered_model_alias("g", "latest-certified", reg.version)
    assert verify_model("models:/g@latest-certified", settings).valid
    mlflow.pyfunc.load_model("models:/g@latest-certified")
