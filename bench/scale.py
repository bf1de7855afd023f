"""Veil at an organization's scale (issue 27): the ledger and the planner at 10k, 100k and 1M people.

    python bench/scale.py                                # every section at 10k and 100k people
    python bench/scale.py --sizes 1000000                # 1M people
    python bench/scale.py --sections ledger-reserve --sizes 10000 100000 1000000
    python bench/scale.py --baseline /path/to/old/tree   # the same sections with that checkout's code, same run
    python bench/scale.py --json                         # one JSON document instead of the table
    python bench/scale.py --sections plan --sizes 10000 100000 1000000 10000000   # the planner to 10M

Sections (each size, and each code tree, in a fresh interpreter: its peak RSS is its own):
  ledger-reserve        Ledger.reserve of one release to N people who are all new (SQLite, WAL,
                        synchronous=FULL); `costs_s` is the pricing before it (release_costs), `time_s`
                        the two together (what the pipeline pays between plan and train)
  ledger-report         `veil ledger --json`'s work (components.ledger.report.ledger_report: summary,
                        private rows, burn-down, PLD estimate) on a ledger of N people × --releases
                        releases. The ledger is built once per size with THIS tree's code and cached under
                        --fixtures (both trees read the same file: the schema is the same; a fixture made
                        before `ledger_release_curves` gets it on its first open, which is not timed)
  token-during-reserve  a second release to the same N people (everyone has a spend) while another
                        process charges PMixED tokens one at a time (TokenBudget.charge, 10 ms apart):
                        the charges' p50/p99/max latency, and the reservation's time
  plan                  bench/plan_scale.py's `measure(people, tree) -> dict` when that file exists
                        (another bench owns the planner's figures); said absent otherwise

Targets (issue 27, a 2-core machine): reserve 1M people ≤ 60 s and ≤ 2 GB peak RSS; the report at
1M people × 10 releases ≤ 30 s; a token charge's p99 ≤ 50 ms while a 1M-person reservation runs; plan
10M people ≤ 600 s wall and ≤ 0.5 KB per person (`--sections plan --sizes 10000 100000 1000000 10000000`:
time and CPU s of make_plan alone, peak RSS of its process, KB per person as plan_scale defines it).
The machine's load average is recorded beside every figure (a shared machine slows everything).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
sys.path.append(str(TREE))   # after PYTHONPATH: a --baseline tree put there wins

PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.001, "noise_multiplier": 1.0, "steps": 1000}
BUDGET = (64.0, 1e-5)       # large enough that 10 releases retire nobody: every release writes N charges
SECTIONS = ("ledger-reserve", "ledger-report", "token-during-reserve", "plan")
TARGETS = {("ledger-reserve", 1_000_000): {"time_s": 60.0, "peak_rss_mb": 2048.0},
           ("ledger-report", 1_000_000): {"time_s": 30.0},
           ("token-during-reserve", 1_000_000): {"token_p99_ms": 50.0},
           ("plan", 10_000_000): {"time_s": 600.0, "kb_per_person": 0.5}}


# --- in the worker ------------------------------------------------------------------------------------

def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _people(n: int) -> dict[str, int]:
    # a few distinct row counts, as an organization's people have (uls prices one draw per person anyway)
    return {f"person{i:07d}@example.org": 1 + i % 3 for i in range(n)}


def _settings(home: Path):
    from components.core.settings import load_settings

    return load_settings(home).ensure()


def _reserve(led, costs) -> float:
    from components.ledger import Budget

    t = time.perf_counter()
    r = led.reserve(kind="user", mechanism="uls", plan_sha256=None, params=dict(PLAN), costs=costs,
                    budget=Budget(*BUDGET))
    took = time.perf_counter() - t
    if len(r.admitted) != len(costs):
        raise SystemExit(f"scale: {len(costs) - len(r.admitted)} people retired; the bench expects none")
    return took


def _costs(led, n: int):
    from components.ledger.release import release_costs

    release_costs(PLAN, {"warm@example.org": 1}, led.orders)      # imports the mechanism: not the pricing's time
    persons = _people(n)
    t = time.perf_counter()
    costs = release_costs(PLAN, persons, led.orders)
    return costs, time.perf_counter() - t


def _charger(home: str, ready, go, stop, out) -> None:
    """One-token charges 10 ms apart: first while nothing else of ours runs (`idle`: what the machine's
    load and disk give anyway), then, from `go`, during the reservation."""
    from components.prediction.budget import TokenBudget

    tb = TokenBudget.open(_settings(Path(home)))
    tb.create("bench", 10 ** 9, "refuse")
    for _ in range(5):          # warm: the first charges open the file and the pool
        tb.charge("bench", 1)
    idle, lat, cpu = [], [], [0.0, 0.0]
    ready.set()
    while not stop.is_set():
        c0, t0 = _cpu_s(), time.perf_counter()
        tb.charge("bench", 1)
        t1 = time.perf_counter()
        (lat if go.is_set() else idle).append(t1 - t0)
        cpu[go.is_set()] += _cpu_s() - c0     # the charge's own CPU (getrusage's tick: a mean over many)
        time.sleep(0.01)
    out.put((idle, lat, cpu))


def section_ledger_reserve(n: int, work: Path, **_) -> dict:
    from components.ledger import Ledger

    led = Ledger.open(_settings(work / "home"))
    cpu0 = _cpu_s()
    costs, costs_s = _costs(led, n)
    reserve_s = _reserve(led, costs)
    led.dispose()
    return {"time_s": costs_s + reserve_s, "costs_s": costs_s, "reserve_s": reserve_s, "cpu_s": _cpu_s() - cpu0}


def section_token_during_reserve(n: int, work: Path, **_) -> dict:
    from components.ledger import Ledger

    s = _settings(work / "home")
    led = Ledger.open(s)
    costs, _ = _costs(led, n)
    first_s = _reserve(led, costs)
    ctx = mp.get_context("spawn")
    ready, go, stop, q = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_charger, args=(str(s.home), ready, go, stop, q))
    p.start()
    if not ready.wait(300):
        raise SystemExit("scale: the token charger did not start")
    time.sleep(10.0)            # the idle control: charges with no reservation running
    go.set()
    cpu0 = _cpu_s()
    took = _reserve(led, costs)
    cpu = _cpu_s() - cpu0
    stop.set()
    idle, lat, ccpu = q.get(timeout=600)
    idle, lat = sorted(idle), sorted(lat)
    p.join(60)
    led.dispose()

    def pct(xs: list, f: float) -> float | None:
        return None if not xs else 1000 * xs[min(len(xs) - 1, int(f * len(xs)))]
    return {"time_s": took, "cpu_s": cpu, "first_reserve_s": first_s, "token_charges": len(lat),
            "token_p50_ms": pct(lat, 0.5), "token_p99_ms": pct(lat, 0.99), "token_max_ms": pct(lat, 1.0),
            "idle_charges": len(idle), "idle_p50_ms": pct(idle, 0.5), "idle_p99_ms": pct(idle, 0.99),
            "token_cpu_ms": 1000 * ccpu[1] / max(1, len(lat)), "idle_cpu_ms": 1000 * ccpu[0] / max(1, len(idle))}


def build_fixture(n: int, releases: int, where: Path) -> dict:
    """A ledger of n people × `releases` releases, built with this tree's code; the time of each release."""
    from components.ledger import Ledger

    tmp = where.with_name(where.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    led = Ledger.open(_settings(tmp / "home"))
    costs, _ = _costs(led, n)
    times = [_reserve(led, costs) for _ in range(releases)]
    led.dispose()
    info = {"people": n, "releases": releases, "reserve_s": times}
    (tmp / "fixture.json").write_text(json.dumps(info))
    tmp.rename(where)
    return info


def section_ledger_report(n: int, work: Path, fixture: Path, releases: int, **_) -> dict:
    from components.ledger import Ledger
    from components.ledger.report import ledger_report

    s = _settings(Path(fixture) / "home")
    # opened once first: a fixture built by older code gets this code's one-time additions (the release
    # curves' record, filled from a scan) here, not inside the timed report
    Ledger.open(s).dispose()
    cpu0 = _cpu_s()
    t = time.perf_counter()
    doc = ledger_report(s)
    took = time.perf_counter() - t
    if doc["people"] != n or doc["releases"] != releases:
        raise SystemExit(f"scale: the fixture holds {doc['people']} people × {doc['releases']} releases")
    return {"time_s": took, "cpu_s": _cpu_s() - cpu0, "releases": releases,
            "max_epsilon": doc["spend"]["max_epsilon"]}


def section_plan(n: int, work: Path, tree: str, **_) -> dict:
    spec = importlib.util.spec_from_file_location("plan_scale", HERE / "plan_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = dict(mod.measure(n, tree))
    # the plan ran in plan_scale's own interpreter: its wall, CPU and peak RSS are that process's, not this one's
    return {"time_s": r.pop("wall_s"), "cpu_s": r.pop("cpu_s"), "peak_rss_mb": r.pop("peak_mb"),
            "kb_per_person": r.pop("kb_per_person"), "growth_mb": r.pop("growth_mb"),
            "records": r.pop("records"), "plan_sha256": r.pop("plan_sha256")[:12]}


WORKERS = {"ledger-reserve": section_ledger_reserve, "ledger-report": section_ledger_report,
           "token-during-reserve": section_token_during_reserve, "plan": section_plan}


def worker(section: str, n: int, args: dict) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"veil-scale-{section}-{n}-"))
    load0 = os.getloadavg()[0]
    try:
        out = WORKERS[section](n, work, **args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.setdefault("peak_rss_mb", _peak_rss_mb())
    out["load_avg"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return out


# --- in the parent ------------------------------------------------------------------------------------

def _run(cmd: list[str], tree: Path, what: str, timeout: float) -> dict:
    env = os.environ.copy()
    env["PYTHONPATH"] = str(tree)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def fixture_for(n: int, releases: int, root: Path, timeout: float) -> tuple[Path, dict]:
    where = root / f"ledger-{n}x{releases}"
    if (where / "fixture.json").exists():
        return where, json.loads((where / "fixture.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    info = _run([sys.executable, __file__, "--build-fixture", str(n), str(releases), str(where)], TREE,
                "fixture", timeout)
    if "error" in info:
        raise SystemExit(f"scale: building the {n}-people fixture failed: {info['error']}")
    return where, info


def _target(section: str, n: int, r: dict) -> str:
    t = TARGETS.get((section, n))
    if not t or "error" in r:
        return ""
    ok = all(r.get(k) is not None and r[k] <= v for k, v in t.items())
    return ("met " if ok else "MISSED ") + ", ".join(f"{k} ≤ {v:g}" for k, v in t.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--releases", type=int, default=10, help="releases in the ledger-report fixture")
    ap.add_argument("--baseline", type=Path, help="another checkout: each section also runs with its code")
    ap.add_argument("--baseline-only", action="store_true", help="run only the --baseline tree's code")
    ap.add_argument("--fixtures", type=Path, default=Path(tempfile.gettempdir()) / "veil-scale-fixtures",
                    help="where the ledger-report fixtures are cached (about 3 GB at 1M × 10)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per section run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=2, metavar=("SECTION", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--args", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--build-fixture", nargs=3, metavar=("N", "RELEASES", "DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], int(a.worker[1]), json.loads(a.args))))
        return
    if a.build_fixture:
        print(json.dumps(build_fixture(int(a.build_fixture[0]), int(a.build_fixture[1]), Path(a.build_fixture[2]))))
        return
    if a.releases < 1:
        sys.exit("scale: --releases must be ≥ 1")
    trees = [("this", TREE)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    if a.baseline_only:
        if not a.baseline:
            sys.exit("scale: --baseline-only needs --baseline")
        trees = trees[1:]
    for name, t in trees:
        if not (t / "components" / "ledger").is_dir():
            sys.exit(f"scale: --baseline {t}: not a Veil checkout (no components/ledger)")
    rows, notes, fixtures = [], [], {}
    for section in a.sections:
        if section == "plan" and not (HERE / "plan_scale.py").exists():
            notes.append("plan: section absent (bench/plan_scale.py with measure(people, tree) -> dict not found)")
            continue
        for n in a.sizes:
            extra: dict = {"tree": ""}
            if section == "ledger-report":
                where, info = fixture_for(n, a.releases, a.fixtures, a.timeout)
                fixtures[n] = info
                extra.update(fixture=str(where), releases=a.releases)
            for name, tree in trees:
                extra["tree"] = str(tree)
                r = _run([sys.executable, __file__, "--worker", section, str(n), "--args", json.dumps(extra)],
                         tree, section, a.timeout)
                r.update(section=section, people=n, code=name)
                r["target"] = _target(section, n, r)
                rows.append(r)
                if not a.json:
                    print((_head() + "\n" if len(rows) == 1 else "") + _line(r), flush=True)
    if a.json:
        print(json.dumps({"bench": "scale", "rows": rows, "fixtures": fixtures, "notes": notes}, indent=2))
        return
    for note in notes:
        print(note)


def _head() -> str:
    h = ("section", "people", "code", "time s", "CPU s", "peak RSS MB", "detail", "load avg", "target")
    return " | ".join(h) + "\n" + " | ".join("---" for _ in h)


def _line(r: dict) -> str:
    if "error" in r:
        return " | ".join([r["section"], f"{r['people']:,}", r["code"], "error: " + r["error"], "", "", "", "", ""])
    if r["section"] == "ledger-reserve":
        detail = f"pricing {r['costs_s']:.1f} s + reserve {r['reserve_s']:.1f} s"
    elif r["section"] == "token-during-reserve":
        detail = "token p50/p99/max " + "/".join("-" if r.get(k) is None else f"{r[k]:.0f}"
                                                for k in ("token_p50_ms", "token_p99_ms", "token_max_ms")) + \
                 f" ms ({r['token_charges']} charges)" + \
                 ("" if r.get("idle_p99_ms") is None else f"; idle p50/p99 {r['idle_p50_ms']:.0f}/{r['idle_p99_ms']:.0f} ms") + \
                 ("" if r.get("token_cpu_ms") is None else f"; CPU {r['token_cpu_ms']:.2f} ms a charge")
    elif r["section"] == "ledger-report":
        detail = f"{r['releases']} releases"
    else:
        detail = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("section", "people", "code", "time_s",
                                                                          "cpu_s", "peak_rss_mb", "load_avg", "target"))
    cpu = "" if r.get("cpu_s") is None else f"{r['cpu_s']:.1f}"
    rss = "" if r.get("peak_rss_mb") is None else f"{r['peak_rss_mb']:.0f}"
    load = "/".join(f"{x:.1f}" for x in r.get("load_avg", []))
    return " | ".join([r["section"], f"{r['people']:,}", r["code"], f"{r['time_s']:.2f}", cpu, rss, detail, load,
                       r["target"]])


if __name__ == "__main__":
    main()
