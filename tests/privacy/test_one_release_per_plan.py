"""Exactly one release per plan, enforced by the ledger (issue 28).

Four `veil train` of one plan at once charged every person twice: the run folder's
`ledger_reservation.json` was checked before and written after the ledger's transaction, with no lock,
and the ledger took several releases of one plan. A kill between the ledger's commit and the file
write opened the same window. Real processes race here; the ledger, not the file, decides.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from components.core.errors import VeilError
from components.ledger import Ledger, PlanAlreadyReleased
from components.renyi import rdp as R

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

RACERS = 4


def _plan(home: Path) -> dict:
    """A real ULS plan (policy + snapshot → plan + annex) under VEIL_HOME=home; no training needed."""
    from components.core.settings import load_settings
    from components.planning import make_plan
    from components.policy import load_policy

    text = re.sub(r"    steps: \d+", "    steps: 5", (ROOT / "policies" / "demo.yaml").read_text())
    text = re.sub(r"expected_batch_size: \d+", "expected_batch_size: 8", text)
    (home / "policy.yaml").write_text(text)
    settings = load_settings(home).ensure()
    plan = make_plan(load_policy(home / "policy.yaml"), make_snapshot(60, seed=1), private_dir=settings.private_dir,
                     created_at="2026-01-01T00:00:00+00:00").to_dict()
    (home / "plan.json").write_text(json.dumps(plan))
    return plan


def _stage_reserve(home: str) -> dict:
    from components.core.settings import load_settings
    from components.draws.annex import load_annex
    from flows import stages

    settings = load_settings(Path(home))
    plan = json.loads((Path(home) / "plan.json").read_text())
    return stages.reserve(settings, plan, load_annex(settings.private_dir, plan), settings.runs_dir / plan["sha256"][:16])


def _racer(home: str, start, out) -> None:
    os.environ["VEIL_HOME"] = home
    start.wait()
    try:
        out.put(("reserved", int(_stage_reserve(home)["release_id"]), ""))
    except VeilError as e:
        out.put(("refused", -1, str(e)))


def _charges_per_person(settings, plan: dict) -> dict[str, int]:
    """How many charges (one per release that charged them) each of the plan's people holds."""
    from components.draws.annex import load_annex
    from components.draws.data import train_rows

    people = {str(u) for u in train_rows(load_annex(settings.private_dir, plan))["user_id"].to_pylist()}
    led = Ledger.open(settings)
    try:
        by_key = {r["person_key"]: r["releases_charged"] for r in led.person_rows()}
        return {p: by_key.get(led.person_key(p), 0) for p in sorted(people)}
    finally:
        led.dispose()


def test_processes_reserving_one_plan_at_once_make_one_release(veil_home, settings):
    plan = _plan(veil_home)
    ctx = mp.get_context("spawn")        # fresh interpreters, own connections: real concurrency
    start, out = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(veil_home), start, out)) for _ in range(RACERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0, "a reserving process died"
    got = [out.get(timeout=5) for _ in procs]
    led = Ledger.open(settings)
    try:
        ids = led.releases_for_plan(plan["sha256"])
        assert len(ids) == 1, f"{len(ids)} releases of one plan"
        assert led.summary()["releases"] == 1
    finally:
        led.dispose()
    # every racer either resumed that one release or stopped, in one line, naming it
    for status, rid, msg in got:
        if status == "reserved":
            assert rid == ids[0]
        else:
            assert f"release {ids[0]}" in msg and "\n" not in msg and "make a new plan" not in msg
    assert any(s == "reserved" for s, _, _ in got)
    counts = _charges_per_person(settings, plan)
    assert counts and set(counts.values()) == {1}, "someone was charged more (or less) than once"


def _killed_after_commit(home: str) -> None:
    """Reserve, then die (SIGKILL-like: os._exit, no cleanup) after the ledger committed and before the
    run folder's copy is written."""
    os.environ["VEIL_HOME"] = home
    from flows import stages

    def die(*_a, **_k):
        os._exit(9)

    stages._write_private_json = die
    _stage_reserve(home)


def test_a_kill_between_the_ledger_commit_and_the_file_resumes_the_same_release(veil_home, settings):
    plan = _plan(veil_home)
    p = mp.get_context("spawn").Process(target=_killed_after_commit, args=(str(veil_home),))
    p.start()
    p.join(300)
    assert p.exitcode == 9
    run = settings.runs_dir / plan["sha256"][:16]
    assert not (run / "ledger_reservation.json").exists()        # the cache was never written
    led = Ledger.open(settings)
    try:
        (first,) = led.releases_for_plan(plan["sha256"])
    finally:
        led.dispose()
    again = _stage_reserve(str(veil_home))                       # the next run resumes, it does not charge
    assert again["release_id"] == first and again["retired"] == []
    assert json.loads((run / "ledger_reservation.json").read_text())["release_id"] == first
    assert set(_charges_per_person(settings, plan).values()) == {1}
    assert _stage_reserve(str(veil_home))["release_id"] == first  # and from the cache, the same


def test_a_finished_release_is_refused_with_what_to_do_not_a_new_plan(veil_home, settings):
    plan = _plan(veil_home)
    rid = _stage_reserve(str(veil_home))["release_id"]
    led = Ledger.open(settings)
    try:
        led.record(rid, "trained")
    finally:
        led.dispose()
    (settings.runs_dir / plan["sha256"][:16] / "ledger_reservation.json").unlink()   # cache lost: the ledger decides
    with pytest.raises(VeilError) as e:
        _stage_reserve(str(veil_home))
    msg = str(e.value)
    assert f"release {rid} is already trained" in msg and "register" in msg
    assert "new plan" not in msg and "\n" not in msg
    assert set(_charges_per_person(settings, plan).values()) == {1}


def test_the_ledger_refuses_a_second_release_of_a_plan_itself(settings):
    from components.ledger.release import release_costs

    plan = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 20,
            "sha256": "d" * 64}
    led = Ledger.open(settings)
    try:
        costs = release_costs(plan, {"a": 1, "b": 1}, led.orders)
        first = led.reserve(kind="user", mechanism="uls", plan_sha256=plan["sha256"], params={}, costs=costs, budget=None)
        with pytest.raises(PlanAlreadyReleased) as e:
            led.reserve(kind="user", mechanism="uls", plan_sha256=plan["sha256"], params={}, costs=costs, budget=None)
        assert e.value.release_id == first.release_id and e.value.status == "reserved"
        assert led.releases_for_plan(plan["sha256"]) == [first.release_id]
        # releases that are not a DP-SGD plan's (PMixED builds key theirs on a policy) may repeat
        led.reserve(kind="user", mechanism="pmixed", plan_sha256="e" * 64, params={}, costs=costs, budget=None)
        led.reserve(kind="user", mechanism="pmixed", plan_sha256="e" * 64, params={}, costs=costs, budget=None)
    finally:
        led.dispose()


