"""Private hyper-parameter selection with a random number of trials (Papernot & Steinke, ICLR 2022).

Tuning on private data leaks through the choice itself: picking the best of K runs costs far more
than one run when K is fixed (roughly K-fold). Papernot & Steinke show that when the number of runs K
is itself random — and hidden — the best-of-K output costs only a little more than a single run.

A = "draw K ~ D; run Q K times (each run: a data-independent, uniformly drawn grid point, trained and
scored); output the run with the best score". Q's per-person Rényi curve is ε_Q(λ).

Theorem 2 (truncated negative binomial, TNB). K ~ D_{η,γ} with η ∈ (−1, ∞), γ ∈ (0, 1):
    P[K = k] = (1−γ)^k / (γ^{−η} − 1) · Π_{ℓ=0}^{k−1} (ℓ+η)/(ℓ+1),  k ≥ 1
(η = 0: the logarithmic distribution P[K=k] = (1−γ)^k / (k log(1/γ)); η = 1: geometric). If Q is
(λ, ε_Q(λ))-RDP and (λ̂, ε_Q(λ̂))-RDP, A is (λ, ε')-RDP with
    ε' = ε_Q(λ) + (1+η)(1 − 1/λ̂) ε_Q(λ̂) + (1+η) log(1/γ)/λ̂ + log(E[K])/(λ−1),
    E[K] = η(1−γ) / (γ (1 − γ^η))        (η ≠ 0),      E[K] = (1/γ − 1) / log(1/γ)   (η = 0).
λ̂ ∈ [1, ∞) is free: we take the best over {1} ∪ the ledger's orders, per λ.

Theorem 6 (Poisson). K ~ Poisson(μ) (K = 0 outputs nothing). If Q is (λ, ε_Q(λ))-RDP and (ε̂, δ̂)-DP
with e^ε̂ ≤ 1 + 1/(λ−1), A is (λ, ε')-RDP with
    ε' = ε_Q(λ) + μ δ̂ + log(μ)/(λ−1).
We use ε̂ = log(1 + 1/(λ−1)) and δ̂ from Q's own curve, δ̂ = min_α exp((α−1)(ε_Q(α) − ε̂)) (the
RDP → (ε, δ) conversion of Mironov 2017, Prop. 3, solved for δ), capped at 1.

Both need Q's output to be totally ordered by its score and everything Q outputs to be covered by
ε_Q; the number K and the losing runs must stay secret (publishing K would make the analysis that of
a fixed K). ε_Q here is the worst of every grid point's training curve and the score's Gaussian curve
(flows/study.py): a uniformly drawn point is a mixture, and a mixture's Rényi divergence is at most the
largest of its parts (joint quasi-convexity of exp((λ−1)D_λ)).
"""
from __future__ import annotations

import math
import secrets as _secrets
from collections.abc import Sequence

import numpy as np

from components.core.errors import VeilError

DISTRIBUTIONS = ("truncated-negative-binomial", "poisson")


