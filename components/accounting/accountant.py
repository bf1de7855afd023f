"""ε for a mechanism, σ for a target: dp_accounting's pessimistic PLD, made fast.

How the number is computed:
  * one step's PLD is built by pessimistic Connect-the-Dots on a grid of losses spaced Δ
    (record/uls: dp_accounting's `from_gaussian_mechanism`; els/group-tight: `mixture_pld`, the
    construction of dp_accounting's mixture PLD, vectorised), then dp_accounting self-composes it and
    reads ε(δ). Connect-the-Dots is pessimistic on any grid, so every value reported is a valid upper
    bound on the true ε whatever Δ was used — the grid only decides how tight;
  * grids are nested (Δ = 2^j · 1e-4), and Connect-the-Dots on a subset of points dominates the finer
    one, so ε only falls as Δ shrinks toward the reference Δ = 1e-4: we are never below dp-accounting's
    reference (pessimistic, Δ = 1e-4) on the same event;
  * we start at Δ = 6.4e-3 and halve Δ until two successive grids agree within 0.25 % (the finer one is
    then within 0.25 % of the Δ → 0 limit if the error shrinks at least linearly in Δ; it shrinks
    about quadratically), stopping at the reference Δ = 1e-4 at the latest;
  * a relative 1e-7 allowance is added for floating-point differences from dp_accounting's own code
    path (a different but equally exact root finding).
"""
from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import version as _pkg_version
from pathlib import Path
from typing import Callable

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from components.accounting import events as ev
from components.accounting.mixture_pld import mixture_pld
from components.core.canonical import epsilon_up, sigma_up
from components.core.errors import VeilError
from components.core.hashing import sha256_json

REFERENCE_DISCRETIZATION = 1e-4
# Nested grids, coarsest first: each is a subset of the next (powers of two times the reference).
DISCRETIZATIONS = tuple(REFERENCE_DISCRETIZATION * 2 ** j for j in range(6, -1, -1))
AGREEMENT = 2.5e-3          # two successive grids this close: accept the finer
FLOAT_ALLOWANCE = 1e-7      # relative, added to every reported ε
# bump when the numerics change (invalidates the calibration cache). veil-pld-2: σ and ε of a
# calibration are published machine-independently (components.core.canonical).
ACCOUNTANT_VERSION = "veil-pld-2"

try:
    LIBRARY_VERSION = _pkg_version("dp-accounting")
except Exception:  # pragma: no cover - dp-accounting is a hard dependency
    LIBRARY_VERSION = "unknown"

NEIGHBOURING = {
    "record": "add_remove_record",
    "uls": "add_remove_user",
    "els": "add_remove_user",
    "group-tight": "add_remove_user",
    "group-naive": "add_remove_user",
}