def _ledger_racer(url: str, key: bytes, start, out) -> None:
    from components.ledger.release import release_costs

    led = Ledger(url, key)
    plan = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 20}
    costs = release_costs(plan, {f"p{i}": 1 for i in range(20)}, led.orders)
    start.wait()
    try:
        r = led.reserve(kind="user", mechanism="uls", plan_sha256="f" * 64, params={}, costs=costs, budget=None)
        out.put(("reserved", r.release_id))
    except PlanAlreadyReleased as e:
        out.put(("refused", e.release_id))
    finally:
        led.dispose()


@pytest.mark.timeout(300)
def test_processes_reserving_one_plan_on_postgresql_make_one_release():
    from _ledger_pg import postgres_server

    with postgres_server() as url:
        key = os.urandom(32)
        Ledger(url, key).dispose()
        ctx = mp.get_context("spawn")
        start, out = ctx.Barrier(RACERS), ctx.Queue()
        procs = [ctx.Process(target=_ledger_racer, args=(url, key, start, out)) for _ in range(RACERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
            assert p.exitcode == 0
        got = [out.get(timeout=5) for _ in procs]
        led = Ledger(url, key)
        try:
            ids = led.releases_for_plan("f" * 64)
            assert len(ids) == 1 and sorted(s for s, _ in got) == ["refused"] * (RACERS - 1) + ["reserved"]
            assert {rid for _, rid in got} == {ids[0]}
            one = R.sampled_gaussian_rdp(0.1, 2.0, 20, led.orders)
            spend = led.spend([f"p{i}" for i in range(20)])
            assert all(np.allclose(v, one) for v in spend.values())
        finally:
            led.dispose()


def _hold_lock(home: str, run: str, ready, done) -> None:
    os.environ["VEIL_HOME"] = home
    from components.core.settings import load_settings
    from flows.stages import RunLock

    with RunLock(load_settings(Path(home)), Path(run), None):
        ready.set()
        done.wait(120)


def test_a_second_trainer_of_a_run_folder_refuses_in_one_line(veil_home, settings, tmp_path):
    from flows.stages import RunLock

    run = settings.runs_dir / "abc"
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(str(veil_home), str(run), ready, done))
    p.start()
    try:
        assert ready.wait(120)
        with pytest.raises(VeilError) as e:
            with RunLock(settings, run, None):
                pass
        msg = str(e.value)
        assert f"pid {p.pid}" in msg and "already being trained" in msg and "\n" not in msg
    finally:
        done.set()
        p.join(60)
    with RunLock(settings, run, None):     # the first one is gone: the lock is free again
        pass
    # and a killed holder never leaves it stale (the kernel drops a dead process' flock)
    ready2, done2 = ctx.Event(), ctx.Event()
    p2 = ctx.Process(target=_hold_lock, args=(str(veil_home), str(run), ready2, done2))
    p2.start()
    assert ready2.wait(120)
    p2.kill()
    p2.join(60)
    t0 = time.monotonic()
    with RunLock(settings, run, None):
        assert time.monotonic() - t0 < 5


def test_torchrun_ranks_share_rank_zeros_one_release(veil_home, settings, monkeypatch):
    """Under torchrun every rank runs the train stage: rank 0 reserves, the others (here: on another
    machine, without rank 0's run folder) resume that release instead of reserving their own."""
    from flows import stages

    plan = _plan(veil_home)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(stages, "RANK0_WAIT_S", 1.0)
    with pytest.raises(VeilError, match="waited .* for rank 0's ledger reservation"):
        _stage_reserve(str(veil_home))          # nothing reserved yet: never reserves on its own
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    rid = _stage_reserve(str(veil_home))["release_id"]
    (settings.runs_dir / plan["sha256"][:16] / "ledger_reservation.json").unlink()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _stage_reserve(str(veil_home))["release_id"] == rid
    assert set(_charges_per_person(settings, plan).values()) == {1}
