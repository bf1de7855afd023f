"""Independent, brute-force reference for PMixED tests: the exact served distribution (enumerating every
Poisson selection) and Rényi divergences, written without the production code's shortcuts."""
from __future__ import annotations

import itertools
import math

import numpy as np


def lam_bruteforce(p: np.ndarray, p0: np.ndarray, r: float, iters: int = 200) -> float:
    """Largest λ with every token's ratio (λ p + (1−λ) p0)/p0 in [e^{−r}, e^{r}], by bisection on λ with
    the constraint checked token by token in plain Python floats."""
    def ok(lam):
        for a, b in zip(p.tolist(), p0.tolist()):
            v = lam * a + (1 - lam) * b
            if b == 0.0:
                if v != 0.0:
                    return False
                continue
            if not (math.exp(-r) <= v / b <= math.exp(r)):
                return False
        return True
    if ok(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def served(members, p0, q, r, lam_fn=None) -> np.ndarray:
    """P(w) = Σ_S Pr[S] mix(S)(w), every subset S of the members enumerated."""
    lam_fn = lam_fn or lam_bruteforce
    bars = [lam_fn(p, p0, r) * p + (1 - lam_fn(p, p0, r)) * p0 for p in members]
    n = len(members)
    out = np.zeros_like(p0, dtype=np.float64)
    for bits in itertools.product((0, 1), repeat=n):
        k = sum(bits)
        w = (q ** k) * ((1 - q) ** (n - k))
        if w == 0:
            continue
        mix = p0 if k == 0 else sum(b for b, s in zip(bars, bits) if s) / k
        out += w * mix
    return out


def renyi(P: np.ndarray, Q: np.ndarray, a: float) -> float:
    """D_α(P‖Q) in float64 log-space (both strictly positive)."""
    lp, lq = np.log(P), np.log(Q)
    z = a * lp - (a - 1) * lq
    m = z.max()
    return float((m + math.log(np.exp(z - m).sum())) / (a - 1))


def dinf(P: np.ndarray, Q: np.ndarray) -> float:
    return float(np.max(np.log(P) - np.log(Q)))


def softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()
