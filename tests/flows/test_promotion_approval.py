"""release.promoters approve through a Prefect pause-for-input step, on a REAL Prefect server: a
promoter resumes the paused retraining with their name and `production` moves (who and when are
tagged on the version and returned); a name that is not a promoter is refused (nothing moves, the
run waits on); nobody answering in time → not promoted, with the reason."""
from __future__ import annotations

import threading
import time

import pytest

from components.core.settings import load_settings
from flows import stages

from conftest import tiny_policy

pytestmark = pytest.mark.slow


def _start(api, policy, org, home, name):
    """retrain_flow in a thread of this process (the test answers its pause from the main thread).
    Prefect's settings are a context variable: the thread enters the server's URL itself."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.retrain import retrain_flow

    box: dict = {}

    def run():
        try:
            with temporary_settings({PREFECT_API_URL: api.api_url}):
                box["result"] = retrain_flow(str(policy), str(org["source"]), "jsonl", home=str(home),
                                             base_model_dir=str(org["base"]), model_name=name,
                                             mapping=stages.DEMO_MAPPING, approval_poll_s=1)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _paused_run(api, t, box, seen=(), timeout=180):
    """The paused veil-retrain run whose pause is not one of `seen` (its state id)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert "error" not in box, box["error"]
        assert t.is_alive(), f"the flow ended without pausing: {box.get('result')}"
        runs = api.api("POST", "/flow_runs/filter", json={
            "flows": {"name": {"any_": ["veil-retrain"]}}, "flow_runs": {"state": {"type": {"any_": ["PAUSED"]}}}})
        fresh = [r for r in runs if r["state"]["id"] not in seen]
        if fresh:
            return fresh[0]
        time.sleep(0.5)
    raise AssertionError("no run paused for approval")


def _alias(home, name, alias="production"):
    from components.registry.mlflow_registry import _client

    try:
        return str(_client(load_settings(home)).get_model_version_by_alias(name, alias).version)
    except Exception:  # noqa: BLE001 - MLflow raises when the alias is not set
        return None


def test_promoter_approves_non_promoter_is_refused(api, veil_home, tmp_path, org):
    from prefect.flow_runs import resume_flow_run

    from components.registry.mlflow_registry import _client

    policy = tiny_policy(tmp_path, promoters=["alice@acme.example", "bob@acme.example"], approval_timeout=300,
                         passable=True)
    t, box = _start(api, policy, org, veil_home, "appr")
    run = _paused_run(api, t, box)
    assert _alias(veil_home, "appr") is None
    # a name that is not a promoter (sent with `veil approve`): refused, production does not move,
    # the run pauses again
    from flows.cli import app

    app(["approve", run["id"], "--promoter", "mallory@acme.example"], standalone_mode=False)
    again = _paused_run(api, t, box, seen={run["state"]["id"]})
    assert again["id"] == run["id"]
    assert _alias(veil_home, "appr") is None
    resume_flow_run(run["id"], run_input={"promoter": "bob@acme.example"})
    t.join(120)
    assert not t.is_alive() and "error" not in box, box
    res = box["result"]
    assert res["action"] == "trained" and res["promoted"] is True, res
    assert res["approval"]["approved"] and res["approval"]["by"] == "bob@acme.example"
    assert res["approval"]["refused"] == ["mallory@acme.example"] and res["approval"]["at"]
    assert "approved by promoter bob@acme.example" in res["reason"]
    assert _alias(veil_home, "appr") == "1"
    tags = _client(load_settings(veil_home)).get_model_version("appr", "1").tags
    assert tags["veil.approval.by"] == "bob@acme.example" and tags["veil.approval.decision"] == "approved"
    assert tags["veil.approval.at"] == res["approval"]["at"]
    state = api.api("GET", f"/flow_runs/{run['id']}")["state"]["type"]
    assert state == "COMPLETED"


def test_no_approval_in_time_is_not_promoted(api, veil_home, tmp_path, org):
    policy = tiny_policy(tmp_path, promoters=["alice@acme.example"], approval_timeout=2, passable=True)
    t, box = _start(api, policy, org, veil_home, "late")
    t.join(240)
    assert not t.is_alive() and "error" not in box, box
    res = box["result"]
    assert res["action"] == "trained" and res["promoted"] is False, res
    assert "no promoter approved within 2 s" in res["reason"] and "no version is production yet" in res["reason"]
    assert res["approval"] == {"approved": False, "by": None, "at": None, "refused": []}
    assert _alias(veil_home, "late") is None
    runs = api.api("POST", "/flow_runs/filter", json={"flows": {"name": {"any_": ["veil-retrain"]}}})
    assert {r["state"]["type"] for r in runs if r["parameters"].get("model_name") == "late"} == {"COMPLETED"}


def test_no_promoters_promotes_on_a_passed_audit(api, veil_home, tmp_path, org):
    from flows.retrain import retrain_flow

    res = retrain_flow(str(tiny_policy(tmp_path, passable=True)), str(org["source"]), "jsonl", home=str(veil_home),
                       base_model_dir=str(org["base"]), model_name="auto", mapping=stages.DEMO_MAPPING)
    assert res["promoted"] is True and res["approval"]["by"] is None, res
    assert "names no promoters" in res["reason"]
    assert _alias(veil_home, "auto") == "1"
