"""The DuckDB catalog file and its single-writer lock.

One writer at a time: the writer takes an exclusive `flock` on `catalog.duckdb.lock` before it opens the
database, so a second writer (another process, or another open in this one) fails at once with a clear
`VeilError` naming the holder — before it could touch the file. DuckDB's own file lock backs this up
(a foreign process holding the file, e.g. a DuckDB shell, is reported the same way). All of an
ingest's changes are one transaction: a crash leaves the catalog as it was.

Readers do not open the catalog: they read immutable snapshots (catalog/snapshots.py).
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb

from catalog.schemas import DDL, EMPTY_RECORDS_VIEW
from components.core.errors import VeilError
from components.core.settings import Settings


def lock_path(settings: Settings) -> Path:
    return settings.catalog_path.with_name(settings.catalog_path.name + ".lock")


@contextmanager
def writer(settings: Settings, *, memory_limit: str = "1GB") -> Iterator[duckdb.DuckDBPyConnection]:
    """Exclusive read-write connection to the catalog (creates it and its tables on first use)."""
    settings.ensure()
    lp = lock_path(settings)
    fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            try:
                info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
                holder = f" (pid {info.get('pid')}, since {info.get('since')})"
            except (ValueError, OSError):
                pass
            raise VeilError(f"{settings.catalog_path}: another writer holds the catalog{holder}; "
                            "wait for it to finish and retry") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
        try:
            con = duckdb.connect(str(settings.catalog_path))
        except duckdb.IOException as e:
            if "lock" in str(e).lower():
                raise VeilError(f"{settings.catalog_path}: the catalog file is open in another process; "
                                "close it and retry") from None
            raise VeilError(f"{settings.catalog_path}: cannot open the catalog: {e}") from None
        try:
            tmp = settings.cache_dir / "duckdb-tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            con.execute("SET TimeZone = 'UTC'")
            con.execute(f"SET memory_limit = '{memory_limit}'")
            con.execute(f"SET temp_directory = '{str(tmp).replace(chr(39), chr(39) * 2)}'")
            con.execute("SET preserve_insertion_order = true")
            con.execute(DDL)
            point_records_view(con, settings)
            yield con
        finally:
            con.close()
    finally:
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def point_records_view(con, settings: Settings, snapshot_id: str | None = None) -> None:
    """(Re)create the `records` view over a snapshot's records.parquet (the latest in the catalog by default)."""
    if snapshot_id is None:
        row = con.sql("SELECT snapshot_id FROM snapshots ORDER BY created_at DESC LIMIT 1").fetchall()
        snapshot_id = row[0][0] if row else None
    if snapshot_id is None:
        con.execute(EMPTY_RECORDS_VIEW)
        return
    f = settings.snapshots_dir / snapshot_id / "records.parquet"
    if not f.is_file():
        # Never fall back to an empty view: the next ingest would cut a snapshot without these records.
        raise VeilError(f"{f}: the catalog's latest snapshot {snapshot_id} is missing its records; restore "
                        f"{settings.snapshots_dir / snapshot_id} before writing to the catalog")
    con.execute("CREATE OR REPLACE VIEW records AS SELECT * FROM read_parquet('" + str(f).replace("'", "''") + "')")


@contextmanager
def reader(settings: Settings) -> Iterator[duckdb.DuckDBPyConnection]:
    """Read-only connection to the catalog; a clear error while a writer holds it."""
    if not settings.catalog_path.is_file():
        raise VeilError(f"{settings.catalog_path}: no catalog yet; run `veil ingest` first")
    try:
        con = duckdb.connect(str(settings.catalog_path), read_only=True)
    except duckdb.IOException as e:
        if "lock" in str(e).lower():
            raise VeilError(f"{settings.catalog_path}: a writer holds the catalog; retry when it is done "
                            "(snapshots stay readable meanwhile)") from None
        raise VeilError(f"{settings.catalog_path}: cannot open the catalog: {e}") from None
    try:
        con.execute("SET TimeZone = 'UTC'")
        yield con
    finally:
        con.close()


def read_quarantine(settings: Settings, *, limit: int | None = None, source_key: str | None = None) -> list[dict]:
    """Quarantined rows (newest ingest first, then by position), raw bytes as text with replacements."""
    with reader(settings) as con:
        where = "WHERE source_key = ?" if source_key else ""
        q = (f"SELECT source, position, line, byte_offset, reason, raw, ingest_id FROM quarantine {where} "
             f"ORDER BY ingest_id DESC, line NULLS LAST, position" + (f" LIMIT {int(limit)}" if limit else ""))
        rows = con.execute(q, [source_key] if source_key else []).fetchall()
    return [{"source": s, "position": p, "line": ln, "byte_offset": off, "reason": r,
             "raw": (raw or b"").decode("utf-8", "replace"), "ingest_id": i}
            for s, p, ln, off, r, raw, i in rows]
