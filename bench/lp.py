"""Secret-protection LP speed: Veil's reduced solve next to the plain LP, one process.

Instance (issue 5): n records × m secrets, each record holding 1–3 secrets drawn uniformly, ρ_s from
three protection tiers (seed 004 Lemma 3.2 KL budgets), constant C. Target: 1M × 100k in ≤ 60 s on 2 cores.

    python bench/lp.py                      # 1M records × 100k secrets, C=10, plus the plain baseline
    python bench/lp.py --records 200000 --secrets 20000 --c 3 30
    python bench/lp.py --no-baseline --json

"ours" = components.planning.solve_secret_lp: identical secret sets merged into one variable, constraints
that cannot bind dropped, secrets whose single-secret records fill their budget settled by dominance (to a
fixed point), the rest to HiGHS' interior point with a hard deadline. Variables/constraints = what HiGHS got. "plain" = scipy.optimize.linprog
(HiGHS interior point) on the unreduced LP, one variable per record. Both report Σw; they must agree.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def kl_budget(kappa: float, gamma: float) -> float:
    return gamma * math.log(gamma / kappa) + (1 - gamma) * math.log((1 - gamma) / (1 - kappa))


TIERS = [(1e-3, 0.01), (1e-3, 0.05), (1e-2, 0.2)]   # (κ, γ): critical, high, moderate


def instance(n: int, m: int, seed: int):
    rng = np.random.default_rng(seed)
    per = rng.integers(1, 4, size=n)
    rec = np.repeat(np.arange(n, dtype=np.int64), per)
    sec = rng.integers(0, m, size=rec.size, dtype=np.int64)
    rho = np.array([kl_budget(*TIERS[t]) for t in rng.integers(0, len(TIERS), size=m)])
    return rec, sec, rho


def plain(rec, sec, rho, n, c, time_limit):
    import scipy.sparse as sp

    from components.bounding.secret_lp import _linprog_with_deadline

    t0 = time.perf_counter()
    pairs = np.unique(np.stack([rec, sec], axis=1), axis=0)
    A = sp.csr_matrix((np.ones(len(pairs)), (pairs[:, 1], pairs[:, 0])), shape=(len(rho), n))
    bounds = np.column_stack([np.zeros(n), np.ones(n)])
    res = _linprog_with_deadline(A, c * rho, bounds, "highs-ipm", time_limit)
    secs = time.perf_counter() - t0
    if res is None or res.status != 0:
        return {"seconds": secs, "objective": None, "status": "time limit" if res is None or res.status == 1 else
                res.message, "variables": n, "constraints": len(rho)}
    return {"seconds": secs, "objective": float(np.clip(res.x, 0, 1).sum()), "status": "optimal",
            "variables": n, "constraints": len(rho)}


def ours(rec, sec, rho, n, c, time_limit):
    from components.bounding.secret_lp import solve_secret_lp

    t0 = time.perf_counter()
    r = solve_secret_lp(rec, sec, rho, n, c=c, time_limit_s=time_limit)
    return {"seconds": time.perf_counter() - t0, "objective": r.objective, "status": r.status,
            "variables": r.n_lp_variables, "merged_variables": r.n_variables, "constraints": r.n_constraints, "retained": r.retained_fraction,
            "binding": r.n_binding}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--secrets", type=int, default=100_000)
    ap.add_argument("--c", type=float, nargs="+", default=[10.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    rec, sec, rho = instance(a.records, a.secrets, a.seed)
    rows = []
    for c in a.c:
        o = ours(rec, sec, rho, a.records, c, a.time_limit)
        p = None if a.no_baseline else plain(rec, sec, rho, a.records, c, a.time_limit)
        rows.append({"c": c, "ours": o, "plain": p,
                     "agree": None if p is None or p["objective"] is None else
                     bool(abs(o["objective"] - p["objective"]) <= 1e-5 * max(1.0, p["objective"]))})
    env = {"records": a.records, "secrets": a.secrets, "pairs": int(rec.size), "cpus": os.cpu_count(),
           "python": platform.python_version(), "target_s": 60.0}
    if a.json:
        print(json.dumps({"env": env, "rows": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"secret LP · {a.records:,} records × {a.secrets:,} secrets ({rec.size:,} record–secret pairs)")
    for col in ("C", "solver", "variables", "constraints", "Σw (kept)", "seconds", "status"):
        t.add_column(col, justify="right")
    for r in rows:
        o = r["ours"]
        t.add_row(f"{r['c']:g}", "ours (merged + reduced)", f"{o['variables']:,}", f"{o['constraints']:,}",
                  f"{o['objective']:,.1f} ({o['retained']:.1%})", f"{o['seconds']:.1f}", o["status"])
        if r["plain"]:
            p = r["plain"]
            t.add_row("", "plain linprog", f"{p['variables']:,}", f"{p['constraints']:,}",
                      "—" if p["objective"] is None else f"{p['objective']:,.1f}", f"{p['seconds']:.1f}",
                      p["status"] + ("" if r["agree"] is None else (" · same optimum" if r["agree"] else
                                                                     " · DIFFERENT optimum")))
    Console().print(t)
    worst = max(r["ours"]["seconds"] for r in rows)
    Console().print(f"target ≤ 60 s: {'met' if worst <= 60 else 'MISSED'} (slowest ours: {worst:.1f} s, "
                    f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
