"""Per-record gradients from one ordinary batched forward/backward, layer by layer.

Each supported layer type has a sampler, registered here in one place, that turns the layer's
input activations and output gradients into per-record parameter gradients (the LoRA A/B matrices
are nn.Linear: their per-record gradients are tiny, r×d, so they are instantiated directly).
A model with a trainable parameter in an unsupported layer falls back to torch.func vmap(grad).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

Sampler = Callable[[nn.Module, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]
_SAMPLERS: dict[type, Sampler] = {}


def register_grad_sampler(*types: type):
    def deco(fn: Sampler) -> Sampler:
        for t in types:
            _SAMPLERS[t] = fn
        return fn
    return deco


def _flat(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, ..., d] -> [B, L, d] for activations and gradients alike."""
    return a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])


def _wants(module: nn.Module, name: str) -> bool:
    p = getattr(module, name, None)
    return isinstance(p, nn.Parameter) and p.requires_grad


@register_grad_sampler(nn.Linear)
def _linear(module, a, g):
    a, g = _flat(a, g)
    out = {}
    if _wants(module, "weight"):
        out["weight"] = torch.einsum("blo,bli->boi", g, a.to(g.dtype))
    if _wants(module, "bias"):
        out["bias"] = g.sum(1)
    return out


def _conv1d_types() -> tuple[type, ...]:
    try:
        from transformers.pytorch_utils import Conv1D
        return (Conv1D,)
    except ImportError:  # pragma: no cover - transformers always ships it today
        return ()


def _conv1d(module, a, g):  # HF GPT-2 Conv1D: y = x @ W + b, W is [in, out]
    a, g = _flat(a, g)
    out = {}
    if _wants(module, "weight"):
        out["weight"] = torch.einsum("bli,blo->bio", a.to(g.dtype), g)
    if _wants(module, "bias"):
        out["bias"] = g.sum(1)
    return out


if _conv1d_types():
    register_grad_sampler(*_conv1d_types())(_conv1d)


@register_grad_sampler(nn.Embedding)
def _embedding(module, ids, g):
    out = {}
    if _wants(module, "weight"):
        B = g.shape[0]
        if ids.shape[0] != B:  # e.g. position ids [1, T] shared by the whole batch
            ids = ids.expand((B,) + tuple(ids.shape[1:]))
        ids = ids.reshape(B, -1)
        g = g.reshape(B, -1, g.shape[-1])
        gw = torch.zeros((B,) + tuple(module.weight.shape), dtype=g.dtype, device=g.device)
        rows = torch.arange(B, device=ids.device)[:, None].expand_as(ids)
        gw.index_put_((rows, ids), g, accumulate=True)
        out["weight"] = gw
    return out


@register_grad_sampler(nn.LayerNorm)
def _layer_norm(module, a, g):
    x_hat = F.layer_norm(a, module.normalized_shape, eps=module.eps)
    dims = list(range(1, a.dim() - len(module.normalized_shape)))
    out = {}
    if _wants(module, "weight"):
        out["weight"] = (g * x_hat.to(g.dtype)).sum(dims) if dims else g * x_hat
    if _wants(module, "bias"):
        out["bias"] = g.sum(dims) if dims else g
    return out


def supported(model: nn.Module) -> bool:
    """True when every trainable parameter lives in a layer with a registered sampler."""
    for m in model.modules():
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if own and type(m) not in _SAMPLERS:
            return False
    return True


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
        self._handles = []
        self._active = False
        for m, _ in self.layers:
            self._handles.append(m.register_forward_hook(self._forward_hook))

    def _forward_hook(self, module, inputs, output):
        if not self._active or not torch.is_grad_enabled() or not isinstance(output, torch.Tensor):
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
            # per-row position ids: a [1, T] broadcast would sum the position-embedding gradient
            # over the batch before our hook sees it
            pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
            out = self.model(input_ids=ids, position_ids=pos, use_cache=False)
            losses = loss_fn(out.logits, ids, lengths)
            losses.sum().backward()
        finally:
            self._active = False
        per: dict[str, torch.Tensor] = {}
        for m, own in self.layers:
            acts = self._acts.get(id(m), [])
            grads = self._grads.get(id(m), [])[::-1]  # backward visits calls in reverse order
            for a, g in zip(acts, grads):
                if g.shape[0] != ids.shape[0]:
                    raise RuntimeError(f"{type(m).__name__}: output not batched per record "
                                       f"({tuple(g.shape)}); use per_record='vmap'")
                for local, t in _SAMPLERS[type(m)](m, a, g).items():
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
                per[n] = torch.zeros((B,) + tuple(params[n].shape), dtype=params[n].dtype, device=ids.device)
        return per, losses.detach()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
