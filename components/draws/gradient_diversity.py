"""Estimate f(G) = L_G / L at the base model for `mechanism: auto` (seed 001 §6, eq. (8)).

L_G is the norm of a user's mean gradient over G of their records; f(G) = median_u L_G(u) / median_u L_1(u)
over a sample of users. f near 1: a user's records pull the same way (ULS's averaging buys little);
f near 1/√G: they are diverse (ULS's per-user clipping loses little signal). The estimate reads private
records without noise, as seed 001 does; the plan says so in its caveats.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from components.draws.selection import keyed_order, user_rng
from components.core.canonical import round_sig


def _grad_norm(model, tokenizer, texts: Sequence[str], seq_len: int) -> float:
    import torch

    model.zero_grad(set_to_none=True)
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    losses = []
    for t in texts:
        enc = tokenizer(t, truncation=True, max_length=seq_len, return_tensors="pt")
        ids = enc["input_ids"].to(device)
        if ids.shape[1] < 2:
            continue
        out = model(input_ids=ids, labels=ids)
        losses.append(out.loss)
    if not losses:
        return float("nan")
    torch.stack(losses).mean().backward()
    sq = sum(float(p.grad.detach().pow(2).sum()) for p in params if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return float(np.sqrt(sq))


def estimate_user_grad_ratio(model, tokenizer, train: pa.Table, *, g_values: Sequence[int], n_users: int = 32,
                             seq_len: int = 128, seed: int = 0) -> Callable[[int], float]:
    """f̂(G) for G in `g_values` (1 is added), interpolated in log G between them (clamped at the ends)."""
    by_user: dict[str, list[str]] = {}
    for u, t in zip(train["user_id"].to_pylist(), train["text"].to_pylist()):
        by_user.setdefault(u, []).append(t)
    users = keyed_order(seed, "grad-ratio", sorted(by_user))[:n_users]
    gs = sorted({1, *[int(g) for g in g_values if g >= 1]})
    was_training = model.training
    model.eval()
    try:
        norms = {g: [] for g in gs}
        for u in users:
            texts = sorted(by_user[u])
            rng = user_rng(seed, "grad-ratio", u)
            for g in gs:
                pick = rng.choice(len(texts), size=min(g, len(texts)), replace=False)
                n = _grad_norm(model, tokenizer, [texts[i] for i in pick], seq_len)
                if np.isfinite(n):
                    norms[g].append(n)
    finally:
        model.train(was_training)
    base = float(np.median(norms[1])) if norms[1] else float("nan")
    # torch's gradient norms differ between CPUs in the last bits; `auto`'s choice and the annex (whose
    # commitment is in the plan) read these ratios, so they are kept to 6 significant digits
    # (components.core.canonical, docs/privacy/plan-identity.md)

    table = {g: round_sig(float(np.median(v)) / base, 6) for g, v in norms.items() if v and base > 0}
    if 1 not in table:
        raise ValueError("gradient diversity: no scorable record among the sampled users")
    xs = np.log2(np.array(sorted(table)))
    ys = np.array([table[g] for g in sorted(table)])

    def f(G: int) -> float:
        return round_sig(float(np.interp(np.log2(max(1, G)), xs, ys)), 6)

    f.table = table  # type: ignore[attr-defined]
    return f
