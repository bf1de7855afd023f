"""Read a plan's data back: the exact rows training may touch, texts joined, hashes checked.

The rows live in the plan's private annex (components.planning.annex): every function here takes the
annex from `load_annex(private_dir, plan)`, which has already been checked against the plan.
"""
from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import VeilError
from components.planning.annex import annex_file


def plan_texts(annex: Mapping, snapshot_records: pa.Table) -> pa.Table:
    """(record_id, text) for every record a plan can name: the snapshot's plus its canary records."""
    texts = snapshot_records.select(["record_id", "text"])
    canary = annex_file(annex, "canary_records")
    if canary is not None:
        texts = pa.concat_tables([texts, pq.read_table(canary).select(["record_id", "text"]).cast(texts.schema)])
    return texts


def train_rows(annex: Mapping) -> pa.Table:
    """The plan's train records file (record_id, user_id[, rate]), its sha256 checked."""
    return pq.read_table(annex_file(annex, "train_records"))


def attacker_rows(annex: Mapping) -> pa.Table:
    """The plan's attacker records file (record_id, user_id, member), its sha256 checked."""
    path = annex_file(annex, "attacker_records")
    if path is None:
        raise VeilError("plan annex: no attacker records file; re-plan with audit.holdout_users > 0")
    return pq.read_table(path)


def training_records(plan: Mapping, annex: Mapping, snapshot_records: pa.Table) -> pa.Table:
    """(user_id, text[, rate]) of the plan's training rows, sorted by (user_id, record_id).

    Rows keep their multiplicity (group privacy lists resampled records more than once)."""
    data = plan["data"]
    chosen = train_rows(annex)
    chosen = chosen.append_column("_row", pa.array(range(chosen.num_rows), pa.int64()))
    joined = chosen.join(plan_texts(annex, snapshot_records), keys="record_id", join_type="inner")
    if joined.num_rows != chosen.num_rows:
        raise VeilError(f"plan: {chosen.num_rows - joined.num_rows} planned record(s) are missing from snapshot "
                        f"{data['snapshot_id']}")
    joined = joined.sort_by([("user_id", "ascending"), ("record_id", "ascending"), ("_row", "ascending")])
    cols = ["user_id", "text"] + (["rate"] if "rate" in joined.column_names else [])
    return joined.select(cols)
