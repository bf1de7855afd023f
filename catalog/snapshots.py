"""Immutable Parquet snapshots of the catalog, named by their content.

    snap = load_snapshot(settings)            # the latest; or load_snapshot(settings, "snap-…")
    snap.snapshot_id, snap.sha256             # sha256 = of manifest.json's bytes (what certificates cite)
    snap.records, snap.secret_spans           # pa.Tables (catalog/schemas.py)

Layout: `snapshots/<snapshot_id>/{records.parquet, secret_spans.parquet, manifest.json}`. Every
snapshot holds the whole catalog: its parent's records, then the new ones in source order. Files are
written deterministically (fixed row groups), and the id is a hash of their sha256s, so the same
content gets the same id; re-ingesting a source adds nothing and cuts no new snapshot. A
snapshot is written into a temporary folder and renamed into place, never modified afterwards;
loading checks every file against the manifest's sha256. `snapshots/LATEST` names the newest.
Readers never open the DuckDB catalog, so they never wait for a writer.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from catalog import recipients
from catalog.schemas import RECORDS, SECRET_SPANS
from components.core.errors import VeilError
from components.core.hashing import sha256_file
from components.core.settings import Settings

SCHEMA = "veil.snapshot/v1"
_BATCH = 65_536
_UNIQUE_COLUMNS = ("record_id", "text")
_SPANS_ORDER = 'record_id, "start", "end", secret_id, detector, detector_version'


@dataclass
class Snapshot:
    snapshot_id: str
    sha256: str
    path: Path
    manifest: dict

    @cached_property
    def records(self) -> pa.Table:
        return pq.read_table(self.path / "records.parquet", schema=RECORDS)

    @cached_property
    def secret_spans(self) -> pa.Table:
        return pq.read_table(self.path / "secret_spans.parquet", schema=SECRET_SPANS)

    @property
    def records_file(self) -> Path:
        return self.path / "records.parquet"

    @property
    def secret_spans_file(self) -> Path:
        return self.path / "secret_spans.parquet"

    def to_dict(self) -> dict:
        return {"snapshot_id": self.snapshot_id, "sha256": self.sha256, "path": str(self.path), **self.manifest}


class _HashingFile:
    """A file being written that hashes its bytes as they go: the snapshot's sha256 is known when the
    writer thread closes it, not read back in the ingest's serial end (~0.2 s a GB of text at 1M
    records, seconds at 10M)."""

    def __init__(self, path: Path):
        self._f = open(path, "wb")
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self._h.update(data)
        self.size += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class RowGroupWriter:
    """Streams tables into one Parquet file in fixed-size row groups of one chunk each, so equal content
    gives equal bytes whatever the chunking of the tables it is handed."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        # No dictionary for columns whose values hardly repeat (ids, texts): Parquet would build one per
        # row group only to drop it past its size limit (measured: ~10 % of the writer's CPU, and no
        # smaller file). The same settings always: equal content still gives equal bytes.
        dict_cols = [n for n in schema.names if n not in _UNIQUE_COLUMNS]
        self._sink = _HashingFile(path)
        self._w = pq.ParquetWriter(pa.PythonFile(self._sink, mode="w"), schema, compression="zstd",
                                   use_dictionary=dict_cols)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0

    def write(self, batch) -> None:
        if batch.num_rows == 0:
            return
        t = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        self._pending.append(t.cast(self.schema))
        self._pending_rows += t.num_rows
        while self._pending_rows >= _BATCH:
            tab = pa.concat_tables(self._pending)
            head, rest = tab.slice(0, _BATCH), tab.slice(_BATCH)
            # One array per column: Parquet cuts a page at each input chunk, so without this the bytes
            # (and the snapshot id) would depend on how the connector happened to batch the rows.
            self._w.write_table(head.combine_chunks(), row_group_size=_BATCH)
            self.rows += head.num_rows
            self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> dict:
        if self._pending:
            tab = pa.concat_tables(self._pending)
            self._w.write_table(tab.combine_chunks(), row_group_size=_BATCH)
            self.rows += tab.num_rows
            self._pending = []
        self._w.close()
        self._sink.close()
        return {"sha256": self._sink.hexdigest(), "bytes": self.path.stat().st_size, "rows": self.rows}


def _write(batches, schema: pa.Schema, path: Path) -> dict:
    w = RowGroupWriter(path, schema)
    for b in batches:
        w.write(b)
    return w.close()


