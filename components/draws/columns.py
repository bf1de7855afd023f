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
    """(code per row, distinct values in first-appearance order): values == distinct.take(code)."""
    values = as_array(values)
    distinct = pc.unique(values)
    if isinstance(distinct, pa.ChunkedArray):
        distinct = distinct.combine_chunks()
    code = pc.index_in(values, value_set=distinct)
    if isinstance(code, pa.ChunkedArray):
        code = code.combine_chunks() if code.num_chunks != 1 else code.chunk(0)
    return np.asarray(code.to_numpy(zero_copy_only=False), dtype=np.int64), distinct


@dataclass(frozen=True)
class Texts:
    """The distinct (person, content) pairs of a set of rows."""
    group: np.ndarray        # per row: its pair's index
    person: np.ndarray       # per pair: the person's code
    content: np.ndarray      # per pair: the content's code
    rep: pa.Array            # per pair: the smallest record id among the rows holding it


def texts(person: np.ndarray, content: np.ndarray, record_id) -> Texts:
    """Group rows by (person code, content code); each pair's representative is its smallest record id."""
    n_content = int(content.max()) + 1 if len(content) else 1
    key = person * np.int64(n_content) + content
    uniq, group = np.unique(key, return_inverse=True)
    rid = as_array(record_id)
    if len(uniq) == len(key):                 # every row its own pair: no aggregation needed
        order = np.argsort(key, kind="stable")
        rep = (rid.combine_chunks() if isinstance(rid, pa.ChunkedArray) else rid).take(pa.array(order))
    else:
        agg = pa.table({"k": pa.array(key), "r": rid}).group_by("k", use_threads=False).aggregate([("r", "min")])
        order = np.argsort(agg["k"].to_numpy(), kind="stable")
        rep = agg["r_min"].take(pa.array(order))
        if isinstance(rep, pa.ChunkedArray):
            rep = rep.combine_chunks()
    return Texts(group=np.asarray(group, np.int64).ravel(), person=uniq // n_content, content=uniq % n_content,
                 rep=rep)


def take(values, idx: np.ndarray) -> pa.Array:
    """values[idx] as one Arrow array."""
    out = as_array(values).take(pa.array(np.asarray(idx, np.int64)))
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def sorted_strings(values: pa.Array) -> list[str]:
    """`sorted(values)` for an Arrow string array (no nulls), as a Python list."""
    if len(values) == 0:
        return []
    return values.take(pc.sort_indices(values)).to_pylist()
