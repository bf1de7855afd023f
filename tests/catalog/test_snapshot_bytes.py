"""A snapshot's bytes — hence its id — are a function of its content alone: Parquet cuts a page at each
input chunk, so the writer hands it one array per column and row group whatever the batching of the
tables it was given (connector blocks, pyarrow.json chunks, the exact-dedup path's staged file)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from catalog.schemas import RECORDS
from catalog.snapshots import RowGroupWriter


def _write(parts, path: Path) -> str:
    w = RowGroupWriter(path, RECORDS)
    for p in parts:
        w.write(p)
    return w.close()["sha256"]


def test_same_rows_in_other_chunks_give_the_same_bytes(tmp_path):
    n = 70_000  # more than one row group (65,536)
    t = pa.table({"record_id": [f"{i:064x}" for i in range(n)], "user_id": [f"u{i % 97}" for i in range(n)],
                  "text": [("word%d " % (i * 7919 % 1000)) * 12 for i in range(n)], "source": ["s"] * n,
                  "created_at": pa.array([None] * n, pa.timestamp("us", tz="UTC")),
                  "metadata": ["{}"] * n}).cast(RECORDS)
    one = _write([t], tmp_path / "a.parquet")
    sliced = _write([t.slice(i, 3000) for i in range(0, n, 3000)], tmp_path / "b.parquet")
    rechunked = _write([pa.Table.from_batches(t.to_batches(max_chunksize=777))], tmp_path / "c.parquet")
    assert one == sliced == rechunked
