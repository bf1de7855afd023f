"""The secret LP against an independent exact solver (vertex enumeration) on small instances."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from components.core.errors import VeilError
from components.bounding.secret_lp import sampling_rates, solve_secret_lp


def brute_force_lp(sets: list[set[int]], cap: np.ndarray) -> float:
    """max Σw s.t. Σ_{i∋s} w_i ≤ cap_s, 0 ≤ w ≤ 1 — by enumerating every vertex of the polytope."""
    n, m = len(sets), len(cap)
    A = np.zeros((m, n))
    for i, s in enumerate(sets):
        for j in s:
            A[j, i] = 1.0
    G = np.vstack([A, np.eye(n), -np.eye(n)])
    h = np.concatenate([cap, np.ones(n), np.zeros(n)])
    best = -np.inf
    for rows in itertools.combinations(range(G.shape[0]), n):
        M = G[list(rows)]
        if abs(np.linalg.det(M)) < 1e-12:
            continue
        w = np.linalg.solve(M, h[list(rows)])
        if np.all(G @ w <= h + 1e-9):
            best = max(best, float(w.sum()))
    return best


def _pairs(sets):
    rec = [i for i, s in enumerate(sets) for _ in s]
    sec = [j for s in sets for j in sorted(s)]
    return np.array(rec, dtype=np.int64), np.array(sec, dtype=np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_lp_optimum_matches_vertex_enumeration(seed):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(2, 5)), int(rng.integers(1, 4))
    base = [set(rng.choice(m, size=int(rng.integers(0, m + 1)), replace=False).tolist()) for _ in range(n)]
    # duplicate some secret sets so merging has something to merge
    sets = base + [set(base[int(rng.integers(0, n))]) for _ in range(int(rng.integers(0, 3)))]  # ≤ 6
    rho = rng.uniform(0.0, 1.0, size=m)
    c = float(rng.choice([0.3, 1.0, 2.5, 10.0]))
    if seed % 2:  # many singletons: exercises the dominance reduction
        sets.append({int(rng.integers(0, m))})
    rec, sec = _pairs(sets)
    res = solve_secret_lp(rec, sec, rho, len(sets), c=c)
    assert res.objective == pytest.approx(brute_force_lp(sets, c * rho), abs=1e-6)
    w = res.weights
    assert np.all((w >= 0) & (w <= 1))
    for j in range(m):  # exactly feasible, not just within solver tolerance
        assert sum(w[i] for i, s in enumerate(sets) if j in s) <= c * rho[j] + 1e-12
    for i, s in enumerate(sets):
        if not s:
            assert w[i] == 1.0


def test_merging_identical_sets_and_dropping_slack_constraints():
    # 30 records share {0}; 5 share {1}; secret 2 has budget for its 2 records: cannot bind.
    sets = [{0}] * 30 + [{1}] * 5 + [{2}] * 2 + [set()] * 4
    rho = np.array([1.0, 1.0, 1.0])
    rec, sec = _pairs(sets)
    res = solve_secret_lp(rec, sec, rho, len(sets), c=3.0)
    assert res.n_variables == 3                 # three distinct non-empty sets
    # secret 2 (load 2 ≤ 3) cannot bind; {0} and {1} alone fill their budgets: nothing left for HiGHS
    assert res.n_constraints == 0 and res.status.startswith("optimal (solved by reductions")
    assert res.objective == pytest.approx(3 + 3 + 2 + 4)
    w = res.weights
    assert np.allclose(w[:30], 0.1) and np.allclose(w[30:35], 0.6)   # equal within a merged group
    assert np.all(w[35:] == 1.0)
    assert res.n_binding == 2


def test_large_c_keeps_everything_and_retained_grows_with_c():
    rng = np.random.default_rng(7)
    n, m = 400, 40
    sets = [set(rng.choice(m, size=int(rng.integers(1, 4)), replace=False).tolist()) for _ in range(n)]
    rho = rng.uniform(0.05, 0.5, size=m)
    rec, sec = _pairs(sets)
    loads = np.bincount(sec, minlength=m)
    c_all = float(np.max(loads / rho))           # seed 004: w ≡ 1 iff C ≥ max_s n_s / ρ_s
    full = solve_secret_lp(rec, sec, rho, n, c=c_all * 1.0001)
    assert full.objective == pytest.approx(n) and full.n_constraints == 0
    prev = -1.0
    for c in (0.5, 2.0, 8.0, 32.0, c_all):
        obj = solve_secret_lp(rec, sec, rho, n, c=c).objective
        assert obj >= prev - 1e-7
        prev = obj
    assert solve_secret_lp(rec, sec, rho, n, c=c_all * 0.5).objective < n


def test_zero_budget_secret_drops_its_records_and_untagged_drop_policy():
    sets = [{0}, {0, 1}, {1}, set()]
    rec, sec = _pairs(sets)
    res = solve_secret_lp(rec, sec, np.array([0.0, 10.0]), 4, c=1.0)
    assert list(res.weights) == [0.0, 0.0, 1.0, 1.0]
    res = solve_secret_lp(rec, sec, np.array([0.0, 10.0]), 4, c=1.0, untagged="drop")
    assert list(res.weights) == [0.0, 0.0, 1.0, 0.0]


def test_rates_have_the_expected_batch_and_refuse_too_large_batches():
    w = np.array([1.0, 0.5, 0.5, 0.0, 1.0])
    p = sampling_rates(w, 2.0)
    assert p.sum() == pytest.approx(2.0) and p.max() <= 1.0 and p[3] == 0.0
    with pytest.raises(VeilError, match="raise spec.secrets.lp.c"):
        sampling_rates(w, 3.5)


def test_time_limit_fails_closed():
    rng = np.random.default_rng(0)
    n, m = 60_000, 6_000
    k = rng.integers(2, 4, size=n)             # no singleton sets: the reductions cannot solve it
    rec = np.repeat(np.arange(n), k)
    sec = rng.integers(0, m, size=rec.size)
    with pytest.raises(VeilError, match="time limit"):
        solve_secret_lp(rec, sec, rng.uniform(0.01, 0.5, size=m), n, c=10.0, time_limit_s=0.01)


def test_bad_inputs_are_user_errors():
    rec, sec = _pairs([{0}])
    with pytest.raises(VeilError):
        solve_secret_lp(rec, sec, np.array([-1.0]), 1, c=1.0)
    with pytest.raises(VeilError):
        solve_secret_lp(rec, sec, np.array([1.0]), 1, c=0.0)
