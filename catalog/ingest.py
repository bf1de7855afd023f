"""Ingest one source into the catalog and cut a snapshot.

    report = ingest_source(Path("org/messages.jsonl"), "jsonl", settings=settings, rules=policy_rules)

A connector streams RAW batches (catalog/schemas.py) from a parse thread to a reader thread, which validates and
hashes each in one DuckDB query and runs the tagger's RE2 candidate test (Arrow). Its bookkeeping goes to
a staging table, its new records stream into the new snapshot (catalog/dedup.py decides which are
new), its secret spans to a span staging table. The merge into the catalog is one transaction:

- read = accepted + quarantined + duplicates, always. `accepted` counts the source's distinct valid
  records (`new` of them were not in the catalog before); `duplicates` are later copies of a record
  (same user, same text) within this source, dropped and counted (seed 003: within-user duplicates
  make user inference easier).
- Re-ingesting a source changes nothing and returns the same snapshot id (ids are content hashes).
- Quarantined rows keep their reason, their position in the source and their raw bytes.
"""
from __future__ import annotations

import errno
import json
import os
import queue
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from catalog import shards as shard_mod
from catalog import snapshots as snap_mod
from catalog import recipients, store
from catalog.connectors.addresses import mailboxes
from catalog.connectors.base import FieldMap, meta_col
from catalog.connectors.debian import DebianChangelogSource
from catalog.connectors.git import GitSource
from catalog.connectors.jsonl import JsonlSource
from catalog.connectors.mail import MailSource
from catalog.connectors.tabular import CsvSource, ParquetSource
from catalog.dates import parse_timestamp
from catalog.dedup import OnlineDedup, verify_dropped
from catalog.ner import load_ner
from catalog.people import likely_duplicates, unsettled_by_policy, write_likely_duplicates
from catalog.tagging import Tagger
from components.core.errors import VeilError
from components.core.hashing import sha256_file, sha256_json
from components.core.identity import person_id_or_empty
from components.core.settings import Settings

FORMATS = ("jsonl", "csv", "parquet", "mbox", "maildir", "git", "debian-changelog")
DEFAULT_MAX_RECORD_BYTES = 1 << 20
# DuckDB's share of an ingest's heap — staged spans and recipients, the merge's and the snapshot's
# queries — past which it spills to VEIL_HOME/cache/duckdb-tmp: with the bounded dedup (dedup.py) the
# heap stays about flat from 1M to 10M records (docs/catalog.md, Memory and speed).
INGEST_MEMORY_LIMIT = "256MB"


@dataclass
class IngestReport:
    snapshot_id: str
    sha256: str               # the snapshot's manifest sha256 (what certificates cite)
    read: int
    accepted: int
    quarantined: int
    duplicates: int
    users: int                # distinct users among this source's accepted records
    records: int              # records in the snapshot (the whole catalog)
    seconds: float
    new: int = 0              # accepted records the catalog did not hold before
    snapshot_users: int = 0
    new_spans: int = 0
    tagged_records: int = 0   # this source's accepted records with at least one secret span
    source: str = ""
    format: str = ""
    source_sha256: str = ""
    ingest_id: str = ""
    quarantine_reasons: dict = field(default_factory=dict)
    # names under several account ids in the snapshot (git/mail): likely one person each; the list
    # names people, so it goes to settings.private_dir/people/likely-duplicates.json, not here
    likely_duplicate_people: int = 0
    # people whose records came under several spellings the identity rule made one id (components.core
    # .identity); which ones is in the same private file
    identity_merged_people: int = 0
    # records whose To/Cc gained the recipients of a dropped copy (catalog/recipients.py)
    recipients_merged: int = 0
    ner: str = ""             # the NER pass: "on: <model> (<version>)" or "off: …" (catalog/ner.py)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seconds"] = round(self.seconds, 3)
        d["records_per_second"] = round(self.read / self.seconds, 1) if self.seconds > 0 else None
        return d


def _connector(source: Path, fmt: str, fields: FieldMap, max_record_bytes: int):
    if fmt == "jsonl":
        return JsonlSource(source, fields, max_line_bytes=max(4 * max_record_bytes, 1 << 16))
    if fmt == "csv":
        return CsvSource(source, fields, max_field_bytes=max(4 * max_record_bytes, 1 << 16))
    if fmt == "parquet":
        return ParquetSource(source, fields)
    if fmt in ("mbox", "maildir"):
        return MailSource(source, fmt)
    if fmt == "git":
        return GitSource(source)
    if fmt == "debian-changelog":
        return DebianChangelogSource(source)
    raise VeilError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _q_ascii(s: str) -> str:
    """A string literal in ASCII-only SQL: other characters as chr(code point). This DuckDB build
    tokenizes a statement holding any non-ASCII character in a Python loop over its characters
    (~8 ms for the stage query, run once per batch with the GIL held). Identifiers (a non-ASCII
    metadata field name) stay as they are: such a mapping pays that loop."""
    if s.isascii():
        return _q(s)
    parts, run = [], []
    for ch in s:
        if ch.isascii():
            run.append(ch)
            continue
        if run:
            parts.append(_q("".join(run)))
            run = []
        parts.append(f"chr({ord(ch)})")
    if run:
        parts.append(_q("".join(run)))
    return "(" + " || ".join(parts) + ")"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


# Per-row bookkeeping of one ingest (no text: that streams into the snapshot, or in exact mode into a
# temporary Parquet file) goes to an Arrow IPC file (_StageFile), the merge's `stage`.
_STAGE = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("byte_offset", pa.int64()), ("locator", pa.string()),
                    ("user_id", pa.string()), ("reason", pa.string()), ("record_id", pa.string()),
                    ("raw", pa.binary()), ("chars", pa.int64()), ("created_at", pa.timestamp("us", tz="UTC")),
                    # online dedup: whether the row went to the snapshot, and its id's first 64 bits
                    # (uint64 as int64) — what the merge checks the online decisions with (dedup.py)
                    ("kept", pa.bool_()), ("prefix", pa.int64())])
