"""The server's scheduler creates runs from a cron schedule (prefect 3.8.8 broke with SQLAlchemy 2.1:
`Can't evaluate bulk DML statement` on every scheduler loop, and a `* * * * *` deployment got no run)."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow


def test_cron_schedule_creates_runs(prefect_server):
    flow = prefect_server.api("POST", "/flows/", json={"name": "veil-scheduler-probe"})
    dep = prefect_server.api("POST", "/deployments/", json={
        "name": "every-minute", "flow_id": flow["id"],
        "schedules": [{"schedule": {"cron": "* * * * *", "timezone": "UTC"}, "active": True}],
    })
    runs, deadline = [], time.monotonic() + 45
    while time.monotonic() < deadline:
        runs = prefect_server.api("POST", "/flow_runs/filter",
                                  json={"deployments": {"id": {"any_": [dep["id"]]}}})
        if runs:
            break
        time.sleep(1)
    log = prefect_server.server_log()
    assert "Can't evaluate bulk DML statement" not in log, log[-3000:]
    assert runs, f"the scheduler created no run in 45 s; server log:\n{log[-3000:]}"
    assert {r["state"]["type"] for r in runs} == {"SCHEDULED"}
    # one run per minute, on the minute, in the schedule's timezone
    starts = sorted(r["expected_start_time"] for r in runs)
    assert all(s.endswith(":00Z") or ":00+00:00" in s for s in starts), starts
