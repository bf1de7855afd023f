"""Seed 001's f(G) estimate: 1 when a user's records are identical, below 1 when they differ."""
from __future__ import annotations

import pyarrow as pa
import pytest
import torch


class CharTokenizer:
    """Bytes as tokens: enough for a gradient-norm test without training a tokenizer."""

    def __call__(self, text, truncation=True, max_length=64, return_tensors="pt"):
        ids = list(text.encode()[:max_length])
        return {"input_ids": torch.tensor([ids], dtype=torch.long)}


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    return GPT2LMHeadModel(cfg), CharTokenizer()


def test_identical_records_give_ratio_one_and_diverse_records_less(tiny_lm):
    from components.draws.gradient_diversity import estimate_user_grad_ratio

    torch.set_num_threads(1)
    model, tok = tiny_lm
    same = pa.table({"user_id": ["a"] * 4 + ["b"] * 4,
                     "text": ["hello there, general"] * 4 + ["quarterly numbers are due"] * 4})
    f = estimate_user_grad_ratio(model, tok, same, g_values=[2, 4], n_users=2, seq_len=32)
    assert f(1) == pytest.approx(1.0) and f(2) == pytest.approx(1.0, rel=1e-5) and f(4) == pytest.approx(1.0, rel=1e-5)
    rows = {"user_id": [], "text": []}
    for u in range(3):
        for t in ("zq xj wv", "THE PLAN IS 42!", "mañana, ¿sí?", "0101 1100 0011"):
            rows["user_id"].append(f"u{u}")
            rows["text"].append(f"{t} {u}")
    f = estimate_user_grad_ratio(model, tok, pa.table(rows), g_values=[4], n_users=3, seq_len=32)
    assert f(1) == pytest.approx(1.0) and f(4) < 0.999
    assert f(2) == pytest.approx((f(1) + f(4)) / 2)        # log-G interpolation between measured points
    assert not any(p.grad is not None for p in model.parameters())   # leaves no gradients behind
