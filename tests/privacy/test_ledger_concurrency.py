"""Several processes (not threads) reserve against one budget at once: nobody overspends.

Each worker reserves releases for the same people as fast as it can; without serialization two
workers read the same spend and both admit a person whose budget has room for one of them only.
"""
from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from components.ledger import Budget, Ledger
from components.renyi import rdp as R
from components.ledger.release import release_costs

PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 20,
        "sha256": "c" * 64}
BUDGET = Budget(4.0, 1e-5)
PEOPLE = [f"p{i}" for i in range(12)]
WORKERS, EACH = 6, 3


def _worker(url: str, key: bytes, start, out) -> None:
    led = Ledger(url, key)
    costs = release_costs(PLAN, {p: 1 for p in PEOPLE}, led.orders)
    start.wait()
    admitted = 0
    for _ in range(EACH):
        # releases of many plans (one release per plan: tests/privacy/test_one_release_per_plan.py)
        r = led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, costs=costs,
                        budget=BUDGET)
        admitted += len(r.admitted)
    led.dispose()
    out.put(admitted)


def _race(url: str) -> None:
    key = os.urandom(32)
    Ledger(url, key).dispose()            # create the tables once; the race is on the reservations
    ctx = mp.get_context("spawn")         # fresh interpreters, own connections: real concurrency
    start, out = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, key, start, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0, "a reserving process failed"
    admitted = sum(out.get(timeout=5) for _ in procs)

    led = Ledger(url, key)
    one = R.sampled_gaussian_rdp(0.1, 2.0, 20, led.orders)
    budget = led.rdp_budget(BUDGET)
    fits = 0                                # how many of these releases the filter lets one person take
    while np.any((fits + 1) * one <= budget):
        fits += 1
    assert 1 <= fits < WORKERS * EACH       # the budget binds: a race would show
    spend = led.spend(PEOPLE)
    for p in PEOPLE:
        assert np.any(spend[p] <= budget), "someone's spend passes the budget at every order"
        assert np.allclose(spend[p], fits * one)   # exactly `fits` charges each, no more
    assert admitted == fits * len(PEOPLE)
    s = led.summary()
    assert s["releases"] == WORKERS * EACH and s["people"] == len(PEOPLE)
    assert s["spend"]["max_epsilon"] <= BUDGET.epsilon
    led.dispose()


def test_processes_reserving_at_once_never_overspend_sqlite(tmp_path):
    _race(f"sqlite:///{tmp_path / 'ledger.db'}")


@pytest.mark.timeout(300)
def test_processes_reserving_at_once_never_overspend_postgresql():
    from _ledger_pg import postgres_server

    with postgres_server() as url:
        _race(url)
