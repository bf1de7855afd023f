"""JSONL ingest speed: ours (validate, hash, dedup, tag, DuckDB merge, Parquet snapshot) next to a plain
`pyarrow.json.read_json` of the same file, in one process run.

Memory: for ours, the peak RSS above the RSS before it started (sampled every 10 ms; ours runs first,
so freed memory of the baseline cannot hide its own), and the peak of its anonymous part (the heap:
RSS also counts file-backed pages — mapped libraries, the memory-mapped stage file — which the kernel
can drop); for pyarrow, the size of the table it builds.

    python bench/ingest.py                 # 1M records of ~300 chars (target: ≥ 150k records/s on 2 cores)
    python bench/ingest.py --records 200000 --json
    python bench/ingest.py --baseline /tmp/main-tree --pairs 3   # another build (a checkout) side by side
    python bench/ingest.py --baseline-commit 92a5528 --shards 2 --big --json   # a commit (temporary worktree),
                                           # ours sharded too, and 10M records (peak RSS: flat?)
    python bench/ingest.py --real          # also real text: this machine's Debian changelogs
    python bench/ingest.py --shards 2 --pairs 3   # 1 process and 2 shard workers, interleaved: the speed-up
    python bench/ingest.py --scales 3 10   # also 3M and 10M records, one run each: peak RSS flat or not

`--real` adds real multi-person text (every installed package's changelog.Debian.gz, maintainers as
people): ingested by the debian-changelog connector, and the same entries as JSONL through the JSONL
path (next to pyarrow.json on that file). A corpus of tens of thousands of entries is small: its
records/s mostly measures the fixed cost of an ingest (opening the catalog, cutting a snapshot,
looking for likely duplicate people), which the table shows as an ingest of a one-record file.

With `--baseline` (or `--baseline-commit REV`, checked out in a temporary `git worktree`), each build
ingests the same file in its own fresh process, alternately (baseline, ours, baseline, ours, …), so both
see the same machine load, after one `pyarrow.json.read_json` of the file in a fresh process (the parse
alone, next to which the CPU seconds per 1M records read); `--shards N` adds ours with N worker
processes (their CPU counted), `--big` one run per build on 10× the records (memory flat or not); each row gives wall and CPU seconds, peak
RSS (and anonymous RSS) above the process's before the ingest, the 1-minute load average before and after, and the
CPU seconds per thread (parse / validate / main / writer / pools). The machine is shared: compare CPU
seconds, and wall seconds only between runs under the same load.

The file is generated deterministically (seeded): heavy-tailed users, ~300-character texts, a few
percent of records carrying secrets the demo policy's rules tag (codenames, AWS-style keys, `*_live_*`
tokens, addresses, phones), 0.5 % within-user duplicates and a few lines without a user (quarantined). Every line is valid
JSON so that pyarrow's reader, which stops at the first malformed line, can read the same file.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("the deploy review budget meeting schedule report customer ticket release branch cache latency "
         "invoice quarter forecast onboarding vendor contract laptop access dashboard metrics outage patch "
         "rollout migration database backup policy travel expense approval hiring roadmap design sprint "
         "feedback incident escalation firewall network storage cluster pipeline model training").split()
CODENAMES = ["BLUEHERON", "NIGHTJAR", "KESTREL", "OSPREY", "SANDPIPER", "CORMORANT",
             "WAXWING", "GOSHAWK", "PETREL", "LAPWING", "SHRIKE", "TANAGER"]
RULES = [
    {"secret_class": "codename", "kind": "literal", "patterns": CODENAMES, "case_sensitive": True},
    {"secret_class": "codename", "kind": "path_glob", "patterns": [f"teams/{c.lower()}/**" for c in CODENAMES],
     "case_sensitive": True},
    {"secret_class": "credential", "kind": "detector", "patterns": ["credentials"], "case_sensitive": True},
    {"secret_class": "credential", "kind": "regex", "patterns": ["AKIA[0-9A-Z]{16}", "acme_live_[0-9a-f]{24}"],
     "case_sensitive": True},
    {"secret_class": "email", "kind": "detector", "patterns": ["email"], "case_sensitive": False},
    {"secret_class": "phone", "kind": "detector", "patterns": ["phone"], "case_sensitive": True},
    {"secret_class": "phone", "kind": "regex", "patterns": [r"\+1-555-\d{3}-\d{4}"], "case_sensitive": True},
]


def generate(path: Path, n: int, seed: int = 0, chars: int = 300) -> dict:
    rng = np.random.default_rng(seed)
    n_users = max(10, n // 200)
    # Heavy tail: Zipf-like user weights.
    w = 1.0 / np.arange(1, n_users + 1) ** 1.1
    users = rng.choice(n_users, size=n, p=w / w.sum())
    words = np.array(WORDS)
    secret_at = rng.random(n) < 0.04
    dup_at = rng.random(n) < 0.005
    bad_at = rng.random(n) < 0.0001
    t0 = 1_767_225_600
    prev: dict[int, str] = {}
    with open(path, "w") as f:
        wi = rng.integers(0, len(words), size=(n, chars // 5))
        for i in range(n):
            u = int(users[i])
            if bad_at[i]:  # valid JSON (pyarrow must read the same file) but no user: quarantined
                f.write(json.dumps({"text": "orphan line", "ts": t0 + i}) + "\n")
                continue
            if dup_at[i] and u in prev:
                text = prev[u]
            else:
                text = " ".join(words[wi[i]].tolist())[:chars]
                if secret_at[i]:
                    k = i % 4
                    s = (CODENAMES[i % 12] if k == 0 else
                         "AKIA" + "".join(rng.choice(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"), 16)) if k == 1 else
                         f"user{u}@acme-corp.example" if k == 2 else f"+1-555-01{i % 10}-{i % 10000:04d}")
                    cut = chars // 2
                    text = text[:cut] + " " + s + " " + text[cut:chars - len(s) - 2]
                prev[u] = text
            f.write(json.dumps({"user": f"user{u}@acme-corp.example", "text": text,
                                "ts": t0 + i, "source": "chat", "team": CODENAMES[u % 12].lower()},
                               separators=(",", ":")) + "\n")
    return {"records": n, "users": n_users, "bytes": path.stat().st_size}


def scale_up(src: Path, dst: Path, times: int) -> int:
    """`times` copies of a generated file, each copy's texts prefixed with its number ("3 the deploy
    …"): distinct records (the same users, duplicates and secrets in each copy), written at the speed
    of a bytes replace rather than of the per-record generator (10M records: seconds, not half an
    hour on a loaded machine). Returns the records written."""
    data = src.read_bytes()
    with open(dst, "wb") as f:
        for k in range(times):
            f.write(data if k == 0 else data.replace(b'"text":"', b'"text":"%d ' % k))
    return times * data.count(b"\n")


def _rss_mib(field: str = "VmRSS") -> float:
    """Resident memory in MiB: all of it (VmRSS), or its anonymous part (RssAnon: the heap, not the
    file-backed pages of mapped libraries and of the memory-mapped stage file, which the kernel can
    drop and re-read)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _measure(kind: str, path: Path, home: Path, shards: int = 1) -> dict:
    """Run one contender in this process: wall and CPU seconds, and its peak RSS above the starting
    RSS (sampled every 10 ms; Linux /proc)."""
    import gc
    import resource
    import threading

    gc.collect()
    start_rss, start_anon, peak, stop = _rss_mib(), _rss_mib("RssAnon"), [0.0, 0.0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_mib())
            peak[1] = max(peak[1], _rss_mib("RssAnon"))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, name="bench-rss", daemon=True)
    ru0, rc0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    sampler.start()
    try:
        if kind == "pyarrow":
            import pyarrow.json as pj

            table = pj.read_json(path)
            out = {"rows": table.num_rows, "table_mib": table.nbytes / 2**20}
            del table
        else:
            import catalog.ingest as ci
            from catalog.ingest import ingest_source
            from components.core.settings import load_settings

            # as `veil ingest` does (a build before it has neither: nothing)
            getattr(ci, "tune_process", getattr(ci, "tune_malloc", lambda: None))()
            extra = {"shards": shards} if shards > 1 else {}  # (a build before --shards has no such argument)
            rep = ingest_source(path, "jsonl", settings=load_settings(home).ensure(), time_field="ts",
                                metadata_fields=("team",), rules=RULES, **extra)
            out = rep.to_dict()
            out["rows"] = rep.read
    finally:
        wall = time.perf_counter() - t
        stop.set()
        sampler.join()
    ru1, rc1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    # a sharded ingest's worker processes (reaped by its end: their CPU is in RUSAGE_CHILDREN)
    child_cpu = (rc1.ru_utime + rc1.ru_stime) - (rc0.ru_utime + rc0.ru_stime)
    out.update({"wall": wall, "cpu": cpu + child_cpu, "workers_cpu": child_cpu,
                "workers_max_rss_mib": rc1.ru_maxrss / 1024 if child_cpu else 0.0,
                "max_rss_mib": max(peak[0], _rss_mib()) - start_rss,
                "max_anon_mib": max(peak[1], _rss_mib("RssAnon")) - start_anon})
    return out


