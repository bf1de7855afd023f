"""`veil retrain` / retrain_flow against a REAL Prefect server: train → skip on unchanged data (no
spend) → train again when new people arrive; the promotion gate moves `production` only on a passed
audit with the required fields. (A run killed mid-training: tests/flows/test_retrain_killed.py.)"""
from __future__ import annotations

import time

import pytest

from components.core.settings import load_settings
from flows import stages

from conftest import retrain_json as _retrain, tiny_policy as _policy, training_releases as _releases

pytestmark = pytest.mark.slow

def _evaluations(home):
    """Evaluation releases in the ledger (one per evaluated model version)."""
    from sqlalchemy import select

    from components.ledger import Ledger
    from components.ledger import store as st

    led = Ledger.open(load_settings(home))
    try:
        with st.read_only(led.engine) as conn:
            return sum(1 for r in conn.execute(select(st.releases.c.mechanism)) if r.mechanism == "evaluation")
    finally:
        led.dispose()


@pytest.fixture(scope="module")
def line(prefect_server, tmp_path_factory, org_builder):
    """One retraining line, run once for the module: train → skip on unchanged data → skip again (the same
    base model at another path) → train once new people arrive. test_retrain_trains_skips_then_trains_new_people
    asserts on each step and test_promotion_gate promotes its two versions, rather than training two of its
    own (each retraining costs a minute of CI's 2 cores). The ledger's counts are read right after each
    step, where the test asserts them."""
    import shutil

    from prefect.settings import PREFECT_API_URL, temporary_settings

    tmp = tmp_path_factory.mktemp("retrain-line")
    home = tmp / "veil-home"
    home.mkdir()
    mp = pytest.MonkeyPatch()  # as the veil_home and api fixtures do, for the module's runs
    mp.setenv("VEIL_HOME", str(home))
    mp.delenv("VEIL_CONFIG", raising=False)
    mp.delenv("VEIL_MLFLOW_TRACKING_URI", raising=False)
    mp.setenv("PREFECT_API_URL", prefect_server.api_url)
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
            org = org_builder(tmp, load_settings(home).ensure())
            policy = _policy(tmp)
            got = {"home": home, "org": org}

            def step(name, result):
                got[name] = {"result": result, "releases": _releases(home), "evaluations": _evaluations(home)}

            step("first", _retrain(policy, org, None))
            step("again", _retrain(policy, org, None))
            moved = tmp / "moved-base"
            shutil.copytree(org["base"], moved)
            step("moved", _retrain(policy, {**org, "base": moved}, None))
            with open(org["source"], "a") as f:
                f.writelines(l + "\n" for l in org["late"])
            step("third", _retrain(policy, org, None))
    finally:
        mp.undo()
    return got


