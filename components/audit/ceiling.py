"""What any attack can reach against an (ε, δ)-DP mechanism: the ceiling an audit compares with.

An (ε, δ)-DP mechanism's hypothesis-testing trade-off (Kairouz et al. 2015; Dong, Roth & Su 2019):
every test of "user in" vs "user out" with type-I error α (FPR) has type-II error β = 1 − TPR ≥ f(α),

    f_{ε,δ}(α) = max(0, 1 − δ − e^ε α, e^{−ε} (1 − δ − α)).

So TPR ≤ 1 − f(FPR) at every operating point and AUROC = ∫ TPR dFPR ≤ 1 − ∫₀¹ f. For (ε, δ) the
integral has a closed form: the two lines cross at α* = (1 − δ)/(1 + e^ε) and

    ∫₀¹ f = (1 − δ)² / (1 + e^ε),   so   AUROC ≤ 1 − (1 − δ)² / (1 + e^ε).

A mechanism that satisfies a whole family of (ε_i, δ_i) guarantees at once (a privacy loss
distribution's δ(ε) profile) has f = max_i f_{ε_i, δ_i}; `auroc_ceiling_from_profile` integrates that
envelope numerically, rounding every approximation towards a *higher* ceiling (see there).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from components.core.errors import VeilError
from components.mechanisms import get as get_mechanism


def _check(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, (int, float)) and epsilon >= 0 and not math.isnan(epsilon)):
        raise VeilError(f"epsilon: must be a number >= 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 <= delta <= 1):
        raise VeilError(f"delta: must be a number in [0, 1], got {delta!r}")


def tradeoff(alpha, epsilon: float, delta: float):
    """f_{ε,δ}(α): the least type-II error any test at type-I error α can have."""
    _check(epsilon, delta)
    a = np.asarray(alpha, dtype=float)
    if math.isinf(epsilon):
        return np.zeros_like(a) if a.ndim else 0.0
    out = np.maximum(0.0, np.maximum(1.0 - delta - math.exp(epsilon) * a,
                                     math.exp(-epsilon) * (1.0 - delta - a)))
    return out if a.ndim else float(out)


def tpr_ceiling(fpr, epsilon: float, delta: float):
    """The largest TPR any test can have at this FPR against an (ε, δ)-DP mechanism."""
    return 1.0 - tradeoff(fpr, epsilon, delta)


def auroc_ceiling(epsilon: float, delta: float) -> float:
    """The largest AUROC any test can reach against an (ε, δ)-DP mechanism: 1 − (1−δ)²/(1+e^ε)."""
    _check(epsilon, delta)
    if math.isinf(epsilon) or epsilon > 700:
        return 1.0
    return 1.0 - (1.0 - delta) ** 2 / (1.0 + math.exp(epsilon))


def auroc_ceiling_from_profile(epsilons: Sequence[float], deltas: Sequence[float], *,
                               grid: int = 20_001) -> float:
    """AUROC ceiling of a mechanism that is (ε_i, δ_i)-DP for every i at once.

    The trade-off curve is the upper envelope f = max_i f_{ε_i,δ_i}, convex and decreasing. We
    integrate it with the midpoint rule, which for a convex function never exceeds the integral
    (Hermite–Hadamard), so the returned ceiling is never below the exact one for this profile. A
    profile sampled on a finite ε grid only loses constraints, which again raises the ceiling: both
    approximations err on the side of "an attack could do more".
    """
    eps = np.asarray(epsilons, dtype=float)
    dls = np.asarray(deltas, dtype=float)
    if eps.shape != dls.shape or eps.ndim != 1 or eps.size == 0:
        raise VeilError("epsilons, deltas: need two 1-D sequences of the same non-zero length")
    for e, d in zip(eps, dls):
        _check(float(e), float(d))
    edges = np.linspace(0.0, 1.0, grid)
    mids = (edges[:-1] + edges[1:]) / 2
    f = np.zeros_like(mids)
    for e, d in zip(eps, dls):
        f = np.maximum(f, tradeoff(mids, float(e), float(d)))
    return float(1.0 - np.sum(f) * (1.0 / (grid - 1)))


_PROFILE_GRID = np.concatenate([np.linspace(0.0, 2.0, 201)[:-1], np.linspace(2.0, 20.0, 361)])


def tpr_ceiling_from_pld(fpr, pld, *, epsilons: Sequence[float] | None = None):
    """The largest TPR any test can have at each FPR against the mechanism of `pld`: one minus the
    upper envelope of the trade-off curves f_{ε,δ(ε)} over an ε grid (a finite grid only drops
    constraints, so the curve is never below the exact one)."""
    grid = np.asarray(epsilons if epsilons is not None else _PROFILE_GRID)
    deltas = np.clip(np.asarray(pld.get_delta_for_epsilon(grid), dtype=float), 0.0, 1.0)
    a = np.asarray(fpr, dtype=float)
    f = np.zeros_like(a)
    for e, d in zip(grid, deltas):
        f = np.maximum(f, tradeoff(a, float(e), float(d)))
    return 1.0 - f


def auroc_ceiling_from_pld(pld, *, epsilons: Sequence[float] | None = None) -> float:
    """AUROC ceiling from a dp_accounting PrivacyLossDistribution (its δ(ε) profile on a grid).

    `pld.get_delta_for_epsilon` already takes the worse of the add and remove directions, so each
    (ε, δ(ε)) pair is a symmetric guarantee and the envelope above applies.
    """
    grid = np.asarray(epsilons if epsilons is not None else _PROFILE_GRID)
    deltas = np.clip(np.asarray(pld.get_delta_for_epsilon(grid), dtype=float), 0.0, 1.0)
    return auroc_ceiling_from_profile(grid, deltas)


def certificate_pld(certificate, *, discretization: float = 1e-3):
    """The composed privacy loss distribution of a certificate's *user-level* mechanism, or None.

    The certificate's mechanism (components.mechanisms) gives it: ULS a Poisson-subsampled
    Gaussian(σ) per step, ELS / group the Binomial(k, q) mixture of Gaussians (Charles et al.), both
    pessimistic and composed over the steps actually run. Record- and secret-level certificates (and
    mechanisms without a PLD) give None: their PLD says nothing about a whole user.
    """

    if not certificate or certificate.get("privacy_unit") != "user":
        return None
    try:
        mech = get_mechanism(certificate.get("mechanism"))
    except VeilError:
        return None
    return mech.user_pld(certificate, discretization)


def certificate_ceilings(certificate) -> dict:
    """AUROC ceilings a certificate implies for user inference.

    `auroc_ceiling`: from its user-level (ε, δ) (any (ε, δ)-DP mechanism); `auroc_ceiling_pld`: from
    the whole δ(ε) profile of the mechanism it certifies (tighter; None when not computable). Both
    are upper bounds on what any test can reach; neither is claimed for a record-level certificate.
    """
    if not certificate or certificate.get("privacy_unit") != "user":
        return {"auroc_ceiling": 1.0, "auroc_ceiling_pld": None}
    out = {"auroc_ceiling": auroc_ceiling(float(certificate["epsilon"]), float(certificate["delta"])),
           "auroc_ceiling_pld": None}

    try:
        pld = certificate_pld(certificate)
    except (KeyError, TypeError, ValueError, VeilError):
        pld = None
    if pld is not None:
        out["auroc_ceiling_pld"] = min(out["auroc_ceiling"], auroc_ceiling_from_pld(pld))
    elif "steps" in certificate and int(certificate["steps"]) == 0:
        out["auroc_ceiling_pld"] = 0.5  # nothing was released that depends on the data
    return out
