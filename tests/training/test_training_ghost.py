"""Ghost norms and book-kept sums against instantiated per-unit gradients, layer by layer: Linear,
HF Conv1D, Embedding (with a padding row), and a weight tied between an Embedding and a Linear
(GPT-2's wte/lm_head), for single-record units and for units of several records."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from components.dpsgd.grad_samplers import _SAMPLERS, _Use, _ghost_kind, _unit_tokens, ghost_norm_sq


def _slots(owner: torch.Tensor, n_units: int) -> torch.Tensor:
    B = owner.shape[0]
    K = int(torch.bincount(owner, minlength=n_units).max())
    slots = torch.full((n_units, K), B, dtype=torch.long)
    fill = [0] * n_units
    for r, u in enumerate(owner.tolist()):
        slots[u, fill[u]] = r
        fill[u] += 1
    return slots


def _case(kind: str, B: int, L: int):
    torch.manual_seed(0)
    if kind == "linear":
        m = nn.Linear(6, 5)
        a = torch.randn(B, L, 6, dtype=torch.float64)
    elif kind == "conv1d":
        from transformers.pytorch_utils import Conv1D
        m = Conv1D(5, 6)
        a = torch.randn(B, L, 6, dtype=torch.float64)
    else:
        m = nn.Embedding(9, 4, padding_idx=0)
        a = torch.randint(0, 9, (B, L))
        a[0, :2] = 0                                   # padding tokens: no gradient to row 0
    m = m.double()
    out_dim = 4 if kind == "embedding" else 5
    g = torch.randn(B, L, out_dim, dtype=torch.float64)
    return m, a, g


@pytest.mark.parametrize("kind", ["linear", "conv1d", "embedding"])
@pytest.mark.parametrize("owner", [None, [0, 1, 1, 2, 2, 2]])
def test_ghost_norm_and_bookkept_sum_match_instantiation(kind, owner):
    B, L = 6, 5
    m, a, g = _case(kind, B, L)
    per = _SAMPLERS[type(m)](m, a, g, frozenset({"bias"}))["weight"]            # [B, *W]
    n_units = B if owner is None else max(owner) + 1
    own = torch.arange(B) if owner is None else torch.tensor(owner)
    units = torch.zeros((n_units,) + tuple(per.shape[1:]), dtype=per.dtype).index_add_(0, own, per)
    use = _Use(m, _ghost_kind(m), a, g)
    got = ghost_norm_sq([use], None if owner is None else _slots(own, n_units))
    torch.testing.assert_close(got, units.flatten(1).square().sum(1))
    f = torch.rand(B, dtype=torch.float64)
    torch.testing.assert_close(use.weighted_sum(f, m.weight.shape), torch.tensordot(f, per, dims=1))
    if kind == "embedding":
        assert per[0, 0].abs().sum() == 0 and use.weighted_sum(f, m.weight.shape)[0].abs().sum() == 0


@pytest.mark.parametrize("owner", [None, [0, 0, 1, 2, 2, 1]])
def test_tied_embedding_and_head_ghost_norm_includes_cross_terms(owner):
    B, L, V, d = 6, 4, 11, 3
    torch.manual_seed(1)
    emb = nn.Embedding(V, d).double()
    head = nn.Linear(d, V, bias=False).double()
    head.weight = emb.weight                                                     # tied
    ids = torch.randint(0, V, (B, L))
    g_emb = torch.randn(B, L, d, dtype=torch.float64)
    h = torch.randn(B, L, d, dtype=torch.float64)
    g_head = torch.randn(B, L, V, dtype=torch.float64)
    per = (_SAMPLERS[nn.Embedding](emb, ids, g_emb)["weight"]
           + _SAMPLERS[nn.Linear](head, h, g_head)["weight"])
    n_units = B if owner is None else max(owner) + 1
    own = torch.arange(B) if owner is None else torch.tensor(owner)
    units = torch.zeros((n_units, V, d), dtype=per.dtype).index_add_(0, own, per)
    uses = [_Use(emb, "embedding", ids, g_emb), _Use(head, "linear", h, g_head)]
    got = ghost_norm_sq(uses, None if owner is None else _slots(own, n_units))
    torch.testing.assert_close(got, units.flatten(1).square().sum(1))
    f = torch.rand(B, dtype=torch.float64)
    torch.testing.assert_close(sum(u.weighted_sum(f, emb.weight.shape) for u in uses),
                               torch.tensordot(f, per, dims=1))


def test_unit_tokens_pads_with_zero_rows():
    x = torch.arange(12.0).view(3, 2, 2)
    u = _unit_tokens(x, torch.tensor([[0, 3], [1, 2]]))
    assert u.shape == (2, 4, 2) and torch.equal(u[0, 2:], torch.zeros(2, 2)) and torch.equal(u[1, 2:], x[2])


# an embedding's left side is token ids (always finite): only its gradient side can be poisoned
@pytest.mark.parametrize("kind,side", [("linear", "a"), ("linear", "g"), ("conv1d", "a"), ("conv1d", "g"),
                                       ("embedding", "g")])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("owner", [None, [0, 1, 1, 2, 2, 2]])
def test_nonfinite_factor_makes_only_its_units_ghost_norm_nonfinite(kind, bad, side, owner):
    """The engine decides a unit's non-finiteness from its squared norm alone, so a non-finite
    factor entry must make that unit's ghost norm non-finite even when the other factor's row is
    zero (inf·0 hidden in a cancelling sum would let a NaN gradient through), and leave every
    other unit's finite."""
    B, L = 6, 5
    m, a, g = _case(kind, B, L)
    a, g = a.clone(), g.clone()
    if side == "a":
        a[2, 1, 3] = bad
        g[2, 1] = 0.0                 # the gradient row that meets it is zero: the product is NaN, not 0
    else:
        g[2, 1, 0] = bad
        if kind != "embedding":
            a[2, 1] = 0.0
    n_units = B if owner is None else max(owner) + 1
    own = torch.arange(B) if owner is None else torch.tensor(owner)
    got = ghost_norm_sq([_Use(m, _ghost_kind(m), a, g)], None if owner is None else _slots(own, n_units))
    bad_unit = int(own[2])
    assert not torch.isfinite(got[bad_unit])
    assert torch.isfinite(torch.cat([got[:bad_unit], got[bad_unit + 1:]])).all()


