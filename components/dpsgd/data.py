"""Training data: tokenized records grouped into privacy units.

A unit is what the sampler draws and what gets clipped: a user for ULS, a record otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.core.errors import VeilError


@dataclass
class TokenizedRecords:
    ids: np.ndarray        # [n_records, seq_len] int64, right-padded
    lengths: np.ndarray    # [n_records] real tokens per record
    user_index: np.ndarray  # [n_records] index into `users`
    users: list[str]

    @property
    def n_records(self) -> int:
        return int(self.ids.shape[0])


def _pad_id(tokenizer) -> int:
    for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
        v = getattr(tokenizer, attr, None)
        if v is not None:
            return int(v)
    return 0


def tokenize_table(data: pa.Table, tokenizer, seq_len: int) -> TokenizedRecords:
    """Tokenize `data.text`, truncating to seq_len. Padding is never attended to by a real token
    (right padding under a causal mask) and never a target, so its id does not matter."""
    for col in ("user_id", "text"):
        if col not in data.column_names:
            raise VeilError(f"training data: column {col!r} missing (have {', '.join(data.column_names)})")
    if data.num_rows == 0:
        raise VeilError("training data: no records")
    if data.column("user_id").null_count or data.column("text").null_count:
        raise VeilError("training data: user_id/text contain nulls")
    texts = data.column("text").to_pylist()
    user_col = data.column("user_id").cast(pa.string())
    users_sorted = sorted(set(user_col.to_pylist()))
    lookup = {u: i for i, u in enumerate(users_sorted)}
    user_index = np.fromiter((lookup[u] for u in user_col.to_pylist()), dtype=np.int64, count=data.num_rows)

    enc = tokenizer(texts, truncation=True, max_length=int(seq_len), add_special_tokens=True)
    seqs = enc["input_ids"]
    ids = np.full((len(seqs), int(seq_len)), _pad_id(tokenizer), dtype=np.int64)
    lengths = np.zeros(len(seqs), dtype=np.int64)
    for i, s in enumerate(seqs):
        s = s[:seq_len]
        ids[i, : len(s)] = s
        lengths[i] = len(s)
    return TokenizedRecords(ids=ids, lengths=lengths, user_index=user_index, users=users_sorted)


def record_rates(data: pa.Table) -> np.ndarray:
    if "rate" not in data.column_names:
        raise VeilError("training data: mechanism 'secret' needs a per-record 'rate' column (the LP's Poisson rates)")
    col = data.column("rate")
    if col.null_count:
        raise VeilError("training data: rate: contains nulls")
    rates = np.asarray(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = np.flatnonzero(~((rates >= 0.0) & (rates <= 1.0)))
    if bad.size:
        raise VeilError(f"training data: rate: row {int(bad[0])} has {rates[bad[0]]!r}, rates must lie in [0, 1]")
    return rates


def records_by_user(tok: TokenizedRecords) -> list[np.ndarray]:
    order = np.argsort(tok.user_index, kind="stable")
    counts = np.bincount(tok.user_index, minlength=len(tok.users))
    return np.split(order, np.cumsum(counts)[:-1])


def user_streams(data: pa.Table, tokenizer, users: list[str]) -> list[np.ndarray]:
    """Each user's records tokenized whole and concatenated (EOS between records when the tokenizer
    has one), in table order: the text random chunks are cut from."""
    texts = data.column("text").to_pylist()
    owners = data.column("user_id").cast(pa.string()).to_pylist()
    enc = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
    eos = getattr(tokenizer, "eos_token_id", None)
    parts: dict[str, list[list[int]]] = {u: [] for u in users}
    for u, ids in zip(owners, enc):
        parts[u].append(list(ids) + ([int(eos)] if eos is not None else []))
    return [np.fromiter((t for ids in parts[u] for t in ids), dtype=np.int64) for u in users]


def random_chunks(stream: np.ndarray, seq_len: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`count` windows of seq_len tokens at uniform random starts (the whole stream if shorter)."""
    if len(stream) <= seq_len:
        return [stream]
    starts = rng.integers(0, len(stream) - seq_len + 1, size=count)
    return [stream[a:a + seq_len] for a in starts]