def test_retrain_trains_skips_then_trains_new_people(api, line, monkeypatch):
    from components.registry import load_model

    veil_home = line["home"]
    monkeypatch.setenv("VEIL_HOME", str(veil_home))  # the pyfunc's own check finds the home's trusted keys
    first = line["first"]["result"]
    assert first["action"] == "trained" and first["model_uri"] == "models:/rt/1", first
    assert first["people_trained"] > 0 and first["people_retired"] == 0
    assert isinstance(first["promoted"], bool) and first["reason"]
    s = load_settings(veil_home)
    loaded = load_model("models:/rt/1", s)
    # the device and precision that trained the model are on its certificate
    assert loaded.certificate["run"]["device"] == "cpu" and loaded.certificate["run"]["precision"] == "float32"
    if not first["promoted"]:  # an inconclusive/failed audit never moves production
        assert "only a passed audit is promoted" in first["reason"] and "no version is production" in first["reason"]
    assert line["first"]["releases"] == 1
    # evaluated as `veil run` evaluates: the version's run holds the DP release (charged to the evaluation
    # people as a release of its own), the exact figures come back to the operator only
    ev = first["evaluation"]
    assert ev is not None and ev["eval_people"] > 0 and 1 < ev["perplexity"] < 600
    pub = ev["published"]
    assert pub["ledger_release_id"] and pub["epsilon"] > 0
    import mlflow

    run = mlflow.tracking.MlflowClient(s.mlflow_tracking_uri).get_run(loaded.run_id)
    assert run.data.metrics["eval_perplexity"] == pub["metrics"]["eval_perplexity"]
    assert run.data.metrics["eval_perplexity"] != pytest.approx(ev["perplexity"], rel=1e-6)
    assert "evaluation.caveat" in run.data.tags
    assert not [k for k in run.data.metrics if "people" in k or "records" in k]
    assert line["first"]["evaluations"] == 1

    again = line["again"]["result"]
    assert again == {"action": "skipped", "model_uri": "models:/rt/1", "promoted": False, "people_trained": 0,
                     "people_retired": 0, "approval": None, "reason": again["reason"]}
    assert "did not change" in again["reason"] and "no budget spent" in again["reason"]
    assert line["again"]["releases"] == 1  # no spend
    # the same base model at another path is the same base (compared by content): still skipped
    assert line["moved"]["result"]["action"] == "skipped"
    assert line["moved"]["releases"] == 1

    # (new people's text was appended to the source before this run)
    third = line["third"]["result"]
    assert third["action"] == "trained" and third["model_uri"] == "models:/rt/2", third
    assert third["people_trained"] > first["people_trained"]
    assert line["third"]["releases"] == 2
    assert third["evaluation"]["published"]["ledger_release_id"] != pub["ledger_release_id"]
    assert line["third"]["evaluations"] == 2          # the skips evaluated nothing

    # the flow ran on the server: its runs are recorded there, completed
    runs = api.api("POST", "/flow_runs/filter", json={"flows": {"name": {"any_": ["veil-retrain"]}}})
    runs = [r for r in runs if r["parameters"].get("home") == str(veil_home)]
    assert len(runs) == 4 and {r["state"]["type"] for r in runs} == {"COMPLETED"}  # train, skip, skip (moved base), train


def test_promotion_gate(api, line, monkeypatch):
    from components.registry.mlflow_registry import _client
    from flows.retrain import promote_task, promotion_gate

    req = ["epsilon", "delta", "privacy_unit", "mechanism", "policy_sha256", "run.device"]
    cert = {"epsilon": 1.0, "delta": 1e-6, "privacy_unit": "user", "mechanism": "uls", "policy_sha256": "ab",
            "run": {"device": "cpu"}}
    assert promotion_gate(cert, {"verdict": "passed"}, req)[0]
    for verdict in ("failed", "inconclusive", None):
        ok, why = promotion_gate(cert, {"verdict": verdict}, req)
        assert not ok and "only a passed audit" in why
    assert not promotion_gate(cert, None, req)[0]
    ok, why = promotion_gate({**cert, "run": {}}, {"verdict": "passed"}, req)
    assert not ok and "run.device" in why

    # the line's two trained versions (its retrainings' own audits did not pass: nothing promoted them)
    first, second = line["first"]["result"], line["third"]["result"]
    uri, home = first["model_uri"], str(line["home"])
    monkeypatch.setenv("VEIL_HOME", home)
    client = _client(load_settings(home))
    got = promote_task.fn(home, uri, cert, {"verdict": "passed"}, req, "production")
    assert got["promoted"] and str(client.get_model_version_by_alias("rt", "production").version) == "1"
    # a later release that fails its audit does not move it
    got = promote_task.fn(home, second["model_uri"], cert, {"verdict": "failed"}, req, "production")
    assert not got["promoted"] and "production stays on models:/rt/1" in got["reason"]
    assert str(client.get_model_version_by_alias("rt", "production").version) == "1"


def test_plan_identity_is_stable(veil_home, tmp_path, org, settings):
    policy = _policy(tmp_path)
    ing = stages.ingest(settings, org["source"], "jsonl", policy=policy, id_field="id", time_field="ts")
    a = stages.plan(settings, policy, snapshot_id=ing["snapshot_id"], base_dir=org["base"])
    time.sleep(1.1)  # a clock-based created_at would differ now
    ing2 = stages.ingest(settings, org["source"], "jsonl", policy=policy, id_field="id", time_field="ts")
    assert ing2["snapshot_id"] == ing["snapshot_id"]
    b = stages.plan(settings, policy, snapshot_id=ing2["snapshot_id"], base_dir=org["base"])
    assert a["plan"]["sha256"] == b["plan"]["sha256"] and a["plan_path"] == b["plan_path"]