@pytest.mark.parametrize("owner", [None, [0, 1, 1, 2, 2, 2]])
def test_split_self_gram_equals_instantiation(owner):
    """From SPLIT_GRAM_TOKENS tokens a unit, a use's own Gram pair is formed from its upper row half
    and lower-right quarter (¾ of the LM head's [L, V] products). The tied embedding/head norm still
    equals the instantiated per-unit gradient's (odd L: unequal halves), and a non-finite entry in
    either half still makes its unit's norm — and only its unit's — non-finite."""
    from components.dpsgd.grad_samplers import SPLIT_GRAM_TOKENS

    B, L, V, d = 6, SPLIT_GRAM_TOKENS + 3, 11, 3
    torch.manual_seed(2)
    emb = nn.Embedding(V, d).double()
    head = nn.Linear(d, V, bias=False).double()
    head.weight = emb.weight
    ids = torch.randint(0, V, (B, L))
    g_emb, h = torch.randn(B, L, d, dtype=torch.float64), torch.randn(B, L, d, dtype=torch.float64)
    g_head = torch.randn(B, L, V, dtype=torch.float64)
    per = (_SAMPLERS[nn.Embedding](emb, ids, g_emb)["weight"] + _SAMPLERS[nn.Linear](head, h, g_head)["weight"])
    n_units = B if owner is None else max(owner) + 1
    own = torch.arange(B) if owner is None else torch.tensor(owner)
    slots = None if owner is None else _slots(own, n_units)
    units = torch.zeros((n_units, V, d), dtype=per.dtype).index_add_(0, own, per)
    got = ghost_norm_sq([_Use(emb, "embedding", ids, g_emb), _Use(head, "linear", h, g_head)], slots)
    torch.testing.assert_close(got, units.flatten(1).square().sum(1))
    for t in (3, L - 2):                     # a token in the upper half, then one in the lower
        bad = g_head.clone()
        bad[2, t, 4] = float("nan")
        h_bad = h.clone()
        h_bad[2, t] = 0.0                    # the row that meets it is zero: NaN, not 0, all the same
        got = ghost_norm_sq([_Use(emb, "embedding", ids, g_emb), _Use(head, "linear", h_bad, bad)], slots)
        bad_unit = int(own[2])
        assert not torch.isfinite(got[bad_unit])
        assert torch.isfinite(torch.cat([got[:bad_unit], got[bad_unit + 1:]])).all()


def test_on_a_gpu_large_weights_take_the_ghost_path():
    """At 1B scale on a GPU every instantiated per-record gradient is held to the end of the
    backward (B copies of each weight: 111.6 GiB measured on an H200 with the CPU rule); there only
    narrow weights (GQA's k/v projections, LoRA's rank-r matrices) instantiate."""
    from components.dpsgd.grad_samplers import ghost_pays

    L = 1024   # a unit: 2 records × 512 tokens
    assert ghost_pays([(2048, 5632, False)], L, 64, "cuda")      # MLP
    assert ghost_pays([(2048, 2048, False)], L, 64, "cuda")      # q/o projection
    assert not ghost_pays([(2048, 256, False)], L, 64, "cuda")   # GQA k/v projection
    assert not ghost_pays([(2048, 16, False)], L, 64, "cuda")    # LoRA A
    assert not ghost_pays([(2048, 2048, False)], L, 64, "cpu")   # the CPU rule instantiates it