def _real(work: Path, doc: Path) -> dict:
    """The real-text rows: Debian changelogs by their connector, the same entries as JSONL, and the
    fixed cost of an ingest (a one-record file)."""
    import pyarrow.json as pj

    from catalog.connectors.debian import DebianChangelogSource

    entries = work / "debian.jsonl"
    people = set()
    n = 0
    with open(entries, "w") as f:
        for b in DebianChangelogSource(doc).batches():
            for r in b.select(["user", "text", "ts", "error"]).to_pylist():
                if r["error"] is None and r["user"] and r["text"]:
                    f.write(json.dumps({"user": r["user"], "text": r["text"], "ts": r["ts"]}) + "\n")
                    people.add(r["user"])
                    n += 1
    one = work / "one.jsonl"
    one.write_text(json.dumps({"user": "a@x.example", "text": "one record"}) + "\n")
    out = {"entries": n, "maintainers": len(people), "mib": round(entries.stat().st_size / 2**20, 1)}
    for name, path, fmt in (("debian_changelog", doc, "debian-changelog"), ("jsonl", entries, "jsonl"),
                            ("one_record", one, "jsonl")):
        home = work / f"home-{name}"
        shutil.rmtree(home, ignore_errors=True)
        out[name] = _measure_fmt(path, home, fmt)
    t, c = time.perf_counter(), time.process_time()
    rows = pj.read_json(entries).num_rows
    out["pyarrow_read_json"] = {"seconds": time.perf_counter() - t, "cpu": time.process_time() - c, "rows": rows}
    return out


