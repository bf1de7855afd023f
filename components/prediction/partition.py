"""People → shards: a keyed hash of the person alone, so removing someone moves nobody else.

shard(u) = HMAC-SHA256(K, canonical(u)) mod N. Balanced in expectation (the hash is uniform); never
rebalanced from the data, because any rebalancing would make one person's shard depend on who else is
there, and removing that person would then change other shards too (docs/privacy/pmixed.md §1).
The key K is private (VEIL_HOME/private/pmixed/partition.key, 0600): without it nobody can tell which
shard a person is in, which the adapters' access restriction relies on as well.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections import Counter
from pathlib import Path

from components.core.errors import VeilError
from components.core.identity import person_id_or_empty

KEY_FILE = "partition.key"


def canonical(person_id: str) -> bytes:
    # the one identity rule (components.core.identity), the ledger's and the planner's: case, spacing,
    # Unicode form and e-mail address form never split a person across shards. Empty under the rule
    # (only blanks or invisible characters): `shard_of` refuses it.
    return person_id_or_empty(person_id).encode("utf-8")


def secret_file(f: Path, n: int = 32) -> bytes:
    """The bytes of a private secret file, created (0600, n random bytes) by whoever gets there first."""
    if not f.exists():
        try:
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(n))
        except FileExistsError:
            pass
    return f.read_bytes()


def load_or_create_key(private_dir: str | Path) -> bytes:
    d = Path(private_dir) / "pmixed"
    d.mkdir(parents=True, exist_ok=True)
    f = d / KEY_FILE
    key = secret_file(f)
    if len(key) != 32:
        raise VeilError(f"{f}: partition key must be 32 bytes")
    return key


def shard_of(key: bytes, person_id: str, shards: int) -> int:
    if shards < 1:
        raise VeilError(f"pmixed: shards must be ≥ 1, got {shards}")
    if person_id is None or not canonical(person_id):
        raise VeilError("pmixed: a record has no person (user_id); it cannot be assigned to a shard")
    d = hmac.new(key, canonical(person_id), hashlib.sha256).digest()
    return int.from_bytes(d[:8], "big") % int(shards)


def partition(key: bytes, person_ids, shards: int) -> dict[str, int]:
    """person id → shard, for every distinct person."""
    return {p: shard_of(key, p, shards) for p in dict.fromkeys(str(x) for x in person_ids)}


def shard_sizes(assign: dict[str, int], shards: int) -> list[int]:
    c = Counter(assign.values())
    return [int(c.get(i, 0)) for i in range(shards)]
