"""Asi & Liu's filtered user-level DP-SGD (seed 000, Alg. 3; Asi & Liu 2024), opt-in.

Every step takes every user (full batch, no amplification) and their unclipped mean gradient over
≤ G records. A sparse-vector test (AboveThreshold) checks that the users' gradients are
concentrated — most pairs within τ of each other — and halts training the first time they are not.
While they are, users with few 2τ-neighbours are dropped at random, the rest are averaged, and
Gaussian noise proportional to τ (not to a clip norm) is added. Privacy therefore rests on τ and on
the halting test; see `components.accounting.filtered` for the numbers.

Costs O(N·d) memory (all users' gradients at once) and O(N²·d) time for the distances: for LoRA
adapters and hundreds to a few thousand users. Our reading of the paper (§5.3): it only beats plain
ULS when τ/C < 0.1, which real text data rarely gives — `concentration` measures that on your data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from components.accounting.filtered import THRESHOLD_FRACTION
from components.dpsgd.sampling import step_rng, noise_seed
from components.core.errors import VeilError
from components.dpsgd.batches import BatchBuilder
from components.dpsgd.data import records_by_user, tokenize_table
from components.dpsgd.model_prep import prepare_model
from components.dpsgd.per_sample import PerUnitGradients
from components.dpsgd.precision import optimizer_targets

# Private randomness streams (sampling.py uses 0 and 1). Each draw has its own stream id: numpy's
# SeedSequence ignores trailing zeros, so [seed, s] and [seed, s, 0] would be the same stream.
_SVT_QUERY_STREAM = 2      # ν_t, per step
_FILTER_STREAM = 3         # which users survive the filter (seed variant)
_SVT_THRESHOLD_STREAM = 4  # ρ, once per run


def pairwise_distances(grads: torch.Tensor) -> torch.Tensor:
    """[N, d] -> [N, N] Euclidean distances (float64, exact zeros on the diagonal)."""
    g = grads.double()
    sq = g.square().sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * (g @ g.T)).clamp(min=0.0)
    d2.fill_diagonal_(0.0)
    return d2.sqrt()


def concentration_score(dist: torch.Tensor, tau: float) -> float:
    """s^conc = (1/N) Σ_{i,i'} 1(‖g_i − g_i'‖ ≤ τ), ordered pairs, i = i' included (seed Eq. 1)."""
    return float((dist <= tau).sum()) / dist.shape[0]


def keep_probabilities(dist: torch.Tensor, tau: float) -> np.ndarray:
    """p_i from f_i = #{i' : ‖g_i − g_i'‖ ≤ 2τ}: 0 below N/2, 1 from 2N/3, linear in between."""
    n = dist.shape[0]
    f = (dist <= 2.0 * tau).sum(1).double().cpu().numpy()
    return np.clip((f - n / 2.0) / (n / 6.0), 0.0, 1.0)


@dataclass(frozen=True)
class SparseVector:
    """One AboveThreshold instance for the whole run, on the query −s^conc_t against −threshold:
    a step passes while the noisy score stays at or above the noisy threshold, and the first
    failure halts training (the single ⊤ of the sparse vector technique).

    threshold noise ~ Lap(threshold_scale), drawn once per run; query noise ~ Lap(query_scale),
    drawn afresh per step. Both come from the run's private seed, so a resumed or replayed step
    redraws exactly the same noise (the test's output is the same: nothing more is revealed)."""

    threshold: float
    threshold_scale: float
    query_scale: float
    private_seed: int

    def threshold_noise(self) -> float:
        return float(step_rng(self.private_seed, 0, _SVT_THRESHOLD_STREAM).laplace(0.0, self.threshold_scale))

    def passes(self, score: float, step: int) -> bool:
        """False (halt) when the noisy query −s + ν reaches the noisy threshold −T + ρ."""
        nu = float(step_rng(self.private_seed, step, _SVT_QUERY_STREAM).laplace(0.0, self.query_scale))
        return not (-score + nu >= -self.threshold + self.threshold_noise())


def filtered_mean(grads: torch.Tensor, dist: torch.Tensor, tau: float, private_seed: int, step: int,
                  variant: str = "veil") -> tuple[torch.Tensor, float]:
    """(ĝ_t, kept weight). "veil": the deterministic weighted mean Σ p_i g_i / Σ p_i (its
    sensitivity is what our certificate bounds); "seed": the paper's random B_t (user i kept with
    probability p_i) and the plain mean over B_t. 0 when nothing is kept."""
    p = keep_probabilities(dist, tau)
    # a non-finite gradient has no neighbours (its distances are NaN) and is never kept; it must not
    # reach the sum either, where 0 · NaN would turn the whole update into NaN
    p[~torch.isfinite(grads).all(1).cpu().numpy()] = 0.0
    if variant == "veil":
        kept = np.flatnonzero(p > 0)
        total = float(p[kept].sum())
        if total <= 0:
            return torch.zeros_like(grads[0]), 0.0
        rows = torch.as_tensor(kept, device=grads.device)
        w = torch.as_tensor(p[kept], dtype=grads.dtype, device=grads.device)
        return (w @ grads[rows]) / total, total
    rng = step_rng(private_seed, step, _FILTER_STREAM)
    keep = np.flatnonzero(rng.random(len(p)) < p)
    if len(keep) == 0:
        return torch.zeros_like(grads[0]), 0.0
    return grads[torch.as_tensor(keep, device=grads.device)].mean(0), float(len(keep))


