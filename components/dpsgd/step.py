"""One DP-SGD step on a given batch: per-unit gradients → clip → sum → all-reduce → noise once →
÷ expected batch size → optimizer. Batch selection happens before (sampling.py), accounting after
(components.accounting), in the jax_privacy manner."""
from __future__ import annotations

import numpy as np
import torch

from components.dpsgd.distributed import DistContext
from components.dpsgd.per_sample import PerUnitGradients, Unit, sequence_losses
from components.dpsgd.precision import acc, acc_dtype, loss_scale_for, optimizer_targets
from components.dpsgd.sampling import noise_seed
from components.core.errors import VeilError


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Every entry of every tensor is finite, with one host sync for the lot (one per tensor would
    stall a GPU step hundreds of times: a 1B LoRA model has 308 trainable tensors).

    First from each tensor's sum (float32 at least): a NaN or ±inf entry makes any sum NaN or ±inf,
    so finite sums prove every entry finite with one read per tensor — isfinite's abs, compares and
    bool copies cost 1.5 % of a full fine-tuning step on a CPU. Only when a sum is not finite (an
    entry is, or a finite tensor's sum overflowed) are the entries checked one by one."""
    if not tensors:
        return True
    dev = tensors[0].device
    sums = torch.stack([t.sum(dtype=acc_dtype(t.dtype)).to(device=dev, dtype=torch.float64) for t in tensors])
    if bool(torch.isfinite(sums).all()):
        return True
    return bool(torch.stack([torch.isfinite(t).all().to(dev) for t in tensors]).all())


class DPStep:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, private: bool,
                 clip_norm: float, noise_multiplier: float, expected_batch_size: float,
                 micro_batch_size: int, private_seed: int, dctx: DistContext | None = None,
                 per_record: str = "auto"):
        self.model = model
        self.optimizer = optimizer
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.private = bool(private)
        self.C = float(clip_norm)
        self.sigma = float(noise_multiplier) if private else 0.0
        self.expected = float(expected_batch_size)
        self.mbs = int(micro_batch_size)
        self.private_seed = int(private_seed)
        self.dctx = dctx or DistContext()
        self.nonfinite_units = 0  # units dropped for a non-finite gradient, all ranks (private: never publish)
        self.per_unit = (PerUnitGradients(model, [n for n, _ in self.named], self.mbs, per_record)
                         if private else None)
        # what the optimizer updates for each trainable weight: the weight, or its float32 master
        # copy when the weight is 16-bit (precision.MasterWeights; copied back after each step)
        self.targets = optimizer_targets(self.named, optimizer)
        self.loss_scale = loss_scale_for(model)

    def __call__(self, step: int, units: list[Unit], ids: np.ndarray, lengths: np.ndarray) -> tuple[float, int]:
        """Runs step number `step` on this rank's `units`; returns (Σ record losses, records) over all ranks."""
        device = self.named[0][1].device
        bad_before = self.per_unit.nonfinite_units if self.private else 0
        if self.private:
            sums, loss_sum, n_rec = self.per_unit.clipped_sum(units, ids, lengths, self.C, device)
            grads = [sums[n] for n, _ in self.named]
        else:
            grads, loss_sum, n_rec = self._plain_sum(units, ids, lengths, device)
        bad = (self.per_unit.nonfinite_units if self.private else 0) - bad_before
        grads = self.dctx.all_reduce_sum([g.float() for g in grads])
        (stats,) = self.dctx.all_reduce_sum([torch.tensor([loss_sum, float(n_rec), float(bad)], dtype=torch.float64,
                                                          device=device)])
        self.nonfinite_units += int(stats[2])
        if self.sigma > 0:
            # the same stream on every rank, added after the reduce: exactly one copy of the noise
            gen = torch.Generator(device=device)
            gen.manual_seed(noise_seed(self.private_seed, step))
            std = self.sigma * self.C
            grads = [g + torch.normal(0.0, std, size=g.shape, generator=gen, device=device, dtype=torch.float32)
                     for g in grads]
        if self.private and not all_finite(grads):
            # Every unit's contribution is finite with norm ≤ C (a non-finite one was replaced by
            # zero), so a non-finite noisy sum comes from the model or the numbers themselves
            # (weights already NaN, overflow), not from one person's data. Stopping here reads
            # only the noisy sum (post-processing): it reveals nothing the step did not release.

            raise VeilError(f"training step {step + 1}: the noisy update is not finite although every unit's "
                            "contribution was finite and clipped: the model's numbers diverged (lower the "
                            "learning rate or train in float32); the run stops, its steps are still charged")
        for t, g in zip(self.targets, grads):
            t.grad = (g / self.expected).to(t.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for (_, p), t in zip(self.named, self.targets):
                if t is not p:
                    p.copy_(t)
        if self.private and not all_finite(self.targets):
            # the weights are a function of the released noisy updates and the public start (post-
            # processing); non-finite weights (a model that was already NaN: every unit then
            # contributes zero) would only train noise from here on

            raise VeilError(f"training step {step + 1}: the model's trainable weights are not finite (they were "
                            "before training, or the optimizer diverged): check the base model and the learning rate")
        return float(stats[0]), int(stats[1])

    def close(self) -> None:
        """Remove the per-record hooks from the model."""
        if self.per_unit is not None:
            self.per_unit.close()

    def _plain_sum(self, units, ids_all, lengths_all, device):
        """Non-private baseline: Σ of record gradients by ordinary batched backward."""
        recs = np.concatenate([u.records for u in units]) if units else np.zeros(0, dtype=np.int64)
        params = [p for _, p in self.named]
        for p in params:
            p.grad = None
        loss_sum = 0.0
        for start in range(0, len(recs), self.mbs):
            r = recs[start:start + self.mbs]
            T = max(2, int(lengths_all[r].max()))
            ids = torch.as_tensor(ids_all[r, :T], device=device)
            lens = torch.as_tensor(lengths_all[r], device=device)
            out = self.model(input_ids=ids, use_cache=False)
            loss = sequence_losses(out.logits, ids, lens).sum()
            (loss * self.loss_scale).backward()
            loss_sum += float(loss.detach())
        grads = [acc(p.grad) / self.loss_scale if p.grad is not None else torch.zeros_like(p, dtype=acc_dtype(p.dtype))
                 for p in params]
        for p in params:
            p.grad = None
        return grads, loss_sum, len(recs)
