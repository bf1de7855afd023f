"""Read a plan's data back: the exact rows training may touch, texts joined, hashes checked."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes


# Schema metadata key carrying the sha256 of the train-records file the table was read from: the
# trainer records it and the certificate checks it against the plan (engine.TRAIN_RECORDS_SHA256_KEY).
TRAIN_RECORDS_SHA256_KEY = b"veil.train_records_sha256"


def _checked(path: str, sha256: str, what: str) -> pa.Table:
    """The file's table, parsed from the very bytes whose sha256 was checked (no second read)."""
    if not Path(path).is_file():
        raise VeilError(f"plan: {what} file {path} is missing")
    data = Path(path).read_bytes()
    if sha256_bytes(data) != sha256:
        raise VeilError(f"plan: {what} file {path} does not match its sha256 in the plan: refusing to use it")
    table = pq.read_table(pa.BufferReader(data))
    return table.replace_schema_metadata({**(table.schema.metadata or {}), b"veil.sha256": sha256.encode()})


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
    read_sha = chosen.schema.metadata[b"veil.sha256"]  # what was actually read, not what the plan says
    chosen = chosen.append_column("_row", pa.array(range(chosen.num_rows), pa.int64()))
    joined = chosen.join(plan_texts(plan, snapshot_records), keys="record_id", join_type="inner")
    if joined.num_rows != chosen.num_rows:
        raise VeilError(f"plan: {chosen.num_rows - joined.num_rows} planned record(s) are missing from snapshot "
                        f"{data['snapshot_id']}")
    joined = joined.sort_by([("user_id", "ascending"), ("record_id", "ascending"), ("_row", "ascending")])
    cols = ["user_id", "text"] + (["rate"] if "rate" in joined.column_names else [])
    return joined.select(cols).replace_schema_metadata({TRAIN_RECORDS_SHA256_KEY: read_sha})
