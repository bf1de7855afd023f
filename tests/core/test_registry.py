"""MLflow registry: certificates travel with models, and a consumer refuses one that does not verify."""
import json

import pytest

from components.certificate import build_certificate
from components.core.errors import VeilError

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)
from components.registry import list_models, load_model, register_model


_W: dict = {}   # the module's one trained-looking adapter and its base (binding needs real weights)


@pytest.fixture(scope="module", autouse=True)
def tiny_adapter(tiny_base, tmp_path_factory):
    import sys

    sys.path.insert(0, str(_Path(__file__).resolve().parents[1] / "privacy"))
    from _sealed_release import build_adapter

    _W["base"] = tiny_base
    _W["adapter"] = build_adapter(_Path(tiny_base), tmp_path_factory.mktemp("adapter") / "adapter")
    return _W["adapter"]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from components.modeling import build_base_model

    texts = [f"the weekly report number {i} is ready for review by the team" for i in range(200)]
    return build_base_model(texts, tmp_path_factory.mktemp("base"), vocab_size=300, n_layer=1, n_embd=16,
                            n_head=2, n_positions=32, steps=2, seq_len=16, batch_size=4, progress=False)


def _plan_and_cert(epsilon_target=8.0, lifetime_budget=None):
    from components.planning.plan import seal

    plan = {"schema": "veil.plan/v1", "mechanism": "uls", "target": {"epsilon": epsilon_target, "delta": 1e-5},
            "sampling_rate": 0.05, "noise_multiplier": 1.0, "steps": 30, "clip_norm": 1.0, "records_per_user": 2,
            "expected_batch_size": 10, "selection": "random",
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32},
            "policy": {"name": "t", "sha256": "01" * 32}}
    if lifetime_budget is not None:
        plan["lifetime_budget"] = lifetime_budget
    plan = seal(plan)
    res = {**bound_run.binding(plan, _W.get("adapter"), _W.get("base")), "steps_run": 30, "mechanism": "uls", "noise_multiplier": 1.0, "sampling_rate": 0.05, "clip_norm": 1.0}
    return plan, build_certificate(plan, res).to_dict()


def test_register_list_load_and_refuse_tampering(settings, tiny_base):
    plan, cert = _plan_and_cert()
    reg = register_model(settings, name="t", certificate=cert, plan=plan, base_model_dir=tiny_base, adapter_dir=_W["adapter"],
                         policy_max_epsilon=8.0)
    assert reg.model_uri == "models:/t/1"
    rows = list_models(settings)
    assert [(r["name"], r["version"], r["certificate_status"]) for r in rows] == [("t", "1", "verified")]
    assert rows[0]["certificate"]["epsilon"] == cert["epsilon"] and "latest-certified" in rows[0]["aliases"]

    import mlflow

    run = mlflow.get_run(reg.run_id)
    assert run.data.metrics["privacy_epsilon"] == pytest.approx(cert["epsilon"])
    assert run.data.tags["privacy.certificate_sha256"] == cert["sha256"]

    loaded = load_model("models:/t@latest-certified", settings)
    assert loaded.certificate["sha256"] == cert["sha256"] and loaded.plan["sha256"] == plan["sha256"]

    # A certificate edited after registration (here: ε halved) no longer verifies: consumers refuse it.
    client = mlflow.MlflowClient()
    forged = dict(cert, epsilon=cert["epsilon"] / 2)
    path = settings.home / "certificate.json"
    path.write_text(json.dumps(forged))
    client.log_artifact(reg.run_id, str(path))
    with pytest.raises(VeilError, match="hash: .*sha256"):
        load_model("models:/t/1", settings)
    assert list_models(settings)[0]["certificate_status"].startswith("INVALID")


def test_refuses_epsilon_above_the_policy(settings, tiny_base):
    plan, cert = _plan_and_cert()
    with pytest.raises(VeilError, match="exceeds the policy"):
        register_model(settings, name="t", certificate=cert, plan=plan, base_model_dir=tiny_base, adapter_dir=_W["adapter"],
                       policy_max_epsilon=cert["epsilon"] / 2)


def test_bad_model_uri_is_a_user_error(settings):
    with pytest.raises(VeilError, match="expected models:/"):
        load_model("runs:/abc/model", settings)
    with pytest.raises(VeilError, match="no such registered model"):
        load_model("models:/nope/3", settings)


