"""Per-secret record weights: the linear program of seed 004 (§2.2), solved with HiGHS.

    maximise   Σ_i w_i
    subject to Σ_{i ∋ s} w_i ≤ C·ρ_s   for every secret s,      0 ≤ w_i ≤ 1

ρ_s = d_KL(γ_s ‖ κ_s) is the secret's KL budget. The constraints are the paper's proxy for "each
secret appears about as often as its protection allows"; the guarantee itself comes from calibrating
σ on the resulting sampling rates p_i = B·w_i / Σw.

Reductions, each preserving the optimum value:
* records without secrets appear in no constraint: weight 1 (or 0 if the policy drops them);
* records with the same set of secrets are interchangeable: one variable W_j ∈ [0, n_j] stands for the
  n_j of them (any optimum can be averaged within the group without changing Σw or feasibility);
* a constraint whose total count Σ_{j∋s} n_j is within C·ρ_s can never bind: dropped; variables left in
  no constraint take their upper bound;
* singleton dominance: when the records holding exactly {s} can fill s's budget alone, some optimum does
  so and gives every other record holding s weight 0 (moving weight onto the {s} records keeps Σw and
  only frees other secrets' budgets). Applied with the rule above to a fixed point; HiGHS gets the rest.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy
import scipy.sparse as sp
from scipy.optimize import linprog

from components.core.errors import VeilError

_FEAS_TOL = 1e-9


@dataclass(frozen=True)
class LPResult:
    weights: np.ndarray            # w_i per record, in [0, 1]
    c: float
    objective: float               # Σ w_i (all records)
    n_records: int
    n_tagged: int                  # records holding at least one secret
    n_secrets: int
    n_variables: int               # after merging identical secret sets
    n_constraints: int             # after dropping constraints that cannot bind
    n_binding: int                 # secrets whose constraint is tight at the solution
    n_lp_variables: int            # variables left for HiGHS after the reductions
    status: str
    solver: str
    seconds: float
    secret_load: np.ndarray = field(repr=False)   # Σ_{i∋s} w_i per secret

    @property
    def retained_fraction(self) -> float:
        return self.objective / self.n_records if self.n_records else 0.0

    def summary(self) -> dict:
        w = self.weights
        return {"c": self.c, "objective": self.objective, "retained_fraction": self.retained_fraction,
                "n_records": self.n_records, "n_tagged_records": self.n_tagged, "n_secrets": self.n_secrets,
                "n_variables": self.n_variables, "n_constraints": self.n_constraints,
                "n_binding": self.n_binding, "n_lp_variables": self.n_lp_variables, "n_zero_weight": int(np.sum(w <= 0)),
                "n_fractional_weight": int(np.sum((w > 0) & (w < 1))), "status": self.status,
                "solver": self.solver, "seconds": round(self.seconds, 3)}


def _unique_pairs(rec: np.ndarray, sec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique (record, secret) pairs; packed into one int64 key when the ranges allow (fast path)."""
    rec, sec = rec.astype(np.int64), sec.astype(np.int64)
    m = int(sec.max()) + 1
    if int(rec.max()) + 1 < (1 << 62) // max(m, 1):
        key = np.unique(rec * m + sec)
        return key // m, key % m
    pairs = np.unique(np.stack([rec, sec], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def _set_rows(rec: np.ndarray, sec: np.ndarray, n_records: int):
    """Unique (record, secret) pairs → tagged record ids, their group index, group secret lists, counts."""
    rec_u, sec_u = _unique_pairs(rec, sec)
    tagged, start, per = np.unique(rec_u, return_index=True, return_counts=True)
    width = int(per.max()) if per.size else 0
    # Pad each record's sorted secret list to `width` with -1; identical rows = identical secret sets.
    pos = np.arange(rec_u.size) - np.repeat(start, per)
    mat = np.full((tagged.size, max(width, 1)), -1, dtype=np.int64)
    mat[np.repeat(np.arange(tagged.size), per), pos] = sec_u
    m = int(sec_u.max()) + 2 if sec_u.size else 2
    bits = max(1, (m - 1).bit_length())
    if bits * mat.shape[1] <= 62:  # pack each row into one integer: 1-D unique is far faster than axis=0
        key = np.zeros(tagged.size, dtype=np.int64)
        for col in range(mat.shape[1]):
            key = (key << bits) | (mat[:, col] + 1)
        _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        groups = mat[first]
    else:
        groups, inverse, counts = np.unique(mat, axis=0, return_inverse=True, return_counts=True)
    return tagged, inverse.reshape(-1), groups, counts, (rec_u, sec_u)


def solve_secret_lp(rec: np.ndarray, sec: np.ndarray, rho: np.ndarray, n_records: int, *, c: float,
                    untagged: str = "keep", time_limit_s: float = 120.0, method: str = "highs-ipm") -> LPResult:
    """Solve the LP. `rec[k]`, `sec[k]`: record k-th pair holds secret (indices into 0..n_records-1 and
    0..len(rho)-1); `rho[s]` ≥ 0 is secret s's KL budget."""
    t0 = time.perf_counter()
    rho = np.asarray(rho, dtype=float)
    if c <= 0 or not np.isfinite(c):
        raise VeilError(f"secret LP: C must be a positive number, got {c}")
    if rho.size and (np.any(rho < 0) or not np.all(np.isfinite(rho))):
        raise VeilError("secret LP: every secret's KL budget rho must be finite and ≥ 0")
    m = rho.size
    w = np.full(n_records, 1.0 if untagged == "keep" else 0.0)
    cap = c * rho
    if rec.size == 0:
        return _result(w, c, n_records, 0, m, 0, 0, "no secrets", "none", t0, rec, sec, m)

    tagged, group_of, groups, counts, upairs = _set_rows(np.asarray(rec), np.asarray(sec), n_records)
    J = groups.shape[0]
    gi, gk = np.nonzero(groups >= 0)                      # group j holds secret groups[j, k]
    gs = groups[gi, gk]
    fixed, W, active = _reduce(groups, counts, gi, gs, cap, m)
    act_idx = np.flatnonzero(active)
    row_of = np.full(m, -1)
    row_of[act_idx] = np.arange(act_idx.size)
    keep = active[gs] & ~fixed[gi]
    A_rows, A_cols = row_of[gs[keep]], gi[keep]
    in_lp = np.zeros(J, dtype=bool)
    in_lp[A_cols] = True
    status, solver = "optimal (solved by reductions)", "none"
    lp_vars = np.flatnonzero(in_lp)
    if lp_vars.size:
        col_of = np.full(J, -1)
        col_of[lp_vars] = np.arange(lp_vars.size)
        A = sp.csr_matrix((np.ones(A_rows.size), (A_rows, col_of[A_cols])), shape=(act_idx.size, lp_vars.size))
        bounds = np.column_stack([np.zeros(lp_vars.size), counts[lp_vars].astype(float)])
        in_fixed = active[gs] & fixed[gi]              # fixed groups still inside active constraints (at 0)
        rhs = cap[act_idx] - np.bincount(row_of[gs[in_fixed]], weights=W[gi[in_fixed]], minlength=act_idx.size)
        res = _linprog_with_deadline(A, np.maximum(rhs, 0.0), bounds, method, float(time_limit_s))
        solver = f"scipy {scipy.__version__} {method}"
        if res is None or res.status == 1:
            raise VeilError(f"secret LP: HiGHS stopped at its time limit ({time_limit_s:g} s) with "
                            f"{lp_vars.size} variables and {act_idx.size} constraints; raise "
                            "spec.secrets.lp.time_limit_s or tag secrets more coarsely")
        if res.status == 2:
            raise VeilError("secret LP: infeasible — a secret has a negative budget; check the policy's kappa/gamma")
        if res.status != 0 or res.x is None:
            raise VeilError(f"secret LP: HiGHS failed ({res.message}); no weights to certify")
        W[lp_vars] = np.clip(res.x, 0.0, counts[lp_vars])
        status = "optimal"
    # Make feasibility exact despite solver tolerances: shrink uniformly where a constraint is over.
    load = np.bincount(gs, weights=W[gi], minlength=m)
    over = load > cap
    if np.any(over):
        W *= float(np.min(cap[over] / load[over])) if np.all(load[over] > 0) else 0.0
    w[tagged] = W[group_of] / counts[group_of]
    return _result(w, c, n_records, tagged.size, m, J, act_idx.size, status, solver, t0, *upairs, m, cap,
                   n_lp=int(lp_vars.size))


def _reduce(groups, counts, gi, gs, cap, m):
    """Fix what the optimum is known to be, to a fixed point; returns (fixed, W, active constraints).

    * A constraint that holds with every free group at its upper bound cannot bind: dropped.
    * A group left in no active constraint takes its upper bound n_j.
    * Singleton dominance: if the records holding exactly {s} alone can fill s's budget (n_{s} ≥ C·ρ_s),
      some optimum fills s with them and gives every other group holding s weight 0 (moving weight
      from a group holding s and more onto the {s} group keeps Σw and frees the other secrets' budgets).
    """
    J = counts.size
    size = (groups >= 0).sum(axis=1)
    single = np.flatnonzero(size == 1)
    single_of = np.full(m, -1)
    single_of[groups[single, 0]] = single
    fixed = np.zeros(J, dtype=bool)
    W = np.zeros(J)
    active = np.zeros(m, dtype=bool)
    active[np.unique(gs)] = True
    n = counts.astype(float)
    while True:
        changed = False
        load = np.bincount(gs, weights=np.where(fixed[gi], W[gi], n[gi]), minlength=m)
        slack = active & (load <= cap * (1 + 1e-12) + _FEAS_TOL)
        if slack.any():
            active &= ~slack
            changed = True
        s_idx = np.flatnonzero(active & (single_of >= 0))
        if s_idx.size:
            g = single_of[s_idx]
            ok = ~fixed[g] & (n[g] >= cap[s_idx])
            s_idx, g = s_idx[ok], g[ok]
        if s_idx.size:
            dominated = np.zeros(m, dtype=bool)
            dominated[s_idx] = True
            hit = np.unique(gi[dominated[gs]])
            hit = hit[~fixed[hit]]
            fixed[hit], W[hit] = True, 0.0
            W[g] = cap[s_idx]
            active[s_idx] = False
            changed = True
        in_active = np.zeros(J, dtype=bool)
        in_active[gi[active[gs]]] = True
        free_alone = ~fixed & ~in_active
        if free_alone.any():
            fixed[free_alone], W[free_alone] = True, n[free_alone]
            changed = True
        if not changed:
            return fixed, W, active


# Below this many variables HiGHS answers in well under a second: solve in-process.
_IN_PROCESS_MAX_VARS = 20_000


def _solve(A, b_ub, bounds, method, time_limit_s):
    return linprog(-np.ones(A.shape[1]), A_ub=A, b_ub=b_ub, bounds=bounds, method=method,
                   options={"time_limit": time_limit_s, "presolve": True})


def _linprog_with_deadline(A, b_ub, bounds, method, time_limit_s):
    """linprog that really stops at the time limit: HiGHS' interior-point solver does not check it,
    so large problems run in a child interpreter that is killed at the deadline (None returned).
    A subprocess, not multiprocessing: nothing of the caller's __main__ is re-imported."""
    if A.shape[1] <= _IN_PROCESS_MAX_VARS:
        return _solve(A, b_ub, bounds, method, time_limit_s)
    import os
    import select
    import subprocess
    import sys
    import tempfile
    from types import SimpleNamespace

    A = A.tocsr()
    with tempfile.TemporaryDirectory(prefix="veil-lp-") as tmp:
        np.savez(os.path.join(tmp, "in.npz"), data=A.data, indices=A.indices, indptr=A.indptr,
                 shape=np.array(A.shape), b=b_ub, bounds=bounds)
        proc = subprocess.Popen([sys.executable, "-m", "components.bounding._lp_worker", tmp, method,
                                 repr(time_limit_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": _repo_root() + os.pathsep
                                     + os.environ.get("PYTHONPATH", "")})
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 120)   # interpreter start + data load
            if not ready or proc.stdout.readline().strip() != b"ready":
                raise VeilError(f"secret LP: the solver process did not start "
                                f"({proc.stderr.read().decode(errors='replace')[-300:] if proc.poll() else 'timeout'})")
            try:
                proc.wait(timeout=time_limit_s)
            except subprocess.TimeoutExpired:
                return None
            if proc.returncode != 0:
                raise VeilError(f"secret LP: the solver process failed (exit {proc.returncode}): "
                                f"{proc.stderr.read().decode(errors='replace')[-300:]}")
            out = np.load(os.path.join(tmp, "out.npz"), allow_pickle=False)
            return SimpleNamespace(status=int(out["status"]), message=str(out["message"]),
                                   x=out["x"] if out["x"].size else None)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _repo_root() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[2])


def _result(w, c, n, n_tagged, m, J, n_cons, status, solver, t0, rec, sec, n_secrets, cap=None,
            n_lp: int = 0) -> LPResult:
    load = np.zeros(n_secrets)
    binding = 0
    if np.size(rec):  # on unique pairs: a record listing a secret twice counts once
        load = np.bincount(sec, weights=w[rec], minlength=n_secrets)
        if cap is not None:
            binding = int(np.sum((load > 0) & (load >= cap * (1 - 1e-6) - 1e-9)))
    return LPResult(weights=w, c=float(c), objective=float(w.sum()), n_records=n, n_tagged=int(n_tagged),
                    n_secrets=int(m), n_variables=int(J), n_constraints=int(n_cons), n_binding=binding,
                    n_lp_variables=int(n_lp),
                    status=status, solver=solver, seconds=time.perf_counter() - t0, secret_load=load)


def sampling_rates(weights: np.ndarray, expected_batch_size: float) -> np.ndarray:
    """Poisson rates p_i = B·w_i / Σw (expected batch B); needs Σw ≥ B so every p_i ≤ 1."""
    total = float(np.sum(weights))
    if total < expected_batch_size:
        raise VeilError(f"secret LP keeps only {total:.1f} records' worth of weight, fewer than the expected "
                        f"batch of {expected_batch_size}: raise spec.secrets.lp.c or lower "
                        "spec.training.expected_batch_size")
    return np.minimum(1.0, expected_batch_size * np.asarray(weights, dtype=float) / total)
