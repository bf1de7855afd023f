"""Per-record gradients from one ordinary batched forward/backward, layer by layer.

Each supported layer type has a sampler, registered here in one place, that turns the layer's
input activations and output gradients into per-record parameter gradients (the LoRA A/B matrices
are nn.Linear: their per-record gradients are tiny, r×d, so they are instantiated directly).
A model with a trainable parameter in an unsupported layer falls back to torch.func vmap(grad).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from components.dpsgd.precision import _HALF, acc, acc_dtype, bmm32, native_products
from components.dpsgd.model_prep import checkpointing_on

Sampler = Callable[..., dict[str, torch.Tensor]]  # (module, input, grad_output, skip) -> {local: [B, ...]}
_SAMPLERS: dict[type, Sampler] = {}


def register_grad_sampler(*types: type):
    def deco(fn: Sampler) -> Sampler:
        for t in types:
            _SAMPLERS[t] = fn
        return fn
    return deco


def _rms_eps(module: nn.Module) -> float | None:
    """ε of an RMSNorm-style layer (y = w ⊙ x/rms(x), or (1 + w) ⊙ x/rms(x) as in Gemma: either way
    ∂y/∂w = x/rms(x)), recognised by name and shape; None for anything else."""
    name = type(module).__name__
    w = getattr(module, "weight", None)
    if not (name.endswith("RMSNorm") or name == "T5LayerNorm") or not isinstance(w, nn.Parameter) or w.dim() != 1:
        return None
    if any(p is not w for p in module.parameters(recurse=False)):
        return None  # a bias or anything else: not the form above
    for attr in ("variance_epsilon", "eps", "epsilon"):
        if isinstance(getattr(module, attr, None), float):
            return float(getattr(module, attr))
    return None


def sampler_for(module: nn.Module) -> Sampler | None:
    """The registered sampler of the module's type, or the RMSNorm one for an RMSNorm-style layer.
    Every sampler is checked against autograd on the run's first micro-batch (`self_check`)."""
    fn = _SAMPLERS.get(type(module))
    if fn is None and _rms_eps(module) is not None:
        return _rms_norm
    return fn


def _rms_norm(module, a, g, skip=frozenset()):
    out = {}
    if _wants(module, "weight", skip):
        x = a.float()
        x_hat = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + _rms_eps(module))
        g = acc(g)  # a 16-bit output gradient: the per-record product in float32 (precision.py)
        prod = g * x_hat.to(g.dtype)
        out["weight"] = prod.reshape(prod.shape[0], -1, prod.shape[-1]).sum(1)
    return out


