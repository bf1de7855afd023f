"""A plan's rows as columns: people and their distinct texts as integer codes (no per-row Python).

The splits (audit_split, eval_split) and the selection decide person by person; what they need of
the rows is who each row belongs to, which of that person's distinct texts it holds, and the
smallest record id holding each (person, text) — the deterministic representative the attacker and
evaluation files name. These are computed here with Arrow's hash kernels and numpy sorts, once for
all rows, so that memory stays a few integers per row and time is set by C loops, not Python.

Orders are Python's: Arrow compares strings as UTF-8 bytes, which for valid UTF-8 (all Arrow strings
are) is the order of code points, i.e. `sorted()` on the same `str`s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def as_array(values) -> pa.Array | pa.ChunkedArray:
    """An Arrow string column of `values` (an Arrow array, or a sequence of strings)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    return pa.array(list(values), pa.string())


def codes(values) -> tuple[np.ndarray, pa.Array]:
    """(code per row, distinct values in first-appearance order): values == distinct.take(code).

    One hash pass (Arrow's dictionary encoding, whose chunks share one dictionary); codes are int32
    (Arrow's dictionary index type), four bytes a row."""
    values = as_array(values)
    enc = pc.dictionary_encode(values)
    chunks = enc.chunks if isinstance(enc, pa.ChunkedArray) else [enc]
    if not chunks:
        return np.empty(0, np.int32), pa.array([], values.type)
    dictionary = chunks[-1].dictionary
    shared = dictionary.buffers()
    if any(c.dictionary.buffers() != shared and not c.dictionary.equals(dictionary) for c in chunks):
        # an Arrow whose chunks carry their own dictionaries: one table-wide dictionary instead
        enc = pa.table({"v": enc}).unify_dictionaries()["v"]
        chunks, dictionary = enc.chunks, enc.chunks[-1].dictionary
    code = np.concatenate([np.asarray(c.indices.to_numpy(zero_copy_only=False)) for c in chunks]).astype(np.int32,
                                                                                                         copy=False)
    return code, dictionary


@dataclass(frozen=True)
class Texts:
    """The distinct (person, content) pairs of a set of rows, numbered in (person code, content)
    order: a person's pairs are consecutive and sorted by content, as `sorted()` sorts them."""
    group: np.ndarray        # per row: its pair's index
    person: np.ndarray       # per pair: the person's code (ascending)
    rep_row: np.ndarray      # per pair: the row holding its smallest record id

    def rep(self, record_id, pairs: np.ndarray) -> pa.Array:
        """The representative record ids of `pairs`."""
        return take(record_id, self.rep_row[pairs])


_SLICE = 1 << 18     # rows whose texts are compared at a time (bounds the copies)


def texts(person: np.ndarray, content, record_id) -> Texts:
    """Group rows by (person code, content); each pair is represented by its smallest record id.

    One stable Arrow sort by (person, content, record id) — strings compared in place, no copy of the
    texts — puts each pair's rows together with its smallest id first; neighbouring contents are then
    compared a slice at a time."""
    n = len(person)
    content = as_array(content)
    order = pc.sort_indices(pa.table({"p": pa.array(person), "t": content, "r": as_array(record_id)}),
                            sort_keys=[("p", "ascending"), ("t", "ascending"), ("r", "ascending")])
    order = np.asarray(order.to_numpy(), np.int64)
    sp = person[order]
    new = np.empty(n, bool)
    if n:
        new[0] = True
        np.not_equal(sp[1:], sp[:-1], out=new[1:])
    for a in range(0, max(n - 1, 0), _SLICE):
        b = min(a + _SLICE, n - 1)
        t = take(content, order[a:b + 1])
        same = pc.equal(t.slice(1), t.slice(0, b - a)).to_numpy(zero_copy_only=False)
        new[a + 1:b + 1] |= ~same
    starts = np.flatnonzero(new)
    gtype = np.int32 if len(starts) < 2 ** 31 else np.int64
    group = np.empty(n, gtype)
    group[order] = (np.cumsum(new) - 1).astype(gtype)
    return Texts(group=group, person=sp[starts], rep_row=order[starts])


