"""A small synthetic snapshot (no catalog needed) for planning tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from components.core.hashing import sha256_bytes

WORDS = "alpha beta gamma delta budget review launch invoice meeting roadmap deploy fix".split()


@dataclass
class FakeSnapshot:
    snapshot_id: str
    sha256: str
    records: pa.Table
    secret_spans: pa.Table


def make_snapshot(n_users: int = 40, seed: int = 0, *, secrets_per_record: int = 0,
                  n_secrets: int = 12) -> FakeSnapshot:
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        user = f"user{u:03d}@acme-corp.example"
        n = int(rng.integers(1, 16))
        for j in range(n):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 30))))
            if j and rng.random() < 0.1:
                text = rows[-1]["text"]                      # an exact duplicate within the user
            rid = sha256_bytes(f"{user}\x00{j}\x00{text}".encode())
            rows.append({"record_id": rid, "user_id": user, "text": text, "source": "mail",
                         "created_at": None, "metadata": "{}"})
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    records = pa.Table.from_pylist(rows)
    spans = []
    if secrets_per_record:
        for r in rows:
            for s in rng.choice(n_secrets, size=int(rng.integers(0, secrets_per_record + 1)), replace=False):
                cls = "codename" if s % 2 == 0 else "credential"
                spans.append({"record_id": r["record_id"], "secret_id": f"{cls}:S{s}", "secret_class": cls,
                              "detector": "literal", "detector_version": "1", "start": 0, "end": 1})
    span_schema = pa.schema([("record_id", pa.string()), ("secret_id", pa.string()), ("secret_class", pa.string()),
                             ("detector", pa.string()), ("detector_version", pa.string()), ("start", pa.int64()),
                             ("end", pa.int64())])
    secret_spans = pa.Table.from_pylist(spans, schema=span_schema)
    digest = sha256_bytes(b"".join(r["record_id"].encode() for r in rows))
    return FakeSnapshot(f"snap-{digest[:8]}", digest, records, secret_spans)