def _flat(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, ..., d] -> [B, L, d] for activations and gradients alike."""
    return a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])


def _wants(module: nn.Module, name: str, skip=frozenset()) -> bool:
    p = getattr(module, name, None)
    return name not in skip and isinstance(p, nn.Parameter) and p.requires_grad


class RecordBuffers:
    """Per-record gradient tensors kept from one book-kept micro-batch to the next, on a CPU.

    A fresh [B, m, n] tensor per layer and micro-batch is a fresh mapping from the C allocator,
    which the kernel fills page by page on first write: measured on GPT-2 4×256 full fine-tuning
    (batch 16 × 128), 48 k page faults and 0.2 s of system time a step, ~10 % of the step. Buffers
    are handed out in request order (`take`) and all taken back when the next micro-batch starts
    (`rewind`), when every tensor of the previous one has been read (the clipped sum returned holds
    none of them). CUDA's caching allocator already reuses its blocks: not used there."""

    def __init__(self):
        self._kept: dict[tuple, list[torch.Tensor]] = {}
        self._next: dict[tuple, int] = {}

    def rewind(self) -> None:
        self._next.clear()

    def take(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        key = (tuple(shape), dtype)
        kept = self._kept.setdefault(key, [])
        i = self._next.get(key, 0)
        self._next[key] = i + 1
        if i == len(kept):
            kept.append(torch.empty(shape, dtype=dtype))
        return kept[i]

    def clear(self) -> None:
        self._kept.clear()
        self._next.clear()


# The buffers of the book-kept backward running now (HookPerRecord.clipped_group sets them for the
# duration of its backward; CPU autograd runs the hooks on the calling thread); None otherwise.
_BUFFERS: RecordBuffers | None = None


def _bmm_rec(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bmm32(a, b), written into a kept buffer during a book-kept CPU backward."""
    bufs = _BUFFERS
    if bufs is None or a.device.type != "cpu":
        return bmm32(a, b)
    dt = torch.promote_types(acc_dtype(a.dtype), acc_dtype(b.dtype))
    return bmm32(a, b, out=bufs.take((a.shape[0], a.shape[1], b.shape[2]), dt))


def _outer_sum(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per record Σ_l x_l y_lᵀ: [B, L, m], [B, L, n] -> [B, m, n], float32 for 16-bit factors
    (precision.bmm32: exact products, float32 accumulation; no float32 copies of the factors on
    CUDA). The batched matmul is run with the narrower factor transposed (for LoRA, the rank-r
    side), which is 2× faster on CPU; the result may then be a transposed view."""
    if x.shape[-1] <= y.shape[-1]:
        return _bmm_rec(x.transpose(1, 2), y)
    return _bmm_rec(y.transpose(1, 2), x).transpose(1, 2)


@register_grad_sampler(nn.Linear)
def _linear(module, a, g, skip=frozenset()):
    a, g = _flat(a, g)  # 16-bit factors: per-record products and sums in float32 (precision.py)
    out = {}
    if _wants(module, "weight", skip):
        out["weight"] = _outer_sum(g, a)
    if _wants(module, "bias", skip):
        out["bias"] = g.sum(1, dtype=acc_dtype(g.dtype))
    return out


def _conv1d_types() -> tuple[type, ...]:
    try:
        from transformers.pytorch_utils import Conv1D
        return (Conv1D,)
    except ImportError:  # pragma: no cover - transformers always ships it today
        return ()


def _conv1d(module, a, g, skip=frozenset()):  # HF GPT-2 Conv1D: y = x @ W + b, W is [in, out]
    a, g = _flat(a, g)
    out = {}
    if _wants(module, "weight", skip):
        out["weight"] = _outer_sum(a, g)
    if _wants(module, "bias", skip):
        out["bias"] = g.sum(1, dtype=acc_dtype(g.dtype))
    return out


if _conv1d_types():
    register_grad_sampler(*_conv1d_types())(_conv1d)


def _embedding_scatter(module, ids, g, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-record embedding gradient [B, V, d], scattered into `out` when given (a tied weight's
    per-record gradient from its other use: no second B×V×d tensor, fill and sum)."""
    B = g.shape[0]
    if ids.shape[0] != B:  # e.g. position ids [1, T] shared by the whole batch
        ids = ids.expand((B,) + tuple(ids.shape[1:]))
    ids = ids.reshape(B, -1)
    g = g.reshape(B, -1, g.shape[-1])
    if module.padding_idx is not None:  # the padding row never gets a gradient
        g = g * (ids != module.padding_idx).unsqueeze(-1).to(g.dtype)
    if out is None:
        out = torch.zeros((B,) + tuple(module.weight.shape), dtype=g.dtype, device=g.device)
    rows = torch.arange(B, device=ids.device)[:, None].expand_as(ids)
    out.index_put_((rows, ids), g.to(out.dtype), accumulate=True)
    return out


@register_grad_sampler(nn.Embedding)
def _embedding(module, ids, g, skip=frozenset()):
    out = {}
    if _wants(module, "weight", skip):
        out["weight"] = _embedding_scatter(module, ids, acc(g))   # float32 rows for a 16-bit layer
    return out


@register_grad_sampler(nn.LayerNorm)
def _layer_norm(module, a, g, skip=frozenset()):
    a, g = acc(a), acc(g)
    x_hat = F.layer_norm(a, module.normalized_shape, eps=module.eps)
    dims = list(range(1, a.dim() - len(module.normalized_shape)))
    out = {}
    if _wants(module, "weight", skip):
        out["weight"] = (g * x_hat.to(g.dtype)).sum(dims) if dims else g * x_hat
    if _wants(module, "bias", skip):
        out["bias"] = g.sum(dims) if dims else g
    return out


# --- ghost norms + book-keeping for matmul and embedding weights -------------------------------
# A use of a weight W [m, n] by a Linear, Conv1D or Embedding layer contributes Σ_t left_t right_tᵀ
# over the unit's tokens: Linear (W [o, i]) left = output grad g, right = input a; Conv1D (W [i, o])
# left = a, right = g; Embedding (W [V, d]) left = one-hot token id, right = g. A tied weight (GPT-2's
# wte is both the input embedding and the LM head) is the sum over its uses, so its squared norm is
#     Σ_{uses j, l} Σ_{t, s} (left_j,t · left_l,s)(right_j,t · right_l,s)
# — L×L Gram matrices, O(L²(m+n)) per use pair (O(L²n) when a side is one-hot), instead of the
# per-record m×n gradient: O(L·m·n) work and B·m·n memory (B×V×d for an LM head). The clipped sum
# is then Σ_r f_r Σ_t left_rt right_rtᵀ: one matmul (or a row scatter for one-hot), no per-record
# gradient kept. Chosen per weight by `ghost_pays`; LoRA's rank-r matrices always instantiate.

def _ghost_kind(module: nn.Module) -> str | None:
    if type(module) is nn.Linear:
        return "linear"
    if _conv1d_types() and isinstance(module, _conv1d_types()):
        return "conv1d"
    if type(module) is nn.Embedding and not module.scale_grad_by_freq and not module.sparse:
        return "embedding"
    return None


def _factor_dims(module: nn.Module, kind: str) -> tuple[int, int, bool]:
    """(left width m, right width n, left is one-hot) of a use of `module.weight` [m, n]."""
    w = module.weight
    return int(w.shape[0]), int(w.shape[1]), kind == "embedding"


# Instantiation's cost beyond the matmul is memory traffic over the B×m×n per-record tensor: one
# pass per use (the bmm's write, a tied weight's scatter-add) plus two reads (norm, weighted sum).
# A pass costs about PASS_COST multiply-adds per element while the tensor fits the last-level cache
# (CACHE_BYTES), 4× that beyond it; ghost's extra is its Gram matrices. Measured with
# `bench/dp_step.py --full` (GPT-2 4×256, batch 16) on a shared 2-core CPU: at seq 128 and 256 the
# blocks' matrices (12–17 MB per layer) instantiate and the tied 8192×256 wte/LM head (134 MB)
# ghosts — the other choice was 8–40 % slower in each case.
PASS_COST = 21
CACHE_BYTES = 32 * 2 ** 20
# Instantiate only while the per-record gradient (m·n per unit) is at most this many times the
# per-unit factors the ghost path keeps anyway (Σ_uses L·(m+n)): per-record memory stays within a
# small multiple of the layer's saved activations, so large layers of large models go ghost.
INSTANTIATION_MEMORY = 2
# On a GPU the Gram products run on tensor cores (precision.mm32/bmm32) and cost little next to
# writing and re-reading B per-record copies of a weight, and every instantiated layer's per-record
# gradient is held until the last layer's backward has run (the norms need all of them): with the
# CPU rule above a 1.1B Llama (bf16, 16 records × 512 tokens) held 111.6 GiB on an H200, 3.4× the
# non-private step. There, a weight instantiates only when its per-record gradient is at most half
# the factors the ghost path keeps anyway (GQA's narrow k/v projections, LoRA's rank-r matrices).
GPU_INSTANTIATION_MEMORY = 0.5


def ghost_pays(dims: list[tuple[int, int, bool]], tokens: int, tensor_bytes: int = 0, device_type: str = "cpu") -> bool:
    """Cost model, per unit of `tokens` tokens, for a weight with uses `dims` (see _factor_dims);
    `tensor_bytes`: bytes per element of m×n over the whole micro-batch (records × itemsize).
    Both paths form the weight-gradient product once — ghost as the book-kept sum's matmul, the
    instantiated path as the per-record matmul (its weighted sum then only reads B×m×n) — so they
    differ by ghost's L×L Gram pair per use pair against instantiation's memory passes. Instantiation
    is ruled out when its memory would exceed INSTANTIATION_MEMORY × the factors (so a 1B-class
    layer never holds B copies of its weight)."""
    L = tokens
    ghost = 0
    for j, (mj, nj, oj) in enumerate(dims):
        for ml, nl, ol in dims[j:]:
            ghost += L * L * ((1 if (oj or ol) else mj) + nj)
    m, n = dims[0][0], dims[0][1]
    factors = sum(L * ((1 if oh else mm) + nn) for mm, nn, oh in dims)
    if device_type == "cuda":
        return m * n > GPU_INSTANTIATION_MEMORY * factors
    if m * n > INSTANTIATION_MEMORY * factors:
        return True
    per_pass = PASS_COST * (1 if m * n * tensor_bytes <= CACHE_BYTES else 4)
    return ghost < per_pass * m * n * (len(dims) + 2)


class Contiguous(NamedTuple):
    """Unit slots when record b is slot b mod K of unit b // K (every unit has K records, in order,
    as per_sample packs equal-sized units): a unit's tokens are then a reshape of the records',
    no copy (the [U, K] index form below copies every factor twice per use)."""
    units: int
    per_unit: int


def _unit_tokens(x: torch.Tensor, slots) -> torch.Tensor:
    """[B, L, d] per record -> [U, K·L, d] per unit (slots: [U, K] index records, B = zero pad;
    or `Contiguous`)."""
    if slots is None:
        return x
    if isinstance(slots, Contiguous):
        return x.reshape(slots.units, -1, x.shape[-1])
    pad = torch.cat([x, x.new_zeros((1,) + tuple(x.shape[1:]))])
    u = pad[slots]                                      # [U, K, L, d]
    return u.reshape(u.shape[0], -1, u.shape[-1])


class _Use:
    """One use of a weight as Σ_t left_t right_tᵀ: left [B, L, m] (or ids [B, L] when one-hot)."""

    def __init__(self, module: nn.Module, kind: str, a: torch.Tensor, g: torch.Tensor):
        B = g.shape[0]
        self.onehot = kind == "embedding"
        if self.onehot:
            ids = a if a.shape[0] == B else a.expand((B,) + tuple(a.shape[1:]))
            ids = ids.reshape(B, -1)
            g = g.reshape(B, -1, g.shape[-1])
            if module.padding_idx is not None:  # the padding row never gets a gradient
                g = g * (ids != module.padding_idx).unsqueeze(-1).to(g.dtype)
            self.left, self.right = ids, g
        else:
            a, g = _flat(a, g)
            # the factors stay in the model's dtype (16 bits: half the memory while they wait for
            # the clip factors); every product of them is taken in float32 (ghost_norm_sq, weighted_sum)
            dt = torch.promote_types(a.dtype, g.dtype)
            a, g = a.to(dt), g.to(dt)
            self.left, self.right = (g, a) if kind == "linear" else (a, g)

    def units(self, slots: "torch.Tensor | Contiguous | None") -> tuple[torch.Tensor, torch.Tensor]:
        if slots is None:
            return self.left, self.right
        if self.onehot and isinstance(slots, Contiguous):
            left = self.left.reshape(slots.units, -1)
        elif self.onehot:  # padded tokens get id 0; their right rows are zero, so they add nothing
            left = torch.cat([self.left, self.left.new_zeros((1, self.left.shape[1]))])[slots]
            left = left.reshape(left.shape[0], -1)
        else:
            left = _unit_tokens(self.left, slots)
        return left, _unit_tokens(self.right, slots)

    def drop_records(self, keep: torch.Tensor) -> None:
        """Zero the factors of the records not in `keep` [B] (a one-hot left side is ids: the
        zeroed right side is enough)."""
        zero = torch.zeros((), dtype=self.right.dtype, device=self.right.device)
        self.right = torch.where(keep.view(-1, 1, 1), self.right, zero)
        if not self.onehot:
            self.left = torch.where(keep.view(-1, 1, 1), self.left, torch.zeros((), dtype=self.left.dtype,
                                                                                device=self.left.device))

    def clipped_sum(self, f_unit: torch.Tensor, f_rec: torch.Tensor, slots: "torch.Tensor | Contiguous | None",
                    shape: torch.Size) -> torch.Tensor:
        """Σ_u f_u Σ_{t∈u} left_t right_tᵀ, float32 (f_unit [U] per unit, f_rec [B] the same per record).

        16-bit factors on a device with fused float32-output GEMMs (CUDA): unit by unit, P_u =
        left_uᵀ right_u from the 16-bit factors themselves (exact products, float32 accumulation),
        then Σ_u f_u P_u in float32 — the float32 path's value up to the order of float32
        additions, on tensor cores. Scaling the factors by f before one big GEMM, as the float32
        path does, would need f·right rounded back to 16 bits: each unit's contribution would then
        be off by up to ~2⁻⁸·f·Σ‖right‖‖left‖ and could exceed C (README "Precision"). Otherwise:
        `weighted_sum` (one GEMM over all tokens with float32 factors)."""
        if (self.onehot or self.left.dtype not in _HALF or self.left.dtype != self.right.dtype
                or not native_products(self.left.device)):
            return self.weighted_sum(f_rec, shape)
        left, right = self.units(slots)
        f = (f_rec if slots is None else f_unit).float()
        m, n = left.shape[-1], right.shape[-1]
        # P for a chunk of units is [c, m, n] float32: bounded to ~256 MiB (an LM head's is 0.25 GB/unit)
        chunk = max(1, (256 << 20) // max(1, 4 * m * n))
        out = None
        for s in range(0, left.shape[0], chunk):
            p = bmm32(left[s:s + chunk].transpose(1, 2), right[s:s + chunk])
            part = torch.tensordot(f[s:s + chunk], p, dims=1)
            out = part if out is None else out.add_(part)   # `out` is a fresh tensor: in place is safe
        return out.reshape(shape)

    def weighted_sum(self, f: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """Σ_r f_r Σ_t left_rt right_rtᵀ (f [B], one factor per record)."""
        right = acc(self.right)   # the clipped sum in float32 even for 16-bit factors
        rf = right * f.to(right.dtype).view(-1, 1, 1)
        if self.onehot:
            out = rf.new_zeros(shape)
            return out.index_add_(0, self.left.reshape(-1), rf.reshape(-1, rf.shape[-1]))
        return acc(self.left).reshape(-1, self.left.shape[-1]).T @ rf.reshape(-1, rf.shape[-1])


def _gram(x: torch.Tensor, y: torch.Tensor, x_onehot: bool, y_onehot: bool, dtype) -> torch.Tensor:
    """[U, Lx, Ly] of x_t · y_s, where a one-hot side is given by its ids [U, L]."""
    if x_onehot and y_onehot:
        return (x.unsqueeze(2) == y.unsqueeze(1)).to(dtype)
    if x_onehot:
        return _gram(y, x, False, True, dtype).transpose(1, 2)
    if y_onehot:  # x_t · e_{y_s} = x_t[y_s]
        return acc(torch.gather(x, 2, y.unsqueeze(1).expand(x.shape[0], x.shape[1], y.shape[1])))
    return bmm32(x, y.transpose(1, 2))


# A use's own Gram pair with at least this many tokens per unit splits its wider side's Gram (see
# _self_pair); below it the two half-size products cost more than the quarter they save.
SPLIT_GRAM_TOKENS = 64


def _self_pair(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_{t,s} (x_t·x_s)(y_t·y_s) per unit, [U, L, m], [U, L, n] -> [U]: a use's own term of its
    weight's squared norm. Both Gram matrices are symmetric, so the wider side's (an LM head's
    [L, V] output gradient: the costly one) is formed as its upper row half against all columns and
    its lower-right quarter only — ¾ of the products — with the off-diagonal quarter counted twice.
    `ghost_pays` still counts the whole Gram: at 128 tokens the split saved 8 % of the product on
    this CPU (smaller GEMMs run slower), at 256 tokens 30 %."""
    if x.shape[-1] < y.shape[-1]:
        x, y = y, x
    L = x.shape[1]
    w = bmm32(y, y.transpose(1, 2))                       # the narrow side's Gram, whole
    if L < SPLIT_GRAM_TOKENS:
        return (_gram(x, x, False, False, w.dtype) * w).sum((1, 2))
    h = L // 2
    top = _gram(x[:, :h], x, False, False, w.dtype) * w[:, :h]   # rows [0, h) against every column
    bottom = _gram(x[:, h:], x[:, h:], False, False, w.dtype) * w[:, h:, h:]
    return top[:, :, :h].sum((1, 2)) + 2 * top[:, :, h:].sum((1, 2)) + bottom.sum((1, 2))


def ghost_norm_sq(uses: list[_Use], slots: "torch.Tensor | Contiguous | None") -> torch.Tensor:
    """Per-unit squared norm of Σ_uses (the weight's gradient), from Gram matrices only. Products
    of 16-bit factors are float32 (precision.bmm32: exact products, float32 accumulation and
    output): a unit's norm is never computed in 16 bits.

    A non-finite entry in a unit's factors makes that unit's result non-finite (the engine's only
    finiteness test for a ghosted weight): the token's own Gram diagonal x_t·x_t is then inf or NaN
    in any BLAS (its operands are that very entry, never a skipped zero), and inf·0 is NaN."""
    fs = [(u.units(slots), u.onehot) for u in uses]
    total = None
    for j, ((lj, rj), oj) in enumerate(fs):
        for l in range(j, len(fs)):
            (ll, rl), ol = fs[l]
            if l == j and not oj:
                c = _self_pair(lj, rj)
            else:
                rg = bmm32(rj, rl.transpose(1, 2))
                c = (_gram(lj, ll, oj, ol, rg.dtype) * rg).sum((1, 2))
            c = c if l == j else 2 * c
            total = c if total is None else total + c
    return total


def row_sq_norms(u: torch.Tensor) -> torch.Tensor:
    """‖u[b]‖² for each b, in float64 (computed in float32 at least, float64 for a float64 u),
    without copying a strided (e.g. transposed) u."""
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    if u.dim() == 1:
        return u.to(dt).square().double()
    return torch.linalg.vector_norm(u, dim=tuple(range(1, u.dim())), dtype=dt).square().double()


def _weighted_rows(f: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Σ_b f[b] u[b] without copying u when it is a transposed per-record view (`_outer_sum`)."""
    if u.dim() == 3 and not u.is_contiguous() and u.mT.is_contiguous():
        return torch.tensordot(f, u.mT, dims=1).T
    return torch.tensordot(f, u, dims=1)


def supported(model: nn.Module) -> bool:
    """True when every trainable parameter lives in a layer with a registered sampler."""
    for m in model.modules():
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if own and sampler_for(m) is None:
            return False
        if own and isinstance(m, nn.Embedding) and (m.scale_grad_by_freq or m.sparse):
            return False  # gradients rescaled by batch counts / sparse: left to torch.func
    return True


def _root_outputs(outs: list) -> list:
    """The outputs whose autograd history contains no other output of `outs`. Every other output
    depends on one of them, so a backward to these roots computes (and hooks see) all of them.
    `outs`: tensors, or autograd GradientEdges of them (`.node` is the tensor's grad_fn).

    Each output's history is searched until another output's node turns up — a few nodes away for
    all but the first layers — and subgraphs found to hold none are remembered; a walk of the whole
    graph cost ~30 ms of host time a step at 22 layers × 14 LoRA matrices."""
    def fn(o):
        return o.node if isinstance(o, torch.autograd.graph.GradientEdge) else o.grad_fn

    nodes = [fn(o) for o in outs]
    marks = {n for n in nodes if n is not None}
    clear: set = set()   # nodes with no output's node anywhere below them (searched to the end)

    def has_output_below(start) -> bool:
        stack = [c for c, _ in start.next_functions if c is not None]
        seen: set = set()
        while stack:   # iterative: graphs of deep models overflow Python's recursion
            node = stack.pop()
            if node in marks:
                return True
            if node in clear or node in seen:
                continue
            seen.add(node)
            stack.extend(c for c, _ in node.next_functions if c is not None)
        clear.update(seen)
        return False

    return [o for o, n in zip(outs, nodes) if n is None or not has_output_below(n)]


class _Tap(torch.autograd.Function):
    """Identity on a recorded layer's output (under activation checkpointing) that keeps the layer's
    input as an autograd saved tensor: the checkpoint then drops it after the forward and
    recomputes it in the backward like the layer's own activations, instead of the sampler holding
    it from the forward to the end. The backward hands (output gradient, input) to the sampler,
    once per recorded use; a rerun's tap (sink None) only keeps the saved tensors in step with the
    first forward's, which is how the checkpoint matches them."""

    @staticmethod
    def forward(ctx, out, a, sink):
        ctx.save_for_backward(a)
        ctx.sink = sink
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        if ctx.sink is not None:
            hp, ci = ctx.sink
            hp._on_grad(ci, g, ctx.saved_tensors[0])
        return g, None, None


class HookPerRecord:
    """Per-record gradients of `loss_fn(model(ids))` via forward/tensor hooks on sampled layers."""

    def __init__(self, model: nn.Module, names: list[str]):
        self.model = model
        by_id = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        self.names = names
        self.layers: list[tuple[nn.Module, dict[str, str]]] = []  # module, local name -> canonical name
        for m in model.modules():
            own = {ln: by_id[id(p)] for ln, p in m.named_parameters(recurse=False)
                   if p.requires_grad and id(p) in by_id}
            if own:
                self.layers.append((m, own))
        self._acts: dict[int, list[torch.Tensor]] = {}
        self._grads: dict[int, list[torch.Tensor]] = {}
        # book-keeping mode: (layer, input, GradientEdge of its output) per call, in call order
        self._calls: list[tuple[nn.Module, torch.Tensor | None, object]] | None = None
        self._on_grad = None   # book-keeping mode: consumer of (call index, output gradient)
        self._handles = []
        self._active = False
        self._buffers = RecordBuffers()   # per-record gradients of the book-kept CPU backward, reused
        # fp16's static loss scale (precision.py): the backward runs on scale·loss and every output
        # gradient is unscaled in float32 before a sampler or a norm sees it. 1: no scaling.
        self.loss_scale = 1.0
        self._tap = False          # book-keeping under activation checkpointing: inputs go through _Tap
        self._replaying = False    # the book-kept backward, in which checkpointed layers rerun
        self._on_grad = None
        for m, _ in self.layers:
            self._handles.append(m.register_forward_hook(self._forward_hook))

    def _forward_hook(self, module, inputs, output):
        # `_active` is set for our forward only, never for the backward: a layer that activation
        # checkpointing reruns during the backward is recorded once (its first call), which is
        # also the call whose output the tensor hooks sit on.
        if self._replaying:  # a checkpointed layer rerun by the backward: not another use
            if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.requires_grad:
                return _Tap.apply(output, inputs[0].detach(), None)   # the first forward's saved tensors
            return
        if not self._active or not torch.is_grad_enabled() or not isinstance(output, torch.Tensor):
            return
        if self._calls is not None:  # book-keeping mode: keep (layer, input, output's edge) in call order
            if output.requires_grad:
                ci = len(self._calls)
                if self._tap:   # the input rides in the graph (recomputed by the checkpoint); the output by its edge
                    self._calls.append((module, None, torch.autograd.graph.get_gradient_edge(output)))
                    return _Tap.apply(output, inputs[0].detach(), (self, ci))
                # the output's GradientEdge (its grad_fn), not the output: holding every layer's
                # output until the backward ends kept each LoRA B's float32 [B, L, out] output
                # alive (12 GiB at 1B). The tensor hook stays on the grad_fn after the output is freed.
                self._calls.append((module, inputs[0].detach(), torch.autograd.graph.get_gradient_edge(output)))
                output.register_hook(lambda g, ci=ci: self._on_grad(ci, g))
            return
        key = id(module)
        self._acts.setdefault(key, []).append(inputs[0].detach())
        if output.requires_grad:
            output.register_hook(lambda g, key=key: self._grads.setdefault(key, []).append(g.detach()))

    def __call__(self, ids: torch.Tensor, lengths: torch.Tensor, loss_fn) -> tuple[dict, torch.Tensor]:
        self._acts.clear()
        self._grads.clear()
        self._active = True
        try:
            out = self._forward(ids)
            losses = loss_fn(out.logits, ids, lengths)
        finally:
            self._active = False
        # Recording stops with the forward: under activation checkpointing the backward reruns each
        # checkpointed layer's forward (and so these hooks), and a rerun is not another use.
        (losses.sum() * self.loss_scale).backward()
        per: dict[str, torch.Tensor] = {}
        for m, own in self.layers:
            acts = self._acts.get(id(m), [])
            grads = self._grads.get(id(m), [])[::-1]  # backward visits calls in reverse order
            for a, g in zip(acts, grads):
                g = self._unscale(g)
                if g.shape[0] != ids.shape[0]:
                    raise RuntimeError(f"{type(m).__name__}: output not batched per record "
                                       f"({tuple(g.shape)}); use per_record='vmap'")
                for local, t in sampler_for(m)(m, a, g, frozenset()).items():
                    name = own[local]
                    per[name] = per[name] + t if name in per else t  # tied weights: sum over uses
            for p in m.parameters(recurse=False):
                p.grad = None
        self._acts.clear()
        self._grads.clear()
        B = ids.shape[0]
        params = dict(self.model.named_parameters())
        for n in self.names:  # a trainable parameter the batch never touched: zero gradient
            if n not in per:
                per[n] = torch.zeros((B,) + tuple(params[n].shape), dtype=acc_dtype(params[n].dtype),
                                     device=ids.device)
        return per, losses.detach()

    def clipped_group(self, ids: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor, owner: torch.Tensor,
                      n_units: int, clip_norm: float, loss_fn, ghost: str = "auto") -> tuple[dict, torch.Tensor]:
        """Σ_u clip_C(Σ_{r∈u} w_r ∇ℓ_r) for one micro-batch holding whole units, from one
        forward and one backward to the layer outputs only (no parameter .grad is formed).

        weights [B]: w_r; owner [B]: the unit of each record (0..n_units-1); ghost: "auto"
        (per-layer cost rule), "always" (every Linear/Conv1D weight used once), "never"."""
        B = ids.shape[0]

        self._tap = checkpointing_on(self.model)
        # before the forward: its host sync (K) then waits for nothing, and the Python work between
        # the forward and the backward below overlaps the device's forward
        singletons = n_units == B
        slots = None
        K = 1
        if not singletons:  # [U, K] record indices per unit, padded with B (a zero row)
            own_h = owner.cpu()   # B integers: the one host sync this needs
            counts = torch.bincount(own_h, minlength=n_units)
            K = int(counts.max())
            if n_units * K == B and bool((own_h == torch.arange(n_units).repeat_interleave(K)).all()):
                slots = Contiguous(n_units, K)
            else:
                order = torch.argsort(own_h, stable=True)
                starts = torch.cumsum(counts, 0) - counts
                pos_in_unit = torch.arange(B) - starts[own_h[order]]
                slots = torch.full((n_units, K), B, dtype=torch.long)
                slots[own_h[order], pos_in_unit] = order
                slots = slots.to(owner.device)
        self._calls = []
        self._active = True
        try:
            out = self._forward(ids)
            losses = loss_fn(out.logits, ids, lengths)
            calls = self._calls
        finally:
            self._active = False
            self._calls = None
        unit_len = ids.shape[1] * K

        # every use of each trainable parameter in this forward (a tied weight has several)
        uses: dict[str, list[tuple[int, str]]] = {}
        for ci, (m, _, _) in enumerate(calls):
            for local, name in self._own(m).items():
                uses.setdefault(name, []).append((ci, local))
        params = dict(self.model.named_parameters())
        ghosted: set[str] = set()
        if ghost != "never":
            for name, us in uses.items():
                kinds = [(_ghost_kind(calls[ci][0]) if local == "weight" else None) for ci, local in us]
                if None in kinds:
                    continue
                dims = [_factor_dims(calls[ci][0], k) for (ci, _), k in zip(us, kinds)]
                if ghost == "always" or ghost_pays(dims, unit_len, B * params[name].element_size(),
                                                       params[name].device.type):
                    ghosted.add(name)

        # Each layer's output gradient is consumed by a tensor hook as the backward reaches it:
        # instantiated per-record gradients are formed there and the [B, L, out] gradient is let go
        # (ghosted layers keep it for the book-kept sum). The backward is asked for the gradients
        # of the root outputs only (those that depend on no other recorded output), which every
        # other output lies upstream of; asking for all of them would hold every one to the end.
        per_record: dict[str, torch.Tensor] = {}
        ghost_uses: dict[str, list[_Use]] = {}
        fresh: set[str] = set()
        sq_now: dict[str, torch.Tensor] = {}

        def consume(ci: int, g: torch.Tensor, a_tap: torch.Tensor | None = None) -> None:
            m, a, edge = calls[ci]
            if a_tap is not None:   # under checkpointing: the input the checkpoint recomputed (_Tap)
                a = a_tap
            # this call's input is let go here (the backward frees its own saved copy when it
            # reaches the layer), not when the whole backward ends; a ghosted layer keeps it in _Use
            calls[ci] = (m, None, edge)
            if g.shape[0] != B:
                raise RuntimeError(f"{type(m).__name__}: output not batched per record "
                                   f"({tuple(g.shape)}); use per_record='vmap'")
            own = self._own(m)
            skip = set()
            g = self._unscale(g.detach())
            if own.get("weight") in ghosted:
                skip.add("weight")
                ghost_uses.setdefault(own["weight"], []).append(_Use(m, _ghost_kind(m), a, g.detach()))
            w = own.get("weight")
            if w in fresh and "weight" not in skip and _ghost_kind(m) == "embedding":
                _embedding_scatter(m, a, acc(g), per_record[w])  # a tied weight's other use, in place
                skip.add("weight")
            for local, t in sampler_for(m)(m, a, g.detach(), frozenset(skip)).items():
                name = own[local]
                if name not in per_record:
                    per_record[name] = t
                    if singletons and len(uses[name]) == 1:  # final: its norm now, while t is still in cache
                        sq_now[name] = row_sq_norms(t)
                    if local == "weight" and _ghost_kind(m) is not None:
                        fresh.add(name)  # a new tensor of this step's (bmm or scatter): may be added to in place
                else:
                    per_record[name] = per_record[name].add_(t) if name in fresh else per_record[name] + t

        roots = _root_outputs([e for _, _, e in calls])
        self._on_grad = consume   # called by each output's tensor hook, or under checkpointing by its _Tap
        self._replaying = self._tap
        global _BUFFERS
        self._buffers.rewind()    # the previous micro-batch's per-record tensors are all read by now
        _BUFFERS = self._buffers
        try:
            torch.autograd.grad((losses * weights.to(losses.dtype)).sum() * self.loss_scale, roots,
                                allow_unused=True)
        finally:
            _BUFFERS = None
            self._on_grad = None
            self._replaying, self._tap = False, False
        del roots, calls

        sq = torch.zeros(n_units, dtype=torch.float64, device=ids.device)
        for us in ghost_uses.values():
            sq += ghost_norm_sq(us, slots).double()
        per_unit: dict[str, torch.Tensor] = {}
        parts = []   # summed once: a GPU step pays each small op's launch (a 1B LoRA model has 308 tensors)
        for name, t in per_record.items():
            if singletons:
                u = t
            elif isinstance(slots, Contiguous):
                u = t.reshape((n_units, slots.per_unit) + tuple(t.shape[1:])).sum(1)
            else:
                u = t.new_zeros((n_units,) + tuple(t.shape[1:]))
                u.index_add_(0, owner, t)
            per_unit[name] = u
            parts.append(sq_now[name] if name in sq_now else row_sq_norms(u))
        if parts:
            sq += torch.stack(parts).sum(0)
        # A unit whose gradient is not finite (NaN/inf anywhere: its norm is then NaN/inf — for a
        # ghosted weight too, see ghost_norm_sq — so the norm is the one test, and no pass over the
        # factors is needed) contributes exactly zero — a zero vector has norm ≤ C, so the
        # sensitivity is unchanged — instead of turning the whole sum into NaN, which would make
        # the release distinguishable by that one unit. The decision reads that unit's own numbers
        # only; its rows are zeroed too, since 0 · NaN is NaN.
        ok = torch.isfinite(sq)
        self.last_nonfinite = (~ok).sum()
        # One host sync per micro-batch (not per layer): when every unit is finite — the usual
        # case — nothing needs zeroing and the copies `torch.where` would make are skipped. The
        # result is the same either way.
        all_ok = bool(self.last_nonfinite == 0)
        factor = torch.where(ok, (clip_norm / sq.sqrt()).clamp(max=1.0), torch.zeros_like(sq))  # norm 0 -> inf -> 1
        params = self.trainable()
        sums: dict[str, torch.Tensor] = {}   # float32 for 16-bit weights (acc_dtype)

        def add(name: str, t: torch.Tensor) -> None:
            t = t.to(acc_dtype(params[name].dtype))
            sums[name] = sums[name] + t if name in sums else t

        f_by_dtype: dict[torch.dtype, torch.Tensor] = {}
        for name, u in per_unit.items():
            if not all_ok:
                u = torch.where(ok.view((-1,) + (1,) * (u.dim() - 1)), u, torch.zeros((), dtype=u.dtype, device=u.device))
            if u.dtype not in f_by_dtype:
                f_by_dtype[u.dtype] = factor.to(u.dtype)
            add(name, _weighted_rows(f_by_dtype[u.dtype], u))
        f_rec = factor[owner]
        keep_rec = ok[owner]
        for name, us in ghost_uses.items():
            for u in us:
                if not all_ok:
                    u.drop_records(keep_rec)
                add(name, u.clipped_sum(factor, f_rec, slots, params[name].shape))
        for n in self.names:   # a trainable weight this micro-batch never touched
            if n not in sums:
                sums[n] = torch.zeros(params[n].shape, dtype=acc_dtype(params[n].dtype), device=params[n].device)
        return sums, losses.detach()

    def trainable(self) -> dict[str, nn.Parameter]:
        """{canonical name: the parameter now} for the sampled layers' trainable weights, read off
        the layers (a model.named_parameters() walk costs ~10 ms a step at 1B on the host)."""
        return {name: getattr(m, local) for m, own in self.layers for local, name in own.items()}

    def _unscale(self, g: torch.Tensor) -> torch.Tensor:
        """An output gradient of scale·loss back to the loss's, in float32 (÷ a power of two: exact)."""
        return g if self.loss_scale == 1.0 else g.float() / self.loss_scale

    def _forward(self, ids: torch.Tensor):
        # Per-row position ids: a [1, T] broadcast would sum the position-embedding gradient over
        # the batch before a hook sees it. A model without position_ids gets none; a layer whose
        # output is then not per record is caught by the batch-dimension check.
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        try:
            return self.model(input_ids=ids, position_ids=pos, use_cache=False)
        except TypeError as e:
            if "position_ids" not in str(e):
                raise
            return self.model(input_ids=ids, use_cache=False)

    def _own(self, module: nn.Module) -> dict[str, str]:
        if not hasattr(self, "_own_cache"):
            self._own_cache = {id(m): own for m, own in self.layers}
        return self._own_cache[id(module)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._buffers.clear()