class SnapshotBuilder:
    """A new snapshot being written: the parent's records, then records added as they stream in.

    Records are encoded and compressed in a writer thread (in arrival order), so that work overlaps
    the next batch's parsing and hashing. Nothing is visible until `finish` renames the folder into
    place; `abort` removes it."""

    def __init__(self, settings: Settings, *, ingest_id: str, parent: str | None):
        self.settings, self.ingest_id, self.parent = settings, ingest_id, parent
        self.tmp = settings.snapshots_dir / f".tmp-{ingest_id}"
        self._records: RowGroupWriter | None = None
        self.added = 0
        self._q: queue.Queue = queue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # record_id → grown To/Cc lists (catalog/recipients.py), applied when the snapshot is finished
        self.recipient_patches: dict[str, dict[str, list[str]]] = {}
        self.patched = 0

    def _writer(self) -> None:
        failed = False
        while True:
            item = self._q.get()
            if item is None:
                return
            if failed:
                continue  # keep draining so the producer never blocks
            try:
                self._open().write(item)
            except BaseException as e:  # handed to the producer at its next call
                self._error, failed = e, True

    def _join(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def _open(self) -> RowGroupWriter:
        if self._records is None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)
            self._records = RowGroupWriter(self.tmp / "records.parquet", RECORDS)
            if self.parent is not None:
                for b in pq.ParquetFile(self.settings.snapshots_dir / self.parent / "records.parquet").iter_batches(_BATCH):
                    self._records.write(b)
        return self._records

    def add_records(self, table) -> None:
        if self._error is not None:
            self._join()
        if table.num_rows:
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="veil-snapshot-writer", daemon=True)
                self._thread.start()
            self._q.put(table)
            self.added += table.num_rows

    def abort(self) -> None:
        try:
            self._join()
        except BaseException:  # noqa: BLE001 - already failing; the folder goes anyway
            pass
        if self._records is not None:
            try:
                self._records._w.close()
                self._records._sink.close()
            except Exception:  # noqa: BLE001 - already failing; the folder goes anyway
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _rewrite_patched(self, path: Path) -> dict:
        """Rewrite the records file with the patched records' metadata (rare: only when a dropped copy
        of a record named recipients its kept copy lacks). Same row groups, same order."""
        out = path.with_name("records.patched.parquet")
        w = RowGroupWriter(out, RECORDS)
        for b in pq.ParquetFile(path).iter_batches(_BATCH):
            t, n = recipients.apply(pa.Table.from_batches([b]), self.recipient_patches)
            self.patched += n
            w.write(t)
        info = w.close()
        os.replace(out, path)  # (a hard link to the parent's file is replaced, never written through)
        return info

    def finish(self, con) -> dict:
        """Write the catalog's spans, the manifest; rename into place; record it in `snapshots`."""
        try:
            return self._finish(con)
        except BaseException:
            self.abort()
            raise

    def _finish(self, con) -> dict:
        settings, tmp, parent, ingest_id = self.settings, self.tmp, self.parent, self.ingest_id
        self._join()
        if self._records is None and parent is not None:
            # No new records (only new spans): the parent's file is reused as is — hard-linked, it is
            # read-only and its bytes are exactly what a copy would write.
            tmp.mkdir(parents=True, exist_ok=True)
            src = settings.snapshots_dir / parent / "records.parquet"
            try:
                os.link(src, tmp / "records.parquet")
            except OSError:
                shutil.copy2(src, tmp / "records.parquet")
            rows = pq.ParquetFile(tmp / "records.parquet").metadata.num_rows
            files = {"records.parquet": {"sha256": sha256_file(tmp / "records.parquet"),
                                         "bytes": (tmp / "records.parquet").stat().st_size, "rows": rows}}
        else:
            files = {"records.parquet": self._open().close()}
        if self.recipient_patches:
            files["records.parquet"] = self._rewrite_patched(tmp / "records.parquet")
        files["secret_spans.parquet"] = _write(
            con.sql('SELECT record_id, secret_id, secret_class, detector, detector_version, "start", "end" '
                    f"FROM secret_spans ORDER BY {_SPANS_ORDER}").to_arrow_reader(_BATCH),
            SECRET_SPANS, tmp / "secret_spans.parquet")
        # The id names the content: both files are written deterministically (fixed row groups, fixed order).
        content = hashlib.sha256(f"{SCHEMA}\n{files['records.parquet']['sha256']}\n"
                                 f"{files['secret_spans.parquet']['sha256']}\n".encode()).hexdigest()
        snapshot_id = f"snap-{content[:16]}"
        rec = str(tmp / "records.parquet").replace("'", "''")
        users = con.sql(f"SELECT count(DISTINCT user_id) FROM read_parquet('{rec}')").fetchall()[0][0]
        secrets, tagged = con.sql("SELECT count(DISTINCT secret_id), count(DISTINCT record_id) FROM secret_spans").fetchall()[0]
        counts = {"records": files["records.parquet"]["rows"], "users": users,
                  "spans": files["secret_spans.parquet"]["rows"], "secrets": secrets, "tagged_records": tagged}
        manifest = {
            "schema": SCHEMA,
            "snapshot_id": snapshot_id,
            "content_sha256": content,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "parent": parent,
            "ingest_id": ingest_id,
            "files": files,
            "counts": counts,
            "columns": {"records": RECORDS.names, "secret_spans": SECRET_SPANS.names},
            "records_order": "the parent snapshot's records, then each ingest's new records in source order",
            "offsets": "secret span start/end are code-point offsets into text: text[start:end]",
        }
        final = settings.snapshots_dir / snapshot_id
        if (final / "manifest.json").is_file():
            # Same content already written (e.g. a run that crashed before its commit): reuse it.
            old = json.loads((final / "manifest.json").read_text())
            if old.get("content_sha256") != content:
                raise VeilError(f"snapshot {snapshot_id}: existing folder holds different content; move it away")
            shutil.rmtree(tmp, ignore_errors=True)
            manifest = old
        else:
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            for f in tmp.iterdir():
                if f.stat().st_mode & 0o277:
                    os.chmod(f, 0o400)  # read-only, and the owner's only (snapshots hold people's text)
            shutil.rmtree(final, ignore_errors=True)  # a folder without a manifest is an unfinished write
            os.replace(tmp, final)
        sha = sha256_file(final / "manifest.json")
        c = manifest["counts"]
        con.execute("INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [snapshot_id, sha, manifest["content_sha256"], datetime.now(timezone.utc), str(final), c["records"],
                     c["users"], c["spans"], c["secrets"], parent, ingest_id])
        return {"snapshot_id": snapshot_id, "sha256": sha, "records": c["records"], "users": c["users"]}