def take(values, idx: np.ndarray) -> pa.Array:
    """values[idx] as one Arrow array.

    A chunked column is taken chunk by chunk: Arrow's `take` on a chunked string column first
    concatenates every chunk (a copy of the whole column) — at 10⁷ people, gigabytes for a few rows."""
    values = as_array(values)
    idx = np.asarray(idx, np.int64)
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks == 1:
            values = values.chunk(0)
        elif values.num_chunks == 0:
            return pa.array([], values.type)
        else:
            bounds = np.cumsum([0] + [len(c) for c in values.chunks])
            which = np.searchsorted(bounds, idx, side="right") - 1
            order = np.argsort(which, kind="stable")
            counts = np.bincount(which, minlength=values.num_chunks)
            pieces, at = [], 0
            for c, cnt in enumerate(counts):
                if cnt:
                    sel = idx[order[at:at + cnt]] - bounds[c]
                    pieces.append(values.chunk(c).take(pa.array(sel)))
                    at += cnt
            taken = pa.concat_arrays(pieces) if pieces else pa.array([], values.type)
            if np.all(order[:-1] < order[1:]):
                return taken
            back = np.empty(len(order), np.int64)
            back[order] = np.arange(len(order))
            return taken.take(pa.array(back))
    return values.take(pa.array(idx))


def take_rows(table: pa.Table, idx: np.ndarray) -> pa.Table:
    """`table.take(idx)`, batch by batch (Arrow's table take concatenates each chunked column first)."""
    idx = np.asarray(idx, np.int64)
    order = None
    if len(idx) > 1 and np.any(idx[1:] < idx[:-1]):
        order = np.argsort(idx, kind="stable")
        idx = idx[order]
    out, start = [], 0
    for batch in table.to_batches():
        lo, hi = np.searchsorted(idx, [start, start + batch.num_rows])
        if hi > lo:
            out.append(batch.take(pa.array(idx[lo:hi] - start)))
        start += batch.num_rows
    result = pa.Table.from_batches(out, schema=table.schema)
    if order is None:
        return result
    back = np.empty(len(order), np.int64)
    back[order] = np.arange(len(order))
    return result.take(pa.array(back))


_CHECK_SLICE = 1 << 20     # neighbouring rows compared at a time by `is_sorted` (bounds the masks)


def is_sorted(table: pa.Table, keys) -> bool:
    """Whether `table`'s rows are already in ascending order of the columns `keys` (strings by UTF-8
    bytes, as `sort_by` orders them), ties in any order. A few comparison kernels over neighbouring rows:
    at 10⁷ people checking costs a tenth of sorting again (issue 27). Columns with nulls count as unsorted
    (the caller sorts, and `sort_by` places nulls as it always has)."""
    n = table.num_rows
    cols = [table.column(k) for k in keys]
    if any(c.null_count for c in cols):
        return False
    for a in range(0, max(n - 1, 0), _CHECK_SLICE):
        m = min(_CHECK_SLICE, n - 1 - a)
        ok = None                  # row i ≤ row i+1 in key order, built from the last key outwards
        for c in reversed(cols):
            x, y = c.slice(a, m), c.slice(a + 1, m)
            ok = pc.less_equal(x, y) if ok is None else pc.or_(pc.less(x, y), pc.and_(pc.equal(x, y), ok))
        if not pc.all(ok).as_py():
            return False
    return True


def sort_rows(table: pa.Table, keys) -> pa.Table:
    """`table.sort_by` ascending on `keys`, or `table` itself when its rows are in that order already:
    a stable sort of sorted rows is the identity, so the result is the same rows either way."""
    if is_sorted(table, keys):
        return table
    return table.sort_by([(k, "ascending") for k in keys])


def distinct_count(values) -> int:
    """`pc.count_distinct(values)` (nulls not counted). On a column already in ascending order (the
    planner's training rows: `sort_rows`), the number of runs: two comparison kernels over neighbours
    instead of a hash table of every value (at 10⁷ people, ≈ 10 CPU s each time, issue 27)."""
    values = as_array(values)
    n = len(values)
    if n == 0 or values.null_count or not pa.types.is_string(values.type):
        return int(pc.count_distinct(values).as_py())
    runs = 1
    for a in range(0, n - 1, _CHECK_SLICE):
        m = min(_CHECK_SLICE, n - 1 - a)
        x, y = values.slice(a, m), values.slice(a + 1, m)
        if not pc.all(pc.less_equal(x, y)).as_py():
            return int(pc.count_distinct(values).as_py())
        runs += int(pc.sum(pc.not_equal(x, y).cast(pa.int64())).as_py() or 0)
    return runs


def sorted_strings(values: pa.Array) -> list[str]:
    """`sorted(values)` for an Arrow string array (no nulls), as a Python list."""
    if len(values) == 0:
        return []
    return values.take(pc.sort_indices(values)).to_pylist()
