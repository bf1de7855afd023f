"""Recipients of deduplicated copies: the kept copy of a record takes the union of every copy's To/Cc.

Ingest keeps one copy of a record (its id is sha256(writer ‖ text)) and drops later copies, within a
source and against the catalog. Under `spec.people.ownership: all-participants` a record's owners are
its writer plus the To/Cc addresses in its `metadata` (components/bounding/people.py). A mail sent
twice with the same words to different people would otherwise be owned only by the first copy's
recipients: the second copy's recipients, whose mail it also is, would not be charged for a text
that is trained on (docs/privacy/multi-owner.md §2). So:

- while staging, every valid row whose metadata names `to` or `cc` has its two lists staged
  (`recip_stage`: seq, record_id, to, cc) — mail rows, and JSONL rows mapping such fields; none
  for the rest (one substring test a batch);
- at the merge, for each record some copy of which was not the one written (a later copy in this
  source, or a record the catalog already holds), the kept copy's lists are extended with the
  addresses of the other copies, in source order (the kept copy's own first, then each later copy's
  new ones): deterministic, and re-ingesting adds nothing;
- records whose lists grew get their metadata rewritten in the new snapshot (`patch_metadata`);
  nothing else in the snapshot changes, and no count does (a copy is still a duplicate).

Only list values are merged — what the owners column reads; a non-list `to`/`cc` is left as it is.
"""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

DDL = """
CREATE OR REPLACE TEMP TABLE recip_stage (seq BIGINT, record_id VARCHAR, "to" VARCHAR[], cc VARCHAR[]);
"""

_LISTS = ("""TRY_CAST(json_extract(metadata, '$.to') AS VARCHAR[]) AS "to", """
          """TRY_CAST(json_extract(metadata, '$.cc') AS VARCHAR[]) AS cc""")


def stage(con, rows: pa.Table) -> None:
    """Stage the To/Cc lists of `rows` (seq, record_id, metadata: valid rows) that name any."""
    meta = rows.column("metadata")
    if meta.null_count == len(meta) or not _may_name(meta):
        return
    has = pc.fill_null(pc.or_(pc.match_substring(meta, '"to"'), pc.match_substring(meta, '"cc"')), False)
    if not pc.any(has).as_py():
        return
    sub = rows.select(["seq", "record_id", "metadata"]).filter(has)
    con.register("rc", sub)
    try:
        con.execute(f"""INSERT INTO recip_stage SELECT seq, record_id, "to", cc FROM (
            SELECT seq, record_id, {_LISTS} FROM rc) WHERE "to" IS NOT NULL OR cc IS NOT NULL""")
    finally:
        con.unregister("rc")


def _may_name(meta) -> bool:
    """Whether any metadata text of the column holds '"to"' or '"cc"': one scan of its bytes
    (most sources map no recipient field, and then the per-row test cost ~0.14 CPU s per 1M
    records). A buffer may hold bytes outside the column's slice: a false yes, never a false no."""
    for chunk in (meta.chunks if isinstance(meta, pa.ChunkedArray) else [meta]):
        data = chunk.buffers()[2] if len(chunk) else None
        if data is not None:
            raw = data.to_pybytes()   # (a copy, then two memchr-fast scans: a fifth of one regex scan)
            if b'"to"' in raw or b'"cc"' in raw:
                return True
    return False


def _union(lists) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for lst in lists:
        for a in lst or ():
            if a not in seen:
                seen.add(a)
                out.append(a)
    return out


def patches(con) -> dict[str, dict[str, list[str]]]:
    """record_id → the grown lists ({"to": […], "cc": […]}) for each record whose kept copy lacks an
    address another copy has. Needs `fresh` (seq, record_id: the copies written) and the `records`
    view (the parent snapshot)."""
    # (most sources name no recipients: then no join with `fresh`, which is every row written)
    if not con.sql("SELECT 1 FROM recip_stage LIMIT 1").fetchall():
        return {}
    # Records with a copy that was not written (a later copy, or one the catalog already holds).
    others = con.sql("""SELECT r.record_id, list(r."to" ORDER BY r.seq), list(r.cc ORDER BY r.seq)
        FROM recip_stage r WHERE NOT EXISTS (SELECT 1 FROM fresh f WHERE f.seq = r.seq)
        GROUP BY r.record_id""").fetchall()
    if not others:
        return {}
    con.register("pk", pa.table({"record_id": pa.array([o[0] for o in others], pa.string())}))
    try:
        # The kept copy's lists: the copy written now, or the catalog's.
        kept = {rid: (to, cc) for rid, to, cc in con.sql(f"""
            SELECT r.record_id, r."to", r.cc FROM recip_stage r JOIN fresh f ON f.seq = r.seq
            WHERE r.record_id IN (SELECT record_id FROM pk)
            UNION ALL
            SELECT record_id, {_LISTS} FROM records WHERE record_id IN (SELECT record_id FROM pk)
            """).fetchall()}
    finally:
        con.unregister("pk")
    out: dict[str, dict[str, list[str]]] = {}
    for rid, tos, ccs in others:
        k_to, k_cc = kept.get(rid, (None, None))
        new_to, new_cc = _union([k_to, *tos]), _union([k_cc, *ccs])
        if new_to != list(k_to or []) or new_cc != list(k_cc or []):
            out[rid] = {"to": new_to, "cc": new_cc}
    return out


def patch_metadata(metadata: str | None, lists: dict[str, list[str]]) -> str:
    """`metadata` (a JSON object) with its `to`/`cc` lists replaced by `lists` (empty ones left out);
    a non-list value already there is kept."""
    try:
        obj = json.loads(metadata) if metadata else {}
    except ValueError:
        obj = {}
    if not isinstance(obj, dict):
        obj = {}
    for key in ("to", "cc"):
        if lists.get(key) and (key not in obj or isinstance(obj[key], list)):
            obj[key] = lists[key]
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def apply(table: pa.Table, patch: dict[str, dict[str, list[str]]]) -> tuple[pa.Table, int]:
    """`table` (records columns) with the metadata of the patched records rewritten; how many."""
    if not patch or table.num_rows == 0:
        return table, 0
    hit = pc.is_in(table.column("record_id"), value_set=pa.array(list(patch), pa.string()))
    idx = pc.indices_nonzero(pc.fill_null(hit, False)).to_pylist()
    if not idx:
        return table, 0
    rids = table.column("record_id").take(pa.array(idx)).to_pylist()
    meta = table.column("metadata").to_pylist()
    for i, rid in zip(idx, rids):
        meta[i] = patch_metadata(meta[i], patch[rid])
    col = table.schema.get_field_index("metadata")
    return table.set_column(col, table.schema.field(col), pa.array(meta, table.schema.field(col).type)), len(idx)
