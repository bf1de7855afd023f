"""Batch selection: true Poisson sampling, one independent stream per step.

Each step t draws from `numpy.random.default_rng(SeedSequence([private_seed, STREAM, t]))`, so the
sampler's whole state is (private_seed, t): a resumed run redraws exactly the batches a clean run
would, and a replayed step after a crash reproduces the same batch (no extra privacy spent).
Every unit is included independently with its own probability — never a shuffled fixed-size batch,
which the accountant does not cover.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SAMPLING_STREAM = 0
_NOISE_STREAM = 1


def step_rng(private_seed: int, step: int, stream: int = _SAMPLING_STREAM) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(private_seed) % (1 << 128), stream, int(step)]))


def noise_seed(private_seed: int, step: int) -> int:
    """A 63-bit seed for the step's torch noise generator (same on every rank)."""
    ss = np.random.SeedSequence([int(private_seed) % (1 << 128), _NOISE_STREAM, int(step)])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class PoissonSampler:
    """Includes unit i at step t with probability rates[i], independently of everything else."""

    rates: np.ndarray          # shape [n_units], each in [0, 1]
    private_seed: int

    @classmethod
    def uniform(cls, n_units: int, q: float, private_seed: int) -> "PoissonSampler":
        return cls(np.full(int(n_units), float(q)), private_seed)

    @property
    def expected_batch_size(self) -> float:
        return float(self.rates.sum())

    def sample(self, step: int) -> tuple[np.ndarray, np.random.Generator]:
        """Sorted indices of the units in step `step`'s batch, and the step's generator (for any
        further per-step draws, e.g. which of a user's records to use)."""
        rng = step_rng(self.private_seed, step)
        chosen = np.flatnonzero(rng.random(self.rates.shape[0]) < self.rates)
        return chosen, rng

    def state_dict(self, next_step: int) -> dict:
        return {"kind": "poisson/seedsequence-per-step", "next_step": int(next_step)}
