"""Online within-source dedup against the catalog, in bounded memory.

Record ids are sha256 hex strings; the first 64 bits of each ("prefixes") are kept in sorted uint64
runs: the parent snapshot's, and this source's. A row is written to the new snapshot iff it is the
first copy in this source of an id whose prefix is not known. A prefix collision can only make this
drop a record it should keep — never keep a duplicate — so the merge checks every dropped row
against the full id of the row or catalog record that made its prefix known (`verify_dropped`)
and redoes the ingest with exact dedup when one differs.

Memory: runs larger than `spill_rows` prefixes live in files in the ingest's temporary folder,
memory-mapped (file-backed pages the kernel may drop, not the heap), and are merged chunk by chunk;
the heap holds O(spill_rows) prefixes whatever the source's size (bench/ingest.py --big measures it).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i

SPILL_ROWS = 1 << 19   # a run of more prefixes than this (4 MiB) goes to a memory-mapped file
_CHUNK = 1 << 20       # prefixes merged (or ids checked) per step


def prefix64(record_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The first 64 bits of each hex sha256 record id, as uint64 (vectorised)."""
    arr = record_ids.combine_chunks() if isinstance(record_ids, pa.ChunkedArray) else record_ids
    if not pa.types.is_string(arr.type):
        arr = arr.cast(pa.string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + n + 1]
    if not np.all(np.diff(offs) == 64):
        raise RuntimeError("catalog: record ids are not 64-character sha256 hex strings")
    nib = _HEX[np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offs[0]:offs[-1]].reshape(n, 64)[:, :16]]
    packed = np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2])  # (n, 8) bytes, big-endian order
    return packed.view(">u8").reshape(n).astype(np.uint64)


class SortedRuns:
    """A set of uint64 as a few sorted runs: a new run is merged into the one before it once it is at
    least half that one's size (a binary counter), so there are O(log n) runs and each value is
    copied O(log n) times. One array re-merged whole with every batch cost O(n) a batch — O(n²) an
    ingest. Runs past `spill_rows` values are written to files under `spill` (names starting with
    `spill`'s name) and memory-mapped; merges of those go chunk by chunk into a new file."""

    def __init__(self, spill: Path | None = None, spill_rows: int | None = None):
        self.runs: list[np.ndarray] = []
        self.spill, self.spill_rows = spill, SPILL_ROWS if spill_rows is None else spill_rows
        self._files: dict[int, Path] = {}      # id(run) -> its file
        self._names = itertools.count()
        self.size = 0

    def contains(self, q: np.ndarray) -> np.ndarray:
        """Which of `q` (sorted) are in the set."""
        known = np.zeros(len(q), dtype=bool)
        for run in self.runs:
            if len(run) == 0 or len(q) == 0:
                continue
            pos = np.searchsorted(run, q).clip(max=len(run) - 1)
            known |= np.asarray(run[pos]) == q
        return known

    def add(self, run: np.ndarray) -> None:
        """Add a sorted run (of values not in the set, or a parent's values: duplicates only cost room)."""
        if len(run) == 0:
            return
        self.size += len(run)
        self.runs.append(self._keep(run))
        while len(self.runs) > 1 and 2 * len(self.runs[-1]) >= len(self.runs[-2]):
            b, a = self.runs.pop(), self.runs.pop()
            self.runs.append(self._merge(a, b))
            self._drop(a)
            self._drop(b)

    def _keep(self, run: np.ndarray) -> np.ndarray:
        if self.spill is None or len(run) <= self.spill_rows:
            return run
        out = self._new_file(len(run))
        out[:] = run
        return self._reopen(out)

    def _new_file(self, n: int) -> np.memmap:
        path = self.spill.with_name(f"{self.spill.name}-{next(self._names)}.stage.arrow")
        m = np.memmap(path, dtype=np.uint64, mode="w+", shape=(n,))
        self._files[id(m)] = path
        return m

    def _reopen(self, m: np.memmap) -> np.ndarray:
        path = self._files.pop(id(m))
        m.flush()
        del m
        r = np.memmap(path, dtype=np.uint64, mode="r")
        self._files[id(r)] = path
        return r

    def _drop(self, run: np.ndarray) -> None:
        path = self._files.pop(id(run), None)
        if path is not None:
            path.unlink(missing_ok=True)   # (the mapping goes with the last reference)

    def _merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        n = len(a) + len(b)
        if self.spill is None or n <= self.spill_rows:
            merged = np.concatenate([a, b])
            merged.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
            return merged
        out = self._new_file(n)
        i = j = k = 0
        while i < len(a) or j < len(b):
            ca, cb = np.asarray(a[i:i + _CHUNK]), np.asarray(b[j:j + _CHUNK])
            more_a, more_b = i + len(ca) < len(a), j + len(cb) < len(b)
            # up to the smaller of the two chunks' last values where a chunk has more after it: every
            # value at or below it is in these chunks
            lims = [c[-1] for c, more in ((ca, more_a), (cb, more_b)) if more and len(c)]
            if lims:
                lim = min(lims)
                ta, tb = np.searchsorted(ca, lim, "right"), np.searchsorted(cb, lim, "right")
            else:
                ta, tb = len(ca), len(cb)
            m = np.concatenate([ca[:ta], cb[:tb]])
            m.sort(kind="stable")
            out[k:k + len(m)] = m
            i, j, k = i + ta, j + tb, k + len(m)
        return self._reopen(out)

    def close(self) -> None:
        self.runs = []
        for path in self._files.values():
            path.unlink(missing_ok=True)
        self._files.clear()


