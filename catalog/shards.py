"""A sharded ingest: one JSONL file read by several worker processes, staged by one writer.

    veil ingest org/messages.jsonl --format jsonl --shards 4

One process parses, validates, hashes and tags about 70–80k records per CPU second; past that a
source waits on one core. Here the file is cut at line starts into byte ranges ("parts"), a pool of
`--shards` processes (spawned: no DuckDB or thread state is forked) runs the per-record work on
each range — parse, validate, record ids, candidate test, tagging (catalog/ingest.py, `_Normalizer`,
`_tag_batch`) — and writes the results to an uncompressed Arrow file per part in the ingest's
temporary folder. The catalog writer (this process, holding the catalog's one-writer lock the
whole time) reads the parts back memory-mapped, in source order, shifting each part's line numbers
by the lines before it, and stages them exactly as an unsharded ingest stages its batches:
within-source dedup, the new snapshot, quarantine and spans in one transaction. So a sharded ingest
writes the same snapshot, record ids, quarantine and counts as an unsharded one (a test compares
them), and the ingest's `options` do not name the shard count (re-ingesting either way is the same
source).

The workers are spawned, so a script that calls `ingest_source(..., shards=N)` needs Python's
`if __name__ == "__main__":` guard (a spawned process imports the main module); `veil ingest` has it.
`keep_duplicates` works the same sharded (the exact path stages the parts' valid rows).

Only uncompressed JSONL is cut this way (a gzip stream has no byte ranges). There are more parts
than workers (`PARTS_PER_WORKER` each, of at least `MIN_PART_BYTES`), so the writer starts on the
first part while the workers are still on later ones. Part files hold people's text: they live in
the private cache, are removed as soon as they are staged, and a crashed ingest's are removed by
the next writer (catalog/snapshots.py, recover).
"""
from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from catalog.connectors.base import GZIP_MAGIC, FieldMap
from components.core.errors import VeilError

PARTS_PER_WORKER = 4
MIN_PART_BYTES = 8 << 20

