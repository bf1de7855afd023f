"""The ledger at scale (issue 27): reserve one release for N people, against a plain SQLite insert of the
same rows in the same run; the ledger report; and a PMixED token charge while a reservation runs.

    python bench/ledger_scale.py                 # 10k and 100k people
    python bench/ledger_scale.py --million       # and 1M
    python bench/ledger_scale.py --json          # one JSON document instead of the table

Each size runs in a fresh interpreter (its peak RSS is its own). Per size:
  reserve_new_s    the first release (everyone new): Ledger.reserve, costs computed before
  reserve_next_s   a later release (everyone has a spend), while another process charges PMixED tokens
  baseline_s       sqlite3 executemany of the same people and charge rows (161-byte curves), WAL,
                   synchronous=FULL, one transaction: what the rows alone cost on this disk
  report_s         `veil ledger --json`'s work (components.ledger.report.ledger_report) after `releases`
  token_*_ms       one-token charges (TokenBudget.charge) from another process during reserve_next
Old code for comparison: PYTHONPATH=/path/to/old/checkout python bench/ledger_scale.py (the bench
uses only APIs both have).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: an old checkout there wins

PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.001, "noise_multiplier": 1.0, "steps": 1000}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _charger(home: str, ready, stop, out) -> None:
    from components.core.settings import load_settings
    from components.prediction.budget import TokenBudget

    tb = TokenBudget.open(load_settings(Path(home)).ensure())
    tb.create("bench", 10 ** 9, "refuse")
    lat = []
    ready.set()
    while not stop.is_set():
        t0 = time.perf_counter()
        tb.charge("bench", 1)
        lat.append(time.perf_counter() - t0)
        time.sleep(0.01)
    out.put(lat)


def _baseline(root: Path, keys: list[str]) -> float:
    path = root / "baseline.db"
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE people (person_key TEXT PRIMARY KEY, first_release_id INT, created_at TEXT)")
    con.execute("CREATE TABLE charges (person_key TEXT, release_id INT, rdp BLOB, rows INT, sampling_rate REAL, "
                "PRIMARY KEY (person_key, release_id))")
    blob = bytes(161)
    t0 = time.perf_counter()
    con.execute("BEGIN IMMEDIATE")
    con.executemany("INSERT INTO people VALUES (?, 1, '2026-01-01T00:00:00')", ((k,) for k in keys))
    con.executemany("INSERT INTO charges VALUES (?, 1, ?, 1, 0.001)", ((k, blob) for k in keys))
    con.execute("COMMIT")
    took = time.perf_counter() - t0
    con.close()
    return took


def worker(n: int, releases: int) -> dict:
    from components.core.settings import load_settings
    from components.ledger import Budget, Ledger
    from components.ledger.release import release_costs
    from components.ledger.report import ledger_report

    root = Path(tempfile.mkdtemp(prefix="veil-ledger-scale-"))
    s = load_settings(root / "home").ensure()
    led = Ledger.open(s)
    budget = Budget(64.0, 1e-5)
    ids = [f"person{i:07d}@example.org" for i in range(n)]
    t0 = time.perf_counter()
    costs = release_costs(PLAN, {i: 1 for i in ids}, led.orders)
    costs_s = time.perf_counter() - t0

    def reserve() -> float:
        t = time.perf_counter()
        r = led.reserve(kind="user", mechanism="uls", plan_sha256=None, params=dict(PLAN), costs=costs,
                        budget=budget)
        assert len(r.admitted) == n
        return time.perf_counter() - t

    out = {"people": n, "costs_s": costs_s, "reserve_new_s": reserve(), "rss_after_reserve_mb": _rss_mb()}
    ctx = mp.get_context("spawn")
    ready, stop, q = ctx.Event(), ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_charger, args=(str(s.home), ready, stop, q))
    p.start()
    ready.wait(120)
    time.sleep(0.3)
    out["reserve_next_s"] = reserve()
    stop.set()
    lat = sorted(q.get(timeout=600))
    p.join(60)
    for _ in range(max(0, releases - 2)):
        reserve()
    keys = [led.person_key(i) for i in ids]
    out["baseline_s"] = _baseline(root, keys)
    led.dispose()
    t0 = time.perf_counter()
    doc = ledger_report(s)
    out["report_s"] = time.perf_counter() - t0
    assert doc["releases"] == max(2, releases) and doc["people"] == n
    led = Ledger.open(s)
    t0 = time.perf_counter()
    led.summary()
    out["summary_s"] = time.perf_counter() - t0
    led.dispose()
    out["releases"] = max(2, releases)
    out["peak_rss_mb"] = _rss_mb()

    def pct(q_: float) -> float | None:
        return None if not lat else 1000 * lat[min(len(lat) - 1, int(q_ * len(lat)))]
    out.update(token_charges=len(lat), token_p50_ms=pct(0.5), token_p99_ms=pct(0.99),
               token_max_ms=None if not lat else 1000 * lat[-1])
    out["reserve_vs_baseline"] = out["reserve_new_s"] / out["baseline_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--million", action="store_true", help="add 1,000,000 people")
    ap.add_argument("--releases", type=int, default=2, help="releases before the report (≥ 2)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.releases)))
        return
    sizes = list(a.sizes) + ([1_000_000] if a.million else [])
    rows = []
    for n in sizes:
        p = subprocess.run([sys.executable, __file__, "--worker", str(n), "--releases", str(a.releases)],
                           capture_output=True, text=True, env=os.environ.copy())
        if p.returncode != 0:
            sys.exit(f"ledger_scale: {n} people failed:\n{p.stderr[-3000:]}")
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    if a.json:
        print(json.dumps({"bench": "ledger_scale", "rows": rows}, indent=2))
        return
    head = ("people", "reserve new s", "reserve next s", "baseline s", "× baseline", "ledger --json s",
            "summary s", "peak RSS MB", "token p50/p99/max ms")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        tok = "/".join("-" if r[k] is None else f"{r[k]:.0f}" for k in ("token_p50_ms", "token_p99_ms", "token_max_ms"))
        print(" | ".join([f"{r['people']:,}", f"{r['reserve_new_s']:.2f}", f"{r['reserve_next_s']:.2f}",
                          f"{r['baseline_s']:.2f}", f"{r['reserve_vs_baseline']:.1f}×", f"{r['report_s']:.2f}",
                          f"{r['summary_s']:.2f}", f"{r['peak_rss_mb']:.0f}", tok]))


if __name__ == "__main__":
    main()
