"""The repaired PMixED per-token bound: a pointwise (D∞) mollifier, pure-DP per token, RDP over tokens.

Derivation: docs/privacy/pmixed.md. In one paragraph: every selected member's distribution p̄_j is forced
into the pointwise ball e^{−r} ≤ p̄_j(w)/p₀(w) ≤ e^{r} around the public model p₀ (for every token w).
Members are Poisson-selected (each independently with probability q); the served distribution is the
average of the selected members (p₀ when none is selected). Changing one person changes one shard's
adapter (the partition is a keyed hash of that person alone), i.e. one member is *replaced*. Conditioned
on the other members' selection, adding member i to a non-empty selection moves every token's mass by a
factor in [(1 + e^{−2r})/2, (1 + e^{2r})/2], and to the empty selection by a factor in [e^{−r}, e^{r}], so

    (1 − q + q·e^{−r}) · R(w)  ≤  P(w)  ≤  (1 − q + q·(1 + e^{2r})/2) · R(w)

for both neighbours, with R the distribution without member i. Hence one token is ε_tok-DP (pure) under
replace-one-member with ε_tok = log(hi) − log(lo); pure ε-DP implies D_α ≤ min(ε, α·ε²/2) at every order
(Bun & Steinke 2016, Prop. 3.3), and RDP composes additively over adaptively chosen tokens.

This deliberately avoids the paper's Theorem 5.1 (research note §3.9: its single-order triangle step is
false). Nothing here depends on data: N, q, r, T are public constants fixed before serving.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from components.accounting.prediction import rdp_to_epsilon
from components.core.errors import VeilError

# The per-person ledger's fixed order grid (components/renyi/rdp.py ORDERS, issue 13); a test checks that
# the two stay equal so a charge computed here lands on the ledger's orders.
ORDERS: tuple[float, ...] = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0,
                             24.0, 32.0, 48.0, 64.0, 128.0, 256.0)


def _check(q: float, radius: float) -> tuple[float, float]:
    q, r = float(q), float(radius)
    if not (0.0 < q <= 1.0):
        raise VeilError(f"pmixed: subsample rate q={q} must be in (0, 1]")
    if not (r >= 0.0 and math.isfinite(r)):
        raise VeilError(f"pmixed: mollifier radius r={r} must be a finite number ≥ 0")
    return q, r


def ratio_bounds(q: float, radius: float) -> tuple[float, float]:
    """(lo, hi): P(w)/R(w) ∈ [lo, hi] for the served distribution P against the one without member i."""
    q, r = _check(q, radius)
    hi = 1.0 - q + q * (1.0 + math.exp(2.0 * r)) / 2.0
    lo = 1.0 - q + q * math.exp(-r)
    return lo, hi


def token_epsilon(q: float, radius: float) -> float:
    """Pure-DP ε of one served token under replace-one-member (hence add/remove-one-person)."""
    lo, hi = ratio_bounds(q, radius)
    return math.log(hi) - math.log(lo)


def pure_to_rdp(eps: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """D_α ≤ min(ε, α ε²/2) for a pair with pointwise ratio within e^{±ε} (D∞ bound; Bun–Steinke 2016)."""
    a = np.asarray(orders, dtype=float)
    if np.any(a <= 1.0):
        raise VeilError("pmixed: Rényi orders must be > 1")
    e = float(eps)
    return np.minimum(e, a * e * e / 2.0)


def token_rdp(q: float, radius: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """The RDP curve one served token costs every person in the ensemble."""
    return pure_to_rdp(token_epsilon(q, radius), orders)


def budget_epsilon(q: float, radius: float, tokens: int, delta: float, orders: Sequence[float] = ORDERS) -> float:
    """(ε, δ) after `tokens` private tokens: RDP composition then the Balle et al. 2020 conversion."""
    if int(tokens) < 0:
        raise VeilError("pmixed: token budget must be ≥ 0")
    if int(tokens) == 0:
        return 0.0
    eps, _ = rdp_to_epsilon(orders, int(tokens) * token_rdp(q, radius, orders), delta)
    return eps


def calibrate_radius(*, epsilon: float, delta: float, tokens: int, q: float, orders: Sequence[float] = ORDERS,
                     iters: int = 200) -> float:
    """The largest radius r (to bisection precision) whose `tokens`-token spend is ≤ (ε, δ).

    Bisection keeps the invariant "lo is feasible"; it returns lo, never the midpoint or hi."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise VeilError(f"pmixed: target epsilon {epsilon} must be a finite number > 0")
    if int(tokens) < 1:
        raise VeilError(f"pmixed: token budget {tokens} must be ≥ 1")
    _check(q, 0.0)
    f = lambda r: budget_epsilon(q, r, tokens, delta, orders) <= epsilon  # noqa: E731
    lo, hi = 0.0, 1.0
    if not f(lo):
        raise VeilError(f"pmixed: even r=0 cannot meet ε={epsilon} at δ={delta} (δ too small for the order grid)")
    while f(hi):
        lo, hi = hi, hi * 2.0
        if hi > 64:
            return lo
    for _ in range(iters):
        mid = (lo + hi) / 2.0
        if f(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    assert f(lo)
    return lo


@dataclass(frozen=True)
class MechanismParams:
    """Everything public that fixes the per-token cost. `tokens` is the private-token budget T."""
    shards: int
    q: float
    radius: float
    tokens: int
    delta: float
    temperature: float = 1.0

    def token_epsilon(self) -> float:
        return token_epsilon(self.q, self.radius)

    def token_rdp(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        return token_rdp(self.q, self.radius, orders)

    def budget_rdp(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        return self.tokens * self.token_rdp(orders)

    def epsilon(self, tokens: int | None = None, orders: Sequence[float] = ORDERS) -> float:
        return budget_epsilon(self.q, self.radius, self.tokens if tokens is None else tokens, self.delta, orders)
