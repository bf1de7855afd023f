"""Training precision: `fp32` (default), `bf16`, `fp16` (static loss scale).

What runs in 16 bits: the base model's weights, activations and output gradients (the forward and
the backward through the network). What never does: every per-unit gradient the clipping reads and
sums, each unit's norm, the clip factors, the clipped sum, the noise and the weights the optimizer
updates. The layer samplers multiply a 16-bit layer's input and output gradient with float32
accumulation and result (`mm32`/`bmm32` below: exact products of 16-bit numbers, so the float32
product of the upcasts up to addition order) when forming the per-record gradient (outer product),
the ghost-norm Gram products and the book-kept clipped sum (on CUDA unit by unit, so nothing scaled is
rounded back to 16 bits: grad_samplers._Use.clipped_sum), so a unit's norm is the float32 norm of the
vector that is then scaled and summed: the clipped vector has norm ≤ C up to float32 rounding, as in
an fp32 run. A norm taken in bf16 (8 mantissa bits) could be off by
~0.4 %, and the "clipped" contribution would then exceed C — a sensitivity, and so an ε, above what
the certificate says.

Trainable weights are float32 in every precision:
- LoRA: the adapter's A/B matrices are float32 on a 16-bit frozen base (peft casts the layer input to
  the adapter's dtype and the sum back to the base's).
- Full fine-tuning: the model's weights are 16-bit (that is the memory saving), and the optimizer
  updates a float32 master copy of each (`master_weights`), copied back into the model after every
  step. Keeping the trainable weights in float32 instead would leave nothing in 16 bits for full
  fine-tuning (every weight is trainable) unless the forward ran under autocast, which every forward
  path (hooks, ghost, vmap, the self-check) would have to enter; a master copy needs no context at all
  and an Adam update of lr·u ≪ a bf16 weight's spacing (2⁻⁸ relative) is not lost.

fp16 loss scaling is static: the loss is multiplied by `FP16_LOSS_SCALE` (a public constant, a power
of two, so scaling and unscaling are exact) and every per-record output gradient is divided by it in
float32 before any norm is taken, so clipping sees true gradients. A unit whose scaled gradient
overflows is non-finite and contributes zero, as any non-finite unit does (README "Non-finite unit
gradients"): the decision reads that unit's own numbers only, because the scale is fixed. A dynamic
scale (torch's GradScaler) would change with whether *any* unit of earlier batches overflowed — other
people's data deciding whether yours is dropped — and is therefore not offered.
"""
from __future__ import annotations

import torch

from components.core.errors import VeilError

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# 2¹⁰: fp16's smallest normal number is 6.1e-5; mean-over-tokens losses give output gradients of
# order 1/T·p that underflow without scaling, while activations' gradients in a transformer rarely
# reach 65504/1024 ≈ 64. Public (it is in this file); never adjusted from data (see module docstring).
FP16_LOSS_SCALE = 1024.0
_HALF = (torch.float16, torch.bfloat16)


def dtype_of(precision: str) -> torch.dtype:
    if precision not in DTYPES:
        raise VeilError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    return DTYPES[precision]


def acc(x: torch.Tensor) -> torch.Tensor:
    """`x` in a dtype that per-unit norms and sums may be computed in: float32 for a 16-bit tensor,
    unchanged otherwise (float32, float64, integer ids)."""
    return x.float() if x.dtype in _HALF else x


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def loss_scale_for(model: torch.nn.Module) -> float:
    """The static loss scale a model's backward runs with: FP16_LOSS_SCALE when any floating weight
    is float16 (fp16's range needs it), else 1 (bf16 has float32's range)."""
    return FP16_LOSS_SCALE if any(p.dtype == torch.float16 for p in model.parameters()) else 1.0