def _measure_fmt(path: Path, home: Path, fmt: str) -> dict:
    import resource

    from catalog.ingest import ingest_source
    from components.core.settings import load_settings

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    rep = ingest_source(path, fmt, settings=load_settings(home).ensure(), time_field="ts" if fmt == "jsonl" else None)
    wall = time.perf_counter() - t
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {"seconds": wall, "cpu": cpu, "read": rep.read, "accepted": rep.accepted, "duplicates": rep.duplicates,
            "quarantined": rep.quarantined, "records_per_second": rep.read / wall if wall else None}


def _thread_cpu() -> dict[int, float]:
    """CPU seconds so far of each thread of this process (Linux /proc)."""
    tck = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tck
        except (OSError, IndexError, ValueError):
            pass
    return out


def _child_pyarrow(path: Path) -> dict:
    """pyarrow.json.read_json of the file in this (fresh) process: the parse alone, its thread pool on."""
    import pyarrow.json  # noqa: F401

    load0 = os.getloadavg()[0]
    res = _measure("pyarrow", path, Path("."))
    return {"seconds": res["wall"], "cpu_seconds": res["cpu"], "records_per_second": res["rows"] / res["wall"],
            "records": res["rows"], "cpu_seconds_per_1m": res["cpu"] / res["rows"] * 1e6,
            "max_rss_mib": res["max_rss_mib"], "load_before": load0, "load_after": os.getloadavg()[0]}