def write_snapshot(con, settings: Settings, *, ingest_id: str, parent: str | None, new_records=None) -> dict:
    """Cut a snapshot: the parent's records followed by `new_records` (Arrow tables/batches with the
    records columns), and every span of the catalog. Returns its catalog row."""
    b = SnapshotBuilder(settings, ingest_id=ingest_id, parent=parent)
    try:
        for t in new_records or ():
            b.add_records(t)
    except BaseException:
        b.abort()
        raise
    return b.finish(con)


def latest_in_catalog(con) -> tuple[str, str] | None:
    row = con.sql("SELECT snapshot_id, sha256 FROM snapshots ORDER BY created_at DESC LIMIT 1").fetchall()
    return (row[0][0], row[0][1]) if row else None


def snapshot_dir_ok(settings: Settings, latest: tuple[str, str]) -> bool:
    m = settings.snapshots_dir / latest[0] / "manifest.json"
    return m.is_file() and sha256_file(m) == latest[1]


def set_latest(settings: Settings, snapshot_id: str) -> None:
    p = settings.snapshots_dir / "LATEST"
    tmp = p.with_name(f".LATEST.{os.getpid()}")
    tmp.write_text(snapshot_id + "\n")
    os.replace(tmp, p)


_COMMITTED = "COMMITTED"


def _committed_path(settings: Settings) -> Path:
    return settings.snapshots_dir / _COMMITTED


def committed_ids(settings: Settings) -> set[str] | None:
    """Snapshots whose catalog transaction committed (None: a catalog older than this list)."""
    p = _committed_path(settings)
    if not p.is_file():
        return None
    return {x.strip() for x in p.read_text().splitlines() if x.strip()}


def _write_committed(settings: Settings, ids) -> None:
    p = _committed_path(settings)
    tmp = p.with_name(f".{_COMMITTED}.{os.getpid()}")
    tmp.write_text("".join(f"{i}\n" for i in sorted(ids)))
    os.replace(tmp, p)


def mark_committed(settings: Settings, snapshot_id: str) -> None:
    """After the catalog's COMMIT: the snapshot becomes visible (listed) and the latest. A kill between
    the folder's rename and the commit leaves a folder that is never listed; `recover` removes it."""
    ids = committed_ids(settings) or set()
    if snapshot_id not in ids:
        _write_committed(settings, ids | {snapshot_id})
    set_latest(settings, snapshot_id)


