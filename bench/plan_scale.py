"""`make_plan` at scale (issue 27, "planning in columns"): wall time and peak memory per size, for
this tree and for an older commit's, on the same synthetic people and the same plan key.

    python bench/plan_scale.py                       # 10k, 100k, 1M people: baseline (92a5528) and this tree
    python bench/plan_scale.py --big                 # and 10M (this tree only: the baseline needs ~33 GB)
    python bench/plan_scale.py --sizes 10000 --json  # one JSON document instead of the table
    python bench/plan_scale.py --no-baseline         # this tree only

People: `person<n>@org.example`, 1–5 records each (mean 3), each record's text one of 50 000 short
sentences and a number that makes it unique (about 5 % of a person's records repeat their previous
text verbatim), record ids 32 hex digits, rows in a random order. Each size's snapshot is written once to Parquet and every measurement reads it in a
fresh interpreter with PYTHONPATH at the tree being measured. The plan key is fixed (32 bytes
written to the private area before planning), so the two trees must produce the same plan sha256:
the bench checks it (`same_plan`).

Per size and tree:
  wall_s / cpu_s       make_plan (policies/demo.yaml with 20 steps, 2 attacker samples per user;
                       evaluation 0.1, holdout 0.25: every per-person split runs)
  peak_mb              the process's peak RSS during make_plan (VmHWM, reset after the snapshot is read)
  growth_mb            peak_mb − the RSS before make_plan (the snapshot table itself excluded)
  kb_per_person        growth_mb / people — the issue's "KB per person" (target ≤ 0.5 at 10M)
`measure(people, tree)` runs one size in one tree and returns that dict (bench/scale.py calls it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE_COMMIT = "92a5528"
SIZES = (10_000, 100_000, 1_000_000)
BIG = 10_000_000
KEY = bytes(range(32))                 # a fixed plan key: both trees draw the same people
WHEN = "2026-01-01T00:00:00+00:00"
_CACHE = Path(tempfile.gettempdir()) / "veil-plan-scale-v2"


# --- synthetic people ---------------------------------------------------------------------------
def make_records(people: int, seed: int = 0):
    """(record_id, user_id, text) for `people` synthetic people, built with numpy (no per-row Python)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 6, size=people)
    n = int(counts.sum())
    person = np.repeat(np.arange(people, dtype=np.int64), counts)
    first = np.zeros(n, dtype=bool)
    first[np.concatenate(([0], np.cumsum(counts)[:-1]))] = True
    words = np.array("alpha beta gamma delta budget review launch invoice meeting roadmap deploy fix "
                     "quarterly report draft notes lunch thanks".split())
    vocab_rng = np.random.default_rng(seed + 1)
    vocab = pa.array([" ".join(vocab_rng.choice(words, size=int(vocab_rng.integers(3, 12))))
                      + f" #{i}" for i in range(50_000)], pa.string())
    idx = rng.integers(0, len(vocab), size=n)
    num = np.arange(n)
    repeat = (~first) & (rng.random(n) < 0.05)
    idx[repeat] = idx[np.flatnonzero(repeat) - 1]          # a person's previous text, verbatim
    num[repeat] = num[np.flatnonzero(repeat) - 1]
    # every other text unique, as real messages are (a number after one of the 50 000 sentences)
    text = pc.binary_join_element_wise(vocab.take(pa.array(idx)), pa.array(num).cast(pa.string()), " ")
    digits = np.char.zfill(np.arange(people).astype("U9"), 9).astype("S9")
    uid = pa.array(np.char.add(np.char.add(b"person", digits), b"@org.example")).cast(pa.string())
    user = uid.take(pa.array(person))
    hexd = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")
    raw = np.frombuffer(rng.bytes(16 * n), dtype=np.uint8).reshape(n, 16)
    rid = pa.array(np.ascontiguousarray(hexd[raw]).view("S32").ravel()).cast(pa.string())
    order = pa.array(rng.permutation(n))
    return pa.table({"record_id": rid, "user_id": user, "text": text}).take(order)


def snapshot_file(people: int) -> Path:
    """The size's snapshot as Parquet (made once, reused by every tree and run)."""
    import pyarrow.parquet as pq

    path = _CACHE / f"people-{people}.parquet"
    if not path.is_file():
        _CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        pq.write_table(make_records(people), tmp, compression="zstd")
        tmp.replace(path)
    return path


def policy_file() -> Path:
    """policies/demo.yaml with 20 steps and 2 attacker samples (people with ≥ 3 texts are audited)."""
    text = (ROOT / "policies" / "demo.yaml").read_text()
    text = re.sub(r"    steps: \d+", "    steps: 20", text)
    text = re.sub(r"attacker_samples_per_user: \d+", "attacker_samples_per_user: 2", text)
    path = _CACHE / "policy.yaml"
    _CACHE.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


