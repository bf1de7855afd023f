"""Fast pessimistic PLD of one step of a mixture-of-Gaussians mechanism.

Mechanism (add/remove neighbouring, noise N(0, σ²), sensitivity c_j with probability p_j):

    REMOVE pair:  upper = Σ_j p_j N(-c_j, σ²)   lower = N(0, σ²)
    ADD pair:     upper = N(0, σ²)              lower = Σ_j p_j N(c_j, σ²)

This is the pair dp_accounting builds in `from_mixture_gaussian_mechanism` (MixtureGaussianPrivacyLoss),
and we discretize it the same way: pessimistic Connect-the-Dots on a fixed grid of privacy losses
(`pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap`), which needs the hockey-stick divergence δ(ε)
at every grid point. dp_accounting finds each inverse privacy loss by a scalar binary search (≈ 60 s for
k=8, σ=1); here the privacy loss is a log-sum-exp of lines, so the inverse is found for the whole grid
at once by Newton's method, which converges monotonically from the side we start on (the loss is
convex in x for REMOVE, concave for ADD). Composition and ε(δ) stay dp_accounting's own code.

Grid choice. The grid is the multiples of `discretization` between a lower and an upper loss:
  * mass below the lower end is moved up onto it (Connect-the-Dots does this) — pessimistic;
  * mass above the upper end goes to +∞ (it is δ at the upper end, ≤ `tail_mass`) — pessimistic.
A grid of multiples of m·Δ is a subset of the Δ grid, so its Connect-the-Dots PLD dominates the Δ one:
coarse results are never below fine ones (up to floating point), which `accountant` relies on.
"""
from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import special

# Mass allowed to escape each end of the grid (the upper escape is charged to δ as mass at +∞).
DEFAULT_TAIL_MASS = 1e-22


# Atoms whose total probability is below this are moved onto the largest sensitivity (see _fold_tail).
FOLD_MASS = 1e-30


