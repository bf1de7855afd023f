"""A failed task or flow shows Prefect its step and error type only (issue 22; flows.prefect_boundary).

Old code: Prefect logged `Task run failed with exception: KeyError('p015@org.example')` with the traceback,
and stored `Task run encountered an exception KeyError: 'p015@org.example'` as the task's and the flow's
state message — measured with a real Prefect server. A VeilError's message went the same way (its
operator detail did not), and some messages quote exact counts. Now every Veil task and flow body raises
a `StepFailed` through the gate; the reason reaches the operator's terminal and the private area only.
"""
from __future__ import annotations

import pickle
import stat
import time
from pathlib import Path

import pytest

from components.core.errors import VeilError

WHO = "p015@org.example"


def _boom(kind: str):
    if kind == "bug":
        return {}[WHO]                                   # a bug whose message is a person's id
    raise VeilError(f"ledger: 17 people, among them {WHO}", operator_detail=f"{WHO} and p016@org.example")


@pytest.mark.parametrize("kind", ["bug", "veil"])
def test_a_failure_reaches_prefect_as_its_step_and_type_only(settings, kind):
    from flows.prefect_boundary import StepFailed, original_error, prefect_safe

    step = prefect_safe("plan")(lambda home, kind: _boom(kind))
    with pytest.raises(StepFailed) as err:
        step(str(settings.home), kind)
    e = err.value
    # what Prefect formats: str (state message), repr (log line), no traceback chain (suppressed)
    seen = " ".join([str(e), repr(e), e.operator_detail or ""])
    assert WHO not in seen and "17 people" not in seen, seen
    assert seen.startswith(f"plan failed ({'KeyError' if kind == 'bug' else 'VeilError'})")
    assert e.__suppress_context__ and e.__cause__ is None
    copy = pickle.loads(pickle.dumps(e))               # a Prefect state / a process pool's copy
    assert type(copy) is VeilError and str(copy) == str(e) and WHO not in repr(copy.__dict__)
    # the operator's: the original in this process, and the private record on disk (owner-only)
    orig = original_error(e)
    assert isinstance(orig, KeyError if kind == "bug" else VeilError) and WHO in str(orig)
    records = list((Path(settings.private_dir) / "failures").iterdir())
    assert len(records) == 1 and records[0].name in str(e)
    assert WHO in records[0].read_text()
    assert stat.S_IMODE(records[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(records[0].parent.stat().st_mode) == 0o700


def test_the_cli_shows_the_operator_the_original(settings):
    """The terminal reads as before: a VeilError's own line and detail; a bug re-raised with its traceback."""
    from flows.cli import _for_the_operator
    from flows.prefect_boundary import StepFailed, prefect_safe

    for kind in ("veil", "bug"):
        try:
            prefect_safe("veil-pipeline")(prefect_safe("plan")(lambda home: _boom(kind)))(str(settings.home))
        except StepFailed as e:
            if kind == "veil":
                shown = _for_the_operator(e)
                assert WHO in str(shown) and WHO in shown.operator_detail
            else:
                with pytest.raises(KeyError):
                    _for_the_operator(e)


def test_every_veil_task_and_flow_runs_behind_the_boundary():
    """A new task or flow without `prefect_safe` would hand Prefect its raw exception; a flow with log_prints,
    every print() of its tasks."""
    from prefect import Flow, Task

    from flows import pipeline, retrain

    objs = {n: o for m in (pipeline, retrain) for n, o in vars(m).items() if isinstance(o, (Task, Flow))}
    assert len(objs) >= 12
    unwrapped = [n for n, o in objs.items() if not getattr(o.fn, "prefect_safe_step", None)]
    assert unwrapped == []
    # and no print() is forwarded to Prefect's log (ungated: the audit prints exact sample counts)
    assert [n for n, o in objs.items() if isinstance(o, Flow) and o.log_prints] == []
    root = Path(__file__).resolve().parents[2] / "flows"
    for f in root.rglob("*.py"):
        text = f.read_text()
        assert text.count("@task(") + text.count("@flow(") == text.count("@prefect_safe("), f


@pytest.mark.prefect
def test_a_real_task_failure_leaves_no_private_value_in_prefect(prefect_harness, settings, monkeypatch):
    """The pipeline's real plan task fails inside a flow (its stage raising a bug on a person's id): neither
    the task's nor the flow's state, nor any log line, nor Prefect's database holds the id."""
    from prefect import flow, get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId,
                                                TaskRunFilter, TaskRunFilterFlowRunId)
    from prefect.settings import get_current_settings

    from flows import pipeline, stages
    from flows.prefect_boundary import StepFailed, prefect_safe

    monkeypatch.setattr(stages, "plan", lambda *a, **k: _boom("bug"))

    @flow(name="veil-failure-probe", persist_result=False)
    @prefect_safe("veil-failure-probe")
    def probe(home: str):
        return pipeline.plan_task(home, "policy.yaml", "snap", None)

    state = probe(str(settings.home), return_state=True)
    assert state.is_failed()
    with pytest.raises(StepFailed):
        state.result()
    with get_client(sync_client=True) as client:
        run = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))[0]
        deadline = time.monotonic() + 30
        while True:                                # task runs reach the server as events, after the flow
            tasks = client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[run.id])))
            if tasks or time.monotonic() > deadline:
                break
            time.sleep(1)
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        dumped = " ".join([run.model_dump_json(), *(t.model_dump_json() for t in tasks), *(g.message for g in logs)])
    assert "plan failed (KeyError)" in dumped
    assert WHO not in dumped
    url = get_current_settings().server.database.connection_url.get_secret_value()
    if url.startswith("sqlite"):
        db = Path(url.split("///", 1)[1])
        assert not [p for p in db.parent.glob(db.name + "*") if p.is_file() and WHO.encode() in p.read_bytes()]
