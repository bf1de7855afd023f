"""The stage query's metadata column: the JSON object of a row's non-null mapped fields, byte for byte
what DuckDB's json_merge_patch('{}', json_object(…)) writes (the expression it replaced for speed:
snapshot ids are content hashes, so the bytes must not drift), and the right object when parsed."""
from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from catalog.connectors.base import meta_col
from catalog.ingest import _stage_sql
from catalog.schemas import RAW

VALUES = ["blue", None, 'a"b\\c', "ünï\u2028 ☃ \x01\t\n", "", "x/y", "😀", "</script>", None]
PATHS = [None, "teams/a/b.txt", None, "ü", "", None, "a", None, None]
META = ("team", 'we"ird ké\\y', "zeta")


def _batch() -> pa.Table:
    n = len(VALUES)
    cols = {f.name: pa.nulls(n, f.type) for f in RAW}
    cols.update({"seq": pa.array(range(n), pa.int64()), "line": pa.array(range(1, n + 1), pa.int64()),
                 "user": pa.array(["u"] * n), "text": pa.array(["hello"] * n), "path": pa.array(PATHS),
                 "source_id": pa.array([f"id{i}" if i % 3 else None for i in range(n)])})
    t = pa.table(cols)
    t = t.append_column("raw", pa.nulls(n, pa.binary()))
    for j, m in enumerate(META):
        t = t.append_column(meta_col(m), pa.array(VALUES[j:] + VALUES[:j]))
    return t


def _run(sql: str, batch: pa.Table) -> list[str]:
    con = duckdb.connect()
    con.register("batch", batch)
    return con.sql(sql).to_arrow_table().column("metadata").to_pylist()


def test_metadata_bytes_match_json_merge_patch_and_hold_the_non_null_fields():
    batch = _batch()
    for with_source_id in (False, True):
        sql = _stage_sql(META, True, "jsonl", None, "user", "text", 1 << 20, with_source_id=with_source_id,
                         with_path=True)
        got = _run(sql, batch)
        keys = (["source_id"] if with_source_id else []) + ["path"] + list(META)
        cols = (["source_id"] if with_source_id else []) + ["path"] + [meta_col(m) for m in META]
        pairs = ", ".join(f"'{k.replace(chr(39), chr(39) * 2)}', \"{c.replace(chr(34), chr(34) * 2)}\""
                          for k, c in zip(keys, cols))
        con = duckdb.connect()
        con.register("batch", batch)
        want = [r[0] for r in con.sql(f"SELECT json_merge_patch('{{}}', json_object({pairs}))::VARCHAR "
                                      "FROM batch ORDER BY seq").fetchall()]
        assert got == want
        rows = batch.to_pylist()
        for row, text in zip(rows, got):
            expect = {k: row[c] for k, c in zip(keys, cols) if row[c] is not None}
            assert json.loads(text) == expect
            assert list(json.loads(text)) == [k for k in keys if k in expect]  # the mapping's order


def test_no_mapped_fields_give_an_empty_object():
    batch = _batch()
    sql = _stage_sql((), True, "jsonl", None, "user", "text", 1 << 20, with_path=False)
    assert set(_run(sql, batch)) == {"{}"}