def _child(path: Path, home: Path, shards: int = 1) -> dict:
    """One ingest in this (fresh) process, with CPU seconds per thread: threads are named by sampling
    `threading.enumerate()` while it runs; pools (DuckDB, Arrow) have no Python name."""
    import threading

    import pyarrow.compute as pc
    import pyarrow.json  # noqa: F401

    import catalog.ingest  # noqa: F401

    pc.match_substring_regex(pa.array(["x"]), "x")
    names: dict[int, str] = {}
    last: dict[int, float] = {}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            for t in threading.enumerate():
                if t.native_id:
                    names.setdefault(t.native_id, t.name)
            last.update(_thread_cpu())
            stop.wait(0.05)

    before = _thread_cpu()
    w = threading.Thread(target=watch, name="bench-watch", daemon=True)
    w.start()
    load0 = os.getloadavg()[0]
    try:
        res = _measure("veil", path, home, shards=shards)
    finally:
        stop.set()
        w.join()
    last.update(_thread_cpu())
    per: dict[str, float] = {}
    for tid, c in last.items():
        name = names.get(tid, "pools")
        if name.startswith("bench-"):  # the bench's own samplers
            continue
        name = {"veil-ingest-reader": "validate", "veil-ingest-parse": "parse", "MainThread": "main",
                "veil-snapshot-writer": "writer"}.get(name, name)
        per[name] = per.get(name, 0.0) + c - before.get(tid, 0.0)
    if res["workers_cpu"]:
        per["shard workers"] = res["workers_cpu"]
    return {"seconds": res["wall"], "cpu_seconds": res["cpu"], "max_rss_mib": res["max_rss_mib"],
            "max_anon_mib": res["max_anon_mib"], "workers_max_rss_mib": res["workers_max_rss_mib"],
            "records": res["read"], "cpu_seconds_per_1m": res["cpu"] / res["read"] * 1e6,
            "records_per_second": res["read"] / res["wall"], "snapshot_id": res["snapshot_id"],
            "load_before": load0, "load_after": os.getloadavg()[0],
            "thread_cpu": {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}}


