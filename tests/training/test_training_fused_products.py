"""The GPU (CUDA) path of 16-bit training, run on a CPU by emulating its fused products.

On CUDA, products of 16-bit factors use `torch.mm/bmm(..., out_dtype=float32)` (precision.mm32/bmm32:
exact products, float32 accumulation and result, on tensor cores) and the book-kept clipped sum of a
ghosted 16-bit layer is formed unit by unit (P_u = left_uᵀ right_u in float32, then Σ_u f_u P_u) rather
than from factors scaled by f and rounded back to 16 bits. `precision.emulate_out_dtype` makes a CPU take
that path (products computed in float64 and rounded to float32), so its logic is checked here: the
update equals the upcast path's, and no unit's contribution exceeds C on adversarial factors — where
the rounded-factor shortcut does exceed it."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from torch import nn

from components.dpsgd import grad_samplers
from components.dpsgd.grad_samplers import Contiguous, _Use, ghost_norm_sq
from components.dpsgd.per_sample import Unit
from components.dpsgd.precision import bmm32, emulate_out_dtype, mm32, native_products
from test_training_precision import _flat, _llama, _update


def test_products_are_float32_of_exact_16bit_products():
    torch.manual_seed(0)
    a = torch.randn(3, 7, 5).bfloat16()
    b = torch.randn(3, 5, 4).bfloat16()
    want = torch.bmm(a.double(), b.double())
    for ctx in (emulate_out_dtype(), contextlib.nullcontext()):
        with ctx:
            got = bmm32(a, b)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
            assert mm32(a[0], b[0]).dtype == torch.float32
    # float32 factors: the ordinary product, untouched
    x = torch.randn(4, 3)
    assert torch.equal(mm32(x, x.T), x @ x.T)
    with emulate_out_dtype():
        assert native_products("cpu")
        assert torch.equal(mm32(x, x.T), x @ x.T)


def _units_batch():
    """Equal-sized ULS units packed in order (→ `Contiguous` slots), then a micro-batch of ragged units
    (→ index slots) and one of single records."""
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 64, size=(20, 16)).astype(np.int64)
    lengths = rng.integers(4, 17, size=20).astype(np.int64)
    units = ([Unit(np.array([2 * i, 2 * i + 1]), 0.5) for i in range(4)]
             + [Unit(np.array([8, 9, 10]), 1 / 3), Unit(np.array([11]), 1.0), Unit(np.array([12, 13]), 0.5)]
             + [Unit(np.array([i]), 1.0) for i in range(14, 20)])
    return units, ids, lengths


@pytest.mark.parametrize("arch,lora,method", [("gpt2", False, "mixed"), ("gpt2", False, "ghost"),
                                              ("llama", False, "ghost"), ("llama", True, "mixed")])
def test_fused_path_equals_upcast_path(monkeypatch, arch, lora, method):
    """Same bf16 update (both are float32 sums of exact products), and the per-unit clipped sum ran."""
    import test_training_precision as tp

    monkeypatch.setattr(tp, "_batch", _units_batch)
    calls = {"per_unit": 0, "rounded": 0}
    clipped_sum, weighted_sum = _Use.clipped_sum, _Use.weighted_sum

    def spy_clipped(self, *a, **k):
        calls["per_unit"] += 1
        return clipped_sum(self, *a, **k)

    def spy_weighted(self, *a, **k):
        if not self.onehot and self.left.dtype == torch.bfloat16:
            calls["rounded"] += 1
        return weighted_sum(self, *a, **k)

    want, _ = _update(arch, "bf16", lora, method, 0.0)
    monkeypatch.setattr(_Use, "clipped_sum", spy_clipped)
    monkeypatch.setattr(_Use, "weighted_sum", spy_weighted)
    with emulate_out_dtype():
        got, _ = _update(arch, "bf16", lora, method, 0.0)
    rel = float((_flat(got) - _flat(want)).norm() / _flat(want).norm())
    assert rel < 1e-5, rel
    if not lora:   # LoRA's rank-r matrices are instantiated, never ghosted
        assert calls["per_unit"] > 0 and calls["rounded"] == 0


def _adversarial(case: str, B: int, L: int, d_in: int = 24, d_out: int = 16):
    """bf16 factors (a [B, L, d_in], g [B, L, d_out]) built to make clipping error-prone."""
    gen = torch.Generator().manual_seed(7)
    if case == "aligned":
        # every token the same: f·g rounds the same way everywhere (chosen in the test to round up)
        a = torch.ones(B, L, d_in)
        g = torch.ones(B, L, d_out)
    elif case == "cancelling":
        # large token gradients that cancel in pairs, leaving a small remainder: Σ‖g_t‖‖a_t‖ ≫ ‖Σ g_t a_tᵀ‖
        # (1e8: the float32 Gram products stay finite; larger units are non-finite and contribute 0)
        a = torch.randn(B, L, d_in, generator=gen)
        a[:, 1::2] = a[:, 0::2]
        g = torch.randn(B, L, d_out, generator=gen) * 1e8
        g[:, 1::2] = -g[:, 0::2]
        g[:, -1] = torch.randn(B, d_out, generator=gen)
    else:  # "scales": every token at its own scale, 1e-6 … 1e6
        a = torch.randn(B, L, d_in, generator=gen) * 10.0 ** torch.randint(-6, 7, (B, L, 1), generator=gen)
        g = torch.randn(B, L, d_out, generator=gen) * 10.0 ** torch.randint(-6, 7, (B, L, 1), generator=gen)
    return a.bfloat16(), g.bfloat16()


def _contributions(use: _Use, factor: torch.Tensor, owner: torch.Tensor, slots, shape) -> list[torch.Tensor]:
    out = []
    for u in range(factor.shape[0]):
        f_u = torch.where(torch.arange(factor.shape[0]) == u, factor, torch.zeros_like(factor))
        out.append(use.clipped_sum(f_u, f_u[owner], slots, shape).double())
    return out


@pytest.mark.parametrize("case", ["aligned", "cancelling", "scales"])
@pytest.mark.parametrize("grouping", ["records", "contiguous", "index"])
@pytest.mark.parametrize("fused", [True, False])
def test_no_units_contribution_exceeds_C(case, grouping, fused):
    """Each unit's contribution to the clipped sum, as computed (then measured in float64), has norm
    ≤ C up to float32 rounding, on factors built against it. The shortcut the per-unit sum replaces —
    scale the 16-bit factor by f, round it back to bf16, one GEMM — exceeds C by ~2⁻⁹ on "aligned"."""
    B, L = 4, 64
    m = nn.Linear(24, 16, bias=False).bfloat16()
    a, g = _adversarial(case, B, L)
    owner = {"records": torch.arange(4), "contiguous": torch.tensor([0, 0, 1, 1]),
             "index": torch.tensor([0, 0, 0, 1])}[grouping]
    n_units = int(owner.max()) + 1
    slots = {"records": None, "contiguous": Contiguous(2, 2),
             "index": torch.tensor([[0, 1, 2], [3, 4, 4]])}[grouping]
    ctx = emulate_out_dtype() if fused else contextlib.nullcontext()
    with ctx:
        use = _Use(m, "linear", a, g)
        sq = ghost_norm_sq([use], slots).double()
        norms = sq.sqrt()
        if case == "aligned":
            # f = 1 − 0.75·2⁻⁹: f·1 lies between the bf16 numbers 1 − 2⁻⁸ and 1, nearer 1 (rounds up)
            C = float(norms.min()) * (1 - 0.75 * 2 ** -9)
        else:
            C = float(norms[torch.isfinite(norms)].min()) / 3
        ok = torch.isfinite(sq)
        factor = torch.where(ok, (C / norms).clamp(max=1.0), torch.zeros_like(norms))
        for u, contrib in enumerate(_contributions(use, factor, owner, slots, m.weight.shape)):
            if not bool(ok[u]):
                continue
            assert float(contrib.norm()) <= C * (1 + 1e-6), (case, u, float(contrib.norm()) / C)
        if case == "aligned":
            # the rounded-factor shortcut, exactly computed (float64) apart from its bf16 rounding
            f_rec = factor[owner]
            rounded = (g.float() * f_rec.float().view(-1, 1, 1)).bfloat16().double()
            u0 = owner == int(norms.argmin())   # the unit whose f is 1 − 0.75·2⁻⁹
            naive = torch.einsum("blo,bli->oi", rounded[u0], a[u0].double())
            assert float(naive.norm()) > C * (1 + 1e-3)


def test_contiguous_slots_equal_index_slots():
    torch.manual_seed(0)
    m = nn.Linear(6, 5, bias=False).double()
    a, g = torch.randn(6, 5, 6, dtype=torch.float64), torch.randn(6, 5, 5, dtype=torch.float64)
    use = _Use(m, "linear", a, g)
    index = torch.tensor([[0, 1], [2, 3], [4, 5]])
    torch.testing.assert_close(ghost_norm_sq([use], Contiguous(3, 2)), ghost_norm_sq([use], index))
    f = torch.rand(3, dtype=torch.float64)
    owner = torch.tensor([0, 0, 1, 1, 2, 2])
    torch.testing.assert_close(use.clipped_sum(f, f[owner], Contiguous(3, 2), m.weight.shape),
                               use.clipped_sum(f, f[owner], index, m.weight.shape))
    emb = nn.Embedding(9, 5).double()
    ids = torch.randint(0, 9, (6, 5))
    e = _Use(emb, "embedding", ids, g)
    torch.testing.assert_close(ghost_norm_sq([e], Contiguous(3, 2)), ghost_norm_sq([e], index))


def test_no_outputs_held_until_the_backward_ends():
    """Book-keeping keeps each layer output's autograd edge, not the output: the big LoRA-B outputs are
    freed during the forward, as in a non-private step (the memory at 1B was 1.43× non-private)."""
    import gc
    import weakref


    model = _llama()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    hooks = grad_samplers.HookPerRecord(model, names)
    alive = []
    fwd = hooks._forward_hook

    def spy(module, inputs, output):
        fwd(module, inputs, output)
        if hooks._calls is not None and isinstance(output, torch.Tensor):
            alive.append(weakref.ref(output))

    hooks._forward_hook = spy
    for h in hooks._handles:
        h.remove()
    hooks._handles = [m.register_forward_hook(spy) for m, _ in hooks.layers]
    seen = {}
    from components.dpsgd.per_sample import sequence_losses

    def loss_fn(logits, ids, lengths):
        gc.collect()
        seen["alive"] = sum(r() is not None for r in alive)
        return sequence_losses(logits, ids, lengths)

    ids = torch.randint(1, 64, (4, 12))
    hooks.clipped_group(ids, torch.full((4,), 12), torch.ones(4), torch.arange(4), 4, 1.0, loss_fn)
    hooks.remove()
    # outputs still alive at the loss: only those the forward itself saves for its backward (inputs of
    # the next layer, e.g. a norm's input); without the edges every recorded output would be
    assert len(alive) > 10 and seen["alive"] < len(alive)


def test_finiteness_checks_batched_into_one_sync():
    """DPStep's checks of the noisy update and the weights read one flag for all tensors; they still
    stop a run whose weights are NaN (every unit then contributes zero; the updated weights are NaN)."""
    from components.core.errors import VeilError
    from components.dpsgd.precision import MasterWeights
    from components.dpsgd.step import DPStep, all_finite
    from test_training_precision import _batch, _gpt2

    assert all_finite([]) and all_finite([torch.ones(3), torch.zeros(2, 2)])
    assert not all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    assert not all_finite([torch.tensor([float("-inf")]), torch.ones(1)])
    # finite entries whose sum overflows (the sums are the first test): checked entry by entry
    assert all_finite([torch.full((4,), 3e38), torch.full((3,), 3e38, dtype=torch.bfloat16)])
    assert not all_finite([torch.full((4,), 3e38), torch.tensor([3e38, float("nan")])])
    m = _gpt2()
    with torch.no_grad():
        m.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    masters = MasterWeights([(n, p) for n, p in m.named_parameters() if p.requires_grad])
    step = DPStep(m, torch.optim.SGD(masters.params, lr=1.0), private=True, clip_norm=1.0, noise_multiplier=1.0,
                  expected_batch_size=9.0, micro_batch_size=8, private_seed=1)
    units, ids, lengths = _batch()
    with pytest.raises(VeilError, match="not finite"):
        step(0, units, ids, lengths)
    step.close()


def test_kept_per_record_buffers_are_reused_and_do_not_leak():
    """On a CPU the book-kept backward writes per-record gradients into buffers kept from one
    micro-batch to the next (no fresh pages each step): a second micro-batch of other records gives
    what a fresh engine gives on it, in the same buffers, and none of them is in the returned sum."""
    import copy

    from components.dpsgd.grad_samplers import HookPerRecord
    from components.dpsgd.per_sample import sequence_losses
    from test_training_precision import _gpt2

    model = _gpt2()
    fresh_model = copy.deepcopy(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    rng = np.random.default_rng(3)
    batches = [torch.as_tensor(rng.integers(1, 64, size=(4, 12))) for _ in range(2)]
    lengths = torch.tensor([12, 9, 5, 12])
    args = (torch.ones(4, dtype=torch.float64), torch.arange(4), 4, 0.05, sequence_losses)

    hp = HookPerRecord(model, names)
    hp.clipped_group(batches[0], lengths, *args, ghost="never")
    kept = {k: [t.data_ptr() for t in v] for k, v in hp._buffers._kept.items()}
    assert kept, "no per-record buffer was kept"
    got, _ = hp.clipped_group(batches[1], lengths, *args, ghost="never")
    assert {k: [t.data_ptr() for t in v] for k, v in hp._buffers._kept.items()} == kept
    ptrs = {p for v in kept.values() for p in v}
    assert not any(t.data_ptr() in ptrs for t in got.values())
    hp.remove()
    want, _ = HookPerRecord(fresh_model, names).clipped_group(batches[1], lengths, *args, ghost="never")
    for n in names:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-7, msg=n)
