"""Golden bytes: a fixed small input gives the same snapshot (id, records and spans files), the same
record ids and the same quarantine as the ingest of main at 92a5528 did. A speed-up of the ingest
(catalog/ingest.py) must not change what it writes; an intended change of the snapshot's content
updates these values on purpose, in its own commit."""
from __future__ import annotations

import hashlib
import json

import duckdb
import pyarrow.parquet as pq

from catalog.ingest import ingest_source

RULES = [
    {"secret_class": "codename", "kind": "literal", "patterns": ["BLUEHERON", "KESTREL"], "case_sensitive": True},
    {"secret_class": "codename", "kind": "path_glob", "patterns": ["teams/kestrel/**"], "case_sensitive": True},
    {"secret_class": "credential", "kind": "detector", "patterns": ["credentials"], "case_sensitive": True},
    {"secret_class": "email", "kind": "detector", "patterns": ["email"], "case_sensitive": False},
    {"secret_class": "phone", "kind": "detector", "patterns": ["phone"], "case_sensitive": True},
    {"secret_class": "credential", "kind": "regex", "patterns": ["acme_live_[0-9a-f]{24}"], "case_sensitive": True},
]
WORDS = "the deploy review budget meeting café naïve 東京 report ticket release branch cache".split()


def lines(seed: int, n: int) -> list[str]:
    """Deterministic JSONL lines: most valid, with duplicates, secrets, odd users, timestamps and
    recipients, and a few bad lines of each quarantine kind."""
    out = []
    x = seed
    for i in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        r = x >> 40
        u = f"user{r % 23}@acme.example"
        if r % 7 == 0:
            u = u.upper()                                    # the identity rule folds it (account kept)
        if r % 31 == 0:
            u = f"User {r % 23} <user{r % 23}@acme.example>"  # display name + address
        text = " ".join(WORDS[(r >> k) % len(WORDS)] for k in range(0, 24, 3))
        k = r % 11
        if k == 0:
            text += " BLUEHERON"
        elif k == 1:
            text += f" AKIA{'ABCDEFGHIJKLMNOP'[r % 5:]}{'Q' * (r % 5)}"
        elif k == 2:
            text += f" mail Ann.{r % 5}@Example.COM"
        elif k == 3:
            text += f" call +1-415-555-{r % 10000:04d}"
        elif k == 4:
            text += f" acme_live_{r:024x}"[:35]
        rec = {"user": u, "text": text}
        t = r % 5
        rec["ts"] = (str(1767225600 + i) if t == 0 else f"2026-01-{1 + i % 28:02d}T10:{i % 60:02d}:00Z" if t == 1
                     else f"Mon, 05 Jan 2026 10:{i % 60:02d}:00 +0100" if t == 2 else None)
        if rec["ts"] is None:
            del rec["ts"]
        if r % 3 == 0:
            rec["team"] = ["kestrel", "heron", "ops"][r % 3 // 1 % 3]
        if r % 13 == 0:
            rec["path"] = f"teams/{['kestrel', 'ops'][r % 2]}/notes.md"
        if r % 17 == 0:
            rec["to"] = [f"user{(r + j) % 23}@acme.example" for j in range(1 + r % 3)]
        out.append(json.dumps(rec, ensure_ascii=r % 2 == 0))
        if i % 9 == 4:
            out.append(out[-1])                              # a duplicate line
        if i % 40 == 8:                                      # the same text to other recipients
            rec = dict(rec, to=[f"user{(r + 5) % 23}@acme.example"])
            out.append(json.dumps(rec))
    bad = ['{"user": "carl@x.example", "text": "unterminated', json.dumps({"text": "no user"}),
           json.dumps({"user": "dan@x.example", "text": "  "}), json.dumps({"user": "eve@x.example", "text": "t",
                                                                           "ts": "yesterday"}),
           json.dumps({"user": 42, "text": "a number"}), json.dumps(["array"]), "",
           json.dumps({"user": "victim@corp.example <eve@evil.example>", "text": "who wrote this"})]
    for j, b in enumerate(bad):
        out.insert(7 + 13 * j, b)
    return out


def write(path, ls):
    path.write_text("".join(line + "\n" for line in ls), encoding="utf-8")
    return path


def _ingest(settings, src):
    return ingest_source(src, "jsonl", settings=settings, time_field="ts", metadata_fields=("team", "to"),
                         rules=RULES)


def _digest(settings, rep) -> dict:
    snap = settings.snapshots_dir / rep.snapshot_id
    ids = pq.read_table(snap / "records.parquet", columns=["record_id"]).column(0).to_pylist()
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    try:
        quarantine = con.sql("SELECT position, byte_offset, reason, raw FROM quarantine "
                             "ORDER BY line, position").fetchall()
    finally:
        con.close()
    return {"snapshot_id": rep.snapshot_id,
            "content_sha256": json.loads((snap / "manifest.json").read_text())["content_sha256"],
            "record_ids_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(),
            "quarantine_sha256": hashlib.sha256(repr(quarantine).encode()).hexdigest(),
            "counts": [rep.read, rep.accepted, rep.quarantined, rep.duplicates, rep.users, rep.new,
                       rep.tagged_records, rep.new_spans, rep.recipients_merged]}


# Computed by main at 92a5528 (before the ingest speed-ups of issue 27).
GOLDEN_FIRST = {
    "snapshot_id": "snap-25689d683fafc159",
    "content_sha256": "25689d683fafc1597a87e920b2f3fd6a6d25ff06133f7dfae777da8a8ba23e59",
    "record_ids_sha256": "a8c808576d464c5cd0ed1da2f5641c1123de4940c04fde96bd80496abb574e91",
    "quarantine_sha256": "6d7d33f8395ccc7fafafa3180944e901df0b1179059c172982f525f58193dfc9",
    "counts": [1712, 1500, 7, 205, 23, 1500, 699, 823, 38]}
GOLDEN_SECOND = {
    "snapshot_id": "snap-70e0e9ff19e4de6e",
    "content_sha256": "70e0e9ff19e4de6e5c08355b59ef554907042685d7a045ed0546b57917b313ee",
    "record_ids_sha256": "fd8e0fafdfe4950733d7f01966f236a23f5a2e5c47121e8bbdb7ea0e96d9fa8f",
    "quarantine_sha256": "3a9b310b6d6cb32a069738654c413a63dedecef01b667c694185e5ba0e1e58dd",
    "counts": [1378, 1200, 14, 164, 23, 900, 557, 523, 23]}


def test_golden_snapshot_of_two_ingests(settings, tmp_path):
    first = _digest(settings, _ingest(settings, write(tmp_path / "a.jsonl", lines(1, 1500))))
    # a second source: new records, copies of the first's (dropped against the catalog), its own bad lines
    second = _digest(settings, _ingest(settings, write(tmp_path / "b.jsonl", lines(1, 300) + lines(2, 900))))
    assert first == GOLDEN_FIRST
    assert second == GOLDEN_SECOND


def test_sharded_ingest_writes_the_same_snapshot(settings, tmp_path, monkeypatch):
    """Cut into many small parts (2 workers), the first source gives the golden snapshot: ids, record
    ids, quarantine (positions and byte offsets) and counts; the second, sharded too (the dedup
    against the catalog, the parent's records), gives the second golden snapshot."""
    from catalog import shards

    monkeypatch.setattr(shards, "MIN_PART_BYTES", 1 << 15)   # parts of 32 KB: 12 of the first file
    a = write(tmp_path / "a.jsonl", lines(1, 1500))
    assert len(shards.cut(a, 12)) == 12
    first = _digest(settings, ingest_source(a, "jsonl", settings=settings, time_field="ts",
                                            metadata_fields=("team", "to"), rules=RULES, shards=2))
    b = write(tmp_path / "b.jsonl", lines(1, 300) + lines(2, 900))
    second = _digest(settings, ingest_source(b, "jsonl", settings=settings, time_field="ts",
                                             metadata_fields=("team", "to"), rules=RULES, shards=2))
    assert first == GOLDEN_FIRST
    assert second == GOLDEN_SECOND
    assert not list((settings.cache_dir / "ingest-tmp").glob("*.arrow"))   # parts removed


def _dying_work(path, start, end, first, *args):
    """A shard worker that is killed (SIGKILL: no cleanup, no exception) half-way through writing
    every part but the first. Module level: the spawned worker imports it by name."""
    import os
    import signal

    from catalog import ingest, shards

    if start > 0:
        shards.partial(args[-2]).write_bytes(b"ARROW1\0\0half a part")
        os.kill(os.getpid(), signal.SIGKILL)
    return ingest._shard_work(path, start, end, first, *args)


def test_killed_shard_worker_leaves_no_catalog_change(settings, tmp_path, monkeypatch):
    """A worker killed mid-part: the ingest fails with one line, no snapshot, no ingest row, no part
    or partial file is left, and the next ingest of the same file gives the golden snapshot."""
    import pytest

    from catalog import ingest, shards
    from components.core.errors import VeilError

    monkeypatch.setattr(shards, "MIN_PART_BYTES", 1 << 15)
    monkeypatch.setattr(ingest, "_shard_work", _dying_work)
    a = write(tmp_path / "a.jsonl", lines(1, 1500))
    with pytest.raises(VeilError, match="worker process died while working on bytes"):
        _ingest_sharded(settings, a)
    # (COMMITTED, the writers' record of committed snapshots, is the catalog's: no snapshot in it)
    left = sorted(p.name for p in settings.snapshots_dir.iterdir() if p.name != "COMMITTED") \
        if settings.snapshots_dir.exists() else []
    assert not left, left   # no snapshot folder, no .tmp- folder, no LATEST
    assert not list((settings.cache_dir / "ingest-tmp").glob("*.arrow"))
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    try:
        assert con.sql("SELECT count(*) FROM ingests").fetchall()[0][0] == 0
    finally:
        con.close()
    monkeypatch.undo()
    assert _digest(settings, _ingest(settings, a)) == GOLDEN_FIRST


def _ingest_sharded(settings, src):
    return ingest_source(src, "jsonl", settings=settings, time_field="ts", metadata_fields=("team", "to"),
                         rules=RULES, shards=2)


def test_cut_ranges_start_at_lines_and_cover_the_file(tmp_path):
    from catalog.shards import cut

    p = tmp_path / "x.jsonl"
    data = b"".join(b'{"user":"u","text":"' + b"x" * (i % 50) + b'"}\n' for i in range(500)) + b'{"no newline":1}'
    p.write_bytes(data)
    for n in (1, 2, 7, 64, 10_000):
        r = cut(p, n)
        assert r[0][0] == 0 and r[-1][1] == len(data)
        assert all(a < b for a, b in r) and all(r[i][1] == r[i + 1][0] for i in range(len(r) - 1))
        assert all(data[a - 1:a] == b"\n" for a, _ in r[1:])


def test_shards_refused_for_gzip_and_other_formats(settings, tmp_path):
    import gzip

    import pytest

    from components.core.errors import VeilError

    g = tmp_path / "a.jsonl.gz"
    g.write_bytes(gzip.compress(b'{"user":"u","text":"t"}\n'))
    with pytest.raises(VeilError, match="uncompressed JSONL"):
        ingest_source(g, "jsonl", settings=settings, shards=2)
    c = tmp_path / "a.csv"
    c.write_text("user,text\nu,t\n")
    with pytest.raises(VeilError, match="only a JSONL file"):
        ingest_source(c, "csv", settings=settings, shards=2)
    with pytest.raises(VeilError, match="--shards"):
        ingest_source(c, "csv", settings=settings, shards=0)
