"""Layer samplers beyond GPT-2: an RMSNorm model (Llama family, with a padding row in its embedding)
gets the one-backward path and matches a per-record autograd loop; a sampler that computes the
wrong thing is caught by the first-step self-check instead of silently mis-clipping."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from components.core.errors import VeilError
from components.dpsgd import grad_samplers
from components.dpsgd.grad_samplers import supported
from components.dpsgd.per_sample import PerUnitGradients, Unit, sequence_losses


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0)
    m = LlamaForCausalLM(cfg).double()
    with torch.no_grad():  # RMSNorm weights start at 1: make them differ so their gradients matter
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return m


def _data(B=5, T=9):
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 50, size=(B, T)).astype(np.int64)
    lengths = rng.integers(3, T + 1, size=B).astype(np.int64)
    ids[0, -2:] = 0                      # padding tokens hit the embedding's padding row
    for b in range(B):
        ids[b, lengths[b]:] = 0
    return ids, lengths


@pytest.mark.parametrize("method", ["mixed", "hooks", "ghost"])
def test_rmsnorm_model_clipped_sum_equals_autograd_loop(method):
    model = _llama()
    assert supported(model)
    ids, lengths = _data()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    C = 0.5
    want = {n: torch.zeros_like(params[n]) for n in names}
    for b in range(len(ids)):
        x = torch.as_tensor(ids[b:b + 1])
        loss = sequence_losses(model(input_ids=x).logits, x, torch.as_tensor(lengths[b:b + 1]))[0]
        g = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
        g = [torch.zeros_like(params[n]) if x_ is None else x_ for n, x_ in zip(names, g)]
        f = min(1.0, C / float(torch.sqrt(sum((t ** 2).sum() for t in g))))
        for n, t in zip(names, g):
            want[n] += f * t
    pu = PerUnitGradients(model, names, micro_batch_size=8, method=method)
    got, _, _ = pu.clipped_sum([Unit(np.array([b]), 1.0) for b in range(len(ids))], ids, lengths, C,
                               torch.device("cpu"))
    pu.close()
    for n in names:
        torch.testing.assert_close(got[n], want[n], rtol=1e-6, atol=1e-9)
    assert pu._checked


def test_self_check_catches_a_wrong_sampler(monkeypatch):
    model = _llama()
    ids, lengths = _data()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    real = grad_samplers._rms_norm
    monkeypatch.setattr(grad_samplers, "_rms_norm", lambda m, a, g, skip=frozenset(): {
        k: 1.01 * v for k, v in real(m, a, g, skip).items()})
    pu = PerUnitGradients(model, names, micro_batch_size=8, method="mixed")
    with pytest.raises(VeilError, match="RMSNorm.*disagree with autograd"):
        pu.clipped_sum([Unit(np.array([b]), 1.0) for b in range(len(ids))], ids, lengths, 1.0, torch.device("cpu"))
    pu.close()