def test_ledger_reservations_gate_registration_and_keep_their_charge(settings, tiny_base):
    """The registry asks the per-person ledger (issue 13): reserved releases register (a `registered`
    event, aggregates on the run); a release whose people were all retired by the filter is refused;
    unreserved releases with a budget are refused; charges stay whatever happens in MLflow."""
    import mlflow
    import numpy as np

    from components.ledger import Ledger, reserve_release
    from components.renyi import rdp as R

    plan, cert = _plan_and_cert()
    one = R.sampled_gaussian_rdp(0.05, 1.0, 30)
    # a budget two releases fit and three do not, under a new ledger's conversion (its order weights are
    # fixed by the budget itself: settle the midpoint, then check it)
    eps = 5.0
    for _ in range(20):
        w = R.order_weights(eps, 1e-5)
        two_fit, three = (R.epsilon_of_spend(k * one, 1e-5, conversion=R.WEIGHTED, weights=w) for k in (2, 3))
        eps = (two_fit + three) / 2
    w = R.order_weights(eps, 1e-5)
    two_fit, three = (R.epsilon_of_spend(k * one, 1e-5, conversion=R.WEIGHTED, weights=w) for k in (2, 3))
    assert two_fit <= eps < three
    plan, cert = _plan_and_cert(lifetime_budget={"epsilon": eps, "delta": 1e-5})
    people = {f"u{i}": 2 for i in range(5)}
    with pytest.raises(VeilError, match="no reservation"):
        register_model(settings, name="a", certificate=cert, plan=plan, base_model_dir=tiny_base, adapter_dir=_W["adapter"])
    # an earlier release of another plan charged the same people once already (a plan is released
    # once: issue 28, tests/privacy/test_one_release_per_plan.py)
    assert len(reserve_release(settings, dict(plan, sha256="1" * 64), people).admitted) == 5
    res = reserve_release(settings, plan, people)
    assert len(res.admitted) == 5
    regs = [register_model(settings, name="a", certificate=cert, plan=plan, base_model_dir=tiny_base,
                           adapter_dir=_W["adapter"], ledger_release_id=res.release_id)]
    with pytest.raises(VeilError, match="already has release"):
        reserve_release(settings, plan, people)
    assert regs[0].lifetime["spend"]["max_epsilon"] == pytest.approx(two_fit)
    tags = mlflow.get_run(regs[0].run_id).data.tags
    assert tags["privacy.ledger_release_id"] == str(regs[0].lifetime["ledger_release_id"])
    # exact admitted/retired counts are N: never a public tag
    assert "privacy.ledger_admitted" not in tags and "privacy.ledger_retired" not in tags
    plan3, cert3 = _plan_and_cert(epsilon_target=7.5, lifetime_budget=plan["lifetime_budget"])   # a third plan
    third = reserve_release(settings, plan3, people)
    assert third.admitted == () and len(third.retired) == 5
    with pytest.raises(VeilError, match="retired every person"):
        register_model(settings, name="c", certificate=cert3, plan=plan3, base_model_dir=tiny_base,
                       adapter_dir=_W["adapter"], ledger_release_id=third.release_id)
    assert {r["name"] for r in list_models(settings)} == {"a"}
    # deleting a registered version gives nothing back
    led = Ledger.open(settings)
    before = led.spend(list(people))
    mlflow.MlflowClient().delete_model_version("a", "1")
    assert all(np.array_equal(led.spend(list(people))[p], before[p]) for p in people)
    assert [e["status"] for e in led.events(regs[0].lifetime["ledger_release_id"])] == ["reserved", "registered"]


def test_a_package_that_would_not_verify_is_never_registered(settings, tiny_base):
    """Signed with a key this installation does not trust: the logged model is checked as a
    consumer would check it, and no version is registered."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    plan, cert = _plan_and_cert()
    with pytest.raises(VeilError, match="does not verify .*signature: seal: no trusted keys"):
        register_model(settings, name="u", certificate=cert, plan=plan, base_model_dir=tiny_base, adapter_dir=_W["adapter"],
                       signing_key=Ed25519PrivateKey.generate())
    assert list_models(settings) == []


def test_a_certificate_its_own_parameters_contradict_is_not_sealed(settings, tiny_base):
    from components.core.hashing import sha256_json

    plan, cert = _plan_and_cert()
    body = {k: v for k, v in dict(cert, epsilon=cert["epsilon"] / 3).items() if k != "sha256"}
    with pytest.raises(VeilError, match="parameters .* give ε"):
        register_model(settings, name="x", certificate={**body, "sha256": sha256_json(body)}, plan=plan,
                       base_model_dir=tiny_base, adapter_dir=_W["adapter"])