def recover(con, settings: Settings) -> dict:
    """Clean a crashed writer's leftovers; call holding the writer lock. The catalog's `snapshots`
    table is the truth: temporary folders (raw text of an unfinished snapshot) and snapshot folders
    it does not name (renamed into place, never committed) are removed; the committed list and LATEST
    are rewritten from it. Returns what was removed."""
    removed = {"temporary": 0, "uncommitted": 0, "staged": 0}
    d = settings.snapshots_dir
    if not d.is_dir():
        return removed
    known = {r[0] for r in con.sql("SELECT snapshot_id FROM snapshots").fetchall()}
    for f in d.iterdir():
        if f.name.startswith(".tmp-") and f.is_dir():
            _rmtree(f)
            removed["temporary"] += 1
        elif f.is_dir() and f.name.startswith("snap-") and f.name not in known:
            _rmtree(f)
            removed["uncommitted"] += 1
    staged = settings.cache_dir / "ingest-tmp"
    if staged.is_dir():
        for f in [*staged.glob("*.parquet"), *staged.glob("*.stage.arrow")]:
            f.unlink(missing_ok=True)
            removed["staged"] += 1
    present = {k for k in known if (d / k / "manifest.json").is_file()}
    if committed_ids(settings) != present:
        _write_committed(settings, present)
    latest = latest_in_catalog(con)
    if latest is not None and (d / latest[0]).is_dir():
        cur = (d / "LATEST").read_text().strip() if (d / "LATEST").is_file() else None
        if cur != latest[0]:
            set_latest(settings, latest[0])
    return removed


def _rmtree(p: Path) -> None:
    # Snapshot files are made read-only; the folder itself is writable, so removal works.
    shutil.rmtree(p, ignore_errors=True)


def latest_snapshot_id(settings: Settings) -> str:
    p = settings.snapshots_dir / "LATEST"
    if not p.is_file():
        raise VeilError(f"{settings.snapshots_dir}: no snapshot yet; run `veil ingest` first")
    try:
        sid = p.read_bytes().decode("ascii").strip()
    except UnicodeDecodeError:
        sid = ""
    if not sid or "/" in sid or sid.startswith("."):
        raise VeilError(f"{p}: garbled (it should hold the latest snapshot's id); the next `veil ingest` "
                        "rewrites it from the catalog, or name one with --snapshot (veil catalog snapshots)")
    return sid


def load_snapshot(settings: Settings, snapshot_id: str | None = None, *, verify: bool = True) -> Snapshot:
    """A snapshot by id (the latest when None). With `verify`, every file must match the manifest."""
    sid = snapshot_id or latest_snapshot_id(settings)
    d = settings.snapshots_dir / sid
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise VeilError(f"snapshot {sid!r}: not found under {settings.snapshots_dir}")
    restore = f"restore the folder {d} from a backup, or ingest the sources again into a fresh VEIL_HOME"
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # (JSONDecodeError is a ValueError)
        raise VeilError(f"{mpath}: not valid JSON ({e}); {restore}") from None
    except OSError as e:
        raise VeilError(f"{mpath}: cannot be read ({e.strerror or e})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA or manifest.get("snapshot_id") != sid \
            or not isinstance(manifest.get("files"), dict):
        raise VeilError(f"{mpath}: not a {SCHEMA} manifest for {sid}; {restore}")
    if verify:
        for name, info in manifest["files"].items():
            f = d / name
            if not f.is_file():
                raise VeilError(f"snapshot {sid}: {name} is missing; {restore}")
            try:
                ok = isinstance(info, dict) and sha256_file(f) == info.get("sha256")
            except OSError as e:
                raise VeilError(f"{f}: cannot be read ({e.strerror or e})") from None
            if not ok:
                raise VeilError(f"{f}: does not match its manifest sha256 (modified or damaged); {restore}")
    return Snapshot(snapshot_id=sid, sha256=sha256_file(mpath), path=d, manifest=manifest)


def list_snapshots(settings: Settings) -> list[dict]:
    """Every committed snapshot on disk (newest first), from the manifests alone. A folder whose catalog
    transaction never committed (a kill at the rename) is not listed."""
    out = []
    committed = committed_ids(settings)
    if settings.snapshots_dir.is_dir():
        for m in settings.snapshots_dir.glob("snap-*/manifest.json"):
            if committed is None and not (settings.snapshots_dir / "LATEST").is_file():
                continue  # nothing committed yet: a folder here is a crashed first ingest's
            if committed is not None and m.parent.name not in committed:
                continue
            try:
                doc = json.loads(m.read_text())
            except json.JSONDecodeError:
                continue
            out.append({"snapshot_id": doc.get("snapshot_id"), "sha256": sha256_file(m),
                        "created_at": doc.get("created_at"), **doc.get("counts", {})})
    return sorted(out, key=lambda d: d.get("created_at") or "", reverse=True)
