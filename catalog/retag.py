"""Re-tag the whole catalog under new rules (a changed policy): spans are replaced, records never touched.

    report = retag(settings, "policies/demo.yaml")

Every record of the latest snapshot is tagged with the new rules (paths for `path_glob` come from the
record's `metadata.path`); `secret_spans` and `secrets` are replaced in one transaction and a new
snapshot is cut whose records file is the previous one, hard-linked (same bytes, so certificates that
cite old snapshots stay valid and the new snapshot costs no copy). Same rules, same spans: no new
snapshot, the current id comes back.
"""
from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from catalog import snapshots as snap_mod
from catalog import store
from catalog.tagging import Tagger
from components.core.errors import VeilError
from components.core.settings import Settings


def retag(settings: Settings, rules: Sequence[dict] | str | Path | None, *, progress: bool = False) -> dict:
    t0 = time.perf_counter()
    tagger = Tagger(rules)
    ingest_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-retag-" + uuid.uuid4().hex[:6]
    with store.writer(settings) as con:
        latest = snap_mod.latest_in_catalog(con)
        if latest is None:
            raise VeilError(f"{settings.catalog_path}: the catalog is empty; run `veil ingest` first")
        parent = latest[0]
        con.execute("""CREATE OR REPLACE TEMP TABLE retag_spans (record_id VARCHAR, secret_id VARCHAR,
            secret_class VARCHAR, detector VARCHAR, detector_version VARCHAR, "start" BIGINT, "end" BIGINT)""")
        rf = pq.ParquetFile(settings.snapshots_dir / parent / "records.parquet")
        for batch in rf.iter_batches(batch_size=65_536, columns=["record_id", "text", "metadata"]):
            con.register("b", batch)
            try:
                paths = con.sql("SELECT json_extract_string(metadata, '$.path') AS p FROM b").to_arrow_table().column("p")
            finally:
                con.unregister("b")
            spans = tagger.tag(batch.column("text"), paths)
            if not spans:
                continue
            rids = batch.column("record_id").to_pylist()
            sp = pa.table({
                "record_id": [rids[s.row] for s in spans], "secret_id": [s.secret_id for s in spans],
                "secret_class": [s.secret_class for s in spans], "detector": [s.detector for s in spans],
                "detector_version": [s.detector_version for s in spans],
                "start": pa.array([s.start for s in spans], pa.int64()), "end": pa.array([s.end for s in spans], pa.int64())})
            con.register("sp", sp)
            try:
                con.execute("INSERT INTO retag_spans SELECT * FROM sp")
            finally:
                con.unregister("sp")
        key = 'record_id, secret_id, detector, detector_version, "start", "end"'
        changed = con.sql(f"""SELECT count(*) FROM (
            (SELECT {key} FROM retag_spans EXCEPT SELECT {key} FROM secret_spans) UNION ALL
            (SELECT {key} FROM secret_spans EXCEPT SELECT {key} FROM retag_spans))""").fetchall()[0][0]
        n_spans = con.sql("SELECT count(*) FROM retag_spans").fetchall()[0][0]
        if not changed:
            return {"snapshot_id": parent, "sha256": latest[1], "changed": False, "spans": n_spans,
                    "rules_sha256": tagger.rules_sha256, "seconds": round(time.perf_counter() - t0, 3)}
        builder = snap_mod.SnapshotBuilder(settings, ingest_id=ingest_id, parent=parent)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM secret_spans")
            con.execute(f"INSERT INTO secret_spans SELECT DISTINCT *, '{ingest_id}' FROM retag_spans")
            con.execute(f"""CREATE OR REPLACE TABLE secrets AS
                SELECT n.secret_id, n.secret_class, coalesce(o.first_ingest, '{ingest_id}') AS first_ingest
                FROM (SELECT secret_id, min(secret_class) AS secret_class FROM secret_spans GROUP BY secret_id) n
                LEFT JOIN secrets o USING (secret_id) ORDER BY n.secret_id""")
            snap = builder.finish(con)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            builder.abort()
            raise
    snap_mod.mark_committed(settings, snap["snapshot_id"])
    return {**snap, "changed": True, "spans": n_spans, "rules_sha256": tagger.rules_sha256,
            "seconds": round(time.perf_counter() - t0, 3)}
