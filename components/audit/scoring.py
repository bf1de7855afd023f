"""Sequence log-likelihoods under a causal LM: the one measurement every audit is built on.

log p(x) = Σ_t log p(x_t | x_<t), summed (not averaged) over tokens as in seed 003 §1.4. When the
tokenizer has a BOS token it is prepended so that the first real token is scored too; target and
reference always see the identical token sequence, so the choice cancels in their difference.
Whole texts are scored by `components.modeling.sequence_logprobs`; this module adds continuations
(log p(s | context), for exposure) and the reference-model switch.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from components.core.errors import VeilError
from components.core.progress import progress
from components.modeling import sequence_logprobs as _lp


def _device(model):
    import torch

    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover - a model without parameters is not a model
        return torch.device("cpu")


def _bos(tokenizer) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [] if bos is None else [int(bos)]


def encode_continuations(tokenizer, contexts: Sequence[str], continuations: Sequence[str],
                         seq_len: int) -> tuple[list[list[int]], list[int]]:
    """Ids of context+continuation and the index of the first continuation token.

    We tokenize the joined string (so the continuation gets the tokens it has in running text, e.g.
    GPT-2's leading-space tokens) and score every token that ends inside the continuation; a token
    straddling the boundary counts as continuation. Long contexts are cut from the left so the whole
    continuation always fits in seq_len.
    """
    bos = _bos(tokenizer)
    ids_out, starts = [], []
    for ctx, cont in zip(contexts, continuations, strict=True):
        full = ctx + cont
        try:
            enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True, verbose=False)  # cut below
            ids, offs = list(enc["input_ids"]), enc["offset_mapping"]
            first = next((i for i, (_, e) in enumerate(offs) if e > len(ctx)), len(ids))
        except (NotImplementedError, TypeError, ValueError):  # slow tokenizer: no offsets
            c = tokenizer(ctx, add_special_tokens=False, verbose=False)["input_ids"] if ctx else []
            k = tokenizer(cont, add_special_tokens=False, verbose=False)["input_ids"]
            ids, first = list(c) + list(k), len(c)
        ids = bos + ids
        first += len(bos)
        if len(ids) - first >= seq_len:
            raise VeilError(f"continuation of {len(ids) - first} tokens does not fit seq_len={seq_len}")
        cut = max(0, len(ids) - seq_len)
        ids_out.append(ids[cut:])
        starts.append(max(first - cut, 1))
    return ids_out, starts


def token_logprob_sums(model, sequences: Sequence[Sequence[int]], starts: Sequence[int] | None = None, *,
                       batch_size: int = 16, progress: str | None = None) -> np.ndarray:
    """Σ_{t >= start} log p(x_t | x_<t) for each id sequence (start defaults to 1: all but the first).

    Sequences are batched by length (right padding, attention mask) and evaluated under inference
    mode; log-softmax runs in float32 whatever the model's dtype.
    """
    import torch

    n = len(sequences)
    starts = [1] * n if starts is None else list(starts)
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    dev = _device(model)
    order = sorted(range(n), key=lambda i: len(sequences[i]))
    bar = _progress(progress, n)
    split = _trunk_and_head(model)
    with torch.inference_mode(), bar as tick:
        for b in range(0, n, batch_size):
            idx = order[b:b + batch_size]
            width = max(len(sequences[i]) for i in idx)
            ids = torch.zeros((len(idx), width), dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            score = torch.zeros((len(idx), width - 1), dtype=torch.bool)
            for r, i in enumerate(idx):
                s = sequences[i]
                ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
                mask[r, :len(s)] = 1
                score[r, max(starts[i], 1) - 1:len(s) - 1] = True  # target x_t sits at logit t-1
            ids, mask, score = ids.to(dev), mask.to(dev), score.to(dev)
            if split is not None:
                sums = _scored_positions_only(split, ids, mask, score)
                if b == 0 and not np.allclose(sums, _all_positions(model, ids, mask, score), rtol=1e-5, atol=1e-3):
                    split = None   # logits are not head(hidden) here (a final scaling, a soft cap): the plain path
            if split is None:
                sums = _all_positions(model, ids, mask, score)
            out[idx] = sums
            tick(len(idx))
    return out


def _all_positions(model, ids, mask, score) -> np.ndarray:
    import torch

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][..., None]).squeeze(-1)
    return (lp * score).sum(-1).double().cpu().numpy()


def _trunk_and_head(model):
    """(trunk, output head) of a HF causal LM (or a peft model wrapping one, adapters included), or None.

    An exposure probe scores the ~10 tokens of a secret after a context of up to seq_len: computing the
    vocabulary-wide log-softmax only at those positions instead of all of them made the secret-exposure
    audit ~3x faster on the Debian corpus (the head is most of a small model's cost). The first batch
    is scored both ways and the plain path kept if they differ (`token_logprob_sums`)."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(hf, "base_model_prefix", "")
    trunk = getattr(hf, prefix, None) if prefix else None
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if trunk is None or head is None or trunk is hf or not callable(trunk):
        return None
    return trunk, head


def _scored_positions_only(split, ids, mask, score) -> np.ndarray:
    import torch

    trunk, head = split
    hidden = trunk(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    rows, cols = score.nonzero(as_tuple=True)
    lp = torch.log_softmax(head(hidden[rows, cols]).float(), dim=-1)
    tok = lp.gather(-1, ids[:, 1:][rows, cols][:, None]).squeeze(-1).double()
    sums = torch.zeros(ids.shape[0], dtype=torch.float64, device=ids.device).index_add_(0, rows, tok)
    return sums.cpu().numpy()


def sequence_logprobs(model, tokenizer, texts: Sequence[str], *, seq_len: int, batch_size: int = 16,
                      progress: str | None = None) -> np.ndarray:
    """log p(x) of each text (sum of token log-probs after truncation to seq_len tokens, BOS prepended).

    Delegates to `components.modeling.sequence_logprobs` (one definition of log p(x) for the whole
    platform); chunked here only to drive the progress bar.
    """

    texts = list(texts)
    out = np.zeros(len(texts), dtype=np.float64)
    chunk = max(batch_size * 8, 1)
    with _progress(progress, len(texts)) as tick:
        for b in range(0, len(texts), chunk):
            out[b:b + chunk] = _lp(model, tokenizer, texts[b:b + chunk], seq_len=seq_len, batch_size=batch_size)
            tick(len(texts[b:b + chunk]))
    return out


def continuation_logprobs(model, tokenizer, contexts: Sequence[str], continuations: Sequence[str], *,
                          seq_len: int, batch_size: int = 16, progress: str | None = None) -> np.ndarray:
    """log p(continuation | context) for each pair."""
    ids, starts = encode_continuations(tokenizer, contexts, continuations, seq_len)
    return token_logprob_sums(model, ids, starts, batch_size=batch_size, progress=progress)


@contextlib.contextmanager
def reference_of(model, reference=None):
    """The reference model p_ref: a given model, or for a peft model the same weights with the adapter off."""
    if reference is not None:
        yield reference
        return
    disable = getattr(model, "disable_adapter", None)
    if disable is None:
        raise VeilError("audit: the model has no adapter to disable; pass a reference model (the base model "
                        "it was fine-tuned from)")
    with disable():
        yield model


def _progress(label: str | None, total: int):
    return progress(f"audit: {label}" if label else "", total, on=bool(label), transient=True)