class OnlineDedup:
    """Decides, batch by batch, which valid rows are new to the catalog: the first copy in this source of
    a record whose id is not in the parent snapshot. Keeps the parent's prefixes and this source's
    distinct ones (SortedRuns; bounded heap with `spill`), and counts this source's distinct prefixes
    (`distinct`: its accepted records, when no prefix collides — which the merge checks)."""

    def __init__(self, parent_records: Path | None, spill: Path | None = None, spill_rows: int | None = None):
        self.parent_records = parent_records
        self.parent = SortedRuns(spill.with_name(spill.name + "-parent") if spill else None, spill_rows)
        self.seen = SortedRuns(spill.with_name(spill.name + "-seen") if spill else None, spill_rows)
        self.distinct = 0
        if parent_records is not None:
            for b in pq.ParquetFile(parent_records).iter_batches(batch_size=self.parent.spill_rows,
                                                                 columns=["record_id"]):
                self.parent.add(np.unique(prefix64(b.column(0))))

    def keep(self, record_ids) -> tuple[np.ndarray, np.ndarray]:
        """(which rows to write, the rows' prefixes)."""
        p = prefix64(record_ids)
        mask = np.zeros(len(p), dtype=bool)
        if len(p) == 0:
            return mask, p
        uniq, first = np.unique(p, return_index=True)
        new_here = ~self.seen.contains(uniq)
        fresh = uniq[new_here]
        self.distinct += len(fresh)
        mask[first[new_here & ~self.parent.contains(uniq)]] = True
        self.seen.add(fresh)   # sorted: np.unique's order
        return mask, p

    def close(self) -> None:
        self.parent.close()
        self.seen.close()


def verify_dropped(stage: pa.Table, parent_records: Path | None, chunk: int | None = None) -> bool:
    """Whether every valid row the online dedup dropped is a true copy: its full record id is the id of
    a kept row of this source or of a parent record with the same prefix (then the prefixes decided
    exactly as full ids would), and no two of those owners share a prefix (then `distinct` counted
    ids). `stage`: the ingest's rows in source order, with `reason`, `kept`, `prefix` (uint64 as
    int64) and `record_id`. False: a collision — redo with exact dedup. Works through the dropped
    rows `chunk` at a time (one pass over the kept rows' prefixes and the parent's ids each), so the
    heap stays bounded whatever the source's size."""
    chunk = chunk or _CHUNK
    pending: list[pa.Table] = []
    n = 0
    for b in stage.select(["reason", "kept", "prefix", "record_id"]).to_batches(max_chunksize=chunk):
        t = pa.Table.from_batches([b])
        drop = pc.and_(pc.is_null(t.column("reason")), pc.invert(pc.fill_null(t.column("kept"), False)))
        d = t.filter(drop).select(["prefix", "record_id"])
        if d.num_rows:
            pending.append(d)
            n += d.num_rows
        if n >= chunk:
            if not _check(pa.concat_tables(pending), stage, parent_records, chunk):
                return False
            pending, n = [], 0
    return _check(pa.concat_tables(pending), stage, parent_records, chunk) if pending else True


def _check(dropped: pa.Table, stage: pa.Table, parent_records: Path | None, chunk: int) -> bool:
    want = np.unique(dropped.column("prefix").to_numpy().view(np.uint64))
    owners: list[pa.Array] = []

    def gather(prefixes: np.ndarray, ids) -> None:
        pos = np.searchsorted(want, prefixes).clip(max=len(want) - 1)
        hit = want[pos] == prefixes
        if hit.any():
            owners.append(ids.filter(pa.array(hit)))

    for b in stage.select(["kept", "prefix", "record_id"]).to_batches(max_chunksize=chunk):
        k = pc.fill_null(b.column(0), False)
        t = pa.Table.from_batches([b]).filter(k)
        if t.num_rows:
            gather(t.column("prefix").to_numpy().view(np.uint64), t.column("record_id").combine_chunks())
    if parent_records is not None:
        for b in pq.ParquetFile(parent_records).iter_batches(batch_size=chunk, columns=["record_id"]):
            ids = b.column(0)
            gather(prefix64(ids), ids.cast(pa.string()))
    own = pa.chunked_array(owners, pa.string()) if owners else pa.chunked_array([], pa.string())
    own = pc.unique(own)
    if len(own) != len(want) or len(np.unique(prefix64(own))) != len(own):
        return False   # a dropped prefix without an owner, or two owners sharing a prefix
    return bool(pc.all(pc.is_in(dropped.column("record_id"), value_set=own)).as_py())
