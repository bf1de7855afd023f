"""Arrow schemas of what the catalog hands to everyone else (snapshots) and the DuckDB tables behind them."""
from __future__ import annotations

import pyarrow as pa

RECORDS = pa.schema([
    pa.field("record_id", pa.string(), nullable=False),   # sha256(user_id \x1f text), hex
    pa.field("user_id", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("created_at", pa.timestamp("us", tz="UTC")),
    pa.field("metadata", pa.string()),                     # JSON object, values as strings
])

SECRET_SPANS = pa.schema([
    pa.field("record_id", pa.string(), nullable=False),
    pa.field("secret_id", pa.string(), nullable=False),    # "<secret_class>:<normalized value>"
    pa.field("secret_class", pa.string(), nullable=False),
    pa.field("detector", pa.string(), nullable=False),
    pa.field("detector_version", pa.string(), nullable=False),
    pa.field("start", pa.int64(), nullable=False),         # code-point offsets: text[start:end]
    pa.field("end", pa.int64(), nullable=False),
])

# What a connector yields per batch (all strings except the positions); the ingest normalizes it.
RAW = pa.schema([
    pa.field("seq", pa.int64()),        # order within the source, unique
    pa.field("line", pa.int64()),       # 1-based line / row / message number in the source
    pa.field("offset", pa.int64()),     # byte offset in the (decompressed) source, when known
    pa.field("locator", pa.string()),   # a readable position where line numbers do not apply
    pa.field("user", pa.string()),
    pa.field("text", pa.string()),
    pa.field("source_id", pa.string()),
    pa.field("ts", pa.string()),
    pa.field("source", pa.string()),
    pa.field("path", pa.string()),
    pa.field("metadata", pa.string()),  # JSON object
    pa.field("error", pa.string()),     # set by a connector that already knows the row is bad
])

# `records` is a view over the latest snapshot's records.parquet (text is stored once, in Parquet);
# this is its shape before the first snapshot.
EMPTY_RECORDS_VIEW = """CREATE OR REPLACE VIEW records AS SELECT NULL::VARCHAR AS record_id, NULL::VARCHAR AS user_id,
    NULL::VARCHAR AS text, NULL::VARCHAR AS source, NULL::TIMESTAMPTZ AS created_at, NULL::VARCHAR AS metadata
    WHERE false"""

DDL = """
CREATE TABLE IF NOT EXISTS secret_spans (
    record_id VARCHAR NOT NULL, secret_id VARCHAR NOT NULL, secret_class VARCHAR NOT NULL,
    detector VARCHAR NOT NULL, detector_version VARCHAR NOT NULL, "start" BIGINT NOT NULL,
    "end" BIGINT NOT NULL, ingest_id VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS secrets (
    secret_id VARCHAR NOT NULL, secret_class VARCHAR NOT NULL, first_ingest VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    user_id VARCHAR NOT NULL, records BIGINT NOT NULL, chars BIGINT NOT NULL,
    first_created_at TIMESTAMPTZ, last_created_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id VARCHAR NOT NULL, sha256 VARCHAR NOT NULL, content_sha256 VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL, path VARCHAR NOT NULL, records BIGINT NOT NULL, users BIGINT NOT NULL,
    spans BIGINT NOT NULL, secrets BIGINT NOT NULL, parent VARCHAR, ingest_id VARCHAR);
CREATE TABLE IF NOT EXISTS quarantine (
    source_key VARCHAR NOT NULL, ingest_id VARCHAR NOT NULL, source VARCHAR NOT NULL, position VARCHAR NOT NULL,
    line BIGINT, byte_offset BIGINT, reason VARCHAR NOT NULL, raw BLOB);
CREATE TABLE IF NOT EXISTS ingests (
    ingest_id VARCHAR NOT NULL, source_key VARCHAR NOT NULL, source VARCHAR NOT NULL, format VARCHAR NOT NULL,
    source_sha256 VARCHAR, options VARCHAR NOT NULL, rules_sha256 VARCHAR NOT NULL,
    started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ NOT NULL, "read" BIGINT NOT NULL,
    accepted BIGINT NOT NULL, new_records BIGINT NOT NULL, quarantined BIGINT NOT NULL,
    duplicates BIGINT NOT NULL, users BIGINT NOT NULL, snapshot_id VARCHAR NOT NULL, tagged_records BIGINT);
ALTER TABLE ingests ADD COLUMN IF NOT EXISTS tagged_records BIGINT;
"""
