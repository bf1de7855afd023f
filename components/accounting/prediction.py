"""Slot for private prediction (PMixED, seed 002): per-token Rényi accounting. A later issue fills it.

What is here is real and tested: the Rényi → (ε, δ) conversion and Rényi composition that any
per-token accountant ends in. What is not here is the per-token bound itself. The research note
(/work/shared/research/002_…, §3.9) found that the paper's per-query bound (its Theorem 5.1, which
rests on a single-order "triangle-like" Rényi inequality) fails on explicit instances, so it must not
be coded as stated; the implementation has to use a bound checked numerically against brute-force
Rényi divergences of the actual mixed next-token distributions.

The interface an implementation provides (and the certificate will call):

    class PerTokenRenyiAccountant(Protocol):
        orders: tuple[float, ...]                      # Rényi orders α > 1 it tracks
        def token_rdp(self, *, ensemble_size, subsample_rate, radius) -> np.ndarray
            # (α ↦ ε(α)) for one generated token, after subsampling of the ensemble
        def spend(self, tokens: int) -> None           # compose `tokens` more tokens
        def epsilon(self, delta: float) -> float       # rdp_to_epsilon(orders, spent, δ)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from components.core.errors import VeilError


@runtime_checkable
class PerTokenRenyiAccountant(Protocol):
    """Per-token Rényi accounting for PMixED-style private prediction (see the module docstring)."""

    orders: tuple[float, ...]

    def token_rdp(self, *, ensemble_size: int, subsample_rate: float, radius: float) -> np.ndarray: ...

    def spend(self, tokens: int) -> None: ...

    def epsilon(self, delta: float) -> float: ...


def compose_rdp(*rdps: Sequence[float]) -> np.ndarray:
    """Rényi DP composes by adding ε(α) order by order."""
    if not rdps:
        raise VeilError("compose_rdp: nothing to compose")
    arrays = [np.asarray(r, dtype=float) for r in rdps]
    if len({a.shape for a in arrays}) != 1:
        raise VeilError("compose_rdp: every curve must be given on the same orders")
    return np.sum(arrays, axis=0)


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """(ε, best α): (α, ε_α)-RDP ⇒ (ε_α + log((α−1)/α) − (log δ + log α)/(α−1), δ)-DP, best over α
    (Balle et al. 2020, Theorem 21)."""
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if a.shape != r.shape or a.ndim != 1 or a.size == 0:
        raise VeilError("rdp_to_epsilon: orders and rdp must be 1-D and of equal length")
    if np.any(a <= 1):
        raise VeilError("rdp_to_epsilon: Rényi orders must be > 1")
    if np.any(r < 0) or np.any(np.isnan(r)):
        raise VeilError("rdp_to_epsilon: Rényi divergences must be ≥ 0")
    if not 0 < delta < 1:
        raise VeilError(f"delta: {delta} must be in (0, 1)")
    eps = r + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    eps = np.maximum(eps, 0.0)
    i = int(np.argmin(eps))
    return float(eps[i]), float(a[i])
