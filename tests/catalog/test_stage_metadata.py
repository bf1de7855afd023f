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


def _odd_batch() -> pa.Table:
    """Rows of every kind the stage query tells apart: plain ones, and each way a row is not plain."""
    rows = [  # user, text, ts, source, error, raw, team, to
        ("a@x.example", "hello", "1767225600", None, None, None, "blue", None),
        ("b@x.example", "héllo ☃ wörld", "176722560", "chat", None, None, "", '["c@x.example"]'),
        ("c@x.example", "x" * 40, "17672256001", "mail", None, None, 'a"b\\c', None),   # oversized; to_json escapes
        (" d@x.example", "lead space", None, None, None, None, "ünï\u2028", None),
        ("e@x.example\u3000", "ideographic space", None, None, None, None, None, None),
        (None, "orphan", "1767225600", None, None, None, "blue", None),
        ("", "empty user", None, None, None, None, None, None),
        ("f@x.example", None, None, None, None, None, None, None),
        ("g@x.example", " \n\t", None, None, None, None, None, None),
        ("h@x.example", " starts blank", "2026-01-02T03:04:05Z", " chat ", None, None, "x\x01y", None),
        ("i@x.example", "iso date", "2026-01-02 03:04:05+02:00", "", None, None, "</script>", None),
        ("j@x.example", "fraction", "1767225600.25", None, None, None, None, None),
        ("k@x.example", "padded", " 1767225600 ", None, None, None, None, None),
        ("l@x.example", "eight digits", "17672256", None, None, None, None, None),
        ("m@x.example", "not a date", "yesterday", None, None, None, None, None),
        ("n@x.example", "bad line", None, None, "malformed JSON: x", b"{oops", None, None),
        ("o@x.example", "tab\tinside", "1767225600", "chat", None, None, "😀", '["p@x.example","q"]'),
    ]
    n = len(rows)
    cols = {f.name: pa.nulls(n, f.type) for f in RAW}
    cols.update({"seq": pa.array(range(n), pa.int64()), "line": pa.array(range(1, n + 1), pa.int64()),
                 "offset": pa.array([10 * i for i in range(n)], pa.int64()),
                 "user": pa.array([r[0] for r in rows], pa.string()), "text": pa.array([r[1] for r in rows], pa.string()),
                 "ts": pa.array([r[2] for r in rows], pa.string()), "source": pa.array([r[3] for r in rows], pa.string()),
                 "error": pa.array([r[4] for r in rows], pa.string()),
                 "source_id": pa.array([f"id{i}" if i % 3 else None for i in range(n)])})
    t = pa.table(cols)
    t = t.append_column("raw", pa.array([r[5] for r in rows], pa.binary()))
    t = t.append_column(meta_col("team"), pa.array([r[6] for r in rows], pa.string()))
    return t.append_column(meta_col("to"), pa.array([r[7] for r in rows], pa.string()))


def test_the_fast_stage_path_gives_the_query_s_output_row_for_row():
    """_FastStage (Arrow kernels for plain rows, the query for the rest) against the stage query
    alone, byte for byte, over rows of every kind, in pieces (the two merges: a few odd rows, and a
    batch with more odd rows than the per-row merge takes)."""
    from catalog.ingest import _FastStage, _meta_pairs

    batch = _odd_batch()
    for with_source_id, with_path in ((False, True), (True, False)):
        meta = ("team", "to")
        sql = _stage_sql(meta, True, "jsonl", "ts", "user", "text", 32, with_source_id=with_source_id,
                         with_path=with_path)
        con = duckdb.connect(config={"threads": 1})
        con.execute("SET TimeZone = 'UTC'")
        con.register("batch", batch)
        want = con.sql(sql).to_arrow_table()
        con.unregister("batch")
        fast = _FastStage(_meta_pairs(meta, with_source_id, with_path), ["to"], "jsonl", 32)
        for max_slow in (64, 2):
            fast._MAX_SLOW = max_slow
            got = fast(con, sql, batch)
            assert got.schema == want.schema
            assert got.to_pylist() == want.to_pylist()
            # the plain rows alone (no query at all) and one odd row among them
            plain = batch.take([0, 1, 16])
            con.register("batch", plain)
            want_plain = con.sql(sql).to_arrow_table()
            con.unregister("batch")
            assert fast(con, sql, plain).to_pylist() == want_plain.to_pylist()
        assert want.column("reason").null_count > 3 and want.column("reason").null_count < len(batch) - 3
