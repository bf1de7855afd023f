"""Read a plan's data back: the exact rows training may touch, texts joined, hashes checked."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import VeilError
from components.core.hashing import sha256_file


def _checked(path: str, sha256: str, what: str) -> pa.Table:
    if not Path(path).is_file():
        raise VeilError(f"plan: {what} file {path} is missing")
    if sha256_file(path) != sha256:
        raise VeilError(f"plan: {what} file {path} does not match its sha256 in the plan: refusing to use it")
    return pq.read_table(path)


def plan_texts(plan: dict, snapshot_records: pa.Table) -> pa.Table:
    """(record_id, text) for every record a plan can name: the snapshot's plus its canary records."""
    texts = snapshot_records.select(["record_id", "text"])
    aud = plan.get("audit") or {}
    if aud.get("canary_records_file"):
        canary = _checked(aud["canary_records_file"], aud["canary_records_sha256"], "canary records")
        texts = pa.concat_tables([texts, canary.select(["record_id", "text"]).cast(texts.schema)])
    return texts


def train_rows(plan: dict) -> pa.Table:
    """The plan's train records file (record_id, user_id[, rate]), its sha256 checked."""
    data = plan["data"]
    return _checked(data["train_records_file"], data["train_records_sha256"], "train records")


def training_records(plan: dict, snapshot_records: pa.Table) -> pa.Table:
    """(user_id, text[, rate]) of the plan's training rows, sorted by (user_id, record_id).

    Rows keep their multiplicity (group privacy lists resampled records more than once)."""
    data = plan["data"]
    chosen = train_rows(plan)
    chosen = chosen.append_column("_row", pa.array(range(chosen.num_rows), pa.int64()))
    joined = chosen.join(plan_texts(plan, snapshot_records), keys="record_id", join_type="inner")
    if joined.num_rows != chosen.num_rows:
        raise VeilError(f"plan: {chosen.num_rows - joined.num_rows} planned record(s) are missing from snapshot "
                        f"{data['snapshot_id']}")
    joined = joined.sort_by([("user_id", "ascending"), ("record_id", "ascending"), ("_row", "ascending")])
    cols = ["user_id", "text"] + (["rate"] if "rate" in joined.column_names else [])
    return joined.select(cols)