# --- one measurement (runs in a fresh interpreter) ------------------------------------------------
def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _worker(people: int, snapshot: str, policy: str) -> dict:
    import hashlib
    import resource

    import pyarrow.parquet as pq

    from components.planning import make_plan
    from components.policy import load_policy

    class Snap:
        pass

    snap = Snap()
    snap.records = pq.read_table(snapshot)
    snap.sha256 = hashlib.sha256(Path(snapshot).read_bytes()).hexdigest()
    snap.snapshot_id = f"snap-{snap.sha256[:16]}"
    snap.secret_spans = None
    pol = load_policy(policy)
    with tempfile.TemporaryDirectory() as private:
        (Path(private) / "keys").mkdir(mode=0o700)
        (Path(private) / "keys" / "plan.key").write_bytes(KEY)
        try:                                             # reset VmHWM: the peak from here on
            Path("/proc/self/clear_refs").write_text("5")
            reset = True
        except OSError:
            reset = False
        before = _status_mb("VmRSS")
        t0, c0 = time.perf_counter(), time.process_time()
        plan = make_plan(pol, snap, private_dir=private, created_at=WHEN)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = _status_mb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    growth = max(0.0, peak - before)
    return {"people": people, "records": snap.records.num_rows, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_mb": round(peak, 1), "before_mb": round(before, 1), "growth_mb": round(growth, 1),
            "kb_per_person": round(growth * 1024.0 / people, 3), "plan_sha256": plan.sha256}


def measure(people: int, tree: Path | None = None, *, timeout: float | None = None) -> dict:
    """Plan `people` synthetic people with the code in `tree` (default: this checkout), in a fresh
    interpreter; returns wall_s, cpu_s, peak_mb, growth_mb, kb_per_person, plan_sha256, load (1-min)."""
    tree = Path(tree) if tree is not None else ROOT
    snap, pol = snapshot_file(people), policy_file()
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(people), str(snap), str(pol)],
                          cwd=str(tree), env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"plan of {people} people in {tree} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update({"tree": str(tree), "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)})
    return out


# --- the baseline tree --------------------------------------------------------------------------
def baseline_tree(commit: str, where: Path) -> Path:
    """A detached `git worktree` of `commit` under `where` (removed by `drop_tree`)."""
    path = where / f"veil-{commit}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), commit],
                   check=True, capture_output=True)
    return path


def drop_tree(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def _table(rows: list[dict]) -> str:
    head = ("people", "records", "tree", "wall s", "cpu s", "peak MB", "growth MB", "KB/person", "× time", "× KB",
            "load")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    base = {r["people"]: r for r in rows if r["which"] == "baseline"}
    for r in rows:
        b = base.get(r["people"]) if r["which"] != "baseline" else None
        lines.append(" | ".join([
            f"{r['people']:,}", f"{r['records']:,}", r["which"], f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}",
            f"{r['peak_mb']:.0f}", f"{r['growth_mb']:.0f}", f"{r['kb_per_person']:.3f}",
            f"{b['wall_s'] / r['wall_s']:.1f}" if b else "", f"{b['kb_per_person'] / max(r['kb_per_person'], 1e-9):.1f}" if b else "",
            f"{r['load_before']:.1f}"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", nargs=3, metavar=("PEOPLE", "SNAPSHOT", "POLICY"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--big", action="store_true", help="also 10M people (this tree only)")
    ap.add_argument("--baseline", default=BASELINE_COMMIT, help="commit to compare with (default %(default)s)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--baseline-max", type=int, default=1_000_000, help="largest size run on the baseline")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(_worker(int(a.worker[0]), a.worker[1], a.worker[2])))
        return 0
    sizes = sorted(set(a.sizes) | ({BIG} if a.big else set()))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        old = None if a.no_baseline else baseline_tree(a.baseline, Path(tmp))
        try:
            for n in sizes:
                if old is not None and n <= a.baseline_max:
                    rows.append({**measure(n, old), "which": "baseline"})
                    print(f"# {n:,} baseline: {rows[-1]['wall_s']} s", file=sys.stderr)
                rows.append({**measure(n), "which": "this"})
                print(f"# {n:,} this: {rows[-1]['wall_s']} s", file=sys.stderr)
        finally:
            if old is not None:
                drop_tree(old)
    same = {}
    for n in sizes:
        shas = {r["plan_sha256"] for r in rows if r["people"] == n}
        if len([r for r in rows if r["people"] == n]) > 1:
            same[n] = len(shas) == 1
    if a.json:
        print(json.dumps({"baseline": None if a.no_baseline else a.baseline, "rows": rows, "same_plan": same,
                          "cpus": os.cpu_count()}, indent=2))
    else:
        print(_table(rows))
        for n, ok in same.items():
            print(f"{n:,} people: {'same plan sha256 in both trees' if ok else 'PLANS DIFFER'}")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