def _run_child(args: list[str], tree: Path) -> dict:
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env, cwd=str(tree),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench child {args[0]} ({tree}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _compare(src: Path, work: Path, baseline: Path | None, pairs: int, shards: int = 1, parse: bool = True) -> list[dict]:
    ours_tree = Path(__file__).resolve().parents[1]
    builds = ([("baseline", baseline, 1)] if baseline is not None else []) + [("ours", ours_tree, 1)] + \
        ([(f"ours --shards {shards}", ours_tree, shards)] if shards > 1 else [])
    runs = [{"build": "pyarrow.json.read_json", "pair": 0, **_run_child(["--child-pyarrow", str(src)], ours_tree)}
            ] if parse else []
    for i in range(pairs):
        for who, tree, n in builds:
            home = work / f"home-{who.replace(' ', '')}"
            shutil.rmtree(home, ignore_errors=True)
            runs.append({"build": who, "pair": i + 1,
                         **_run_child(["--child", str(src), str(home), str(tree), str(n)], tree)})
            shutil.rmtree(home, ignore_errors=True)
    return runs


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, path, home, tree, shards = sys.argv
        sys.path.insert(0, tree)  # that build's catalog, not this checkout's
        print(json.dumps(_child(Path(path), Path(home), int(shards))))
        return 0
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child-pyarrow":
        print(json.dumps(_child_pyarrow(Path(sys.argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--chars", type=int, default=300)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--keep", type=Path, default=None, help="keep the generated file and catalog here")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of another build: run both, alternately, in fresh processes")
    ap.add_argument("--pairs", type=int, default=2, help="with --baseline: how many baseline/ours pairs")
    ap.add_argument("--baseline-commit", default=None, metavar="REV",
                    help="a commit of this repository as the baseline (a temporary `git worktree`, removed after)")
    ap.add_argument("--shards", type=int, default=1,
                    help="also run ours with `--shards N` worker processes, interleaved with the one-process "
                         "ingest (fresh processes, `--pairs` of each; a baseline too if given)")
    ap.add_argument("--scales", type=int, nargs="*", default=[],
                    help="also ingest these multiples of the records (e.g. `--scales 3 10`: 3M and 10M beside "
                         "1M; copies of the file, each copy's texts prefixed with its number: distinct records; "
                         "one run per build): peak RSS at each size — memory flat or not")
    ap.add_argument("--big", action="store_true",
                    help="with a baseline: also ingest 10× the records (10 copies of the file, each copy's texts "
                         "prefixed with its number: distinct records; one run per build): does peak memory stay flat?")
    ap.add_argument("--real", action="store_true", help="also ingest real text: this machine's Debian changelogs")
    ap.add_argument("--real-dir", type=Path, default=Path("/usr/share/doc"),
                    help="with --real: the folder holding <package>/changelog.Debian.gz")
    args = ap.parse_args(argv)
    if args.baseline_commit is not None:
        return _with_worktree(args)
    if args.baseline is not None or args.shards > 1 or args.scales or args.big:
        return _main_compare(args)
    if args.real and not (args.real_dir.is_dir() and next(args.real_dir.glob("*/changelog.Debian.gz"), None)):
        print(f"--real-dir: {args.real_dir} holds no <package>/changelog.Debian.gz (a Debian machine's "
              "/usr/share/doc does)", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="veil-bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "bench.jsonl"
    try:
        gen = generate(src, args.records, chars=args.chars)
        home = work / "home"
        shutil.rmtree(home, ignore_errors=True)
        # One process, one after the other; imports warmed first so neither pays them.
        import pyarrow.compute as pc
        import pyarrow.json  # noqa: F401

        import catalog.ingest  # noqa: F401

        pc.match_substring_regex(pa.array(["x"]), "x")
        ours = _measure("veil", src, home)
        pa_res = _measure("pyarrow", src, home)
        ours2 = _measure("veil", src, home)  # re-ingest: idempotent, must cut no new snapshot
        real = _real(work, args.real_dir) if args.real else None
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        result = {
            "file": {"records": gen["records"], "users": gen["users"], "mib": round(gen["bytes"] / 2**20, 1)},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average_1min": round(load, 2) if load is not None else None},
            "pyarrow_read_json": {"seconds": round(pa_res["wall"], 3), "cpu_seconds": round(pa_res["cpu"], 2),
                                  "table_mib": round(pa_res["table_mib"]),
                                  "records_per_second": round(pa_res["rows"] / pa_res["wall"])},
            "veil_ingest": {"seconds": ours["seconds"], "records_per_second": ours["records_per_second"],
                            "cpu_seconds": round(ours["cpu"], 2), "max_rss_mib": round(ours["max_rss_mib"]),
                            "max_anon_mib": round(ours["max_anon_mib"]), "read": ours["read"], "accepted": ours["accepted"], "quarantined": ours["quarantined"],
                            "duplicates": ours["duplicates"], "tagged_records": ours["tagged_records"],
                            "spans": ours["new_spans"], "snapshot_id": ours["snapshot_id"]},
            "veil_reingest": {"seconds": ours2["seconds"], "records_per_second": ours2["records_per_second"],
                              "cpu_seconds": round(ours2["cpu"], 2), "max_rss_mib": round(ours2["max_rss_mib"]),
                              "same_snapshot": ours2["snapshot_id"] == ours["snapshot_id"], "new": ours2["new"]},
            "target_records_per_second": 150_000,
        }
        if real is not None:
            result["real_debian_changelogs"] = real
        result["meets_target"] = (result["veil_ingest"]["records_per_second"] or 0) >= 150_000
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"JSONL ingest, {result['file']['records']:,} records × ~{args.chars} chars "
                    f"({result['file']['mib']} MiB), {result['machine']['cpus']} CPUs")
    for c in ("", "seconds", "records/s", "CPU s", "memory MiB"):
        t.add_column(c, justify="left" if c == "" else "right")
    p = result["pyarrow_read_json"]
    t.add_row("pyarrow.json.read_json", f"{p['seconds']:.2f}", f"{p['records_per_second']:,}",
              f"{p['cpu_seconds']:.1f}", f"{p['table_mib']:,} (table)")
    v = result["veil_ingest"]
    t.add_row("veil ingest", f"{v['seconds']:.2f}", f"{v['records_per_second']:,.0f}", f"{v['cpu_seconds']:.1f}",
              f"{v['max_rss_mib']:,} (peak RSS +; anonymous {v['max_anon_mib']:,})")
    r = result["veil_reingest"]
    t.add_row("veil re-ingest (same file)", f"{r['seconds']:.2f}", f"{r['records_per_second']:,.0f}",
              f"{r['cpu_seconds']:.1f}", f"{r['max_rss_mib']:,} (peak RSS +)")
    Console().print(t)
    if real is not None:
        rt = Table(title=f"Real text: {real['entries']:,} Debian changelog entries by {real['maintainers']} "
                         f"maintainers ({real['mib']} MiB as JSONL), {args.real_dir}")
        for c in ("", "seconds", "records/s", "CPU s", "accepted", "duplicates", "quarantined"):
            rt.add_column(c, justify="left" if c == "" else "right")
        p = real["pyarrow_read_json"]
        rt.add_row("pyarrow.json.read_json (JSONL)", f"{p['seconds']:.2f}", f"{p['rows'] / p['seconds']:,.0f}",
                   f"{p['cpu']:.1f}", "", "", "")
        for key, label in (("debian_changelog", "veil ingest --format debian-changelog"),
                           ("jsonl", "veil ingest, the same entries as JSONL"),
                           ("one_record", "veil ingest of a one-record file (fixed cost)")):
            x = real[key]
            rt.add_row(label, f"{x['seconds']:.2f}", f"{x['records_per_second']:,.0f}", f"{x['cpu']:.1f}",
                       f"{x['accepted']:,}", f"{x['duplicates']:,}", f"{x['quarantined']:,}")
        Console(width=max(Console().width, 120)).print(rt)
    print(f"veil ingest = parse, validate, sha256 ids, within-user dedup, tag ({v['tagged_records']:,} records), "
          f"DuckDB merge, Parquet snapshot; {v['quarantined']} quarantined, {v['duplicates']:,} duplicates. "
          f"Re-ingest: same snapshot={r['same_snapshot']}, new={r['new']}.")
    print(f"target ≥ 150,000 records/s: {'met' if result['meets_target'] else 'NOT met'}"
          f" (1-min load average {result['machine']['load_average_1min']} on {result['machine']['cpus']} CPUs)")
    return 0


def _with_worktree(args) -> int:
    """The baseline build is a commit of this repository, checked out in a temporary worktree."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    tree = Path(tempfile.mkdtemp(prefix="veil-bench-baseline-")) / "tree"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), args.baseline_commit],
                   check=True, capture_output=True)
    try:
        args.baseline = tree
        return _main_compare(args)
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)


def _summary(runs: list[dict], who: str, records: int) -> dict:
    mine = [r for r in runs if r["build"] == who and r["records"] == records]
    if not mine:
        return {}
    return {"cpu_seconds_min": round(min(r["cpu_seconds"] for r in mine), 2),
            "cpu_seconds_per_1m_min": round(min(r["cpu_seconds_per_1m"] for r in mine), 2),
            "records_per_second_max": round(max(r["records_per_second"] for r in mine)),
            "max_rss_mib": round(max(r["max_rss_mib"] for r in mine)),
            "max_anon_mib": round(max(r["max_anon_mib"] for r in mine)),
            # the wall time's lower bound on enough free cores: the busiest pipeline thread's CPU
            "busiest_thread_cpu_seconds_min": round(min(max(v for k, v in r["thread_cpu"].items()
                                                            if k not in ("pools", "shard workers"))
                                                        for r in mine), 2),
            # on two free cores, at best: the CPU seconds spread over both, or the busiest thread
            "records_per_second_2_free_cores_bound": round(records / max(
                min(r["cpu_seconds"] for r in mine) / 2,
                min(max(v for k, v in r["thread_cpu"].items() if k not in ("pools", "shard workers")) for r in mine)))}


def _main_compare(args) -> int:
    work = args.keep or Path(tempfile.mkdtemp(prefix="veil-bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "bench.jsonl"
    try:
        if not src.is_file():
            generate(src, args.records, chars=args.chars)
        baseline = args.baseline.resolve() if args.baseline is not None else None
        runs = _compare(src, work, baseline, args.pairs, args.shards)
        for r in runs:
            r.setdefault("records", args.records)
        sizes = [args.records]
        for times in sorted(set(args.scales + ([10] if args.big else []))):
            if times <= 1:
                continue
            big = work / f"bench-{times}x.jsonl"
            if not big.is_file():
                scale_up(src, big, times)
            # (no pyarrow row: its table of 10× the records would need ~10 GB)
            for r in _compare(big, work, baseline, 1, args.shards, parse=False):
                runs.append({**r, "records": r.get("records", times * args.records), "pair": f"{r['pair']} ({times}×)"})
            big.unlink(missing_ok=True)  # (disk: the 10× file is ~4 GB at 1M records)
            sizes.append(times * args.records)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    whos = list(dict.fromkeys(r["build"] for r in runs if r["build"] != "pyarrow.json.read_json"))
    speedup = _speedup(runs, args.shards, args.records) if args.shards > 1 else None
    result = {"records": args.records, "cpus": os.cpu_count(),
              "baseline": str(args.baseline_commit or args.baseline) if args.baseline is not None else None,
              "runs": runs, "target_records_per_second": 150_000,
              "summary": {f"{who} @ {n:,}": _summary(runs, who, n) for n in sizes for who in whos}}
    if speedup is not None:
        result["shards_speedup"] = speedup
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"JSONL ingest, ~{args.chars} chars a record, {os.cpu_count()} CPUs, "
                    + (f"baseline = {result['baseline']}; " if result["baseline"] else "")
                    + "each row a fresh process, one after the other")
    for c in ("build", "records", "load before→after", "seconds", "records/s", "CPU s", "CPU s / 1M",
              "peak RSS + MiB", "of it anonymous", "CPU s per thread", "snapshot"):
        t.add_column(c)
    for r in runs:
        n = r.get("records", args.records)
        t.add_row(r["build"], f"{n:,}", f"{r['load_before']:.1f}→{r['load_after']:.1f}", f"{r['seconds']:.2f}",
                  f"{r['records_per_second']:,.0f}", f"{r['cpu_seconds']:.2f}", f"{r['cpu_seconds'] / n * 1e6:.2f}",
                  f"{r['max_rss_mib']:.0f}" + (f" (+ workers ≤ {r['workers_max_rss_mib']:.0f} each)"
                                               if r.get("workers_max_rss_mib") else ""),
                  f"{r.get('max_anon_mib', float('nan')):.0f}",
                  " ".join(f"{k} {v}" for k, v in r.get("thread_cpu", {}).items()), r.get("snapshot_id", ""))
    Console(width=220).print(t)
    for key, b in result["summary"].items():
        if b:
            print(f"{key}: least CPU {b['cpu_seconds_min']} s ({b['cpu_seconds_per_1m_min']} per 1M records), busiest "
                  f"thread {b['busiest_thread_cpu_seconds_min']} CPU s; best "
                  f"{b['records_per_second_max']:,} records/s here; peak RSS +{b['max_rss_mib']} MiB (anonymous "
                  f"{b['max_anon_mib']}); on 2 free cores at most {b['records_per_second_2_free_cores_bound']:,} "
                  "records/s (CPU s / 2, or the busiest thread)")
    if speedup:
        print(f"--shards {args.shards} against one process, pair by pair (same minutes): wall × "
              f"{', '.join(f'{x:.2f}' for x in speedup['wall_ratios'])} (one process' wall / sharded wall: above 1 "
              f"is faster), CPU × {', '.join(f'{x:.2f}' for x in speedup['cpu_ratios'])} (sharded CPU / one "
              "process' CPU)")
    return 0


def _speedup(runs: list[dict], shards: int, records: int) -> dict:
    """Per pair at the base size: one process' wall over the sharded run's wall (the speed-up), and
    the sharded run's CPU over one process' (what sharding costs)."""
    one = {r["pair"]: r for r in runs if r["build"] == "ours" and r.get("records") == records}
    many = {r["pair"]: r for r in runs if r["build"] == f"ours --shards {shards}" and r.get("records") == records}
    pairs = [k for k in one if k in many]
    return {"pairs": len(pairs),
            "wall_ratios": [round(one[k]["seconds"] / many[k]["seconds"], 3) for k in pairs],
            "cpu_ratios": [round(many[k]["cpu_seconds"] / one[k]["cpu_seconds"], 3) for k in pairs]}


if __name__ == "__main__":
    raise SystemExit(main())