def _jsonable_eps(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class EpsilonResult:
    epsilon: float                 # math.inf when no finite ε reaches δ (to_dict writes null)
    delta: float
    mechanism: str
    dp_event: dict
    seconds: float
    sampling_rate: float
    noise_multiplier: float
    steps: int
    k: int
    accountant: str = "pld"
    library_version: str = LIBRARY_VERSION
    pessimistic: bool = True
    discretization: float = REFERENCE_DISCRETIZATION
    neighbouring: str = "add_remove_user"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["epsilon"] = _jsonable_eps(self.epsilon)
        d["notes"] = list(self.notes)
        d["reference_discretization"] = REFERENCE_DISCRETIZATION
        d["accountant_version"] = ACCOUNTANT_VERSION
        return d


@dataclass(frozen=True)
class Calibration:
    noise_multiplier: float
    epsilon: float                 # achieved, as `epsilon(...)` reports it at this σ (≤ target)
    delta: float
    seconds: float
    dp_event: dict
    mechanism: str
    target_epsilon: float
    sampling_rate: float
    steps: int
    k: int
    discretization: float
    tolerance: float
    accountant: str = "pld"
    library_version: str = LIBRARY_VERSION
    pessimistic: bool = True
    neighbouring: str = "add_remove_user"
    cached: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accountant_version"] = ACCOUNTANT_VERSION
        return d


# --- one composed evaluation at a fixed grid -----------------------------------------------------

def _single_step_pld(mechanism: str, q: float, sigma: float, k: int, disc: float):
    if mechanism in ev.MIXTURE_MECHANISMS:
        sens, probs = ev.binomial_sensitivities(k, q)
        return mixture_pld(sigma, sens, probs, discretization=disc)
    return pld_lib.from_gaussian_mechanism(sigma, sensitivity=1.0, sampling_prob=q,
                                           value_discretization_interval=disc,
                                           pessimistic_estimate=True, use_connect_dots=True)


def _composed(mechanism: str, q: float, sigma: float, steps: int, k: int, disc: float):
    base = "record" if mechanism == "group-naive" else mechanism
    return _single_step_pld(base, q, sigma, k, disc).self_compose(steps)


def composed_pld(model: str, q: float, sigma: float, steps: int, k: int = 1, discretization: float = 1e-3):
    """The pessimistic PLD of `steps` steps of accounting model `model` (one of events.PLD_MODELS)."""
    if model not in ev.PLD_MODELS:
        raise VeilError(f"accounting: {model!r} has no composable PLD; models: {', '.join(ev.PLD_MODELS)}")
    ev.validate(model, sampling_rate=q, noise_multiplier=sigma, steps=steps, k=k)
    return _composed(model, float(q), float(sigma), int(steps), int(k), float(discretization))


# The composed PLD's δ(ε) is exact to about this much (FFT round-off: values of −5e-14 show up where
# the truth is ~1e-20). The naive conversion multiplies δ₀ by up to e^{(k−1)ε₀}, so δ₀ is never taken
# below this floor (nor below the PLD's own mass at +∞).
NAIVE_DELTA_FLOOR = 1e-13


class _DeltaCurve:
    """δ(ε) of a composed PLD (max over both directions) for many ε at once, O(log n) each.

    For a dense PMF with losses L_i, δ(ε) = m_∞ + Σ_{L_i > ε} p_i (1 − e^{ε − L_i}); suffix sums of p_i
    and (in log space) of p_i e^{−L_i} make every evaluation a lookup. Same formula as dp_accounting's.
    """

    def __init__(self, pld):
        self._parts = []
        for pmf in (pld._pmf_remove, pld._pmf_add):  # noqa: SLF001 - dp-accounting 0.6.0 internals, pinned
            dense = pmf.to_dense_pmf()
            probs = np.asarray(dense._probs, dtype=float)  # noqa: SLF001
            losses = (np.arange(len(probs)) + dense._lower_loss) * dense._discretization  # noqa: SLF001
            pos = np.maximum(probs, 0.0)
            s1 = np.concatenate([np.cumsum(pos[::-1])[::-1], [0.0]])
            with np.errstate(divide="ignore"):
                terms = np.log(pos) - losses
            log_s2 = np.concatenate([np.logaddexp.accumulate(terms[::-1])[::-1], [-np.inf]])
            self._parts.append((losses, s1, log_s2, float(dense._infinity_mass)))  # noqa: SLF001

    def __call__(self, eps) -> np.ndarray:
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        out = np.zeros_like(eps)
        for losses, s1, log_s2, inf in self._parts:
            j = np.searchsorted(losses, eps, side="right")  # first loss > ε
            d = inf + s1[j] - np.exp(np.minimum(eps + log_s2[j], 700.0))
            out = np.maximum(out, d)
        return out


# The composed PLD's δ(ε) is exact to about this much (FFT round-off: values of −5e-14 show up where
# the truth is ~1e-20). The naive conversion multiplies δ₀ by up to e^{(k−1)ε₀}, so δ₀ is never taken
# below this floor (nor below the PLD's own mass at +∞).
NAIVE_DELTA_FLOOR = 1e-13


def _naive_group_epsilon(pld, k: int, delta: float) -> float:
    """Smallest kε₀ with δ₀(ε₀)·(e^{kε₀}−1)/(e^{ε₀}−1) ≤ δ (the classic group conversion, Vadhan 2017)."""
    if k == 1:
        return float(pld.get_epsilon_for_delta(delta))
    curve = _DeltaCurve(pld)
    floor = max(NAIVE_DELTA_FLOOR, pld._pmf_remove._infinity_mass, pld._pmf_add._infinity_mass)  # noqa: SLF001

    def log_factor(e0) -> np.ndarray:
        e0 = np.maximum(np.asarray(e0, dtype=float), 1e-300)
        # log((e^{kε}−1)/(e^ε−1)), stable for small and large ε
        return np.log(-np.expm1(-k * e0)) + k * e0 - np.log(-np.expm1(-e0)) - e0

    def feasible(e0) -> np.ndarray:
        e0 = np.atleast_1d(np.asarray(e0, dtype=float))
        d0 = np.maximum(curve(e0), floor)
        return np.log(d0) + log_factor(e0) <= math.log(delta)

    if math.log(floor) + math.log(k) > math.log(delta):
        return math.inf
    # Beyond e_max even the floor times the factor exceeds δ.
    e_max, step = 0.0, 1.0
    while float(log_factor(e_max + step)[()]) + math.log(floor) <= math.log(delta):
        e_max += step
    for _ in range(60):
        step /= 2
        if float(log_factor(e_max + step)[()]) + math.log(floor) <= math.log(delta):
            e_max += step
    grid = np.linspace(0.0, e_max, 20001)
    ok = feasible(grid)
    if not ok.any():
        return math.inf
    i = int(np.argmax(ok))
    if i == 0:
        return 0.0
    lo, hi = float(grid[i - 1]), float(grid[i])  # infeasible, feasible
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if feasible(mid)[0]:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return k * hi


def _epsilon_at(mechanism: str, q: float, sigma: float, steps: int, delta: float, k: int, disc: float) -> float:
    pld = _composed(mechanism, q, sigma, steps, k, disc)
    if mechanism == "group-naive":
        e = _naive_group_epsilon(pld, k, delta)
    else:
        e = float(pld.get_epsilon_for_delta(delta))
    return e * (1.0 + FLOAT_ALLOWANCE) if math.isfinite(e) else math.inf


def _adaptive_epsilon(mechanism, q, sigma, steps, delta, k) -> tuple[float, float]:
    """(ε, Δ): refine nested grids until two successive values agree within AGREEMENT."""
    prev = _epsilon_at(mechanism, q, sigma, steps, delta, k, DISCRETIZATIONS[0])
    for disc in DISCRETIZATIONS[1:]:
        cur = _epsilon_at(mechanism, q, sigma, steps, delta, k, disc)
        if disc == REFERENCE_DISCRETIZATION:
            return cur, disc
        if math.isfinite(cur) and math.isfinite(prev) and cur <= prev * (1 + 1e-9) + 1e-12 \
                and prev - cur <= AGREEMENT * cur:
            return cur, disc
        prev = cur
    raise AssertionError("unreachable: the last grid is the reference grid")


# --- public API ----------------------------------------------------------------------------------

def epsilon(mechanism: str, *, sampling_rate: float, noise_multiplier: float, steps: int, delta: float,
            k: int = 1) -> EpsilonResult:
    """ε at δ after `steps` steps of `mechanism` (add/remove neighbouring, pessimistic PLD)."""
    ev.validate(mechanism, sampling_rate=sampling_rate, noise_multiplier=noise_multiplier, steps=steps,
                delta=delta, k=k)
    t0 = time.perf_counter()
    q, s, T, d, k = float(sampling_rate), float(noise_multiplier), int(steps), float(delta), int(k)
    eps, disc = _adaptive_epsilon(mechanism, q, s, T, d, k)
    event = ev.event_to_dict(ev.dp_event(mechanism, sampling_rate=q, noise_multiplier=s, steps=T, k=k))
    notes = []
    if mechanism == "group-naive":
        event = {"name": "GroupPrivacyConversion", "group_size": k,
                 "rule": "(k·ε0, δ0·(exp(k·ε0)−1)/(exp(ε0)−1)) from record-level (ε0, δ0)", "event": event}
        notes.append("classic group-privacy conversion of the record-level bound; loose, for comparison")
    if not math.isfinite(eps):
        notes.append("no finite ε reaches this δ (δ is below the accountant's pessimistic floor)")
    return EpsilonResult(epsilon=eps, delta=d, mechanism=mechanism, dp_event=event,
                         seconds=time.perf_counter() - t0, sampling_rate=q, noise_multiplier=s, steps=T, k=k,
                         discretization=disc, neighbouring=NEIGHBOURING[mechanism], notes=tuple(notes))


def calibration_key(mechanism: str, *, epsilon: float, delta: float, sampling_rate: float, steps: int,
                    k: int, tolerance: float) -> str:
    return sha256_json({"mechanism": mechanism, "epsilon": float(epsilon), "delta": float(delta),
                        "sampling_rate": float(sampling_rate), "steps": int(steps), "k": int(k),
                        "tolerance": float(tolerance), "library": LIBRARY_VERSION,
                        "accountant": ACCOUNTANT_VERSION})


def bisect_sigma(f: Callable[[float], float], target: float, *, tol: float, sigma0: float = 1.0,
                 sigma_max: float = 1e4, sigma_min: float = 1e-3, what: str = "target") -> tuple[float, float]:
    """(σ_lo, σ_hi) with f(σ_hi) ≤ target < f(σ_lo) and σ_hi/σ_lo ≤ 1 + tol; f non-increasing in σ.

    Brackets by doubling/halving, then closes the bracket by regula falsi (Illinois) on log ε vs log σ,
    which is nearly linear, falling back to halving the log-bracket when a value is infinite.
    σ_lo is 0 when even σ_min meets the target.
    """
    hi = sigma0
    f_hi = f(hi)
    while f_hi > target:
        hi *= 2.0
        if hi > sigma_max:
            raise VeilError(f"{what}: not reachable with noise_multiplier ≤ {sigma_max:g}")
        f_hi = f(hi)
    lo = hi / 2.0
    f_lo = f(lo)
    while f_lo <= target:
        hi, f_hi, lo = lo, f_lo, lo / 2.0
        if lo < sigma_min:
            return 0.0, hi
        f_lo = f(lo)
    log_t = math.log(target)

    def g(v: float) -> float:
        return math.log(v) - log_t if v > 0 else -math.inf

    g_lo, g_hi, side = g(f_lo), g(f_hi), 0
    while hi / lo - 1.0 > tol:
        a, b = math.log(lo), math.log(hi)
        if math.isfinite(g_lo) and math.isfinite(g_hi) and g_lo != g_hi:
            x = b - g_hi * (b - a) / (g_hi - g_lo)
            x = min(max(x, a + 0.02 * (b - a)), b - 0.02 * (b - a))
        else:
            x = 0.5 * (a + b)
        mid = math.exp(x)
        v = f(mid)
        if v <= target:
            hi, g_hi = mid, g(v)
            if side == 1:
                g_lo /= 2.0   # Illinois: the stale end keeps half its weight
            side = 1
        else:
            lo, g_lo = mid, g(v)
            if side == -1:
                g_hi /= 2.0
            side = -1
    return lo, hi


def calibrate(mechanism: str, *, epsilon: float, delta: float, sampling_rate: float, steps: int, k: int = 1,
              cache_dir: Path | str | None = None, tolerance: float = 1e-3) -> Calibration:
    """Smallest σ (within relative `tolerance`, rounded up to canonical.SIGMA_DIGITS significant
    digits) with epsilon(σ) ≤ target ε.

    The returned `epsilon` is what `epsilon(...)` reports at that σ, rounded up to
    canonical.EPSILON_DIGITS significant digits: never below what a certificate recomputes.
    """
    ev.validate(mechanism, sampling_rate=sampling_rate, steps=steps, delta=delta, k=k, epsilon=epsilon)
    if not 0 < tolerance < 0.5:
        raise VeilError(f"tolerance: {tolerance} must be in (0, 0.5)")
    t0 = time.perf_counter()
    target, d, q, T, k = float(epsilon), float(delta), float(sampling_rate), int(steps), int(k)
    cache_path = None
    if cache_dir is not None:
        key = calibration_key(mechanism, epsilon=target, delta=d, sampling_rate=q, steps=T, k=k, tolerance=tolerance)
        cache_path = Path(cache_dir) / "calibrations" / f"{key}.json"
        if cache_path.is_file():
            try:
                data = json.loads(cache_path.read_text())
                data.pop("accountant_version", None)
                data.update(cached=True, seconds=time.perf_counter() - t0)
                return Calibration(**data)
            except (ValueError, TypeError):
                pass  # a corrupt cache entry is recomputed and overwritten

    what = f"epsilon={target:g} at delta={d:g}"
    coarse = DISCRETIZATIONS[0]
    f_coarse = functools.lru_cache(maxsize=None)(lambda s: _epsilon_at(mechanism, q, s, T, d, k, coarse))
    _, sigma = bisect_sigma(f_coarse, target, tol=tolerance, what=what)
    if sigma == 0.0:
        raise VeilError(f"{what}: met even with noise_multiplier < 1e-3; the target is too loose to calibrate")
    epsilon_result = _eval(mechanism, q, sigma, T, d, k)
    if epsilon_result.discretization < coarse:
        sigma = _refine_on_grid(mechanism, q, T, d, k, epsilon_result.discretization, target, sigma,
                                epsilon_result.epsilon, f_coarse, tolerance)
        epsilon_result = _eval(mechanism, q, sigma, T, d, k)
    # σ is published rounded up (more noise) and ε recomputed there and rounded up, so that a plan is
    # the same on every CPU (components.core.canonical); epsilon() may also settle on another grid at
    # the new σ. Step up until the published ε meets the target.
    if sigma_up(sigma) != sigma:
        sigma = sigma_up(sigma)
        epsilon_result = _eval(mechanism, q, sigma, T, d, k)
    for _ in range(20):
        if epsilon_up(epsilon_result.epsilon) <= target:
            break
        sigma = sigma_up(sigma * (1.0 + tolerance))
        epsilon_result = _eval(mechanism, q, sigma, T, d, k)
    else:
        raise VeilError(f"{what}: calibration did not converge")
    cal = Calibration(noise_multiplier=sigma, epsilon=epsilon_up(epsilon_result.epsilon), delta=d,
                      seconds=time.perf_counter() - t0, dp_event=epsilon_result.dp_event, mechanism=mechanism,
                      target_epsilon=target, sampling_rate=q, steps=T, k=k,
                      discretization=epsilon_result.discretization, tolerance=tolerance,
                      neighbouring=NEIGHBOURING[mechanism])
    if cache_path is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cal.to_dict(), sort_keys=True))
        tmp.replace(cache_path)
    return cal


