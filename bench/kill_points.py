"""Every kill point of `veil retrain` (issue 28): a real `veil retrain` process SIGKILLed at each of the
ten named points of components/core/faults.py (VEIL_FAULT_KILL_AT), then run again, on a tiny policy in
a fresh VEIL_HOME per point against one real Prefect server. Each row: whether the next run completed
with one ledger release per plan, everyone charged once, one registered version, audited, its promotion
decided (the checks of tests/flows/test_kill_points.py, which this runs with VEIL_FAULT_ALL_POINTS=1),
and the seconds the killed run and the whole point took. CI draws points at random instead.

    python bench/kill_points.py [--json] [--points after-plan,during-audit]

About 2 minutes a point on 2 busy cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--points", help="comma-separated points (default: all ten)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from components.core.faults import POINTS

    points = a.points.split(",") if a.points else list(POINTS)
    unknown = [p for p in points if p not in POINTS]
    if unknown:
        print(f"error: not kill points: {', '.join(unknown)} (one of {', '.join(POINTS)})", file=sys.stderr)
        return 2
    select = " or ".join(f"[{p}]" for p in points)
    env = {**os.environ, "VEIL_FAULT_ALL_POINTS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", "-rA",
                           "tests/flows/test_kill_points.py", "-k", f"every and ({select})"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    rows = {}
    for line in proc.stdout.splitlines():
        if "KILLPOINT " in line:
            row = json.loads(line.split("KILLPOINT ", 1)[1])
            rows[row["point"]] = {**row, "ok": True}
    for p in points:
        rows.setdefault(p, {"point": p, "ok": False, "killed_s": None, "resume_action": None, "total_s": None})
    table = [rows[p] for p in points]
    if a.json:
        print(json.dumps({"points": table, "all_ok": all(r["ok"] for r in table)}, indent=2))
    else:
        print(f"{'point':<22} {'ok':<4} {'killed run s':>12} {'resumed as':<10} {'point s':>8}")
        for r in table:
            print(f"{r['point']:<22} {'yes' if r['ok'] else 'NO':<4} {r['killed_s'] or '':>12} "
                  f"{r['resume_action'] or '':<10} {r['total_s'] or '':>8}")
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
