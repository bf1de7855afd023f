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
import pyarrow.compute as pc

from components.core.errors import VeilError
from components.core.canonical import round_sig
from components.draws.annex import prf_seed, prf_seed_column
from components.draws.columns import codes, take, take_rows
from components.draws.streams import floyd_choice, replace_choice

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
    # Columns: each row's person as an integer code (first-appearance order, as the per-user dict this
    # replaced), every person's rows ordered by record id (a stable sort: input order must not matter
    # beyond that), and the per-person draws replayed vectorised (streams) from each person's own keyed
    # Generator — one PRF per person, exactly as `user_rng`.
    person, people = codes(records.column("user_id"))
    rid = records.column("record_id")
    order = np.asarray(pc.sort_indices(pa.table({"p": pa.array(person), "r": rid}),
                                       sort_keys=[("p", "ascending"), ("r", "ascending")]).to_numpy(), np.int64)
    counts = np.bincount(person, minlength=len(people))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pos = np.arange(len(order)) - starts[person[order]]        # each row's place among its person's rows
    ppl = strategy in ("ppl-high", "ppl-low")
    texts = records.column("text").to_pylist() if ppl or (length is not None and strategy != "random") else None

    score: np.ndarray | None = None
    if strategy in ("longest", "shortest"):
        if length is None:
            score = np.asarray(pc.utf8_length(records.column("text")).to_numpy(zero_copy_only=False), dtype=float)
        else:
            score = np.asarray([length(t) for t in texts], dtype=float)
    elif ppl:
        if scorer is None:
            raise VeilError(f"selection '{strategy}' needs the public base model's perplexities: "
                            "pass a scorer built from the base model (or choose another strategy)")
        score = np.empty(len(texts), dtype=float)
        for p in range(len(people)):     # one user per call: the batch holds this user's texts only
            rows = order[starts[p]:starts[p] + counts[p]]
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

    if strategy == "random":
        kept = np.ones(len(order), bool)                        # by position in `order`
        over = np.flatnonzero(counts > k)
        if len(over):
            picks = floyd_choice(int(seed), _person_words(seed, "select", take(people, over), key), counts[over], int(k))
            kept[counts[person[order]] > k] = False
            kept[(starts[over][:, None] + picks).ravel()] = True
        # a person's chosen rows in ascending pick order, i.e. ascending record-id order
        chosen_pos = np.flatnonzero(kept)
    else:
        sign = -1.0 if descending else 1.0
        # within a person: by (sign·score, record id); `pos` is the record-id order (ties keep it)
        by = np.lexsort((pos, sign * score[order], person[order]))
        rank = np.arange(len(by)) - starts[person[order][by]]
        chosen_pos = by[rank < k]
    chosen = order[chosen_pos]                                  # grouped by person, in person-code order
    if exactly_k:
        chosen = _resample_to_k(chosen, person, people, int(k), seed, key)
    return take_rows(records, chosen)


def _resample_to_k(chosen: np.ndarray, person: np.ndarray, people: pa.Array, k: int, seed: int,
                   key: bytes | None) -> np.ndarray:
    """Each person's block of `chosen` followed by k − n resampled rows of that block (with
    replacement, from the person's own `user_rng(seed, "resample", …)`): group privacy's exactly k."""
    n = np.bincount(person[chosen], minlength=len(people))
    short = np.flatnonzero((n < k) & (n > 0))
    if len(short) == 0:
        return chosen
    need = np.zeros(len(people), np.int64)
    need[short] = k - n[short]
    # a size-s draw with replacement is the first s of a longer one (independent bounded draws from
    # the same stream), so one draw of the largest size serves every person
    extra = replace_choice(int(seed), _person_words(seed, "resample", take(people, short), key), n[short],
                           int(need[short].max()))
    first = np.concatenate(([0], np.cumsum(n)[:-1]))           # each person's block in `chosen`
    size = n + need
    at = np.concatenate(([0], np.cumsum(size)[:-1]))           # and in the output
    out = np.empty(int(size.sum()), np.int64)
    pc_of = person[chosen]
    out[at[pc_of] + (np.arange(len(chosen)) - first[pc_of])] = chosen
    cols = np.arange(extra.shape[1])[None, :]
    mask = cols < need[short][:, None]
    dst = (at[short] + n[short])[:, None] + cols
    src = chosen[first[short][:, None] + extra]
    out[dst[mask]] = src[mask]
    return out


def _person_words(seed: int, purpose: str, people: pa.Array, key: bytes | None) -> np.ndarray:
    """(n, 4) uint32: the words `user_rng(seed, purpose, user, key)` seeds each person's Generator with."""
    if key is not None:
        return prf_seed_column(key, purpose, people)
    out = np.empty((len(people), 4), np.uint32)
    for i, u in enumerate(people.to_pylist()):
        digest = hashlib.sha256(f"{purpose}\x00{u}".encode()).digest()
        out[i] = np.frombuffer(digest[:16], "<u4")
    return out
