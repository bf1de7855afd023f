"""prefect.yaml deploys as documented (infra/README.md) to a real server: work pool, cron schedule
with its timezone, parameters, one run at a time with ENQUEUE."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import PREFECT

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_prefect_yaml_deploys(prefect_server):
    env = {**prefect_server.env, "VEIL_REPO": str(ROOT), "PYTHONPATH": str(ROOT)}
    for cmd in ([PREFECT, "work-pool", "create", "veil-cpu", "--type", "process"],
                [PREFECT, "--no-prompt", "deploy", "--name", "veil-retrain"]):
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        # the session's server is shared: the worker test may have created the pool already
        assert r.returncode == 0 or "already exists" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    deps = prefect_server.api("POST", "/deployments/filter", json={})
    d = next(x for x in deps if x["name"] == "veil-retrain")
    assert d["entrypoint"] == "flows/retrain.py:retrain_flow" and d["work_pool_name"] == "veil-cpu"
    (sched,) = d["schedules"]
    assert sched["schedule"]["cron"] == "0 3 * * 0" and sched["schedule"]["timezone"] == "Europe/Paris"
    assert sched["active"] is True
    assert d["concurrency_limit"] == 1 or d["global_concurrency_limit"]["limit"] == 1
    assert d["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    assert set(d["parameters"]) >= {"policy", "source", "fmt", "model_name", "mapping"}
    # the parameters fit the flow's signature (Prefect enforces the schema on each run)
    assert set(d["parameters"]) <= set(d["parameter_openapi_schema"]["properties"])
    flow = prefect_server.api("GET", f"/flows/{d['flow_id']}")
    assert flow["name"] == "veil-retrain"