# What a part holds per row: the stage query's output (catalog/ingest.py, _stage_sql) and the text.
PART = pa.schema([("seq", pa.int64()), ("line", pa.int64()), ("byte_offset", pa.int64()), ("locator", pa.string()),
                  ("user_id", pa.string()), ("reason", pa.string()), ("record_id", pa.string()), ("raw", pa.binary()),
                  ("source", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")), ("metadata", pa.string()),
                  ("chars", pa.int64()), ("candidate", pa.bool_()), ("text", pa.string())])


def check(source: Path, fmt: str, shards: int) -> None:
    """`--shards` is a whole number ≥ 1; above 1 only for an uncompressed JSONL file."""
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise VeilError(f"--shards: {shards!r} is not a whole number of processes ≥ 1")
    if shards == 1:
        return
    if fmt != "jsonl":
        raise VeilError(f"--shards: {fmt} sources are read by one process; only a JSONL file is cut into shards")
    with open(source, "rb") as f:
        if f.read(2) == GZIP_MAGIC:
            raise VeilError(f"{source}: --shards needs an uncompressed JSONL file (a gzip stream has no byte "
                            "ranges); decompress it, or ingest it without --shards")


def cut(path: Path, parts: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) covering the file, each starting at a line start (after a newline):
    about equal sizes; fewer ranges where a line is longer than a range."""
    size = path.stat().st_size
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, parts):
            at = max(size * k // parts, bounds[-1])
            if at >= size:
                break
            f.seek(at)
            while True:  # to the next newline (a long line: read on in 1 MiB steps)
                chunk = f.read(1 << 20)
                if not chunk:
                    at = size
                    break
                nl = chunk.find(b"\n")
                if nl >= 0:
                    at += nl + 1
                    break
                at += len(chunk)
            if at >= size:
                break
            if at > bounds[-1]:
                bounds.append(at)
    bounds.append(size)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a] or [(0, size)]


class ShardedJsonl:
    """The parts of one JSONL file, worked by `workers` processes; `parts()` yields, in source order,
    ("rows", table) and ("spans", table) with line numbers shifted to the whole file's."""

    format = "jsonl"
    default_source = "jsonl"

    def __init__(self, path: Path, fields: FieldMap, *, workers: int, max_record_bytes: int, sql: str, rules,
                 ner, tmp_dir: Path, ingest_id: str, work):
        """`work`: the per-part function run in a worker (catalog/ingest.py, _shard_work: a module-level
        function, which a spawned process imports by name)."""
        self.work = work
        self.path = Path(path)
        self.fields, self.workers, self.max_record_bytes = fields, workers, max_record_bytes
        self.sql, self.rules, self.ner = sql, rules, ner
        self.tmp_dir, self.ingest_id = tmp_dir, ingest_id
        self.ranges = cut(self.path, max(1, min(workers * PARTS_PER_WORKER,
                                                 self.path.stat().st_size // MIN_PART_BYTES)))
        self._sha: str | None = None
        self._sha_error: BaseException | None = None

    @property
    def sha256(self) -> str:
        if self._sha is None:
            raise RuntimeError("catalog: the sharded source's sha256 is known once its parts are read")
        return self._sha

    def _hash(self) -> None:
        try:
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                while chunk := f.read(16 << 20):
                    h.update(chunk)
            self._sha = h.hexdigest()
        except BaseException as e:  # noqa: BLE001 - raised by parts()
            self._sha_error = e

    def _files(self, k: int) -> tuple[Path, Path]:
        # (named *.stage.arrow: a crashed ingest's are removed by the next writer's recover())
        return (self.tmp_dir / f"{self.ingest_id}.part-{k}.stage.arrow",
                self.tmp_dir / f"{self.ingest_id}.spans-{k}.stage.arrow")

    def parts(self):
        hasher = threading.Thread(target=self._hash, name="veil-ingest-sha256", daemon=True)
        hasher.start()
        f = self.fields
        fields = {"user": f.user, "text": f.text, "id": f.id, "time": f.time, "source": f.source, "path": f.path,
                  "metadata": list(f.metadata)}
        # Workers share the machine with this process (the snapshot writer): one fewer than asked
        # would leave a core idle while the parts are worked, so `workers` of them.
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(self.ranges)), mp_context=get_context("spawn"))
        futures = []
        try:
            for k, (a, b) in enumerate(self.ranges):
                part, sp = self._files(k)
                futures.append(pool.submit(self.work, str(self.path), a, b, k == 0, fields, self.max_record_bytes,
                                           self.sql, self.rules, self.ner, str(part), str(sp)))
            lines = 0
            for k, fut in enumerate(futures):
                part, sp = self._files(k)
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    a, b = self.ranges[k]
                    raise VeilError(f"{self.path}: a --shards worker process died while working on bytes {a}-{b} "
                                    "(killed, or out of memory); nothing was written to the catalog; run the "
                                    "ingest again") from None
                if not (part.is_file() and sp.is_file()):   # a finished part is renamed into place whole
                    raise RuntimeError(f"catalog: shard part {k} reported done but its files are missing; "
                                       "refusing to stage")
                try:
                    for name, path in (("rows", part), ("spans", sp)):
                        # (not closed here: the snapshot writer's thread may still hold a batch's mapped
                        # buffers; the mapping goes with the last of them, the file's name at once)
                        r = ipc.open_file(pa.memory_map(str(path)))
                        for i in range(r.num_record_batches):
                            t = pa.Table.from_batches([r.get_batch(i)])
                            if lines:
                                t = _shift(t, lines, ("seq", "line") if name == "rows" else ("seq",))
                            yield name, t
                finally:
                    part.unlink(missing_ok=True)
                    sp.unlink(missing_ok=True)
                lines += res["lines"]
        finally:
            for fut in futures:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            for k in range(len(self.ranges)):
                for p in self._files(k):
                    p.unlink(missing_ok=True)
                    partial(p).unlink(missing_ok=True)
            hasher.join()
        if self._sha_error is not None:
            raise self._sha_error


def partial(path: Path | str) -> Path:
    """Where a worker writes a part before renaming it to `path`: `x.part-3.stage.arrow` →
    `x.part-3.partial.stage.arrow` (still `*.stage.arrow`, so a crashed ingest's are removed by the next
    writer's recover())."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".stage.arrow") + ".partial.stage.arrow")


def _shift(t: pa.Table, by: int, cols) -> pa.Table:
    for c in cols:
        t = t.set_column(t.schema.get_field_index(c), c, pc.add(t.column(c), pa.scalar(by, pa.int64())))
    return t


def default_workers() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
