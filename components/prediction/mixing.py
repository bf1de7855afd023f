"""Algorithm 1 of PMixED, repaired: Poisson selection, the pointwise mollifier, the mixture, a CSPRNG draw.

All arithmetic is float64 in log-space over the whole vocabulary. The mollifier is the D∞ ball
e^{−r} ≤ p̄(w)/p₀(w) ≤ e^{r} (docs/privacy/pmixed.md); for p̄ = λ p + (1 − λ) p₀ the ratio is
1 + λ(p(w)/p₀(w) − 1), monotone in λ for every w, so the largest feasible λ has a closed form:

    λ* = min(1, (e^{r} − 1)/(M − 1) [M > 1], (1 − e^{−r})/(1 − m) [m < 1]),  M = max p/p₀, m = min p/p₀.

Rounding can put λ* a hair outside the ball, so the result is *verified* in log-space and shrunk until it
is inside: what is returned is always a feasible point (the "feasible end of the bracket").

Randomness: selection and the token draw use `secrets.SystemRandom` (the OS CSPRNG). Callers cannot seed
it; tests pass their own `random.Random` only through the `rng` argument of these pure functions.
"""
from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence

import numpy as np

from components.core.errors import VeilError

_CSPRNG = secrets.SystemRandom()
SLACK = 1e-9  # nats between the enforced and the accounted radius


def log_softmax64(logits, temperature: float = 1.0) -> np.ndarray:
    """float64 log-softmax of (logits / temperature) over the last axis: the per-model transform."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise VeilError(f"temperature {temperature} must be a finite number > 0")
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    # −inf is a legitimate logit (a token the model rules out: probability 0); NaN and +inf are not
    # distributions, and a row with no finite logit gives none — refuse them rather than serve NaN
    if np.any(np.isnan(z)) or np.any(np.isposinf(z)):
        raise VeilError("prediction: the model produced NaN or +inf logits; refusing to sample")
    m = np.max(z, axis=-1, keepdims=True)
    if np.any(np.isneginf(m)):
        raise VeilError("prediction: every logit of a row is −inf (no token is possible); refusing to sample")
    return z - m - np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True))


def _log_ratio(logp_bar: np.ndarray, logp0: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        d = logp_bar - logp0
    return np.where(np.isneginf(logp_bar) & np.isneginf(logp0), 0.0, d)


def mix_log(logp: np.ndarray, logp0: np.ndarray, lam: float) -> np.ndarray:
    """log(λ p + (1 − λ) p₀), exact at λ = 0 and λ = 1."""
    if lam <= 0.0:
        return np.array(logp0, dtype=np.float64, copy=True)
    if lam >= 1.0:
        return np.array(logp, dtype=np.float64, copy=True)
    return np.logaddexp(math.log(lam) + logp, math.log1p(-lam) + logp0)


def in_ball(logp_bar: np.ndarray, logp0: np.ndarray, radius: float) -> bool:
    """Is max_w |log p̄(w) − log p₀(w)| ≤ r? (A token p₀ gives no mass must get none either.)"""
    d = _log_ratio(logp_bar, logp0)
    if np.any(np.isnan(d)):
        return False
    return bool(np.max(np.abs(d)) <= radius)


def _log_expm1(x: float) -> float:
    return x + math.log(-math.expm1(-x))


def solve_lambda(logp: np.ndarray, logp0: np.ndarray, radius: float, max_shrinks: int = 200) -> float:
    """The largest λ ∈ [0, 1] with λ p + (1 − λ) p₀ in the pointwise ball of radius r around p₀."""
    r = float(radius)
    if r <= SLACK:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = _log_ratio(logp, logp0)
    if np.any(np.isnan(d)):
        return 0.0
    log_M, log_m = float(np.max(d)), float(np.min(d))
    lam = 1.0
    if log_M > 0.0:
        # (e^r − 1)/(M − 1) in log-space: log expm1(x) = x + log(−expm1(−x)) neither cancels nor overflows
        lr = _log_expm1(r - SLACK) - _log_expm1(log_M)
        lam = min(lam, 1.0 if lr >= 0.0 else math.exp(lr))
    if log_m < 0.0:
        lam = min(lam, -math.expm1(-(r - SLACK)) / -math.expm1(log_m))
    lam = max(0.0, lam)
    target = r - SLACK  # enforce a hair inside the accounted radius: float rounding of p̄ stays covered
    step = 1e-12
    for _ in range(max_shrinks):
        if in_ball(mix_log(logp, logp0, lam), logp0, target):
            return lam
        lam, step = lam * (1.0 - step), min(step * 4.0, 0.5)  # geometric: a few tries for rounding, then fast
        if lam < 1e-300:
            break
    return 0.0


def poisson_select(n: int, q: float, rng: random.Random | None = None) -> list[int]:
    """Each member independently with probability q (true Poisson subsampling; never with replacement)."""
    g = rng or _CSPRNG
    return [i for i in range(int(n)) if g.random() < q]


def mixture_log(member_logps: Sequence[np.ndarray], logp0: np.ndarray, radius: float) -> tuple[np.ndarray, list[float]]:
    """log of the served distribution: the average of the mollified selected members, or p₀ if none."""
    if not len(member_logps):
        return np.array(logp0, dtype=np.float64, copy=True), []
    lams = [solve_lambda(lp, logp0, radius) for lp in member_logps]
    stacked = np.stack([mix_log(lp, logp0, lam) for lp, lam in zip(member_logps, lams)])
    m = np.max(stacked, axis=0)
    # a token every mollified member gives probability 0 has m = −inf; (−inf) − (−inf) would be NaN, so
    # shift such columns by 0 instead: exp(−inf) = 0, mean 0, log 0 = −inf — the token stays impossible
    shift = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = shift + np.log(np.mean(np.exp(stacked - shift), axis=0))
    return out, lams


def sample_token(logp: np.ndarray, rng: random.Random | None = None) -> int:
    """Inverse-CDF draw from exp(logp) with a CSPRNG uniform (53 bits). A −inf entry has probability 0
    and is never drawn; NaN (or +inf, or no possible token) is refused, never sampled from."""
    g = rng or _CSPRNG
    lp = np.asarray(logp, dtype=np.float64)
    if lp.ndim != 1 or not len(lp) or np.any(np.isnan(lp)) or np.any(np.isposinf(lp)):
        raise VeilError("prediction: the distribution to sample has NaN or +inf entries; refusing to sample")
    top = np.max(lp)
    if not np.isfinite(top):
        raise VeilError("prediction: no token has positive probability; refusing to sample")
    p = np.exp(lp - top)
    c = np.cumsum(p)
    u = g.random() * c[-1]
    i = int(np.searchsorted(c, u, side="right"))
    # c[i] > u ≥ c[i−1] means c rises at i, so p[i] > 0. Only rounding (u = c[-1]) runs past the end:
    # then the last token with positive probability, never a trailing impossible one
    return i if i < len(c) else int(np.flatnonzero(p > 0.0)[-1])
