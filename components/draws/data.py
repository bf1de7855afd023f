"""Read a plan's data back: the exact rows training may touch, texts joined, hashes checked.

The rows live in the plan's private annex (components.draws.annex): every function here takes the
annex from `load_annex(private_dir, plan)`, which has already been checked against the plan.
"""
from __future__ import annotations

from pathlib import Path
from typing import Collection, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.draws.annex import annex_file, plan_snapshot_ref
from components.bounding.owners import owner_set

# Schema metadata key carrying the sha256 of the train-records file the table was read from: the
# trainer records it and the certificate checks it against the plan (engine.TRAIN_RECORDS_SHA256_KEY).
TRAIN_RECORDS_SHA256_KEY = b"veil.train_records_sha256"


def _checked(annex: Mapping, key: str) -> pa.Table | None:
    """The annex file's table, parsed from the very bytes whose sha256 was checked (no second read,
    so what training uses is what was hashed); None when the annex has no such file."""
    path = annex_file(annex, key, check=False)
    if path is None:
        return None
    if not Path(path).is_file():
        raise VeilError(f"plan annex: {key.replace('_', ' ')} file {path} is missing")
    data = Path(path).read_bytes()
    sha256 = annex.get(f"{key}_sha256")
    if sha256_bytes(data) != sha256:
        raise VeilError(f"plan annex: {key.replace('_', ' ')} file {path} does not match its sha256 in the annex: "
                        "refusing to use it")
    table = pq.read_table(pa.BufferReader(data))
    return table.replace_schema_metadata({**(table.schema.metadata or {}), b"veil.sha256": sha256.encode()})


def plan_texts(annex: Mapping, snapshot_records: pa.Table) -> pa.Table:
    """(record_id, text) for every record a plan can name: the snapshot's plus its canary records."""
    texts = snapshot_records.select(["record_id", "text"])
    canary = _checked(annex, "canary_records")
    if canary is not None:
        texts = pa.concat_tables([texts, canary.select(["record_id", "text"]).cast(texts.schema)])
    return texts


def train_rows(annex: Mapping) -> pa.Table:
    """The plan's train records file (record_id, user_id[, rate]), its sha256 checked."""
    table = _checked(annex, "train_records")
    if table is None:
        raise VeilError("plan annex: no train records file")
    return table


def attacker_rows(annex: Mapping) -> pa.Table:
    """The plan's attacker records file (record_id, user_id, member), its sha256 checked."""
    table = _checked(annex, "attacker_records")
    if table is None:
        raise VeilError("plan annex: no attacker records file, so this release cannot be audited; set audit.holdout_users > 0 "
                        "for the next release (a new plan of the same data is a new release, charged again)")
    return table


def training_records(plan: Mapping, annex: Mapping, snapshot_records: pa.Table, *,
                     drop_records: Collection[str] = ()) -> pa.Table:
    """(user_id, text[, rate]) of the plan's training rows, sorted by (user_id, record_id).

    Rows keep their multiplicity (group privacy lists resampled records more than once). The table's
    schema metadata carries the sha256 of the bytes actually read (TRAIN_RECORDS_SHA256_KEY).
    `drop_records`: record ids left out (every row of each), e.g. the records holding a secret the
    per-secret ledger dropped from this release."""
    chosen = train_rows(annex)
    read_sha = chosen.schema.metadata[b"veil.sha256"]  # what was actually read, not what the annex says
    if drop_records:
        import pyarrow.compute as pc

        chosen = chosen.filter(pc.invert(pc.is_in(chosen["record_id"],
                                                  pa.array(sorted(set(drop_records)), chosen["record_id"].type))))
    # the trainer reads the writer and the text; a multi-owner file's `owners` is the ledger's
    chosen = chosen.select([c for c in chosen.column_names if c != "owners"])
    chosen = chosen.append_column("_row", pa.array(range(chosen.num_rows), pa.int64()))
    joined = chosen.join(plan_texts(annex, snapshot_records), keys="record_id", join_type="inner")
    if joined.num_rows != chosen.num_rows:
        raise VeilError(f"plan: {chosen.num_rows - joined.num_rows} planned record(s) are missing from snapshot "
                        f"{plan_snapshot_ref(plan, annex)[0]}")
    joined = joined.sort_by([("user_id", "ascending"), ("record_id", "ascending"), ("_row", "ascending")])
    cols = ["user_id", "text"] + (["rate"] if "rate" in joined.column_names else [])
    return joined.select(cols).replace_schema_metadata({TRAIN_RECORDS_SHA256_KEY: read_sha})


def evaluation_records(plan: Mapping, annex: Mapping, snapshot_records: pa.Table, *,
                       single_owner: bool = False) -> pa.Table:
    """(user_id, text) of the plan's evaluation people's records (components.draws.eval_split),
    sorted by (user_id, record_id), the file's sha256 checked. A plan without an evaluation split (its
    policy's `evaluation.fraction` was 0, or nobody was drawn) is refused in one line.

    `single_owner` (the DP evaluation release): with multi-owner records (an `owners` column), keep
    only the records the evaluation person owns alone. A mail's content is every owner's data: were a
    mail to v scored as its writer u's, changing v's content would move u's figures as well as v's,
    and one person would move as many people's clipped means as they have correspondents among the
    evaluation people — not the sensitivity the release's noise is calibrated for."""
    table = _checked(annex, "eval_records")
    if table is None:
        fraction = (plan.get("evaluation") or {}).get("fraction")
        raise VeilError(f"plan {str(plan.get('sha256'))[:12]}…: no evaluation people "
                        + ("(the plan predates the evaluation split)" if fraction is None else
                           f"(evaluation.fraction = {fraction:g}: nobody was drawn)" if fraction else
                           "(its policy sets evaluation.fraction: 0)")
                        + ": this release cannot be evaluated; set evaluation.fraction > 0 for the next release (a new plan "
                          "of the same data is a new release, charged again)")
    joined = table.join(snapshot_records.select(["record_id", "text"]), keys="record_id", join_type="inner")
    if joined.num_rows != table.num_rows:
        raise VeilError(f"plan: {table.num_rows - joined.num_rows} evaluation record(s) are missing from snapshot "
                        f"{plan_snapshot_ref(plan, annex)[0]}")
    if single_owner and "owners" in snapshot_records.column_names:
        owned = dict(zip(snapshot_records.column("record_id").to_pylist(),
                         snapshot_records.column("owners").to_pylist()))
        keep = [i for i, (r, u) in enumerate(zip(joined.column("record_id").to_pylist(),
                                                 joined.column("user_id").to_pylist()))
                if owner_set(owned.get(r) or [u]) == (str(u),)]
        joined = joined.take(pa.array(keep, pa.int64()))
    return joined.sort_by([("user_id", "ascending"), ("record_id", "ascending")]).select(["user_id", "text"])
