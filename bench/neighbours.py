"""The neighbour harness at full size (issue 22): every scenario on D and on D without each of 20+
people, under 3 keys, every published field diffed (tests/privacy/_neighbours.py explains the checks).

    python bench/neighbours.py                    # all scenarios, 21 people removed each, 3 keys
    python bench/neighbours.py --people 6 --keys 1 --scenario two_lines
    python bench/neighbours.py --json

Prints a table: scenario, keys, people removed, runs, findings, DP outcomes, seconds. Exit 1 when any
scenario has a finding (each is printed). A "DP outcome" is a pair whose runs took different courses
because of a DP release the removed person was charged for — one planned, the other refused on the
estimate N̂ alone; or one released (admitting that person) while the ledger's filter left no one without
them: allowed, and each is printed with the step and the ledger release that prices it
(_neighbours.divergence). `make test` runs a 3-person, 1-key sample of the same
scenarios (tests/privacy/test_neighbour_scenarios.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "privacy"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--people", type=int, default=21, help="people removed per scenario and key")
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    ap.add_argument("--org", type=int, default=28, help="people in the organisation")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import _neighbours as nb
    import _scenarios as sc
    from rich.console import Console
    from rich.table import Table

    people, scenarios = sc.make(a.org)
    step = max(1, len(people) // max(1, a.people))
    removed = people[::step][:a.people]
    keys = [bytes([17 + i]) * 32 for i in range(a.keys)]
    names = a.scenario or sorted(scenarios)
    err = Console(stderr=True)
    rows, all_findings, all_notes = [], [], []
    for name in names:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"veil-nb-{name}-") as tmp:
            os.environ["VEIL_HOME"] = str(Path(tmp) / "unused")
            with err.status(f"{name}: {len(keys)} keys × {len(removed)} people removed…"):
                notes: list = []
                findings = nb.check_scenario(name, scenarios[name], Path(tmp), people, removed, keys, notes)
        rows.append({"scenario": name, "keys": len(keys), "people_removed": len(removed),
                     "runs": len(keys) * (1 + len(removed)), "findings": len(findings),
                     "dp_outcomes": len(notes), "seconds": round(time.perf_counter() - t0, 1)})
        all_findings += findings
        all_notes += notes
    known = sorted(f"{c}:{p}" for c, p in nb.KNOWN_OPEN)
    if a.json:
        print(json.dumps({"rows": rows, "known_open": known,
                          "findings": [f.__dict__ for f in all_findings],
                          "dp_outcomes": [n.__dict__ for n in all_notes]}, indent=2))
    else:
        out = Console()
        t = Table(title=f"neighbour harness: an organisation of {len(people)} people")
        for col in ("scenario", "keys", "people removed", "runs", "findings", "DP outcomes", "seconds"):
            t.add_column(col, justify="right" if col != "scenario" else "left")
        for r in rows:
            t.add_row(r["scenario"], str(r["keys"]), str(r["people_removed"]), str(r["runs"]),
                      str(r["findings"]), str(r["dp_outcomes"]), f"{r['seconds']:.1f}")
        out.print(t)
        for n in all_notes[:20]:
            out.print(f"[yellow]allowed[/yellow] {n.scenario} −{n.person}: {n.why}")
        for f in all_findings[:50]:
            out.print(f"[red]finding[/red] {f.scenario} −{f.person}: {f.channel}:{f.path}: {f.why}")
        if known:
            out.print("known open (skipped, named in the harness): " + ", ".join(known))
        out.print(f"{sum(r['findings'] for r in rows)} findings over {sum(r['runs'] for r in rows)} runs")
    return 1 if all_findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
