"""Weekly retraining on a real multi-author corpus, as a new platform engineer runs it (issue 26).

    python bench/retrain_real.py --home DIR --base-model BASE [--policy policies/debian-weekly.yaml]
        [--weeks 1] [--last-entry 2026-09-08] [--json] [--from-json DIR-result.json]

The corpus is this machine's Debian changelogs (/usr/share/doc). A weekly schedule needs data that
changes every week, so the source folder is rebuilt before each step from the installed changelogs
cut at a date: week 0 holds every entry older than `--last-entry − weeks·7 days`, each later week
adds the next seven days' entries (a package upgrade adds entries at the top of its changelog; a
package whose entries are all newer is not installed yet). The same folder path is used every week,
as a scheduled job would see it.

Steps, each one CLI command timed on its own (the commands a user types; `--json` where it exists):

    veil ingest SRC --format debian-changelog --policy P     (week 0)
    veil plan --policy P --base-model BASE --json             (before training: can the audit settle?
                                                               how many releases fit the budget?)
    veil run --policy P --source SRC --format debian-changelog --base-model BASE --json   (week 0)
    veil ledger --admin --json                                (the forecast for the next release)
    veil retrain --policy P --source SRC --format debian-changelog --base-model BASE --json  (weeks 1…)
    veil evaluate MODEL_URI --json                            (perplexity: the scheduled flow does not evaluate)
    veil ledger --admin --json                                (what the release actually charged)
    veil models --json                                        (verdicts, reasons, aliases)

It prints one row per release: ε, the ledger's per-person spend (min/median/max) after it, the audit
verdict and its reason, whether it was promoted to `production`, perplexity base → model, wall
times; and whether each ledger forecast matched what the next release did. Nothing here is a
test: the numbers depend on the machine's installed packages. `VEIL_HOME` is `--home`.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def materialize(doc_root: Path, out: Path, cutoff: datetime) -> dict:
    """Rebuild `out` as `doc_root`'s changelogs holding only entries dated before `cutoff`.
    Returns {files, entries} written. Entries are newest first in a changelog: everything from the
    first entry older than the cutoff on is kept verbatim (including lines the parser quarantines)."""
    from catalog.connectors.debian import NAMES, _decompress, parse_changelog

    tmp = out.with_name(out.name + ".new")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    files = entries = 0
    seen: set[str] = set()
    for root, dirs, names in os.walk(doc_root, followlinks=False):
        dirs.sort()
        for n in sorted(names):
            if n not in NAMES:
                continue
            p = Path(root) / n
            real = os.path.realpath(p)
            if real in seen or not os.path.isfile(real) or not real.startswith(str(doc_root.resolve())):
                continue
            seen.add(real)
            try:
                data = _decompress(Path(real).read_bytes())
            except Exception:  # noqa: BLE001 - a file ingest would quarantine: leave it out of the study
                continue
            keep_from, kept = None, 0
            for e in parse_changelog(data):
                if "ts" not in e:
                    continue
                if datetime.fromisoformat(e["ts"]) < cutoff:
                    keep_from = e["line"] if keep_from is None else keep_from
                    kept += 1
            if keep_from is None:
                continue
            lines = data.split(b"\n")[keep_from - 1:]
            dest = tmp / Path(real).relative_to(doc_root.resolve()).parent / "changelog.Debian.gz"
            dest.parent.mkdir(parents=True, exist_ok=True)
            # mtime=0: the same entries give the same bytes, so an unchanged week is an unchanged source
            with open(dest, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
                g.write(b"\n".join(lines))
            files += 1
            entries += kept
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return {"files": files, "entries": entries}


def veil(args: list[str], env: dict, log: Path, timeout: int) -> tuple[dict | None, float, int, str]:
    """Run one veil command; (its --json document or None, wall seconds, exit code, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "import sys; from flows.cli import main; sys.argv[0] = 'veil'; "
                        "sys.exit(main())", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    with open(log, "a") as f:
        f.write(f"$ veil {' '.join(args)}   # {wall:.1f} s, exit {p.returncode}\n{p.stdout}\n--- stderr ---\n"
                f"{p.stderr}\n")
    doc = None
    if "--json" in args and p.stdout.strip():
        try:
            doc = json.loads(p.stdout)
        except json.JSONDecodeError:
            start = p.stdout.find("{")
            doc = json.loads(p.stdout[start:]) if start >= 0 else None
    return doc, wall, p.returncode, p.stderr


def noise(stderr: str) -> list[str]:
    """Third-party warnings and progress bars that reached the screen."""
    marks = ("Warning", "warning:", "warn(", "Downloading artifacts", "it/s]", "Traceback")
    return [ln.strip()[:160] for ln in stderr.splitlines() if any(m in ln for m in marks)]


def spend(ledger: dict | None) -> dict:
    """min/median/max per-person spend from `veil ledger --admin --json` (administrators only)."""
    d = ((ledger or {}).get("administrators_only") or {}).get("spend") or {}
    return {k: d.get(f"{k}_epsilon") for k in ("min", "median", "max")}


def _admin_forecast(ledger: dict | None) -> dict:
    return ((ledger or {}).get("administrators_only") or {}).get("forecast") or {}


def forecast_checks(rows: list[dict]) -> list[dict]:
    """What the ledger forecast after release i (for a person of that plan; administrators only) against
    what release i+1 did: the people it retired, and the releases left one release later."""
    out = []
    for a, b in zip(rows, rows[1:]):
        fa, fb = _admin_forecast(a["ledger"]), _admin_forecast(b["ledger"])
        public = ((a["ledger"] or {}).get("forecast") or {}).get("releases_for_a_new_person")
        retired = (b["result"] or {}).get("people_retired")
        left_a, left_b = fa.get("releases_left_min"), fb.get("releases_left_min")
        out.append({"after_week": a["week"], "releases_for_a_new_person": public,
                    "forecast_next_release_retires": fa.get("next_release_retires"), "next_release_retired": retired,
                    "retires_matches": None if retired is None else fa.get("next_release_retires") == retired,
                    "releases_left_min": left_a, "releases_left_min_after_next": left_b,
                    "releases_left_matches": None if left_a is None or left_b is None else left_b == left_a - 1,
                    "releases_left_median": fa.get("releases_left_median"),
                    "releases_left_median_after_next": fb.get("releases_left_median")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, type=Path, help="a fresh VEIL_HOME")
    ap.add_argument("--base-model", required=True, type=Path)
    ap.add_argument("--policy", type=Path, default=ROOT / "policies" / "debian-weekly.yaml")
    ap.add_argument("--doc-root", type=Path, default=Path("/usr/share/doc"))
    ap.add_argument("--weeks", type=int, default=1, help="weekly retrainings after the first release")
    ap.add_argument("--last-entry", default="2026-09-08", help="the last week ends here (YYYY-MM-DD)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per command")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--from-json", type=Path, help="print the table of a saved DIR-result.json and exit")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        saved["forecasts"] = forecast_checks(saved["rows"])
        print(json.dumps(saved, indent=1, default=str)) if args.json else print_table(saved)
        return

    home = args.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    src = home.parent / (home.name + "-source") / "doc"
    log = home.parent / (home.name + "-commands.log")
    log.write_text("")
    env = {**os.environ, "VEIL_HOME": str(home), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    end = datetime.fromisoformat(args.last_entry).replace(tzinfo=timezone.utc)
    pol, base, fmt = str(args.policy), str(args.base_model), "debian-changelog"
    commands: list[dict] = []
    rows: list[dict] = []
    forecasts: list[dict] = []

    def run(cmd: list[str]) -> dict | None:
        doc, wall, rc, err = veil(cmd, env, log, args.timeout)
        commands.append({"command": "veil " + " ".join(cmd), "wall_s": round(wall, 1), "exit": rc,
                         "noise": noise(err)})
        if rc != 0:
            print(f"veil {' '.join(cmd)} exited {rc}: {err.strip().splitlines()[-1:] }", file=sys.stderr)
        return doc

    def ledger_now() -> dict | None:
        return run(["ledger", "--admin", "--json"])

    plan_doc = None
    for week in range(args.weeks + 1):
        cutoff = end - timedelta(days=7 * (args.weeks - week))
        t0 = time.perf_counter()
        made = materialize(args.doc_root, src, cutoff)
        commands.append({"command": f"(week {week}: source = entries before {cutoff.date()}: {made['entries']} "
                                    f"entries in {made['files']} changelogs)",
                         "wall_s": round(time.perf_counter() - t0, 1), "exit": 0, "noise": []})
        if week == 0:
            run(["ingest", str(src), "--format", fmt, "--policy", pol, "--json"])
            plan_doc = run(["plan", "--policy", pol, "--base-model", base, "--json"])
            res = run(["run", "--policy", pol, "--source", str(src), "--format", fmt, "--base-model", base,
                       "--json"])
        else:
            res = run(["retrain", "--policy", pol, "--source", str(src), "--format", fmt, "--base-model", base,
                       "--json"])
        wall = commands[-1]["wall_s"]
        ev = None
        if week and (res or {}).get("action") == "trained":
            # the scheduled flow does not evaluate; `veil run` does (a DP release charged to evaluation people)
            ev = run(["evaluate", res["model_uri"], "--json"])
        led = ledger_now()
        rows.append({"week": week, "command": "run" if week == 0 else "retrain", "result": res, "ledger": led,
                     "evaluation": ev, "wall_s": wall})
    models = run(["models", "--json"])

    forecasts.extend(forecast_checks(rows))
    out = {"policy": pol, "base_model": base, "plan": plan_doc, "rows": rows, "models": models,
           "forecasts": forecasts, "commands": commands}
    (home.parent / (home.name + "-result.json")).write_text(json.dumps(out, indent=1, default=str))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return
    print_table(out)


def _fmt(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


def release_rows(out: dict) -> list[dict]:
    """One row per week: the release it made (or why none), from the commands' --json documents."""
    versions = {f"models:/{m.get('name')}/{m.get('version')}": m for m in (out.get("models") or [])
                if isinstance(m, dict)}
    table = []
    for r in out["rows"]:
        res = r["result"] or {}
        uri = res.get("model_uri") or (res.get("registration") or {}).get("model_uri")
        m = versions.get(uri, {})
        cert = res.get("certificate") or m.get("certificate") or {}
        audit = res.get("audit") or (cert.get("audit") if isinstance(cert.get("audit"), dict) else None) or {}
        gate = audit.get("gate") or {}
        ev = res.get("evaluation") or r.get("evaluation") or {}
        sp = spend(r["ledger"])
        table.append({
            "week": r["week"], "command": r["command"], "model_uri": uri,
            "action": res.get("action", "trained" if uri else "failed"),
            "epsilon": (cert.get("guarantee") or cert).get("epsilon") if isinstance(cert, dict) else None,
            "spend_min": sp.get("min"), "spend_median": sp.get("median"), "spend_max": sp.get("max"),
            "verdict": audit.get("verdict"), "reason": gate.get("reason") or "; ".join(audit.get("reasons") or []),
            "promoted": res.get("promoted", "production" in (m.get("aliases") or [])),
            "promotion_reason": res.get("reason"),
            "ppl_base": ev.get("base_perplexity"), "ppl_model": ev.get("perplexity"),
            "people_retired": res.get("people_retired"), "wall_s": r["wall_s"]})
    return table


def print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    t = Table(title=f"weekly retraining on this machine's Debian changelogs ({Path(out['policy']).name})")
    for c in ("week", "release", "ε", "spend min/med/max", "audit", "reason", "production?", "PPL base→model",
              "wall s"):
        t.add_column(c, overflow="fold")
    for r in release_rows(out):
        t.add_row(f"{r['week']} ({r['command']})", str(r["model_uri"] or r["action"]), _fmt(r["epsilon"], ".4g"),
                  f"{_fmt(r['spend_min'])} / {_fmt(r['spend_median'])} / {_fmt(r['spend_max'])}",
                  str(r["verdict"]), (r["reason"] or "")[:200],
                  ("yes" if r["promoted"] else "no") + (f": {r['promotion_reason'][:160]}"
                                                         if r["promotion_reason"] else ""),
                  f"{_fmt(r['ppl_base'], '.1f')} → {_fmt(r['ppl_model'], '.1f')}", f"{r['wall_s']:.0f}")
    con.print(t)
    for f in out["forecasts"]:
        con.print(f"ledger after week {f['after_week']}: a new person can take {f['releases_for_a_new_person']} "
                  f"releases; this plan's people: min {f['releases_left_min']} / median {f['releases_left_median']} "
                  f"left, the next release would retire {f['forecast_next_release_retires']}.\n"
                  f"  the next release retired {f['next_release_retired']} (match: {f['retires_matches']}); "
                  f"releases left after it: min {f['releases_left_min_after_next']} / median "
                  f"{f['releases_left_median_after_next']} (one fewer: {f['releases_left_matches']})")
    c = Table(title="commands")
    for col in ("command", "wall s", "exit", "third-party noise on screen"):
        c.add_column(col, overflow="fold")
    for x in out["commands"]:
        c.add_row(x["command"], f"{x['wall_s']:.1f}", str(x["exit"]), str(len(x["noise"])) +
                  (f": {x['noise'][0]}" if x["noise"] else ""))
    con.print(c)


if __name__ == "__main__":
    main()
