"""How long `veil` takes to start, in fresh processes: this tree against a baseline tree.

Three commands, each run --repeat times in a new Python process (imports and all, as a user pays them):

    veil --help                      the light path every command shares
    veil policy check <policy>       a command that reads one YAML file
    veil verify models:/bench/1      a registered release: seal, hashes, ε recomputed, registry checks

The release is built once, in a temporary VEIL_HOME, by this tree (tests/privacy/_sealed_release: a
tiny base, a tiny LoRA adapter, a real sealed certificate); both trees verify the same one. The
baseline is a `git worktree` of --baseline (default d1cd1fb, before issue 23) in a temporary folder,
removed afterwards, run with the same interpreter and PYTHONPATH pointed at it.

    python bench/startup.py [--repeat 5] [--baseline REV] [--json]

Targets (issue 23): `veil --help` ≤ 0.5 s, `veil policy check` ≤ 1 s, `veil verify` ≥ 3× faster than
the baseline. Compare CPU seconds on a shared machine (wall time also counts waiting for a core); the
load average before and after the timed runs is printed beside them.

What each command pays for now: `--help` the CLI alone (typer, rich's console, table and panel, and the
command table in flows/cli/__init__.py; no command module, none of typer's rich_utils — rich's Markdown,
pygments, tracebacks — no pydantic, policy, mechanism, registry or accountant); `policy check` adds its
own command module, pydantic, YAML and the mechanism registry — without numpy or pyarrow, which a
mechanism loads only in the hooks that compute; `verify --json` its own command module (no rich: the
consoles and tables are made when something is drawn), the local SQLite
registry and its file artifacts without MLflow (components.registry.local_store; MLflow's client for any
other store), cryptography for the seal, and dp-accounting to recompute ε: dp-accounting's PLD imports
scipy.stats and scipy.signal at its top (which load scipy.optimize, linalg, sparse, special, fft and
numpy's testing and f2py modules), about three quarters of what verify still costs. Importing only
dp_accounting.pld, without the package's __init__ (mechanism_calibration, scipy.optimize), saves
nothing measurable: scipy.stats imports scipy.optimize itself.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICY = "policies/demo.yaml"
MODEL_URI = "models:/bench/1"

# `from flows.cli import main` with argv set, as the `veil` console script does (the script itself
# is installed for one tree only; this runs whichever tree is first on PYTHONPATH)
VEIL = "import sys; from flows.cli import main; sys.argv = ['veil'] + sys.argv[1:]; main()"

BUILD = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT / 'tests' / 'privacy')!r})
from _sealed_release import build_adapter, build_base, plan_and_certificate
from components.core.settings import load_settings
from components.registry import register_model
tmp = Path(sys.argv[1])
settings = load_settings(tmp / 'home').ensure()
base = build_base(tmp / 'base')
adapter = build_adapter(base, tmp / 'adapter')
plan, cert = plan_and_certificate(adapter, base)
register_model(settings, name='bench', certificate=cert, plan=plan, base_model_dir=base, adapter_dir=adapter,
               policy_max_epsilon=8.0)
"""


def _env(tree: Path, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VEIL_", "MLFLOW_", "PREFECT_API"))}
    env.update(PYTHONPATH=str(tree), VEIL_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(argv: list[str], tree: Path, home: Path, expect: int = 0) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh `veil` process. CPU time is what a loaded machine
    changes least: the wall time also counts waiting for a core."""
    t0, c0 = time.perf_counter(), _cpu()
    p = subprocess.run([sys.executable, "-c", VEIL, *argv], cwd=tree, env=_env(tree, home),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds, cpu = time.perf_counter() - t0, _cpu() - c0
    if p.returncode != expect:
        raise SystemExit(f"bench: `veil {' '.join(argv)}` in {tree} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return seconds, cpu


def _compile(tree: Path) -> None:
    """Byte-compile once, so that no timed run pays for writing a tree's .pyc files."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "catalog", "components", "flows"], cwd=tree,
                   check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline", default="d1cd1fb", help="git revision to compare against (default: before issue 23)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeat < 1:
        raise SystemExit("bench: --repeat must be at least 1")
    # a `timeout` or Ctrl-C still removes the baseline worktree (the `finally` below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    commands = {"veil --help": (["--help"], 0),
                "veil policy check": (["policy", "check", POLICY], 0),
                "veil verify": (["verify", MODEL_URI, "--json"], 0)}
    with tempfile.TemporaryDirectory(prefix="veil-startup-") as d:
        tmp = Path(d)
        base_tree = tmp / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree), args.baseline],
                       check=True)
        try:
            trees = {"baseline": base_tree, "this tree": ROOT}
            for tree in trees.values():
                _compile(tree)
            home = tmp / "home"
            subprocess.run([sys.executable, "-c", BUILD, str(tmp)], cwd=ROOT, env=_env(ROOT, home), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times: dict[str, dict[str, list[tuple[float, float]]]] = {c: {t: [] for t in trees} for c in commands}
            for name, tree in trees.items():     # one untimed run each: the OS's file cache, MLflow's first open
                for argv, expect in commands.values():
                    _run(argv, tree, home, expect)
            load_before = os.getloadavg()
            for _ in range(args.repeat):         # interleaved, so that machine load falls on both trees alike
                for cmd, (argv, expect) in commands.items():
                    for name, tree in trees.items():
                        times[cmd][name].append(_run(argv, tree, home, expect))
            load_after = os.getloadavg()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
            shutil.rmtree(base_tree, ignore_errors=True)
    rows = []
    for cmd in commands:
        row = {"command": cmd}
        for i, unit in ((0, "s"), (1, "cpu_s")):
            b = [t[i] for t in times[cmd]["baseline"]]
            o = [t[i] for t in times[cmd]["this tree"]]
            row.update({f"baseline_median_{unit}": round(statistics.median(b), 3), f"baseline_min_{unit}": round(min(b), 3),
                        f"median_{unit}": round(statistics.median(o), 3), f"min_{unit}": round(min(o), 3),
                        f"speedup_{unit}": round(statistics.median(b) / statistics.median(o), 2)})
        rows.append(row)
    doc = {"baseline": args.baseline, "repeat": args.repeat, "python": sys.version.split()[0],
           "cpus": os.cpu_count(), "load_average_1min": [round(load_before[0], 2), round(load_after[0], 2)],
           "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"fresh-process start-up, {args.repeat} runs each (baseline {args.baseline}); seconds, wall and CPU; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after, {os.cpu_count()} CPUs:")
    print(f"{'command':<18} {'':>5} {'baseline med':>12} {'min':>7} {'this tree med':>14} {'min':>7} {'speed-up':>9}")
    for r in rows:
        for unit, label in (("s", "wall"), ("cpu_s", "CPU")):
            print(f"{r['command'] if unit == 's' else '':<18} {label:>5} {r[f'baseline_median_{unit}']:>12.3f} "
                  f"{r[f'baseline_min_{unit}']:>7.3f} {r[f'median_{unit}']:>14.3f} {r[f'min_{unit}']:>7.3f} "
                  f"{r[f'speedup_{unit}']:>8.2f}×")


if __name__ == "__main__":
    main()