class FilteredStep:
    """One step of Alg. 3 on all users' units: unclipped unit gradients → distances → sparse-vector
    test → randomized filter → mean → Gaussian noise → optimizer. Single process only."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, tau: float,
                 noise_std: float, svt: SparseVector, micro_batch_size: int, private_seed: int,
                 per_record: str = "auto", variant: str = "veil"):
        self.model, self.optimizer = model, optimizer
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.tau, self.noise_std, self.svt = float(tau), float(noise_std), svt
        self.private_seed = int(private_seed)
        self.variant = variant
        self.nonfinite_units = 0
        self.per_unit = PerUnitGradients(model, [n for n, _ in self.named], int(micro_batch_size), per_record)

        self.targets = optimizer_targets(self.named, optimizer)   # float32 masters of 16-bit weights

    def __call__(self, step: int, units, ids: np.ndarray, lengths: np.ndarray) -> tuple[float, int, bool, float]:
        """(Σ record losses, records, passed, kept weight). When the test fails nothing is updated."""

        device = self.named[0][1].device
        grads, loss_sum, n_rec = self.per_unit.unit_gradients(units, ids, lengths, device)
        # non-finite users are never kept (filtered_mean); counted for the private result only
        self.nonfinite_units += int((~torch.isfinite(grads).all(1)).sum())
        dist = pairwise_distances(grads)
        if not self.svt.passes(concentration_score(dist, self.tau), step):
            return loss_sum, n_rec, False, 0
        mean, kept = filtered_mean(grads, dist, self.tau, self.private_seed, step, self.variant)
        gen = torch.Generator(device=device)
        gen.manual_seed(noise_seed(self.private_seed, step))
        mean = mean + torch.normal(0.0, self.noise_std, size=mean.shape, generator=gen, device=device,
                                   dtype=torch.float32)
        if not bool(torch.isfinite(mean).all()):  # post-processing of the noisy mean (see step.DPStep)

            raise VeilError(f"training step {step + 1}: the noisy update is not finite although no non-finite "
                            "user was kept: the model's numbers diverged; the run stops, its steps are still charged")
        offset = 0
        for t in self.targets:
            t.grad = mean[offset:offset + t.numel()].view_as(t).to(t.dtype)
            offset += t.numel()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for (_, p), t in zip(self.named, self.targets):
                if t is not p:
                    p.copy_(t)
        return loss_sum, n_rec, True, kept

    def close(self) -> None:
        self.per_unit.close()


def concentration_profile(model: torch.nn.Module, tokenizer, data, *, records_per_user: int, seq_len: int,
                          clip_norm: float, lora: dict | None = None, max_users: int | None = None,
                          micro_batch_size: int = 16, seed: int = 0) -> dict:
    """How concentrated the users' mean gradients are at `model` (research note §7.8's diagnostic):
    pairwise distances relative to the clip norm C, and τ*/C, the smallest τ for which Alg. 3's test
    (s ≥ 4N/5) would pass. Alg. 3 only pays when τ*/C is small (the seed measured ≈ 1)."""

    model = prepare_model(model, SimpleNamespace(lora=lora, seed=seed))
    model.train()
    tok = tokenize_table(data, tokenizer, seq_len)
    by_user = records_by_user(tok)
    rng = np.random.default_rng(seed)
    users = np.arange(len(by_user))
    if max_users is not None and len(users) > max_users:
        users = np.sort(rng.choice(users, size=max_users, replace=False))
    units, ids, lengths = BatchBuilder("uls", tok, by_user, G=records_per_user).build(users, rng)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    per_unit = PerUnitGradients(model, names, micro_batch_size)
    try:
        grads, _, _ = per_unit.unit_gradients(units, ids, lengths, next(model.parameters()).device)
    finally:
        per_unit.close()
    dist = pairwise_distances(grads)
    n = dist.shape[0]
    off = dist[~torch.eye(n, dtype=torch.bool, device=dist.device)]
    norms = grads.double().norm(dim=1)
    # s ≥ 0.8N ⇔ at least 0.8·N² of the N² ordered pairs (diagonal included) lie within τ: τ* is
    # that order statistic of the distances
    need = math.ceil(THRESHOLD_FRACTION * n * n)       # pairs within τ for s ≥ 0.8N
    tau_star = float(dist.flatten().sort().values[need - 1])
    C = float(clip_norm)
    return {"n_users": int(n), "clip_norm": C, "dimension": int(grads.shape[1]),
            "user_grad_norm_median_over_C": float(norms.median()) / C,
            "pairwise_distance_over_C": {q: float(torch.quantile(off, q)) / C for q in (0.1, 0.5, 0.8, 0.9)},
            "tau_star_over_C": tau_star / C}