def _refine_on_grid(mechanism, q, T, d, k, disc, target, sigma_ok, eps_ok, f_coarse, tol) -> float:
    """Smallest σ (to tol) with ε ≤ target on grid `disc`, given σ_ok that meets it there.

    The coarse curve minus its gap to the fine grid predicts where the fine curve crosses the target;
    the bracket around that guess is then closed on the fine grid.
    """
    f = functools.lru_cache(maxsize=None)(lambda s: _epsilon_at(mechanism, q, s, T, d, k, disc))
    f(sigma_ok)  # seed the cache (= eps_ok up to the grid epsilon() settled on)
    gap = max(0.0, f_coarse(sigma_ok) - eps_ok)
    _, guess = bisect_sigma(f_coarse, target + gap, tol=tol, sigma0=sigma_ok)
    guess = min(max(guess, 1e-3), sigma_ok)

    def f_bracketed(s: float) -> float:   # never above the σ known to work
        return f(min(s, sigma_ok))

    # start just above the guess so that the doubling step lands on σ_ok's side quickly
    _, hi = bisect_sigma(f_bracketed, target, tol=tol, sigma0=guess * (1 + 4 * tol))
    return min(hi, sigma_ok)


def _eval(mechanism, q, sigma, T, d, k) -> EpsilonResult:
    return epsilon(mechanism, sampling_rate=q, noise_multiplier=sigma, steps=T, delta=d, k=k)