def cast_base(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """The base model in the spec's precision (a no-op when it was loaded in it, as `veil train` does)."""
    dt = dtype_of(precision)
    if any(p.is_floating_point() and p.dtype != dt for p in model.parameters()):
        model.to(dt)
    return model


def trainable_to_float32(model: torch.nn.Module) -> None:
    """LoRA: the adapter's weights in float32 whatever the base's dtype (peft does this by default
    today, `autocast_adapter_dtype`; done here too so a peft version that stops doing it cannot
    silently train 16-bit adapters)."""
    for p in model.parameters():
        if p.requires_grad and p.dtype in _HALF:
            p.data = p.data.float()


class MasterWeights:
    """Float32 master copies of a model's 16-bit trainable weights (full fine-tuning in bf16/fp16).

    `params`: what the optimizer updates, in the order of `named` (the master for a 16-bit weight,
    the weight itself otherwise); `sync()` rounds the masters into the model after each step."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]):
        self.named_model = list(named)
        self.masters: dict[str, torch.Tensor] = {}
        for n, p in self.named_model:
            if p.dtype in _HALF:
                self.masters[n] = p.detach().float().clone().requires_grad_(True)
        self.params = [self.masters.get(n, p) for n, p in self.named_model]
        self.named = [(n, t) for (n, _), t in zip(self.named_model, self.params)]

    @torch.no_grad()
    def sync(self) -> None:
        for n, p in self.named_model:
            if n in self.masters:
                p.copy_(self.masters[n])


def optimizer_targets(named: list[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer) -> list:
    """For each trainable weight in `named`, the tensor `optimizer` updates: the weight itself, or
    — for a 16-bit weight — its float32 master (the optimizer was built over `MasterWeights.params`,
    in the same order). A 16-bit weight the optimizer would update in place is refused: Adam's steps
    of lr·u below a bf16 weight's spacing would be lost."""
    if not any(p.dtype in _HALF for _, p in named):
        return [p for _, p in named]
    held = [p for g in optimizer.param_groups for p in g["params"]]
    if len(held) != len(named) or any(m.shape != p.shape for m, (_, p) in zip(held, named)):
        raise VeilError("16-bit trainable weights: build the optimizer over "
                        "components.dpsgd.precision.MasterWeights(trainable).params (same order)")
    for m, (n, p) in zip(held, named):
        if p.dtype in _HALF and m.dtype in _HALF:
            raise VeilError(f"trainable weight {n} is {str(p.dtype).replace('torch.', '')} and the optimizer updates "
                            "it in place: give it a float32 master (components.dpsgd.precision.MasterWeights)")
    return held


def describe(precision: str, full_finetune: bool) -> str:
    """The run's precision as the certificate states it (fp32: the dtype name, as before)."""
    if precision == "fp32":
        return "float32"
    weights = "fp32 master weights" if full_finetune else "fp32 LoRA weights"
    scale = f"static loss scale {FP16_LOSS_SCALE:g}; " if precision == "fp16" else ""
    return f"{precision} base ({scale}fp32 per-unit norms, clipping, clipped sum and noise; {weights})"


# --- products of 16-bit factors with float32 accumulation and output --------------------------
# The per-record gradients, ghost-norm Gram products and the book-kept clipped sum multiply a
# layer's 16-bit input by its 16-bit output gradient. The product of two bf16 (8-bit significand)
# or two fp16 (11-bit) numbers is exact in float32 (24 bits), so a GEMM that reads the 16-bit
# factors and accumulates *and outputs* float32 equals the float32 product of their upcasts up to
# the order of the float32 additions: what the norms and sums are defined as (module docstring),
# without float32 copies of the factors and on the GPU's tensor cores (an H100 does ~60 TFLOP/s in
# float32 SIMT, ~800 in bf16). torch ≥ 2.9 has it on CUDA (`torch.mm/bmm(..., out_dtype=float32)`);
# CPU builds lack `aten::mm.dtype`, so there the factors are upcast first (same values). Which one
# a device has is found once, by trying.
_NATIVE_OUT_DTYPE: dict[str, bool] = {}
_EMULATE_NATIVE = False   # tests: run the CUDA path's logic on CPU (see `emulate_out_dtype`)


def native_products(device: torch.device | str) -> bool:
    """True when 16-bit factors on `device` are multiplied by the fused float32-output GEMM (CUDA,
    torch ≥ 2.9) — then the book-kept clipped sum is formed unit by unit (grad_samplers._Use)."""
    kind = torch.device(device).type
    if _EMULATE_NATIVE:
        return True
    if kind not in _NATIVE_OUT_DTYPE:
        try:
            x = torch.ones((1, 1), dtype=torch.bfloat16, device=device)
            _NATIVE_OUT_DTYPE[kind] = torch.mm(x, x, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _NATIVE_OUT_DTYPE[kind] = False
    return _NATIVE_OUT_DTYPE[kind]


class emulate_out_dtype:
    """Context manager for tests: `native_products` answers True on any device and the fused
    products are computed as float64 products of the upcasts rounded to float32 (the fused GEMM's
    result up to float32 addition order), so the CUDA path's logic runs on a CPU."""

    def __enter__(self):
        global _EMULATE_NATIVE
        self._old, _EMULATE_NATIVE = _EMULATE_NATIVE, True
        return self

    def __exit__(self, *exc):
        global _EMULATE_NATIVE
        _EMULATE_NATIVE = self._old


def _fused(op, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """op(a, b) in one float32-output GEMM when both are the same 16-bit dtype and the device has
    it; None otherwise."""
    if a.dtype not in _HALF or a.dtype != b.dtype or not native_products(a.device):
        return None
    if _EMULATE_NATIVE and not _NATIVE_OUT_DTYPE.get(a.device.type, False):
        return op(a.double(), b.double()).float()
    try:
        return op(a, b, out_dtype=torch.float32)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError) as e:
        # a layout the fused kernel refuses (checked when the op is dispatched, before it runs):
        # contiguous copies, else the caller's upcast product — same values either way
        _warn_once(f"float32-output {op.__name__} refused {tuple(a.shape)}·{tuple(b.shape)} "
                   f"(strides {a.stride()}, {b.stride()}): {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        try:
            return op(a.contiguous(), b.contiguous(), out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, NotImplementedError):
            return None


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        import warnings

        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _product32(op, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """op(a, b) (torch.mm or torch.bmm) with float32 accumulation and result when either factor is
    16-bit: the fused GEMM where the device has it, else on upcast factors (unchanged for float32).
    `out`: a tensor of the result's shape and dtype that the upcast product is written into (the
    fused GEMM allocates its own); the result is returned either way."""
    fused = _fused(op, a, b)
    if fused is not None:
        return fused
    dt = torch.promote_types(acc_dtype(a.dtype), acc_dtype(b.dtype))
    if out is not None and out.dtype == dt:
        return op(a.to(dt), b.to(dt), out=out)
    return op(a.to(dt), b.to(dt))


def mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with float32 accumulation and result when either factor is 16-bit (unchanged otherwise)."""
    return _product32(torch.mm, a, b)


def bmm32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Batched a @ b, as `mm32` (`out`: see _product32)."""
    return _product32(torch.bmm, a, b, out)