def _fold_tail(c: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Move the probability of the largest sensitivities but one, while it totals ≤ FOLD_MASS, onto the
    largest sensitivity. A sensitivity that is stochastically larger gives a dominating pair in both
    directions (Choquette-Choo et al. 2023, Lemma 4.5 / Cor. 4.7), so this is pessimistic; it turns e.g.
    Bin(64, 5e-4) into ~16 atoms instead of 65, which is where the time goes."""
    order = np.argsort(c)
    c, p = c[order], p[order]
    if len(c) <= 2:
        return c, p
    # suffix sums over all atoms but the last (the largest keeps its own mass and gets the fold)
    inner = p[:-1]
    suffix = np.cumsum(inner[::-1])[::-1]          # suffix[i] = Σ_{j ≥ i, j < last} p_j
    fold = suffix <= FOLD_MASS
    if not fold.any():
        return c, p
    first = int(np.argmax(fold))
    if first == 0:
        first = 1  # never fold everything into one atom
    moved = float(inner[first:].sum())
    c2 = np.concatenate([c[:first], c[-1:]])
    p2 = np.concatenate([p[:first], [p[-1] + moved]])
    return c2, p2


class _Mixture:
    """Sensitivities/probabilities with zero-probability atoms dropped and zero sensitivities merged."""

    def __init__(self, sigma: float, sensitivities, probs):
        c = np.asarray(sensitivities, dtype=float)
        p = np.asarray(probs, dtype=float)
        if c.shape != p.shape or c.ndim != 1:
            raise ValueError("sensitivities and probabilities must be 1-D of equal length")
        if np.any(c < 0) or np.any(p < 0):
            raise ValueError("sensitivities and probabilities must be ≥ 0")
        if not math.isclose(float(p.sum()), 1.0, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"probabilities sum to {p.sum()}, not 1")
        keep = p > 0
        c, p = c[keep], p[keep] / p[keep].sum()
        c, p = _fold_tail(c, p)
        self.p0 = float(p[c == 0].sum())
        pos = c > 0
        if not pos.any():
            raise ValueError("at least one positive sensitivity needs positive probability")
        self.c = c[pos]
        self.p = p[pos]
        self.sigma = float(sigma)
        var = self.sigma ** 2
        self.b = self.c / var  # slopes of the per-component losses
        # log-weights of the per-component losses, zero sensitivity included as a constant term
        self.a = np.log(self.p) - self.c ** 2 / (2 * var)
        self.log_p0 = math.log(self.p0) if self.p0 > 0 else -math.inf

    # --- privacy losses as functions of the output x ------------------------------------------
    def _lse(self, x: np.ndarray, sign: float) -> tuple[np.ndarray, np.ndarray]:
        """log(p0 + Σ_j exp(a_j + sign·b_j·x)) and its x-derivative, vectorised over x."""
        z = self.a[None, :] + sign * np.multiply.outer(x, self.b)
        if self.p0 > 0:
            z = np.concatenate([np.full((len(x), 1), self.log_p0), z], axis=1)
            slopes = np.concatenate([[0.0], sign * self.b])
        else:
            slopes = sign * self.b
        m = z.max(axis=1)
        w = np.exp(z - m[:, None])
        s = w.sum(axis=1)
        return m + np.log(s), (w @ slopes) / s

    def loss(self, x: np.ndarray, remove: bool) -> np.ndarray:
        x = np.atleast_1d(np.asarray(x, dtype=float))
        if remove:
            return self._lse(x, -1.0)[0]
        return -self._lse(x, 1.0)[0]

    def inverse_loss(self, eps: np.ndarray, remove: bool, table: tuple[np.ndarray, np.ndarray] | None = None
                     ) -> np.ndarray:
        """x with loss(x) = ε for each ε (all inside the loss's range), by monotone Newton steps.

        `table` = (xs increasing, loss(xs)) tabulated once: each search starts at the nearest tabulated
        point on the safe side of its root, so a handful of steps suffice.
        """
        eps = np.asarray(eps, dtype=float)
        if remove:
            # loss = LSE(a - b x): convex, decreasing. Start left of the root: for every j,
            # a_j - b_j x ≥ ε when x ≤ (a_j - ε)/b_j, so the largest such x has loss ≥ ε.
            x = np.max((self.a[None, :] - eps[:, None]) / self.b[None, :], axis=1)
            target, sign = eps, -1.0
        else:
            # -loss = LSE(a + b x) =: M(x): convex, increasing; solve M = -ε starting right of the root.
            x = np.min((-eps[:, None] - self.a[None, :]) / self.b[None, :], axis=1)
            target, sign = -eps, 1.0
        if table is not None:
            xs, ls = table  # loss decreasing in x
            # number of tabulated points with loss ≥ ε  (ls reversed is increasing)
            n_ge = len(ls) - np.searchsorted(ls[::-1], eps, side="left")
            if remove:   # safe side: loss ≥ ε, i.e. the last tabulated x with loss ≥ ε
                has = n_ge > 0
                x[has] = np.maximum(x[has], xs[n_ge[has] - 1])
            else:        # safe side: loss ≤ ε, i.e. the first tabulated x with loss ≤ ε
                n_gt = len(ls) - np.searchsorted(ls[::-1], eps, side="right")
                has = n_gt < len(xs)
                x[has] = np.minimum(x[has], xs[n_gt[has]])
        active = np.arange(len(eps))
        # δ(ε) is the maximum over x of P_upper(X ≤ x) − e^ε P_lower(X ≤ x), attained at the root, so
        # an error η in x lowers δ by O(η²) only: 1e-11 is far below anything that shows in ε.
        for _ in range(100):
            val, der = self._lse(x[active], sign)
            step = (val - target[active]) / der
            x[active] -= step
            done = np.abs(step) <= 1e-11 * np.maximum(1.0, np.abs(x[active]))
            active = active[~done]
            if active.size == 0:
                break
        return x

    def _table(self, x_range, remove: bool, n: int = 4096):
        if x_range is None:
            return None
        xs = np.linspace(x_range[0], x_range[1], n)
        return xs, self.loss(xs, remove)

    # --- hockey-stick divergence δ(ε) -----------------------------------------------------------
    def delta(self, eps: np.ndarray, remove: bool, x_range: tuple[float, float] | None = None) -> np.ndarray:
        """δ(ε) = P_upper(L > ε) − e^ε P_lower(L > ε), computed in log space to limit cancellation."""
        eps = np.asarray(eps, dtype=float)
        out = np.zeros_like(eps)
        s = self.sigma
        if remove:
            # loss ≥ log p0 everywhere: below it every output has larger loss, δ = 1 − e^ε.
            low = eps <= self.log_p0 + 1e-12 if self.p0 > 0 else np.zeros_like(eps, dtype=bool)
            out[low] = -np.expm1(eps[low])
            idx = ~low
            x = self.inverse_loss(eps[idx], remove=True, table=self._table(x_range, True))
            log_up = special.logsumexp(special.log_ndtr(np.add.outer(x, self.c) / s), axis=1, b=self.p)
            if self.p0 > 0:
                log_up = np.logaddexp(log_up, self.log_p0 + special.log_ndtr(x / s))
            log_low = special.log_ndtr(x / s)
        else:
            # loss ≤ −log p0 everywhere: at or above it δ = 0.
            high = eps >= -self.log_p0 - 1e-12 if self.p0 > 0 else np.zeros_like(eps, dtype=bool)
            idx = ~high
            x = self.inverse_loss(eps[idx], remove=False, table=self._table(x_range, False))
            log_up = special.log_ndtr(x / s)
            log_low = special.logsumexp(special.log_ndtr(np.subtract.outer(x, self.c) / s), axis=1, b=self.p)
            if self.p0 > 0:
                log_low = np.logaddexp(log_low, self.log_p0 + special.log_ndtr(x / s))
        diff = log_low + eps[idx] - log_up  # ≤ 0 in exact arithmetic
        out[idx] = np.exp(log_up) * -np.expm1(np.minimum(diff, 0.0))
        out = np.clip(out, 0.0, 1.0)
        # δ(ε) is non-increasing; repair round-off upwards (pessimistic).
        return np.maximum.accumulate(out[::-1])[::-1]

    def _log_upper_cdf_remove(self, x: float) -> float:
        v = special.logsumexp(special.log_ndtr((x + self.c) / self.sigma), b=self.p)
        if self.p0 > 0:
            v = np.logaddexp(v, self.log_p0 + special.log_ndtr(x / self.sigma))
        return float(v)

    def _left_tail_point(self, log_mass: float) -> float:
        """A point x with P_upper(X < x) ≤ exp(log_mass) for the REMOVE pair (bisection, kept on the safe side)."""
        z = float(-special.ndtri(math.exp(log_mass)))
        lo, hi = -self.sigma * z - float(self.c.max()), -self.sigma * z  # cdf(lo) ≤ mass ≤ cdf(hi)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if self._log_upper_cdf_remove(mid) <= log_mass:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-9:
                break
        return lo

    # --- grid ends -------------------------------------------------------------------------------
    def grid_bounds(self, discretization: float, remove: bool, tail_mass: float
                    ) -> tuple[int, int, tuple[float, float]]:
        z = float(-special.ndtri(tail_mass))  # P(N(0,1) > z) = tail_mass
        s = self.sigma
        if remove:
            # upper distribution = Σ p_j N(−c_j, σ²): each component lies left of N(0, σ²).
            x_hi = s * z                       # P_upper(X > x_hi) ≤ tail_mass  → lower loss end
            x_lo = self._left_tail_point(math.log(tail_mass))  # P_upper(X < x_lo) ≤ tail_mass
            lo = float(self.loss(x_hi, True)[0])
            hi = float(self.loss(x_lo, True)[0])
        else:
            x_hi, x_lo = s * z, -s * z           # upper distribution = N(0, σ²)
            lo = float(self.loss(x_hi, False)[0])
            hi = float(self.loss(x_lo, False)[0])
            if self.p0 > 0:
                hi = min(hi, -self.log_p0)
        return math.floor(lo / discretization), math.ceil(hi / discretization), (x_lo, x_hi)


def mixture_pmf(sigma: float, sensitivities, probs, *, discretization: float, remove: bool,
                tail_mass: float = DEFAULT_TAIL_MASS) -> pld_pmf.PLDPmf:
    """Pessimistic Connect-the-Dots PMF for one adjacency direction of the mixture mechanism."""
    mix = _Mixture(sigma, sensitivities, probs)
    lo, hi, x_range = mix.grid_bounds(discretization, remove, tail_mass)
    eps = np.arange(lo, hi + 1) * discretization
    deltas = mix.delta(eps, remove, x_range)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(discretization, lo, hi, deltas)


def mixture_pld(sigma: float, sensitivities, probs, *, discretization: float = 1e-4,
                tail_mass: float = DEFAULT_TAIL_MASS) -> pld_lib.PrivacyLossDistribution:
    """Both directions (REMOVE, ADD) of one mixture step as a dp_accounting PrivacyLossDistribution."""
    remove = mixture_pmf(sigma, sensitivities, probs, discretization=discretization, remove=True,
                         tail_mass=tail_mass)
    add = mixture_pmf(sigma, sensitivities, probs, discretization=discretization, remove=False,
                      tail_mass=tail_mass)
    return pld_lib.PrivacyLossDistribution(remove, add)