def _check(distribution: str, eta: float | None, gamma: float | None, mu: float | None) -> None:
    if distribution not in DISTRIBUTIONS:
        raise VeilError(f"private selection: distribution {distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if distribution == "poisson":
        if mu is None or not (float(mu) > 0 and math.isfinite(float(mu))):
            raise VeilError(f"private selection: poisson needs mu > 0, got {mu!r}")
    else:
        if eta is None or not (float(eta) > -1 and math.isfinite(float(eta))):
            raise VeilError(f"private selection: eta must be > -1, got {eta!r}")
        if gamma is None or not 0 < float(gamma) < 1:
            raise VeilError(f"private selection: gamma must be in (0, 1), got {gamma!r}")


def expected_trials(distribution: str, *, eta: float | None = None, gamma: float | None = None,
                    mu: float | None = None) -> float:
    """E[K] of the number of runs."""
    _check(distribution, eta, gamma, mu)
    if distribution == "poisson":
        return float(mu)
    e, g = float(eta), float(gamma)
    if e == 0.0:
        return (1.0 / g - 1.0) / math.log(1.0 / g)
    return e * (1.0 - g) / (g * (1.0 - g ** e))


def tnb_pmf(k: int, eta: float, gamma: float) -> float:
    """P[K = k] of the truncated negative binomial D_{η,γ} (k ≥ 1)."""
    if k < 1:
        return 0.0
    e, g = float(eta), float(gamma)
    if e == 0.0:
        return (1.0 - g) ** k / (k * math.log(1.0 / g))
    # Π_{ℓ<k} (ℓ+η)/(ℓ+1) = Γ(k+η) / (Γ(η) k!); for −1 < η < 0 both Γ(η) and the normaliser
    # γ^{−η} − 1 are negative, so magnitudes (lgamma is log|Γ|) give the probability
    log_p = (k * math.log1p(-g) - math.log(abs(g ** (-e) - 1.0))
             + math.lgamma(k + e) - math.lgamma(e) - math.lgamma(k + 1))
    return math.exp(log_p)


def draw_trials(distribution: str, *, eta: float | None = None, gamma: float | None = None,
                mu: float | None = None, rng=None, max_trials: int = 10_000) -> int:
    """K from the OS CSPRNG (or `rng`, a random.Random, for tests) by inverse transform."""
    _check(distribution, eta, gamma, mu)
    r = rng if rng is not None else _secrets.SystemRandom()
    u = r.random()
    if distribution == "poisson":
        m = float(mu)
        k, p = 0, math.exp(-m)
        c = p
        while u > c and k < max_trials:
            k += 1
            p *= m / k
            c += p
        return k
    k, c = 0, 0.0
    while k < max_trials:
        k += 1
        c += tnb_pmf(k, float(eta), float(gamma))
        if u <= c:
            return k
    return k  # the tail beyond max_trials is below float resolution for sane parameters


def _poisson_delta_hat(orders: np.ndarray, curve: np.ndarray, lam: float) -> float:
    eps_hat = math.log1p(1.0 / (lam - 1.0))
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.exp((orders - 1.0) * (curve - eps_hat))
    d = d[np.isfinite(d)]
    return float(min(1.0, d.min())) if len(d) else 1.0


def selection_rdp(orders: Sequence[float], q_curve: Sequence[float], distribution: str, *,
                  eta: float | None = None, gamma: float | None = None, mu: float | None = None) -> np.ndarray:
    """ε'(λ) of best-of-K on the orders `orders`, given Q's RDP curve on the same orders (module doc)."""
    _check(distribution, eta, gamma, mu)
    a = np.asarray(orders, dtype=float)
    c = np.asarray(q_curve, dtype=float)
    if a.shape != c.shape or a.ndim != 1 or np.any(a <= 1) or np.any(np.isnan(c)) or np.any(c < 0):
        raise VeilError("private selection: Q's curve must be ≥ 0 on orders > 1, one value per order")
    ek = expected_trials(distribution, eta=eta, gamma=gamma, mu=mu)
    out = np.empty_like(a)
    if distribution == "poisson":
        for i, lam in enumerate(a):
            out[i] = c[i] + float(mu) * _poisson_delta_hat(a, c, lam) + math.log(float(mu)) / (lam - 1.0)
        return np.maximum(out, 0.0)
    e1 = 1.0 + float(eta)
    log_inv_g = math.log(1.0 / float(gamma))
    # λ̂ = 1 (then (1 − 1/λ̂)ε̂ = 0) and every order of the grid
    hats = [e1 * log_inv_g] + [e1 * (1.0 - 1.0 / h) * ch + e1 * log_inv_g / h for h, ch in zip(a, c)]
    best_hat = min(x for x in hats if math.isfinite(x)) if any(math.isfinite(x) for x in hats) else math.inf
    for i, lam in enumerate(a):
        out[i] = c[i] + best_hat + math.log(ek) / (lam - 1.0)
    return np.maximum(out, 0.0)


def rdp_to_epsilon(orders: Sequence[float], curve: Sequence[float], delta: float) -> tuple[float, float]:
    """(ε, the order reaching it) = min_λ ε(λ) + log(1/δ)/(λ−1) (Mironov 2017, Prop. 3)."""
    a = np.asarray(orders, dtype=float)
    c = np.asarray(curve, dtype=float)
    v = c + math.log(1.0 / float(delta)) / (a - 1.0)
    i = int(np.nanargmin(v))
    return float(v[i]), float(a[i])


def gaussian_rdp(orders: Sequence[float], noise_multiplier: float) -> np.ndarray:
    """The Gaussian mechanism with sensitivity 1 and noise σ: ε(λ) = λ / (2σ²)."""
    s = float(noise_multiplier)
    if not (s > 0 and math.isfinite(s)):
        raise VeilError(f"private selection: score noise multiplier {noise_multiplier!r} must be > 0")
    return np.asarray(orders, dtype=float) / (2.0 * s * s)
