"""Clipped sums of per-unit gradients.

Per-record gradients of the trainable parameters come from per-layer samplers on one batched
backward (grad_samplers.py) or, for layers without a sampler, torch.func (functional_call +
vmap(grad)). For LoRA they are small, so instantiating them is cheaper than ghost norms.
A unit's gradient is the weighted sum of its records' gradients (weight 1/|S_u| for a ULS user,
1 for a record), formed before clipping, so a user's records are averaged and then clipped as one.
Units are packed into micro-batches of at most `micro_batch_size` records; a unit larger than that
is accumulated over several micro-batches before it is clipped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call, grad_and_value, vmap

from components.dpsgd.grad_samplers import row_sq_norms, HookPerRecord, supported
from components.dpsgd.precision import acc, acc_dtype, loss_scale_for
from components.core.errors import VeilError
from components.dpsgd.model_prep import checkpointing_on


def sequence_losses(logits: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Mean next-token NLL per sequence. logits [b,T,V], ids [b,T], lengths [b] -> [b].
    A record with < 2 tokens has no target and loss 0 (so gradient 0).

    The cross-entropy runs over all T positions with the targets shifted left and the positions
    without a target ignored, rather than over logits[:, :-1]: the slice's backward would allocate,
    zero and copy a second [b,T,V] tensor, the largest in the step."""
    T = ids.shape[-1]
    valid = torch.arange(T, device=ids.device) < (lengths[..., None] - 1)   # position t predicts t+1
    targets = torch.where(valid, torch.roll(ids, -1, dims=-1), torch.full_like(ids, -100))
    logits = logits if logits.dtype == torch.float32 else logits.float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                            reduction="none", ignore_index=-100).view(targets.shape)
    mask = valid.to(nll.dtype)
    return (nll * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


@dataclass
class Unit:
    records: np.ndarray    # record indices into the tokenized table
    weight: float          # per-record weight inside the unit (1/|S_u| for ULS, 1 otherwise)


def pack(units: list[Unit], micro_batch_size: int) -> list[list[Unit]]:
    """Groups of whole units with ≤ micro_batch_size records in all (a bigger unit stands alone)."""
    groups, cur, n = [], [], 0
    for u in units:
        k = len(u.records)
        if cur and n + k > micro_batch_size:
            groups.append(cur)
            cur, n = [], 0
        cur.append(u)
        n += k
    if cur:
        groups.append(cur)
    return groups


class PerUnitGradients:
    """Computes Σ_u clip_C(Σ_{r∈u} w_u ∇ℓ_r) over the trainable parameters of `model`."""

    def __init__(self, model: torch.nn.Module, names: list[str], micro_batch_size: int, method: str = "auto",
                 loss_scale: float | None = None):
        """method: "mixed" (per-layer samplers on one batched backward; ghost norm or
        instantiation chosen per layer), "hooks" (always instantiate), "ghost" (ghost norm for
        every matmul weight), "vmap" (torch.func), or "auto" (mixed when every trainable layer
        has a sampler, else vmap). loss_scale: fp16's static loss scale (None: from the model's
        dtype, precision.loss_scale_for); per-record gradients are unscaled in float32 before any
        norm. Every per-record gradient, norm and sum is float32 for a 16-bit model."""

        self.model = model
        self.names = names
        self.micro_batch_size = int(micro_batch_size)
        if method == "auto":
            method = "mixed" if supported(model) else "vmap"
        self.method = method
        if method == "vmap":
            if checkpointing_on(model):
                # torch.func cannot run through torch's checkpoint (saved-tensor hooks): refused
                # here, before any step, rather than failing in the first one

                raise VeilError("gradient_checkpointing: per-record gradients by torch.func (per_record 'vmap', or "
                                "'auto' with a trainable layer that has no per-record sampler) cannot run through "
                                "activation checkpointing; set gradient_checkpointing: false")
        self._hooks = HookPerRecord(model, names) if method in ("mixed", "hooks", "ghost") else None
        # mixed: ghost norm or instantiation chosen per layer; hooks: always instantiate; ghost:
        # ghost norm for every Linear/Conv1D weight (tests use the last two to pin both paths)
        self._ghost = {"mixed": "auto", "hooks": "never", "ghost": "always"}.get(method, "never")
        self.loss_scale = float(loss_scale_for(model) if loss_scale is None else loss_scale)
        if self._hooks is not None:
            self._hooks.loss_scale = self.loss_scale
        scale = self.loss_scale

        def loss_one(params, ids, length):
            out = functional_call(model, params, (ids.unsqueeze(0),), {"use_cache": False})
            loss = sequence_losses(out.logits, ids.unsqueeze(0), length.unsqueeze(0))[0]
            return loss * scale, loss

        self._per_record = vmap(grad_and_value(loss_one, has_aux=True), in_dims=(None, 0, 0), randomness="different")
        self._checked = self._hooks is None  # layer samplers are checked once, on real records
        self.nonfinite_units = 0  # units whose gradient was not finite and so contributed zero (private)

    def self_check(self, ids: torch.Tensor, lengths: torch.Tensor) -> None:
        """Per-record gradients from the layer samplers must equal autograd's, record by record,
        on (up to two of) the run's own records: a sampler whose layer computes something else (a
        new transformers version, an unusual norm layer) would make the clipping — and so the
        certificate — wrong. Same dropout masks on both sides (forked RNG)."""

        ids, lengths = ids[:2], lengths[:2]
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        sixteen_bit = any(p.dtype in (torch.float16, torch.bfloat16) for p in self.model.parameters())
        devices = [ids.device] if ids.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            per, _ = self._hooks(ids, lengths, sequence_losses)
        compared = 0
        for b in range(ids.shape[0]):
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(0)
                out = self._hooks._forward(ids)
                grads = torch.autograd.grad(sequence_losses(out.logits, ids, lengths)[b],
                                            [params[n] for n in self.names], allow_unused=True)
            # A record whose gradient is not finite cannot be compared (and would stop the run on
            # its data alone); it contributes zero anyway. The check moves on to later records.
            if not all(g is None or bool(torch.isfinite(g).all()) for g in grads):
                continue
            compared += 1
            for n, want in zip(self.names, grads):
                want = torch.zeros_like(params[n]) if want is None else want
                got = per[n][b]
                # a wrong sampler is off by far more than rounding; 16-bit models round at ~1e-2 —
                # also for float32 LoRA weights on a 16-bit base, whose output gradients come
                # through 16-bit layers (on a GPU two backwards of the same records differ at that
                # level: attention kernels accumulate in a varying order)
                rel = 3e-2 if sixteen_bit else 1e-3
                tol = rel * float(want.abs().max()) + 1e-7
                if not torch.allclose(got.float(), want.float(), rtol=rel, atol=tol):
                    layer = n.rsplit(".", 1)[0]
                    raise VeilError(f"per-record gradients of {layer} ({type(self.model.get_submodule(layer)).__name__}) "
                                    "disagree with autograd; train with per_record='vmap'")
        self._checked = compared > 0

    def per_record(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[dict, torch.Tensor]:
        if self._hooks is not None:
            return self._hooks(ids, lengths, sequence_losses)
        params = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        grads, (_, losses) = self._per_record(params, ids, lengths)
        # torch.func gives a 16-bit model's per-record gradients in 16 bits; the unit sums, norms and
        # clipped sum that follow are float32 (and unscaled there, ÷ a power of two: exact)
        return {n: acc(g) / self.loss_scale if self.loss_scale != 1.0 else acc(g) for n, g in grads.items()}, losses

    def close(self) -> None:
        if self._hooks is not None:
            self._hooks.remove()
            self._hooks = None

    def clipped_sum(self, units: list[Unit], ids_all: np.ndarray, lengths_all: np.ndarray,
                    clip_norm: float, device: torch.device) -> tuple[dict, float, int]:
        """Returns ({name: Σ clipped unit grads}, Σ record losses, records processed)."""
        params = (self._hooks.trainable() if self._hooks is not None
                  else {n: p for n, p in self.model.named_parameters() if p.requires_grad})
        total: dict[str, torch.Tensor] = {}   # the clipped sum (of 16-bit weights' gradients: float32)

        def add(n: str, t: torch.Tensor) -> None:   # no zeros-and-add per tensor for the usual one group
            total[n] = total[n] + t if n in total else t

        loss_sum, n_rec = 0.0, 0
        bad = torch.zeros((), dtype=torch.int64, device=device)
        mbs = self.micro_batch_size
        for group in pack(units, mbs):
            recs = np.concatenate([u.records for u in group])
            owner = np.repeat(np.arange(len(group)), [len(u.records) for u in group])
            w = np.repeat(np.array([u.weight for u in group], dtype=np.float64), [len(u.records) for u in group])
            if not self._checked:
                T = max(2, int(lengths_all[recs[:2]].max()))
                self.self_check(torch.as_tensor(ids_all[recs[:2], :T], device=device),
                                torch.as_tensor(lengths_all[recs[:2]], device=device))
            if self._hooks is not None and len(recs) <= mbs:  # whole units in one pass: book-keeping
                T = max(2, int(lengths_all[recs].max()))
                sums, losses = self._hooks.clipped_group(
                    torch.as_tensor(ids_all[recs, :T], device=device), torch.as_tensor(lengths_all[recs], device=device),
                    torch.as_tensor(w, device=device), torch.as_tensor(owner, device=device), len(group),
                    clip_norm, sequence_losses, ghost=self._ghost)
                for n in self.names:
                    add(n, sums[n])
                bad = bad + self._hooks.last_nonfinite
                loss_sum += float(losses.sum())
                n_rec += len(recs)
                continue
            unit_grads, ls, nr = self._group_unit_grads(group, recs, owner, w, ids_all, lengths_all, device)
            loss_sum += ls
            n_rec += nr
            sq = sum(row_sq_norms(unit_grads[n]) for n in self.names)
            # a non-finite unit gradient contributes exactly zero (see grad_samplers.clipped_group)
            ok = torch.isfinite(sq)
            bad = bad + (~ok).sum()
            factor = torch.where(ok, (clip_norm / sq.sqrt()).clamp(max=1.0), torch.zeros_like(sq))  # norm 0 -> inf -> 1
            for n in self.names:
                g = unit_grads[n]
                g = torch.where(ok.view((-1,) + (1,) * (g.dim() - 1)), g, torch.zeros((), dtype=g.dtype, device=g.device))
                add(n, torch.tensordot(factor.to(g.dtype), g, dims=1))
        for n in self.names:
            if n not in total:
                total[n] = torch.zeros(params[n].shape, dtype=acc_dtype(params[n].dtype), device=params[n].device)
            elif total[n].dtype != acc_dtype(params[n].dtype):
                total[n] = total[n].to(acc_dtype(params[n].dtype))
        self.nonfinite_units += int(bad)  # private: kept in the run folder's result only
        return total, loss_sum, n_rec

    def unit_gradients(self, units: list[Unit], ids_all: np.ndarray, lengths_all: np.ndarray,
                       device: torch.device) -> tuple[torch.Tensor, float, int]:
        """Unclipped unit gradients Σ_{r∈u} w_u ∇ℓ_r, flattened over the trainable parameters in
        `names` order: ([U, d] float32, Σ record losses, records processed)."""
        rows, loss_sum, n_rec = [], 0.0, 0
        for group in pack(units, self.micro_batch_size):
            recs = np.concatenate([u.records for u in group])
            if not self._checked:
                T = max(2, int(lengths_all[recs[:2]].max()))
                self.self_check(torch.as_tensor(ids_all[recs[:2], :T], device=device),
                                torch.as_tensor(lengths_all[recs[:2]], device=device))
            owner = np.repeat(np.arange(len(group)), [len(u.records) for u in group])
            w = np.repeat(np.array([u.weight for u in group], dtype=np.float64), [len(u.records) for u in group])
            g, ls, nr = self._group_unit_grads(group, recs, owner, w, ids_all, lengths_all, device)
            rows.append(torch.cat([g[n].reshape(len(group), -1).float() for n in self.names], 1))
            loss_sum += ls
            n_rec += nr
        d = sum(p.numel() for n, p in self.model.named_parameters() if n in set(self.names))
        return (torch.cat(rows) if rows else torch.zeros((0, d), device=device)), loss_sum, n_rec

    def _group_unit_grads(self, group: list[Unit], recs: np.ndarray, owner: np.ndarray, w: np.ndarray,
                          ids_all: np.ndarray, lengths_all: np.ndarray, device: torch.device):
        """({name: [len(group), ...] unit gradients}, Σ record losses, records) for one packed group,
        over as many micro-batches as its records need."""
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        mbs = self.micro_batch_size
        singletons = len(recs) == len(group) and all(u.weight == 1.0 for u in group)
        unit_grads, loss_sum, n_rec = None, 0.0, 0
        for start in range(0, len(recs), mbs):
            sl = slice(start, start + mbs)
            r = recs[sl]
            T = max(2, int(lengths_all[r].max()))
            ids = torch.as_tensor(ids_all[r, :T], device=device)
            lens = torch.as_tensor(lengths_all[r], device=device)
            g, losses = self.per_record(ids, lens)
            loss_sum += float(losses.sum())
            n_rec += len(r)
            if singletons:
                unit_grads = g
                continue
            if unit_grads is None:
                unit_grads = {n: torch.zeros((len(group),) + params[n].shape, dtype=acc_dtype(params[n].dtype),
                                             device=device) for n in self.names}
            idx = torch.as_tensor(owner[sl], device=device)
            wt = torch.as_tensor(w[sl], device=device)
            for n in self.names:
                gn = g[n]
                unit_grads[n].index_add_(0, idx, gn * wt.to(gn.dtype).view((-1,) + (1,) * (gn.dim() - 1)))
        return unit_grads, loss_sum, n_rec
