"""Sequence log-likelihoods and perplexities under a causal LM (audits, perplexity-based selection).

log p(x) = Σ_t log p(x_t | x_<t), summed over the text's tokens. The tokenizer's BOS (when it has
one) is prepended so the first real token is scored too; texts are truncated to `seq_len` tokens in
all (BOS included). Every model sees the same ids for the same text, so differences between a
target and a reference model compare like with like.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from components.core.errors import VeilError
from components.core.progress import progress as _progress


def _encode(tokenizer, texts: Sequence[str], seq_len: int) -> list[list[int]]:
    if seq_len < 2:
        raise VeilError(f"seq_len: must be at least 2, got {seq_len}")
    bos = [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]
    # verbose=False: texts longer than the model's positions are expected here, they are cut below
    enc = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"] if len(texts) else []
    return [(bos + list(ids))[:seq_len] for ids in enc]


def _sums_and_counts(model, tokenizer, texts, seq_len: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    sums, counts, _ = token_statistics(model, tokenizer, texts, seq_len, batch_size)
    return sums, counts


# Tokens per forward pass (rows × padded width). A forward of a small model on the CPU costs mostly
# per-call overhead: 8 short texts per call made evaluation slower than training (issue 26: 72 s for
# 1,000 demo texts at 8 per batch, 21 s at 64). The cap bounds the float32 logits (tokens × vocab)
# a batch materialises: 4,096 × 50k vocabulary ≈ 0.8 GB.
MAX_BATCH_TOKENS = 4096


def pad_right(seqs: Sequence[Sequence[int]], pad: int):
    """Token-id sequences as one right-padded batch: (ids, attention mask), both long tensors of shape
    (len(seqs), longest). Causal models read a position only from those before it, so the padding
    changes no real position's logits."""
    import torch

    w = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), w), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), w), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[r, :len(s)] = 1
    return ids, mask


def _batches(order: list[int], lengths: list[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Consecutive runs of `order` (sorted by length) with at most `batch_size` texts and at most
    `max_tokens` padded tokens each (a single longer text still gets its own batch)."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = max([lengths[i]] + [lengths[j] for j in cur])
        if cur and (len(cur) >= batch_size or (len(cur) + 1) * width > max_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def token_statistics(model, tokenizer, texts: Sequence[str], seq_len: int,
                     batch_size: int, *, max_batch_tokens: int = MAX_BATCH_TOKENS,
                     progress: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per text: Σ_t log p(x_t | x_<t) (float64), the number of scored tokens, and how many of them
    were the model's argmax prediction (next-token accuracy's numerator). Ties in the argmax go to
    the lowest id (torch's rule), so the count is deterministic. Batches hold at most `batch_size`
    texts and `max_batch_tokens` padded tokens; `progress`: a label for a progress bar (texts done)."""
    import torch

    if batch_size < 1:
        raise VeilError(f"batch_size: must be at least 1, got {batch_size}")
    seqs = _encode(tokenizer, texts, seq_len)
    n = len(seqs)
    sums = np.zeros(n, dtype=np.float64)
    counts = np.array([max(len(s) - 1, 0) for s in seqs], dtype=np.int64)
    correct = np.zeros(n, dtype=np.int64)
    if n == 0:
        return sums, counts, correct
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    order = sorted(range(n), key=lambda i: len(seqs[i]))  # similar lengths together: little padding
    lengths = [len(s) for s in seqs]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), _progress(progress or "", n, on=bool(progress), transient=True) as tick:
            for idx in _batches(order, lengths, int(batch_size), int(max_batch_tokens)):
                width = max(lengths[i] for i in idx)
                tick(len(idx))
                if width < 2:
                    continue  # nothing to score in this batch
                ids, mask = pad_right([seqs[i] for i in idx], pad)
                ids, mask = ids.to(dev), mask.to(dev)
                logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
                lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
                sums[idx] = (lp * mask[:, 1:]).sum(-1).double().cpu().numpy()
                hits = (logits.argmax(-1) == ids[:, 1:]) & mask[:, 1:].bool()
                correct[idx] = hits.sum(-1).cpu().numpy()
    finally:
        model.train(was_training)
    return sums, counts, correct


def sequence_logprobs(model, tokenizer, texts: Sequence[str], seq_len: int = 128, batch_size: int = 16, *,
                      return_counts: bool = False):
    """Σ_t log p(x_t | x_<t) per text (float64 array); with `return_counts`, also the number of
    scored tokens per text. The model's train/eval mode is restored afterwards."""
    sums, counts = _sums_and_counts(model, tokenizer, list(texts), seq_len, batch_size)
    return (sums, counts) if return_counts else sums


def perplexity_scores(model, tokenizer, texts: Sequence[str], seq_len: int = 128, batch_size: int = 16) -> np.ndarray:
    """exp(-mean token log-prob) per text, over the same truncated tokens as `sequence_logprobs`."""
    sums, counts = _sums_and_counts(model, tokenizer, list(texts), seq_len, batch_size)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        raise VeilError(f"perplexity: text #{int(empty[0])} has no token to score (empty text?)")
    return np.exp(-sums / counts)
