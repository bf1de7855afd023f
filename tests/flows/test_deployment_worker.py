"""The prefect.yaml deployment run by a real process worker against a real server: two runs
triggered at once run one after the other (concurrency 1, ENQUEUE) and both complete; the first
trains and registers a version, the second finds the data unchanged and skips."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from flows import stages

from conftest import PREFECT, tiny_policy
from _output import assert_quiet, prefect_log_text

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _cli(env, *args):
    r = subprocess.run([PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    return r


def _t(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_two_runs_at_once_run_one_after_the_other(prefect_server, veil_home, tmp_path, org):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    env = {**prefect_server.env, "VEIL_REPO": str(ROOT), "PYTHONPATH": str(ROOT), "VEIL_HOME": str(veil_home),
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    pool = _cli(env, "work-pool", "create", "veil-cpu", "--type", "process")
    assert pool.returncode == 0 or "already exists" in (pool.stdout + pool.stderr), pool.stdout + pool.stderr
    dep = _cli(env, "--no-prompt", "deploy", "--name", "veil-retrain")
    assert dep.returncode == 0, dep.stdout[-2000:] + dep.stderr[-2000:]

    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "veil-cpu", "--type", "process"],
                              cwd=tmp_path, env=env, stdout=open(tmp_path / "worker.log", "wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    since = datetime.now(timezone.utc)
    params = {"policy": str(tiny_policy(tmp_path)), "source": str(org["source"]), "fmt": "jsonl",
              "home": str(veil_home), "base_model_dir": str(org["base"]), "model_name": "dep",
              "mapping": stages.DEMO_MAPPING}
    try:
        with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
            runs = [run_deployment("veil-retrain/veil-retrain", parameters=params, timeout=0) for _ in range(2)]
        ids = [str(r.id) for r in runs]
        deadline, states = time.monotonic() + 400, {}
        while time.monotonic() < deadline:
            got = [prefect_server.api("GET", f"/flow_runs/{i}") for i in ids]
            states = {g["id"]: g["state"]["type"] for g in got}
            if all(s in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for s in states.values()):
                break
            time.sleep(1)
        log = (tmp_path / "worker.log").read_text(errors="replace")
        assert set(states.values()) == {"COMPLETED"}, f"{states}\n{log[-4000:]}"
        # A run is COMPLETED before its process has sent its last buffered log lines (Prefect's log
        # worker flushes at exit): wait for them here, before the worker's process group is signalled
        # below — a signal that reaches a run's process while it flushes loses those lines (seen on a
        # loaded fresh-clone run: the worker's terminal had printed them, Prefect never got them).
        flush_deadline = time.monotonic() + 120
        while True:
            plog = prefect_log_text(prefect_server.api, since)
            if ("step: trained" in plog and "skipped:" in plog) or time.monotonic() > flush_deadline:
                break
            time.sleep(2)
    finally:
        os.killpg(worker.pid, signal.SIGINT)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)

    got = sorted((prefect_server.api("GET", f"/flow_runs/{i}") for i in ids), key=lambda g: g["start_time"])
    first, second = got
    # one after the other: the second started only after the first ended
    assert _t(second["start_time"]) >= _t(first["end_time"]), (first["start_time"], first["end_time"],
                                                               second["start_time"])
    # the second waited for the slot (ENQUEUE), it was not refused or run beside the first
    history = prefect_server.api("GET", f"/flow_run_states/?flow_run_id={second['id']}")
    assert any(h["name"] == "AwaitingConcurrencySlot" for h in history), [h["name"] for h in history]
    # the first trained and registered a version; the second saw the same data and spent nothing
    from components.core.settings import load_settings
    from components.registry.mlflow_registry import _client

    versions = _client(load_settings(veil_home)).search_model_versions("name='dep'")
    assert [str(v.version) for v in versions] == ["1"]
    from sqlalchemy import select

    from components.ledger import Ledger
    from components.ledger import store as st

    led = Ledger.open(load_settings(veil_home))
    try:
        with st.read_only(led.engine) as conn:
            kinds = [(r.kind, r.mechanism) for r in conn.execute(select(st.releases.c.kind, st.releases.c.mechanism))]
    finally:
        led.dispose()
    # one training reservation (beside its plan's N̂ and its evaluation): the skip spent nothing
    assert sum(1 for k, m in kinds if k != "population" and m != "evaluation") == 1
    assert all(g["deployment_id"] for g in got)
    # the worker's terminal (its flow-run processes write there) and the runs' Prefect log: Veil's
    # lines only, no third-party warning, bar or traceback (issue 26)
    assert_quiet((tmp_path / "worker.log").read_text(errors="replace"), "the worker's output")
    log = plog
    assert_quiet(log, "the deployment runs' Prefect log")
    assert "step: trained" in log and "skipped:" in log, log[-3000:]
