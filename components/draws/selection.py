"""Contribution bounding: which of a user's records training may touch (seed 000 §2.5).

Every choice for a user depends only on that user's records, the plan's seed and key and (for
perplexity strategies) the public base model, so adding or removing one user never changes anyone
else's selection — the property the user-level neighbour analysis needs. Randomness comes from a
per-user RNG keyed by (key, seed, purpose, user id), so a user's draw does not depend on who else is
in the data; the planner passes its secret key, so nobody can recompute which records were chosen.
Perplexities are computed one user at a time: a batched scorer's padding and kernel choice then
depend on that user's texts alone, never on who else shares the batch.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from components.core.errors import VeilError
from components.core.canonical import round_sig
from components.draws.annex import prf_seed

SELECTION_DIGITS = 6   # perplexities compared at this precision (machine-independent selection)

# A scorer maps texts to base-model perplexities (higher = more surprising). Planning stays pure:
# the caller builds it from the public base model (never a model fine-tuned on private data).
Scorer = Callable[[Sequence[str]], Sequence[float]]

STRATEGIES = ("random", "longest", "shortest", "ppl-high", "ppl-low", "random-chunk")
# Strategies whose records are re-drawn by the trainer at every visit of a user (ULS only).
REDRAWN_PER_VISIT = ("random-chunk",)


def user_rng(seed: int, purpose: str, user_id: str, key: bytes | None = None) -> np.random.Generator:
    """An RNG for one user and one purpose; independent of every other user (keyed when `key` is given)."""
    if key is None:
        digest = hashlib.sha256(f"{purpose}\x00{user_id}".encode()).digest()
        words = [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]
    else:
        words = prf_seed(key, purpose, user_id)
    return np.random.default_rng(np.random.SeedSequence([int(seed), *words]))


def keyed_order(seed: int, purpose: str, ids: Sequence[str]) -> list[str]:
    """`ids` in a seeded pseudo-random order that depends on nothing but the seed and each id."""
    def key(i: str) -> bytes:
        return hashlib.sha256(f"{int(seed)}\x00{purpose}\x00{i}".encode()).digest()
    return sorted(ids, key=key)


def _group_rows(user_ids: Sequence[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(user_ids):
        groups.setdefault(u, []).append(i)
    return groups


def select_records(records: pa.Table, k: int, strategy: str, *, seed: int, exactly_k: bool = False,
                   scorer: Scorer | None = None, length: Callable[[str], int] | None = None,
                   key: bytes | None = None) -> pa.Table:
    """Rows of `records` (record_id, user_id, text) that training may use, at most k per user.

    `exactly_k` (seed 000's group privacy): users with fewer than k records are resampled with
    replacement up to k, so duplicates appear. `random-chunk` keeps every record: the trainer
    draws chunks of the user's concatenated text at each visit. Lengths are characters unless
    `length` (e.g. a token counter) is given. Ties break by record_id, so output is deterministic.
    """
    if strategy not in STRATEGIES:
        raise VeilError(f"selection: unknown strategy '{strategy}'; use one of {', '.join(STRATEGIES)}")
    if k < 1:
        raise VeilError(f"selection: k must be at least 1, got {k}")
    if records.num_rows == 0:
        return records
    if strategy in REDRAWN_PER_VISIT:
        return records
    users = records.column("user_id").to_pylist()
    rids = records.column("record_id").to_pylist()
    texts = records.column("text").to_pylist() if strategy != "random" else None
    groups = _group_rows(users)
    for rows in groups.values():
        rows.sort(key=lambda r: rids[r])  # input order must not matter

    score: np.ndarray | None = None
    if strategy in ("longest", "shortest"):
        f = length or len
        score = np.asarray([f(t) for t in texts], dtype=float)
    elif strategy in ("ppl-high", "ppl-low"):
        if scorer is None:
            raise VeilError(f"selection '{strategy}' needs the public base model's perplexities: "
                            "pass a scorer built from the base model (or choose another strategy)")
        score = np.empty(len(texts), dtype=float)
        for rows in groups.values():       # one user per call: the batch holds this user's texts only
            s = np.asarray(list(scorer([texts[r] for r in rows])), dtype=float)
            if s.shape != (len(rows),):
                raise VeilError(f"selection '{strategy}': the scorer must return one finite perplexity per record")
            score[rows] = s
        if not np.all(np.isfinite(score)):
            raise VeilError(f"selection '{strategy}': the scorer must return one finite perplexity per record")
        # The base model's perplexities come out of torch kernels whose last bits differ between CPUs;
        # the records they pick go into the plan (its train-records commitment), so they are compared at
        # SELECTION_DIGITS significant digits, ties broken by record id (docs/privacy/plan-identity.md)

        score = np.asarray([round_sig(float(x), SELECTION_DIGITS) for x in score], dtype=float)
    descending = strategy in ("longest", "ppl-high")

    keep: list[int] = []
    for user, rows in groups.items():
        if strategy == "random":
            rng = user_rng(seed, "select", user, key)
            if len(rows) > k:
                chosen = [rows[i] for i in sorted(rng.choice(len(rows), size=k, replace=False))]
            else:
                chosen = list(rows)
        else:
            sign = -1.0 if descending else 1.0
            chosen = sorted(rows, key=lambda r: (sign * score[r], rids[r]))[:k]
        if exactly_k and len(chosen) < k:
            rng = user_rng(seed, "resample", user, key)
            extra = rng.choice(len(chosen), size=k - len(chosen), replace=True)
            chosen = chosen + [chosen[i] for i in extra]
        keep.extend(chosen)
    return records.take(pa.array(keep, type=pa.int64()))