_STAGE_DDL = recipients.DDL
_STAGED = pa.schema([("seq", pa.int64()), ("record_id", pa.string()), ("user_id", pa.string()), ("text", pa.string()),
                     ("source", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")), ("metadata", pa.string())])


# A source's timestamp as the stage query reads it (epoch seconds, or what DuckDB's cast reads).
_TS_SQL = ("CASE WHEN ts IS NULL THEN NULL "
           "WHEN regexp_full_match(trim(ts), '[0-9]{9,11}(\\.[0-9]+)?') THEN to_timestamp(TRY_CAST(trim(ts) AS DOUBLE)) "
           "ELSE TRY_CAST(trim(ts) AS TIMESTAMPTZ) END")


def _meta_pairs(meta_names: Sequence[str], with_source_id: bool, with_path: bool) -> list[tuple[str, str]]:
    """(key, column) of the metadata object's members, in its order. The source's own id and the path
    (what path_glob rules see, so a re-tag sees it too) are kept."""
    return ([("source_id", "source_id")] if with_source_id else []) + \
        ([("path", "path")] if with_path and "path" not in meta_names else []) + \
        [(m, meta_col(m)) for m in meta_names if not (with_source_id and m == "source_id")]


def _stage_sql(meta_names: Sequence[str], has_meta_cols: bool, default_source: str, time_field: str | None,
               user_field: str, text_field: str, max_bytes: int, with_source_id: bool = False,
               with_path: bool = False, candidate: str = "false") -> str:
    if has_meta_cols:
        pairs = [(k, _ident(c)) for k, c in _meta_pairs(meta_names, with_source_id, with_path)]
        if pairs:
            # A JSON object of the non-null members (absent fields leave no key behind), written by
            # hand: the same bytes as json_merge_patch('{}', json_object(…)) (a test compares them) at
            # ~60 % of its CPU. The columns are strings (connectors/base.py): to_json quotes them.
            # Recipient fields arrive as JSON array text (`_recipients`): kept as an array, which the
            # owners column and the dedup union read; every other member is a JSON string.
            members = ", ".join(f"CASE WHEN {col} IS NOT NULL THEN to_json({_q_ascii(k)}) || ':' || "
                                f"{col if k in RECIPIENT_FIELDS else f'to_json({col})'} END"
                                for k, col in pairs)
            meta = f"'{{' || concat_ws(',', {members}) || '}}'"
        else:
            meta = "'{}'"
    else:
        meta = "coalesce(metadata, '{}')"
    tname = time_field or "time"
    ts = _TS_SQL
    return f"""
    WITH b AS (SELECT *, trim("user") AS u, {ts} AS cts FROM batch),
    v AS (SELECT *,
        CASE WHEN error IS NOT NULL THEN error
             WHEN u IS NULL OR u = '' THEN {_q_ascii(f"missing user: field {user_field!r} is absent or empty")}
             WHEN text IS NULL OR NOT regexp_matches(text, '\S') THEN {_q_ascii(f"missing text: field {text_field!r} is absent or empty")}
             WHEN strlen(text) > {int(max_bytes)}
                  THEN 'oversized record: ' || strlen(text)::VARCHAR || ' bytes > {int(max_bytes)}'
             WHEN ts IS NOT NULL AND cts IS NULL
                  THEN {_q_ascii(f"bad timestamp: field {tname!r} is not a date we read (ISO-8601, RFC 2822, epoch seconds/ms, …): ")} || left(ts, 60)
        END AS reason FROM b)
    SELECT seq, line, "offset" AS byte_offset, locator, u AS user_id, reason,
           NULL::VARCHAR AS record_id,  -- sha256(user_id, 0x1f, text): _RecordIds, after this query
           CASE WHEN reason IS NOT NULL THEN coalesce(raw, encode(to_json(struct_pack(
                "user" := "user", text := left(text, 65536), ts := ts))::VARCHAR)) END AS raw,
           coalesce(nullif(trim(source), ''), {_q_ascii(default_source)}) AS source,
           cts::TIMESTAMPTZ AS created_at, {meta} AS metadata,
           CASE WHEN reason IS NULL THEN length(text) END AS chars,
           CASE WHEN reason IS NULL THEN {candidate} ELSE false END AS candidate
    FROM v
    """


def _chunks(a) -> list[pa.Array]:
    return a.chunks if isinstance(a, pa.ChunkedArray) else [a]


def _byte_view(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data bytes) of a string array (its own slice: offsets index `data`)."""
    n = len(a)
    offs = np.frombuffer(a.buffers()[1], dtype=np.int32)[a.offset:a.offset + n + 1].astype(np.int64)
    buf = a.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None and offs[-1] > offs[0] else np.zeros(1, np.uint8)
    return offs, data


def _plain_edges(a) -> np.ndarray:
    """Per row: set, and its first and last bytes printable non-space ASCII ('!'..'~'): trimming
    (DuckDB's trim: spaces and Unicode spaces) leaves such a value as it is."""
    out = []
    for c in _chunks(a):
        offs, data = _byte_view(c)
        first, last = offs[:-1], offs[1:] - 1
        ok = last >= first
        f = data[np.where(ok, first, 0)]
        e = data[np.where(ok, last, 0)]
        ok &= (f >= 0x21) & (f <= 0x7E) & (e >= 0x21) & (e <= 0x7E)
        if c.null_count:
            ok &= c.is_valid().to_numpy(zero_copy_only=False)
        out.append(ok)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


def _not_blank_head(a) -> np.ndarray:
    """Per row: set, and its first byte is not RE2's \s ([\t\n\f\r ]): then the text matches '\S'
    (a text that starts blank is left to the stage query, which asks RE2)."""
    out = []
    for c in _chunks(a):
        offs, data = _byte_view(c)
        ok = offs[1:] > offs[:-1]
        f = data[np.where(ok, offs[:-1], 0)]
        ok &= (f != 9) & (f != 10) & (f != 12) & (f != 13) & (f != 32)
        if c.null_count:
            ok &= c.is_valid().to_numpy(zero_copy_only=False)
        out.append(ok)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


_UNSAFE_BYTES = np.zeros(256, dtype=bool)
_UNSAFE_BYTES[:0x20] = _UNSAFE_BYTES[0x22] = _UNSAFE_BYTES[0x5C] = _UNSAFE_BYTES[0x7F] = True


def _json_plain(a) -> np.ndarray:
    """Per row: no byte that DuckDB's to_json escapes (or might: control characters, '"', '\\',
    DEL) — then to_json(v) is '"' || v || '"'. One scan of the column's bytes; per row only if
    any such byte is there."""
    out = []
    for c in _chunks(a):
        offs, data = _byte_view(c)
        n = len(c)
        bad = _UNSAFE_BYTES[data[offs[0]:offs[-1]]]
        if not bad.any():
            out.append(np.ones(n, dtype=bool))
            continue
        at = np.flatnonzero(bad) + offs[0]
        rows = np.searchsorted(offs, at, side="right") - 1
        ok = np.ones(n, dtype=bool)
        ok[rows] = False
        out.append(ok)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


class _FastStage:
    """The stage query (`_stage_sql`) for the rows whose every value is plain, in Arrow kernels and
    byte tests: the same output at about a third of DuckDB's CPU (the query's string work — trims,
    the date cast, the metadata object — and its planning per batch were the reader thread's
    costliest step: docs/scaling.md). A row is plain when no rule of the query can fire on it and
    its values need no rewriting: no connector error; a user and a source that trimming leaves as
    they are (printable non-space ASCII at both ends; a null source takes the default); a text that
    is set, not oversized, and starts with a byte RE2's \S matches; a timestamp that is null, 9–11
    ASCII digits (epoch seconds: exact microseconds) or one the query's own date expression reads
    (asked of DuckDB for those values only); metadata values without a byte to_json escapes. Every
    other row goes through the stage query itself, and the two are put back in source order.
    tests/catalog/test_stage_metadata.py compares both paths on rows of every kind."""

    def __init__(self, pairs: Sequence[tuple[str, str]], raw_keys: Sequence[str], default_source: str,
                 max_bytes: int):
        self.pairs, self.raw_keys = list(pairs), frozenset(raw_keys)
        self.default_source, self.max_bytes = default_source, int(max_bytes)
        # the members' '"key":' prefixes, as the query writes them (to_json of the key)
        con = duckdb.connect()
        try:
            self.keys = [con.execute("SELECT to_json(?::VARCHAR)", [k]).fetchall()[0][0] + ":" for k, _ in self.pairs]
        finally:
            con.close()
        self.schema: pa.Schema | None = None   # the stage query's output schema (asked once)

    def __call__(self, con, sql: str, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        if self.schema is None:
            con.register("batch", batch.slice(0, 0))
            try:
                self.schema = con.sql(sql).to_arrow_table().schema
            finally:
                con.unregister("batch")

        def col(name: str, combine: bool = True):
            c = batch.column(name)
            if pa.types.is_null(c.type) or c.null_count == n:
                return None
            return c.combine_chunks() if combine else c

        err, user, text, ts, source = col("error"), col("user"), col("text", False), col("ts"), col("source")
        if user is None or text is None or n == 0:
            return self._slow(con, sql, batch, None)
        lengths = pc.binary_length(text)
        ok = _plain_edges(user) & _not_blank_head(text)
        ok &= pc.fill_null(pc.less_equal(lengths, self.max_bytes), False).to_numpy(zero_copy_only=False)
        if err is not None:
            ok &= err.is_null().to_numpy(zero_copy_only=False)
        if source is not None:
            ok &= _plain_edges(source) | source.is_null().to_numpy(zero_copy_only=False)
        members = []
        for key, (k, c) in zip(self.keys, self.pairs):
            v = col(c)
            if v is None:
                continue
            if k not in self.raw_keys:
                ok &= _json_plain(v)
                members.append(pc.binary_join_element_wise(key + '"', v, '"', ""))
            else:  # recipients: JSON array text, written as it is
                members.append(pc.binary_join_element_wise(key, v, ""))
        tstype = pa.timestamp("us", tz="UTC")
        created = pa.nulls(n, tstype)
        if ts is not None:
            tl = pc.binary_length(ts)
            digits = pc.fill_null(pc.and_(pc.ascii_is_decimal(ts), pc.and_(pc.greater_equal(tl, 9),
                                                                              pc.less_equal(tl, 11))), False)
            secs = pc.cast(pc.if_else(digits, ts, pa.scalar(None, pa.string())), pa.int64())
            created = pc.cast(pc.multiply(secs, 1_000_000), tstype)
            other = pc.and_(pc.is_valid(ts), pc.invert(digits))
            if pc.any(other).as_py():
                # other forms (ISO-8601, …): the query's own expression reads them, for these rows only
                at = pc.indices_nonzero(other)
                con.register("tsb", pa.table({"ts": pc.take(ts, at)}))
                try:
                    got = con.sql(f"SELECT ({_TS_SQL})::TIMESTAMPTZ AS cts FROM tsb").to_arrow_table().column(0)
                finally:
                    con.unregister("tsb")
                full = np.full(n, -1, dtype=np.int64)
                full[at.to_numpy()] = np.arange(len(at))
                read = pc.take(got.cast(tstype), pa.array(full, mask=full < 0))
                created = pc.if_else(other, read, created)
                ok &= pc.or_(pc.invert(other), pc.is_valid(read)).to_numpy(zero_copy_only=False)
        if not ok.any():
            return self._slow(con, sql, batch, None)
        if members:
            # concat_ws(',', …): the non-null members, comma-separated (pairwise: Arrow's own
            # null_handling="skip" drops whole rows when given one array)
            acc = members[0]
            for m in members[1:]:
                acc = pc.coalesce(pc.binary_join_element_wise(acc, m, ","), acc, m)
            meta = pc.binary_join_element_wise("{", pc.coalesce(acc, ""), "}", "")
        else:
            meta = pa.array(["{}"] * n, pa.string())
        src = pa.array([self.default_source] * n, pa.string()) if source is None else \
            pc.coalesce(source, pa.scalar(self.default_source, pa.string()))
        cols = {"seq": batch.column("seq"), "line": batch.column("line"), "byte_offset": batch.column("offset"),
                "locator": batch.column("locator"), "user_id": user,
                "reason": pa.nulls(n, pa.string()), "record_id": pa.nulls(n, pa.string()),
                "raw": pa.nulls(n, pa.binary()), "source": src, "created_at": created, "metadata": meta,
                "chars": pc.utf8_length(text), "candidate": pa.array(np.zeros(n, dtype=bool))}
        fast = pa.table([cols[f.name] for f in self.schema], names=self.schema.names).cast(self.schema)
        if ok.all():
            return fast
        return self._slow(con, sql, batch, ok, fast)

    # Past this many rows for the stage query, the whole batch goes to it (the merge below is a
    # slice per row; a source of mostly odd rows is read as before, at the query's cost).
    _MAX_SLOW = 64

    def _slow(self, con, sql: str, batch: pa.Table, ok: np.ndarray | None, fast: pa.Table | None = None) -> pa.Table:
        """The stage query on the rows not `ok` (all rows: None), put in `fast`'s place for those rows."""
        bad = None if ok is None else np.flatnonzero(~ok)
        if bad is not None and len(bad) > self._MAX_SLOW:
            bad = None
        sub = batch if bad is None else batch.filter(pa.array(~ok))   # (a take would join the text chunks)
        con.register("batch", sub)
        try:
            out = con.sql(sql).to_arrow_table()
        finally:
            con.unregister("batch")
        if bad is None:
            return out
        out = out.cast(fast.schema)
        # fast's rows with the query's in their places: zero-copy slices, in source order
        parts, at = [], 0
        for j, i in enumerate(bad.tolist()):
            if i > at:
                parts.append(fast.slice(at, i - at))
            parts.append(out.slice(j, 1))
            at = i + 1
        if at < fast.num_rows:
            parts.append(fast.slice(at))
        return pa.concat_tables(parts)


_SPANS = pa.schema([("seq", pa.int64()), ("record_id", pa.string()), ("secret_id", pa.string()),
                    ("secret_class", pa.string()), ("detector", pa.string()), ("detector_version", pa.string()),
                    ("start", pa.int64()), ("end", pa.int64())])


def _spans_table(spans, seqs: pa.Array, rids: pa.Array) -> pa.Table:
    """`seqs[i]` and `rids[i]` belong to `spans[i]` (columns: _SPANS)."""
    return pa.table({
        "seq": seqs.cast(pa.int64()),
        "record_id": rids.cast(pa.string()),
        "secret_id": pa.array([s.secret_id for s in spans], pa.string()),
        "secret_class": pa.array([s.secret_class for s in spans], pa.string()),
        "detector": pa.array([s.detector for s in spans], pa.string()),
        "detector_version": pa.array([s.detector_version for s in spans], pa.string()),
        "start": pa.array([s.start for s in spans], pa.int64()),
        "end": pa.array([s.end for s in spans], pa.int64()),
    })


_MALLOC_TUNED = False
_GC_FROZEN = False


def tune_malloc() -> None:
    """For a process whose life is an ingest (`veil ingest`, a shard worker, the bench) — never called
    by `ingest_source` itself, since it changes the whole process' allocator: a flow process that
    ingests and then trains keeps glibc's dynamic thresholds. Let glibc's malloc keep the ingest's large blocks (the 16 MiB reads, their carries, the UTF-8
    and newline scans' temporaries) in its heap instead of mapping fresh pages for each and unmapping
    them when freed: each fresh page is a fault the kernel zeroes. Measured on 1M records: the parse
    thread's page faults 118k → 36k, the ingest's system CPU 2.5 → 1.5 s (docs/scaling.md). Once per
    process; a no-op off glibc. The freed blocks stay in the heap (up to the trim threshold), which
    the next batch reuses: peak memory is what the pipeline holds at once, as before."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 64 << 20)    # M_MMAP_THRESHOLD: blocks under 64 MiB come from the heap
    mallopt(-1, 256 << 20)   # M_TRIM_THRESHOLD: give memory back past 256 MiB free at the top


def tune_process() -> None:
    """For a process whose life is an ingest (`veil ingest`, a shard worker, the bench; never
    `ingest_source` itself, for the reasons `tune_malloc` gives): `tune_malloc`, then `gc.freeze()`.
    Freezing moves the objects alive now (the imported modules, pyarrow's, DuckDB's and the detectors'
    ~60k) to the cyclic collector's permanent generation, which its full collections skip: an ingest
    allocates few containers that outlive a batch, so its two or three full collections per 1M
    records were traversals of import-time objects. Measured on 1M records: collector CPU 0.23 → 0.09 s
    (its full collections 0.16 → 0.03 s; docs/scaling.md). What is frozen is never collected, which
    costs nothing in a process that ends with its ingest. Once per process."""
    global _GC_FROZEN
    tune_malloc()
    if _GC_FROZEN:
        return
    _GC_FROZEN = True
    import gc

    gc.freeze()


def ingest_source(source: Path | str, fmt: str, *, settings: Settings, user_field: str = "user",
                  text_field: str = "text", id_field: str | None = None, time_field: str | None = None,
                  metadata_fields: Sequence[str] = (), rules: Sequence[dict] | str | Path | None = None,
                  progress: bool = False, source_field: str | None = "source", path_field: str | None = "path",
                  max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, keep_duplicates: bool = False,
                  ner: str | Path | None = None, shards: int = 1) -> IngestReport:
    """Read `source` (format `fmt`), tag secrets with `rules` (a list of rule dicts, a policy path, or
    None for the built-in credential/email/phone detectors), merge into the catalog, cut a snapshot.
    `ner`: a local token-classification model directory for names and places (default: the
    `VEIL_NER_MODEL` environment variable; neither: the pass is off, and `report.ner` says so).
    `shards`: worker processes for the per-record work of a JSONL file (catalog/shards.py); the
    snapshot is the same as with one."""
    t0 = time.perf_counter()
    source = Path(source)
    if fmt not in FORMATS:
        raise VeilError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if not source.exists():
        raise VeilError(f"{source}: no such file or directory")
    if fmt in ("jsonl", "csv", "parquet", "mbox") and not source.is_file():
        raise VeilError(f"{source}: {fmt} source must be a file")
    if fmt in ("maildir", "git", "debian-changelog") and not source.is_dir():
        raise VeilError(f"{source}: {fmt} source must be a directory")
    shard_mod.check(source, fmt, shards)
    fields = FieldMap(user=user_field, text=text_field, id=id_field, time=time_field, source=source_field,
                      path=path_field, metadata=tuple(metadata_fields))

    ner_plugin, ner_status = load_ner(ner)
    tagger = Tagger(rules, ner=ner_plugin)
    try:
        return _ingest(source, fmt, fields, max_record_bytes, settings=settings, tagger=tagger, rules=rules,
                       progress=progress, keep_duplicates=keep_duplicates, time_field=time_field,
                       user_field=user_field, text_field=text_field, id_field=id_field, path_field=path_field,
                       ner_status=ner_status, t0=t0, shards=shards, ner=ner)
    except OSError as e:          # a full disk, an unreadable source: the file and the cause, one line
        raise VeilError(_os_problem(e, source, settings)) from None
    except duckdb.IOException as e:
        raise VeilError(_os_problem(e, source, settings)) from None


def _os_problem(e: Exception, source: Path, settings: Settings) -> str:
    """One line for an I/O failure during an ingest. An ingest commits whole or not at all (the merge is
    one catalog transaction, LATEST is rewritten from the catalog by the next writer), and a failed
    one's temporary files are removed: running it again is the recovery."""
    if isinstance(e, OSError):
        what = e.strerror or " ".join(str(e).split())[:300]
        full = e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)) or "[errno 28]" in what.lower()
        # Arrow's write errors name no file: what fills up is VEIL_HOME (the source is only read)
        where = e.filename if e.filename is not None else (settings.home if full else source)
    else:                         # DuckDB's message names the file
        where, what = settings.catalog_path, " ".join(str(e).split())[:300]
        full = "space left" in what or "disk is full" in what.lower()
    if full:
        return (f"{where}: no space left on device while ingesting {source} ({what}); free space on that disk "
                "and run the ingest again (an ingest commits whole or not at all: the catalog is as it was "
                "before, or holds this ingest whole)")
    return f"{where}: {what} (while ingesting {source})"


def _ingest(source: Path, fmt: str, fields: FieldMap, max_record_bytes: int, *, settings: Settings, tagger,
            rules, progress: bool, keep_duplicates: bool, time_field, user_field, text_field, id_field,
            path_field, ner_status: str, t0: float, shards: int = 1, ner=None) -> IngestReport:
    conn = _connector(source, fmt, fields, max_record_bytes)
    has_meta_cols = fmt in ("jsonl", "csv", "parquet")
    sql = _stage_sql(fields.metadata, has_meta_cols, conn.default_source, time_field if has_meta_cols else "Date",
                     user_field if has_meta_cols else "user", text_field if has_meta_cols else "text",
                     max_record_bytes, with_source_id=bool(id_field) and has_meta_cols,
                     with_path=bool(path_field) and has_meta_cols)
    fast = None
    if has_meta_cols:
        fast = _FastStage(_meta_pairs(fields.metadata, bool(id_field), bool(path_field)),
                          [m for m in fields.metadata if m in RECIPIENT_FIELDS], conn.default_source, max_record_bytes)
    ingest_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    started = datetime.now(timezone.utc)

    options = {"format": fmt, "fields": asdict(fields), "max_record_bytes": max_record_bytes}
    if keep_duplicates:
        options["keep_duplicates"] = True

    def source_reader():
        if shards == 1:
            return _connector(source, fmt, fields, max_record_bytes)
        return shard_mod.ShardedJsonl(source, fields, workers=shards, max_record_bytes=max_record_bytes, sql=sql,
                                      rules=tagger.rules, ner=ner, tmp_dir=settings.cache_dir / "ingest-tmp",
                                      ingest_id=ingest_id, work=_shard_work)

    if shards > 1:
        conn = source_reader()
    try:
        report = _run(settings, conn, sql, tagger, progress=progress, exact=keep_duplicates, ingest_id=ingest_id,
                      source=source, fmt=fmt, options=options, started=started, fast=fast)
    except _PrefixCollision:
        # Two different records share a 64-bit id prefix (odds ~n²/2⁶⁵): redo with exact dedup.
        conn = source_reader()
        report = _run(settings, conn, sql, tagger, progress=progress, exact=True, ingest_id=ingest_id,
                      source=source, fmt=fmt, options=options, started=started, fast=fast)
    if report.accepted:
        try:
            _report_likely_duplicates(report, settings, rules, source)
        except (OSError, duckdb.IOException) as e:  # after the commit: the ingest stands, the report is missing
            where = getattr(e, "filename", None) or settings.private_dir
            raise VeilError(f"{where}: {getattr(e, 'strerror', None) or e}: the ingest is committed (snapshot "
                            f"{report.snapshot_id}) but the likely-duplicates report was not written; free space "
                            "and run `veil catalog people --policy <policy>` to write it") from None
    report.ner = ner_status
    report.seconds = time.perf_counter() - t0
    return report


def _report_likely_duplicates(report: IngestReport, settings: Settings, rules, source: Path) -> None:
    """Likely duplicates, for the operator only (names in a private file, counts on their screen):
    names under several ids (sources that carry names), spellings the identity rule merged (all)."""
    found, merged = likely_duplicates(settings.snapshots_dir / report.snapshot_id / "records.parquet")
    if isinstance(rules, (str, Path)):
        # ingested under a policy: names its people.aliases already merge are settled, not news
        found = unsettled_by_policy(found, rules)
    report.likely_duplicate_people = len(found)
    report.identity_merged_people = len(merged)
    write_likely_duplicates(settings.private_dir, found, str(source), merged)


class _PrefixCollision(Exception):
    pass


_INSERT_INGEST = ('INSERT INTO ingests (ingest_id, source_key, source, format, source_sha256, options, rules_sha256, '
                  'started_at, finished_at, "read", accepted, new_records, quarantined, duplicates, users, '
                  'snapshot_id, tagged_records) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)')


def _already_ingested(con, conn, tagger: Tagger, latest: tuple[str, str], *, ingest_id: str, source: Path,
                      fmt: str, options: dict, started: datetime) -> IngestReport | None:
    """The same bytes, mapping and rules were ingested before, and no re-tag replaced spans since:
    records and spans only grow between re-tags, so the catalog already holds everything this run
    would add. Report the earlier counts, skip the work.
    A file is hashed up front only when an earlier ingest of the same path with the same options exists."""
    opts = json.dumps(options, sort_keys=True)
    prior = con.execute(
        'SELECT source_sha256, "read", accepted, quarantined, duplicates, users, source_key, tagged_records '
        "FROM ingests i WHERE source = ? AND format = ? AND options = ? AND rules_sha256 = ? "
        # a re-tag since then replaced spans: the source must be tagged again
        "AND NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.ingest_id LIKE '%-retag-%' AND s.created_at >= i.started_at) "
        "ORDER BY finished_at DESC LIMIT 1",
        [str(source), fmt, opts, tagger.rules_sha256]).fetchall()
    if not prior:
        return None
    sha, read, accepted, quarantined, duplicates, users, source_key, tagged = prior[0]
    if fmt in ("jsonl", "csv", "parquet", "mbox"):
        current = sha256_file(source)
    elif fmt == "git":
        current = conn.sha256  # HEAD commit + .mailmap, known before reading the log
    else:
        return None  # maildir: its hash needs every file read anyway
    if current != sha:
        return None
    reasons = dict(con.execute("SELECT regexp_replace(reason, ':.*', '') AS r, count(*) FROM quarantine "
                               "WHERE source_key = ? GROUP BY r ORDER BY r", [source_key]).fetchall())
    n_records, n_users = con.sql("SELECT count(*), count(DISTINCT user_id) FROM records").fetchall()[0]
    con.execute(_INSERT_INGEST, [ingest_id, source_key, str(source), fmt, sha, opts, tagger.rules_sha256, started,
                                 datetime.now(timezone.utc), read, accepted, 0, quarantined, duplicates, users,
                                 latest[0], tagged])
    return IngestReport(snapshot_id=latest[0], sha256=latest[1], read=read, accepted=accepted,
                        quarantined=quarantined, duplicates=duplicates, users=users, records=n_records, seconds=0.0,
                        new=0, snapshot_users=n_users, new_spans=0, tagged_records=tagged or 0, source=str(source),
                        format=fmt, source_sha256=sha, ingest_id=ingest_id, quarantine_reasons=reasons)


def _run(settings: Settings, conn, sql: str, tagger: Tagger, *, progress: bool, exact: bool, ingest_id: str,
         source: Path, fmt: str, options: dict, started: datetime, fast: _FastStage | None = None) -> IngestReport:
    """One pass over the source. Online (default): new records stream straight into the new snapshot.
    Exact: they are staged in a temporary Parquet file and picked by the merge's exact dedup."""
    tmp_dir = settings.cache_dir / "ingest-tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    staged_path = tmp_dir / f"{ingest_id}.parquet"
    with store.writer(settings, memory_limit=INGEST_MEMORY_LIMIT) as con:
        snap_mod.recover(con, settings)  # a crashed writer's leftovers: we hold the lock, nobody else writes
        con.execute(_STAGE_DDL)
        threads = _one(con, "SELECT current_setting('threads')")
        # Staging inserts one batch at a time, a single DuckDB task each: no worker threads then (their
        # hand-offs cost CPU the other pipeline threads need); all of them again for the merge.
        con.execute("SET threads = 1")
        latest = snap_mod.latest_in_catalog(con)
        if not exact and latest is not None:
            again = _already_ingested(con, conn, tagger, latest, ingest_id=ingest_id, source=source, fmt=fmt,
                                      options=options, started=started)
            if again is not None:
                return again
        parent = latest[0] if latest else None
        builder = snap_mod.SnapshotBuilder(settings, ingest_id=ingest_id, parent=parent)
        dedup = None if exact else OnlineDedup(settings.snapshots_dir / parent / "records.parquet" if parent else None,
                                               spill=tmp_dir / f"{ingest_id}.dedup")
        # (after recover(), which removes every stage file it finds: a crashed ingest's)
        stage = _StageFile(tmp_dir / f"{ingest_id}.stage.arrow")
        # the secret spans found, likewise (file-backed; a DuckDB table grew the heap ~15 bytes a record)
        stage.spans = _StageFile(tmp_dir / f"{ingest_id}.spans.stage.arrow", _SPANS)
        bar = None
        try:
            sharded = isinstance(conn, shard_mod.ShardedJsonl)
            bar = None if sharded else _progress(progress, conn)
            staged = pq.ParquetWriter(staged_path, _STAGED, compression="none") if exact else None
            read = 0  # records the connector offered, counted as they arrive (checked against staging)
            try:
                # Sharded: worker processes did the per-record work (catalog/shards.py); their parts
                # are staged here, in source order, as this process' own batches are below.
                for kind, t in (conn.parts() if sharded else ()):
                    if kind == "spans":
                        stage.spans.append(t)
                    elif t.num_rows:
                        read += t.num_rows
                        _stage_tagged(con, t, t, None, stage, staged, dedup, builder)
                # Four threads: parse (pyarrow.json, single-threaded: less CPU than its thread pool),
                # validate+hash+candidate test (DuckDB on one thread, RE2), this one (staging,
                # tagging), the snapshot writer. Measured per thread on 1M records: 2.1 / 3.4 / 3.3 /
                # 1.3 CPU s — balanced, where one reader thread doing parse and validation was the
                # longest at 5.4 s (docs/catalog.md, Memory and speed).
                for batch, out in (() if sharded else _prefetch(
                        _prefetch(conn.batches(), depth=1, name="veil-ingest-parse"),
                        transform=_Normalizer(sql, tagger, fast))):
                    read += batch.num_rows
                    if batch.num_rows:
                        _stage_batch(con, batch, out, tagger, stage, staged, dedup, builder)
                    if bar is not None:
                        bar.advance(conn)
            finally:
                if staged is not None:
                    staged.close()
            con.execute(f"SET threads = {int(threads)}")
            source_sha = conn.sha256
            source_key = sha256_json({"source_sha256": source_sha, **options})
            stage_rows = stage.table()
            con.register("stage", stage_rows)
            con.register("span_stage", stage.spans.table())
            try:
                return _merge(con, settings, tagger, builder, staged_path if exact else None, latest, read=read,
                              ingest_id=ingest_id, source=source, fmt=fmt, source_sha=source_sha,
                              source_key=source_key, options=options, started=started, dedup=dedup,
                              stage_rows=stage_rows)
            finally:
                con.unregister("stage")
                con.unregister("span_stage")
        except BaseException:
            builder.abort()
            raise
        finally:
            if bar is not None:
                bar.stop()
            staged_path.unlink(missing_ok=True)
            stage.close()
            stage.spans.close()
            if dedup is not None:
                dedup.close()


class _StageFile:
    """The per-row bookkeeping, appended batch by batch to an uncompressed Arrow IPC file and read back
    memory-mapped by the merge (DuckDB scans the mapped buffers without copying them).

    Appending is about a copy into the page cache — half the CPU of inserting the same rows into a
    DuckDB temporary table (~0.75 CPU s per 1M records on the main thread, which tags and stages in
    the pipeline: docs/catalog.md, Memory and speed) — and the pages are file-backed, so a large
    source does not grow the process' anonymous memory (a DuckDB table spilled past its limit). The
    file holds quarantined rows' raw bytes: it is removed after the merge, and a crashed ingest's by
    the next writer (catalog/snapshots.py, recover)."""

    def __init__(self, path: Path, schema: pa.Schema = _STAGE):
        self.path, self.schema = path, schema
        self._w = ipc.new_file(path, schema)
        self._map: pa.MemoryMappedFile | None = None
        self.spans: _StageFile | None = None   # the ingest's secret spans (_SPANS), a file of their own

    def append(self, t: pa.Table) -> None:
        self._w.write_table(t if t.schema.equals(self.schema) else t.cast(self.schema))

    def write(self, out: pa.Table, kept: pa.Array | None = None, prefix: pa.Array | None = None) -> None:
        n = out.num_rows
        t = out.select(_STAGE.names[:-2])
        t = t.append_column("kept", kept if kept is not None else pa.nulls(n, pa.bool_()))
        t = t.append_column("prefix", prefix if prefix is not None else pa.nulls(n, pa.int64()))
        self.append(t)

    def table(self) -> pa.Table:
        """Close the writer; the rows, memory-mapped."""
        self._w.close()
        self._map = pa.memory_map(str(self.path))
        return ipc.open_file(self._map).read_all()

    def close(self) -> None:
        try:
            self._w.close()
        except Exception:  # noqa: BLE001 - already closed (table()) or failing: the file goes anyway
            pass
        if self._map is not None:
            self._map.close()
            self._map = None
        self.path.unlink(missing_ok=True)


class _RecordIds:
    """Record ids, sha256(user_id ‖ 0x1f ‖ text) in hex, of a batch's rows, by Apache DataFusion's
    sha256: Rust's sha2, which uses the CPU's SHA instructions, at ~40 % of the CPU of DuckDB's
    software sha256 — the ingest's largest single cost (~1.3 CPU s per 1M records of ~300
    characters; docs/catalog.md, Memory and speed). Tests check ids against hashlib."""

    def __init__(self):
        from datafusion import SessionConfig, SessionContext

        # one partition: the batch is one task on this thread, and a projection keeps the row order
        self.ctx = SessionContext(SessionConfig().with_target_partitions(1))

    def __call__(self, user_ids: pa.ChunkedArray, texts: pa.Array, valid: pa.Array) -> pa.Array:
        """Ids of the `valid` rows (their user and text are set), null elsewhere."""
        t = pa.table({"u": user_ids, "t": texts}).combine_chunks()
        if len(t) == 0:
            return pa.array([], pa.string())
        self.ctx.register_record_batches("rows", [t.to_batches(max_chunksize=len(t))])
        try:
            ids = self.ctx.sql("SELECT encode(sha256(concat(u, chr(31), t)), 'hex') AS h FROM rows").to_arrow_table()
        finally:
            self.ctx.deregister_table("rows")
        ids = ids.column(0).combine_chunks().cast(pa.string())
        if len(ids) != len(t):
            raise RuntimeError("catalog: DataFusion returned a different number of record ids; refusing to stage")
        return pc.if_else(valid, ids, pa.scalar(None, pa.string()))


# Metadata fields that name a record's other participants: under `ownership: all-participants` each
# one owns the record (components/bounding/people.py reads them as lists). The mail connector writes
# them as lists; a JSONL/CSV/Parquet source's `--meta to --meta cc` arrive as text (`as_text`).
RECIPIENT_FIELDS = ("to", "cc")


def _recipient_list(raw: str, field: str) -> tuple[str | None, str | None]:
    """One source value of a recipient field → (JSON array text of its participants, None), or
    (None, why the record is quarantined). A JSON array of strings, or one string; each entry is a
    mailbox list (`a@x, "B" <b@y>`) read by the mail connector's rule (an address-like display name
    that differs is ambiguous), or a plain account name (a chat handle) kept as it is."""
    s = raw.strip()
    items: list = [raw]
    if s[:1] in ("[", "{"):
        try:
            parsed = json.loads(s)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return None, f"wrong type: field {field!r} (recipients) is a JSON object, not a list of strings"
        if isinstance(parsed, list):
            for x in parsed:
                if not isinstance(x, str):
                    kind = "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else \
                        {bool: "boolean", dict: "object", list: "array", type(None): "null"}.get(type(x), "value")
                    return None, f"wrong type: field {field!r} (recipients) holds a JSON {kind}, not a string"
            items = parsed
    out: list[str] = []
    for it in items:
        it = it.strip()
        if not it:
            continue
        if "@" not in it and "<" not in it and "\uff20" not in it and "\ufe6b" not in it:
            who = [it]                          # an account name, not an address (chat handles)
        else:
            boxes, why = mailboxes(it)
            if why:
                return None, f"ambiguous recipient: {why} ({field})"
            who = [b.addr for b in boxes]
        out += [w for w in who if w not in out]
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")), None


def _recipients(batch: pa.Table) -> pa.Table:
    """The batch with its recipient metadata columns as JSON array text (see `_recipient_list`),
    and the rows whose recipients are ambiguous or of the wrong type quarantined with the reason.
    Before this, a JSONL `"to": ["b@x"]` was kept as the string '["b@x"]', which the owners column
    cannot read: its recipients owned nothing and were charged nothing."""
    for field in RECIPIENT_FIELDS:
        name = meta_col(field)
        if name not in batch.schema.names:
            continue
        col = batch.column(name)
        if pa.types.is_null(col.type) or col.null_count == len(col):
            continue
        col = col.cast(pa.string())
        fixed: dict[str, str | None] = {}
        why: dict[str, str] = {}
        for v in pc.unique(col).to_pylist():
            if v is None:
                continue
            fixed[v], bad = _recipient_list(v, field)
            if bad:
                why[v] = bad
        idx = pc.index_in(col, value_set=pa.array(list(fixed), pa.string()))
        batch = batch.set_column(batch.schema.get_field_index(name), name,
                                 pc.take(pa.array(list(fixed.values()), pa.string()), idx))
        if why:
            bad_idx = pc.index_in(col, value_set=pa.array(list(why), pa.string()))
            reason = pc.take(pa.array(list(why.values()), pa.string()), bad_idx)
            err = batch.column("error")
            err = err.cast(pa.string()) if pa.types.is_null(err.type) else err
            batch = batch.set_column(batch.schema.get_field_index("error"), "error", pc.coalesce(err, reason))
    return batch


def _person_ids(batch: pa.Table, memo: dict | None = None) -> tuple[pa.Table, pa.Array | None]:
    """The batch with its `user` column under the one identity rule (components.core.identity: case,
    spacing, Unicode form, e-mail address form), so every record's `user_id` is its person's id and
    the catalog counts the people the planner and the ledger count. A user that is nothing under the
    rule becomes '' and is quarantined as a missing user. Also, per row, the source's own spelling
    (trimmed as the stage query trims) where the rule changed it, else null: kept in the record's
    metadata as `account`, so the ledger can find what that spelling was charged before the rule
    (Ledger.link_identities). Each distinct user is mapped once per batch, and once per ingest with
    `memo` (user → (person, account, ambiguity or None); the same source spelling recurs in every
    batch: ~5k users × 24 batches were 120k rule applications on the bench's 1M records)."""
    users = batch.column("user")
    if pa.types.is_null(users.type) or users.null_count == len(users):
        return batch, None

    changed: dict[str, tuple[str, str]] = {}
    ambiguous: dict[str, str] = {}
    if memo is None:
        memo = {}
    elif len(memo) > 1 << 20:   # bounded: a source of millions of distinct spellings stays flat in memory
        memo.clear()
    for u in pc.unique(users).to_pylist():
        if u is None:
            continue
        hit = memo.get(u)
        if hit is None:
            acct, person = u.strip(" "), person_id_or_empty(u)
            hit = memo[u] = (person, acct, _display_conflict(u, person) if person != acct else None)
        person, acct, why = hit
        if person != acct:
            changed[u] = (person, acct)
            if why:
                ambiguous[u] = why
    if ambiguous:
        batch = _quarantine_users(batch, ambiguous)
    if not changed:
        return batch, None
    idx = pc.index_in(users, value_set=pa.array(list(changed), pa.string()))
    persons = pc.coalesce(pc.take(pa.array([v[0] for v in changed.values()], pa.string()), idx), users)
    accounts = pc.take(pa.array([v[1] for v in changed.values()], pa.string()), idx)
    batch = batch.set_column(batch.schema.get_field_index("user"), "user", persons)
    return batch, accounts.combine_chunks() if isinstance(accounts, pa.ChunkedArray) else accounts


def _display_conflict(raw: str, person: str) -> str | None:
    """Why a user field `Display Name <address>` is ambiguous, if it is: its display name holds another
    address (`victim@corp <eve@evil>`): the rule credits the angle address, a reader may credit the
    display name's. The mail connector's rule (catalog/connectors/addresses.py), for every format."""
    if "@" not in person:
        return None
    import unicodedata

    if "<" not in (raw if raw.isascii() else unicodedata.normalize("NFKC", raw)):
        return None

    boxes, why = mailboxes(raw)
    return f"ambiguous user: {why}" if why else None


def _quarantine_users(batch: pa.Table, reasons: dict[str, str]) -> pa.Table:
    """`batch` with `error` set to reasons[user] on the rows of those users (an earlier error stays)."""
    users = batch.column("user")
    idx = pc.index_in(users, value_set=pa.array(list(reasons), pa.string()))
    why = pc.take(pa.array(list(reasons.values()), pa.string()), idx)
    err = batch.column("error")
    err = err.cast(pa.string()) if pa.types.is_null(err.type) else err
    return batch.set_column(batch.schema.get_field_index("error"), "error", pc.coalesce(err, why))


def _with_account(meta: pa.ChunkedArray | pa.Array, accounts: pa.Array) -> pa.Array:
    """`metadata` with `"account": <the source's spelling>` appended where `accounts` has one (a field
    of the source's own named `account` wins: then nothing is added)."""
    vals = meta.to_pylist()
    for i in pc.indices_nonzero(pc.is_valid(accounts)).to_pylist():
        m, a = vals[i], accounts[i].as_py()
        if m is None:
            continue
        if m == "{}":
            vals[i] = "{" + '"account":' + json.dumps(a, ensure_ascii=False) + "}"
        elif '"account"' not in m or "account" not in json.loads(m):     # (the substring test: no parse)
            vals[i] = m[:-1] + ',"account":' + json.dumps(a, ensure_ascii=False) + "}"
    return pa.array(vals, pa.string())


class _Normalizer:
    """Validates and hashes a batch with the stage query, on a private in-memory DuckDB owned by the
    reader thread (the query reads only the batch), so that work overlaps the main thread's."""

    def __init__(self, sql: str, tagger: Tagger, fast: _FastStage | None = None):
        self.sql = sql
        self.tagger = tagger
        self.fast = fast          # the query's plain rows in Arrow kernels (_FastStage), or None
        self.con: duckdb.DuckDBPyConnection | None = None
        self.ids: _RecordIds | None = None
        self.persons: dict = {}   # _person_ids' memo, across the batches of this ingest

    def __call__(self, batch: pa.Table):
        if batch.num_rows == 0:
            return batch, None
        if self.con is None:
            # One thread: a 16 MiB block is one DuckDB task anyway, and its idle workers cost
            # ~1.3 CPU s per 1M records in hand-offs (measured); this runs on its own Python thread.
            self.con = duckdb.connect(config={"threads": 1})
            self.con.execute("SET TimeZone = 'UTC'")
            self.ids = _RecordIds()
        batch, accounts = _person_ids(batch, self.persons)
        batch = _recipients(batch)
        out = self._stage(batch)
        # Dates DuckDB cannot read (RFC 2822, …) are rare: the stage query finds them, and only then
        # are they rewritten (catalog/dates.py) and the batch staged again.
        if pc.any(pc.fill_null(pc.starts_with(out.column("reason"), "bad timestamp"), False)).as_py():
            fixed = self._fix_timestamps(batch)
            if fixed is not batch:
                batch, out = fixed, self._stage(fixed)
        if not pc.all(pc.equal(out.column("seq"), batch.column("seq"))).as_py():  # the row order we rely on
            raise RuntimeError("catalog: DuckDB reordered a batch; refusing to stage it")
        valid = pc.is_null(out.column("reason"))
        if accounts is not None:
            i = out.schema.get_field_index("metadata")
            out = out.set_column(i, "metadata", _with_account(out.column("metadata"), accounts))
        # One array per column: pyarrow.json hands over ~16 chunks a block, and Arrow's RE2 scan pays
        # its DFA's warm-up per call and chunk (measured: a combined block costs about half).
        texts = batch.column("text")
        texts = texts.cast(pa.string()) if pa.types.is_null(texts.type) else texts
        if isinstance(texts, pa.ChunkedArray) and texts.num_chunks != 1:
            texts = texts.combine_chunks()
            # the main thread's tagger gets the one array too (no second 16 MiB copy there)
            batch = batch.set_column(batch.schema.get_field_index("text"), "text", texts)
        out = out.set_column(out.schema.get_field_index("record_id"), "record_id",
                             self.ids(out.column("user_id"), texts, valid.combine_chunks()))
        # The tagger's candidate test (one RE2 alternation), run by Arrow: the same RE2 engine as
        # DuckDB's regexp_matches, a third cheaper on this scan, and it releases the GIL.
        paths = batch.column("path")
        paths = None if pa.types.is_null(paths.type) else paths
        cand = pc.and_(self.tagger.candidate_mask(texts, paths), valid)
        out = out.set_column(out.schema.get_field_index("candidate"), "candidate", pc.fill_null(cand, False))
        return batch, out

    def _stage(self, batch: pa.Table) -> pa.Table:
        if self.fast is not None:
            return self.fast(self.con, self.sql, batch)
        self.con.register("batch", batch)
        try:
            return self.con.sql(self.sql).to_arrow_table()
        finally:
            self.con.unregister("batch")

    def _fix_timestamps(self, batch: pa.Table) -> pa.Table:
        """Values DuckDB's cast cannot read (RFC 2822 and other common forms, catalog/dates.py) are
        rewritten as ISO-8601 before the stage query; the rest stay as they are (one vectorised test)."""
        ts = batch.column("ts")
        if ts.null_count == len(ts):
            return batch
        self.con.register("tsb", pa.table({"i": pa.array(np.arange(len(ts), dtype=np.int64)), "ts": ts}))
        try:
            bad = self.con.sql("SELECT list(i) FROM tsb "
                               "WHERE ts IS NOT NULL AND NOT regexp_full_match(trim(ts), '[0-9]{9,11}(\\.[0-9]+)?') "
                               "AND TRY_CAST(trim(ts) AS TIMESTAMPTZ) IS NULL").fetchall()[0][0]
        finally:
            self.con.unregister("tsb")
        if not bad:
            return batch

        vals = ts.to_pylist()
        for i in bad:
            fixed = parse_timestamp(vals[i])
            if fixed is not None:
                vals[i] = fixed
        return batch.set_column(batch.schema.get_field_index("ts"), "ts", pa.array(vals, pa.string()))

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def _stage_batch(con, batch: pa.Table, out: pa.Table, tagger: Tagger, stage: _StageFile,
                 staged: pq.ParquetWriter | None, dedup: OnlineDedup | None, builder) -> None:
    """Tag a normalized batch, then stage it (`_stage_tagged`)."""
    _stage_tagged(con, batch, out, _tag_batch(batch, out, tagger), stage, staged, dedup, builder)


def _tag_batch(batch: pa.Table, out: pa.Table, tagger: Tagger) -> pa.Table | None:
    """The secret spans of a normalized batch's valid rows (`span_stage`'s columns), or None.

    Online, the tagger reads the batch's own text column through the candidate mask (false on invalid
    rows), not a filtered copy of the texts (a filter copies every text it keeps)."""
    reason = out.column("reason")
    all_valid = reason.null_count == out.num_rows
    if tagger.mask_only:
        spans = tagger.tag(batch.column("text"), batch.column("path"), mask=out.column("candidate"))
        seqs, rids = out.column("seq"), out.column("record_id")
    else:  # rules without a prefilter, or NER, read every row they are given: the valid ones only
        valid = pc.is_null(reason)
        texts, paths, cand = batch.column("text"), batch.column("path"), out.column("candidate")
        seqs, rids = out.column("seq"), out.column("record_id")
        if not all_valid:
            texts, paths, cand = texts.filter(valid), paths.filter(valid), cand.filter(valid)
            seqs, rids = seqs.filter(valid), rids.filter(valid)
        spans = tagger.tag(texts, paths, mask=cand)
    if not spans:
        return None
    # only the rows that have spans: a whole column as Python objects cost ~0.3 CPU s per 1M rows
    at = pa.array([s.row for s in spans], pa.int64())
    return _spans_table(spans, seqs.take(at), rids.take(at))


def _stage_tagged(con, batch: pa.Table, out: pa.Table, spans: pa.Table | None, stage: _StageFile,
                  staged: pq.ParquetWriter | None, dedup: OnlineDedup | None, builder) -> None:
    """Keep a normalized batch's bookkeeping in `stage`; its new records go to the snapshot being built
    (online) or its valid rows to the staged file (exact); its secret spans (`_tag_batch`) go to
    `span_stage`. Texts are copied once at most: online, the rows the snapshot gets are picked from
    the batch in one filter (valid and new)."""
    n = out.num_rows
    reason = out.column("reason")
    all_valid = reason.null_count == n
    valid = None if all_valid else pc.is_null(reason)
    rows = pa.table({"seq": out.column("seq"), "record_id": out.column("record_id"), "user_id": out.column("user_id"),
                     "text": batch.column("text"), "source": out.column("source"),
                     "created_at": out.column("created_at"), "metadata": out.column("metadata")},
                    schema=_STAGED)
    if not all_valid and not pc.any(valid).as_py():
        stage.write(out)
        return
    # the recipients' staging reads three short columns: filtered apart from the texts
    bookkeeping = rows.select(["seq", "record_id", "metadata"])
    recipients.stage(con, bookkeeping if all_valid else bookkeeping.filter(valid))
    if staged is not None:
        stage.write(out)
        staged.write_table(rows if all_valid else rows.filter(valid))
    else:
        if all_valid:
            keep, prefix = dedup.keep(rows.column("record_id"))
            known = None
        else:
            at = pc.indices_nonzero(valid).to_numpy()
            keep, prefix = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.uint64)
            k, p = dedup.keep(rows.column("record_id").take(pa.array(at)))
            keep[at[k]] = True
            prefix[at] = p
            known = ~valid.to_numpy(zero_copy_only=False)
        stage.write(out, pa.array(keep, mask=known), pa.array(prefix.view(np.int64), mask=known))
        builder.add_records((rows if keep.all() else rows.filter(pa.array(keep))).drop_columns(["seq"]))
    if spans is not None and spans.num_rows:
        stage.spans.append(spans)


_WORKER: dict = {}   # a shard worker process' state, kept between its parts (_shard_work)


def _shard_work(path: str, start: int, end: int, first: bool, fields: dict, max_record_bytes: int, sql: str,
                rules, ner, part: str, spans_part: str) -> dict:
    """One part of a sharded ingest (catalog/shards.py), in a worker process: the per-record work of
    an ingest — the same steps as `_run`'s pipeline — written to `part` (rows, shards.PART) and
    `spans_part` (_SPANS). Line numbers count from the part's first line."""
    tune_process()   # a worker process lives for its parts only
    conn = JsonlSource(Path(path), FieldMap(**{**fields, "metadata": tuple(fields["metadata"])}),
                       max_line_bytes=max(4 * max_record_bytes, 1 << 16), start=start, end=end, check_mapping=first)
    # A worker runs several parts: the tagger (compiled rules), the normalizer's DuckDB and DataFusion
    # sessions and its person-id memo are made once per process, not once per part.
    key = sha256_json({"sql": sql, "rules": rules, "ner": str(ner)})
    if _WORKER.get("key") != key:
        tagger = Tagger(rules, ner=load_ner(ner)[0])
        _WORKER.update(key=key, tagger=tagger, normalizer=_Normalizer(sql, tagger))
    tagger, norm = _WORKER["tagger"], _WORKER["normalizer"]
    rows = 0
    # Written under partial names and renamed once whole: a worker killed mid-part leaves no file the
    # writer could take for a finished part (it reads only the final names, after the worker's
    # result; shards.partial(), removed like every stage file by the next writer's recover()).
    tmp_part, tmp_spans = shard_mod.partial(part), shard_mod.partial(spans_part)
    with ipc.new_file(tmp_part, shard_mod.PART) as w, ipc.new_file(tmp_spans, _SPANS) as ws:
        # (a lambda: _prefetch closes a transform that has close(); this one serves the next part too)
        for batch, out in _prefetch(_prefetch(conn.batches(), depth=1, name="veil-ingest-parse"),
                                    transform=lambda b: norm(b)):
            rows += batch.num_rows
            if not batch.num_rows:
                continue
            spans = _tag_batch(batch, out, tagger)
            text = batch.column("text")
            cols = [out.column(n) if n != "text" else text for n in shard_mod.PART.names]
            w.write_table(pa.Table.from_arrays([c.cast(f.type) for c, f in zip(cols, shard_mod.PART)],
                                                schema=shard_mod.PART))
            if spans is not None:
                ws.write_table(spans.cast(_SPANS))
    os.replace(tmp_spans, spans_part)
    os.replace(tmp_part, part)      # last: the rows' file names a finished part
    return {"rows": rows, "lines": conn.lines}


def _update_users(con, *, parent_records: int, online: bool = False) -> None:
    """Per-user counts over the new snapshot: the parent's table plus this ingest's new records (their
    lengths were measured while staging), so the merge does not read every text again. A users table
    that does not add up to the parent snapshot is rebuilt from the records instead."""
    have = _one(con, "SELECT coalesce(sum(records), 0) FROM users")
    if have != parent_records:
        con.execute("""CREATE OR REPLACE TABLE users AS SELECT user_id, count(*) AS records,
            sum(length(text)) AS chars, min(created_at) AS first_created_at, max(created_at) AS last_created_at
            FROM records GROUP BY user_id ORDER BY user_id""")
        return
    con.execute(f"""CREATE OR REPLACE TABLE users AS
        WITH n AS (SELECT s.user_id, count(*) AS records, sum(s.chars) AS chars, min(s.created_at) AS f,
                          max(s.created_at) AS l
                   FROM stage s {"WHERE s.kept" if online else "JOIN fresh USING (seq)"} GROUP BY s.user_id)
        SELECT coalesce(u.user_id, n.user_id) AS user_id,
               coalesce(u.records, 0) + coalesce(n.records, 0) AS records,
               (coalesce(u.chars, 0) + coalesce(n.chars, 0))::HUGEINT AS chars,
               least(u.first_created_at, n.f) AS first_created_at, greatest(u.last_created_at, n.l) AS last_created_at
        FROM users u FULL OUTER JOIN n ON u.user_id = n.user_id ORDER BY user_id""")


def _fresh_rows(con, staged_path: Path):
    """The staged rows to add to the catalog (first copy of each record not in it yet, or every copy
    kept with its own id), in source order, with the record ids the merge decided."""
    fresh_t = con.sql("SELECT seq, record_id FROM fresh ORDER BY seq").to_arrow_table()
    fresh = fresh_t.column("seq").to_numpy()
    ids = fresh_t.column("record_id")
    if len(fresh) == 0:
        return
    for batch in pq.ParquetFile(staged_path).iter_batches(batch_size=65_536):
        seq = batch.column("seq").to_numpy()
        pos = np.searchsorted(fresh, seq).clip(max=len(fresh) - 1)
        keep = fresh[pos] == seq
        if keep.any():
            t = pa.Table.from_batches([batch]).filter(pa.array(keep)).drop_columns(["seq"])
            rid = ids.take(pa.array(pos[keep]))
            yield t.set_column(t.schema.get_field_index("record_id"), "record_id", rid)


def _prefetch(it, depth: int = 2, transform=None, name: str = "veil-ingest-reader"):
    """Run a connector (and `transform` on each item) in a background thread, `depth` batches ahead:
    parsing, validating and hashing (pyarrow, DuckDB, zlib, git: all release the GIL) overlap tagging
    and writing of the previous batch."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def work():
        try:
            for item in it:
                if transform is not None:
                    item = transform(item)
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, raised there
            q.put(e)

    t = threading.Thread(target=work, name=name, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            t.join(timeout=0.05)
        for obj in (it, transform):
            close = getattr(obj, "close", None)
            if close is not None:
                close()


def _one(con, q: str):
    return con.sql(q).fetchall()[0][0]


def _merge(con: duckdb.DuckDBPyConnection, settings: Settings, tagger: Tagger, builder, staged_path: Path | None,
           latest: tuple[str, str] | None, *, read: int, ingest_id: str, source: Path, fmt: str, source_sha: str,
           source_key: str, options: dict, started: datetime, dedup: OnlineDedup | None = None,
           stage_rows: pa.Table | None = None) -> IngestReport:
    staged_rows = _one(con, "SELECT count(*) FROM stage")
    if staged_rows != read:  # a bug, not bad input: never report counts that do not add up
        raise RuntimeError(f"catalog: the source offered {read} records but {staged_rows} were staged")
    quarantined = _one(con, "SELECT count(*) FROM stage WHERE reason IS NOT NULL")
    if options.get("keep_duplicates"):
        # Every copy is kept; the k-th extra copy of a record gets its own id, sha256(id + "#k").
        con.execute("""CREATE OR REPLACE TEMP TABLE firsts AS SELECT seq,
            CASE WHEN k = 0 THEN record_id ELSE sha256(record_id || '#' || k::VARCHAR) END AS record_id
            FROM (SELECT seq, record_id, row_number() OVER (PARTITION BY record_id ORDER BY seq) - 1 AS k
                  FROM stage WHERE reason IS NULL)""")
        accepted = _one(con, "SELECT count(*) FROM firsts")
        # Counted, not a remainder: valid rows that are not the kept copy of their record.
        duplicates = _one(con, "SELECT count(*) FROM stage s WHERE reason IS NULL "
                               "AND NOT EXISTS (SELECT 1 FROM firsts f WHERE f.seq = s.seq)")
    elif staged_path is None:
        # Online: the pipeline decided which rows are new (`kept`, by 64-bit id prefixes) and counted
        # this source's distinct prefixes. Checked exactly here, in bounded memory: every dropped row
        # must be a copy of the row or catalog record that made its prefix known (dedup.py). Before,
        # a DuckDB GROUP BY over every record id held ~1 GB at 10M records.
        valid = _one(con, "SELECT count(*) FROM stage WHERE reason IS NULL")
        kept = _one(con, "SELECT count(*) FROM stage WHERE kept")
        if kept != builder.added or not verify_dropped(stage_rows, dedup.parent_records):
            raise _PrefixCollision()
        accepted, duplicates = dedup.distinct, valid - dedup.distinct
    else:
        con.execute("CREATE OR REPLACE TEMP TABLE firsts AS SELECT record_id, min(seq) AS seq, count(*) AS copies "
                    "FROM stage WHERE reason IS NULL GROUP BY record_id")
        # Counted, not a remainder: each record's copies beyond the kept one, from the same grouping
        # (an anti-join of every valid row against `firsts` counted the same rows at ~3× the CPU of
        # the grouping itself: the merge's costliest query on 1M records).
        accepted, duplicates = con.sql("SELECT count(*), coalesce(sum(copies - 1), 0) FROM firsts").fetchall()[0]
    if read != accepted + quarantined + duplicates:
        raise RuntimeError(f"catalog: read {read} != accepted {accepted} + quarantined {quarantined} "
                           f"+ duplicates {duplicates}")
    users = _one(con, "SELECT count(DISTINCT user_id) FROM stage WHERE reason IS NULL")
    reasons = dict(con.sql("SELECT regexp_replace(reason, ':.*', '') AS r, count(*) FROM stage "
                           "WHERE reason IS NOT NULL GROUP BY r ORDER BY r").fetchall())
    if accepted == 0:
        # Nothing usable is a wrong source or mapping, not a success: nothing is written.
        first = con.sql("SELECT coalesce(locator, 'line ' || line::VARCHAR), reason FROM stage "
                        "WHERE reason IS NOT NULL ORDER BY seq LIMIT 1").fetchall()
        why = f"; first: {first[0][0]}: {first[0][1][:120]}" if first else ""
        raise VeilError(f"{source}: nothing accepted ({read} records read, {quarantined} quarantined: "
                        + ", ".join(f"{k} {v}" for k, v in reasons.items()) + f"){why}; nothing written"
                        if read else f"{source}: nothing accepted: no records in the source; nothing written")
    con.execute("BEGIN TRANSACTION")
    try:
        if staged_path is None:   # the rows written (checked above): a view, not a copy of their ids
            con.execute("CREATE OR REPLACE TEMP VIEW fresh AS SELECT seq, record_id FROM stage WHERE kept")
            new = builder.added
        else:
            con.execute("CREATE OR REPLACE TEMP TABLE fresh AS SELECT f.seq, f.record_id FROM firsts f "
                        "ANTI JOIN records r ON r.record_id = f.record_id")
            new = _one(con, "SELECT count(*) FROM fresh")
        if options.get("keep_duplicates"):  # spans follow each copy's own id
            con.execute("""CREATE OR REPLACE TEMP TABLE new_spans AS SELECT DISTINCT f.record_id, p.secret_id,
                p.secret_class, p.detector, p.detector_version, p."start", p."end"
                FROM span_stage p JOIN firsts f ON p.seq = f.seq""")
        else:  # a copy's spans are its first's: DISTINCT folds them (a view: one copy of the spans fewer)
            con.execute("""CREATE OR REPLACE TEMP VIEW new_spans AS SELECT DISTINCT record_id, secret_id,
                secret_class, detector, detector_version, "start", "end" FROM span_stage""")
        tagged = _one(con, "SELECT count(DISTINCT record_id) FROM new_spans")
        con.execute("""CREATE OR REPLACE TEMP TABLE add_spans AS SELECT n.* FROM new_spans n ANTI JOIN secret_spans s
            ON s.record_id = n.record_id AND s.secret_id = n.secret_id AND s.detector = n.detector
            AND s.detector_version = n.detector_version AND s."start" = n."start" AND s."end" = n."end" """)
        new_spans = _one(con, "SELECT count(*) FROM add_spans")
        con.execute(f"INSERT INTO secret_spans SELECT *, {_q(ingest_id)} FROM add_spans")
        con.execute(f"""INSERT INTO secrets SELECT secret_id, min(secret_class), {_q(ingest_id)} FROM add_spans a
            WHERE NOT EXISTS (SELECT 1 FROM secrets s WHERE s.secret_id = a.secret_id) GROUP BY secret_id""")
        con.execute(f"""INSERT INTO quarantine
            SELECT {_q(source_key)}, {_q(ingest_id)}, {_q(str(source))},
                   coalesce(locator, 'line ' || line::VARCHAR), line, byte_offset, reason, raw
            FROM stage s WHERE reason IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM quarantine q WHERE q.source_key = {_q(source_key)}
                AND q.position = coalesce(s.locator, 'line ' || s.line::VARCHAR) AND q.reason = s.reason)""")
        # A dropped copy's recipients join its kept copy's (all-participants owners; catalog/recipients.py).
        if not options.get("keep_duplicates"):
            builder.recipient_patches = recipients.patches(con)
        if new or new_spans or latest is None or builder.recipient_patches:
            if staged_path is not None and new:
                for t in _fresh_rows(con, staged_path):
                    builder.add_records(t)
            snap = builder.finish(con)
            store.point_records_view(con, settings, snap["snapshot_id"])
            if new:
                _update_users(con, parent_records=0 if latest is None else
                              _one(con, f"SELECT records FROM snapshots WHERE snapshot_id = {_q(latest[0])}"),
                              online=staged_path is None)
        else:
            builder.abort()
            snap = {"snapshot_id": latest[0], "sha256": latest[1]}
        snap_id, snap_sha = snap["snapshot_id"], snap["sha256"]
        if "records" in snap:  # counted while the snapshot was cut: not read again in this serial step
            n_records, n_users = snap["records"], snap["users"]
        else:
            n_records, n_users = con.sql("SELECT count(*), count(DISTINCT user_id) FROM records").fetchall()[0]
        con.execute(_INSERT_INGEST, [ingest_id, source_key, str(source), fmt, source_sha,
                                     json.dumps(options, sort_keys=True), tagger.rules_sha256, started,
                                     datetime.now(timezone.utc), read, accepted, new, quarantined, duplicates, users,
                                     snap_id, tagged])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    snap_mod.mark_committed(settings, snap_id)
    return IngestReport(snapshot_id=snap_id, sha256=snap_sha, read=read, accepted=accepted, quarantined=quarantined,
                        duplicates=duplicates, users=users, records=n_records, seconds=0.0, new=new,
                        snapshot_users=n_users, new_spans=new_spans, tagged_records=tagged, source=str(source),
                        format=fmt, source_sha256=source_sha, ingest_id=ingest_id, quarantine_reasons=reasons,
                        recipients_merged=builder.patched)


class _Progress:
    def __init__(self, conn):
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        unit = getattr(conn, "progress_unit", "bytes")
        count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
        self.p = Progress(TextColumn("ingest {task.description}"), BarColumn(), count, TextColumn(unit if unit != "bytes" else ""),
                          TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.task = self.p.add_task(conn.path.name, total=getattr(conn, "progress_total", None))
        self.p.start()

    def advance(self, conn) -> None:
        self.p.update(self.task, completed=getattr(conn, "progress_done", 0))

    def stop(self) -> None:
        self.p.stop()


def _progress(enabled: bool, conn):
    return _Progress(conn) if enabled else None
