"""Mechanisms as dp_accounting DpEvents, and DpEvents as JSON.

One step of each mechanism, composed `steps` times (add/remove neighbouring, noise multiplier σ in
units of the clip norm):

  record, uls   PoissonSampled(q, Gaussian(σ))   — one record / one user (per-user clipped mean) per unit
  els,          MixtureOfGaussians(σ, sensitivities 0..k, Binomial(k, q))  — Charles et al. Thm 1;
  group-tight     a user's ≤ k records are each Poisson-sampled at rate q, so Bin(k, q) of them land
  group-naive   the record-level event; the group conversion (kε₀, δ₀(e^{kε₀}−1)/(e^{ε₀}−1)) is applied
                  to its (ε₀, δ₀) curve afterwards (no DpEvent expresses it)
"""
from __future__ import annotations

import math
from typing import Any

import dp_accounting
from dp_accounting import dp_event as _de
from scipy import stats

from components.core.errors import VeilError

MECHANISMS = ("record", "uls", "els", "group-naive", "group-tight")
MIXTURE_MECHANISMS = ("els", "group-tight")
# Models whose composed PLD is the whole privacy loss of one unit (group-naive's is a record's: its
# group conversion happens on (ε, δ), so it cannot be composed with others as a PLD).
PLD_MODELS = ("record", "uls", "els", "group-tight")


def validate(mechanism: str, *, sampling_rate: float | None = None, noise_multiplier: float | None = None,
             steps: int | None = None, delta: float | None = None, k: int | None = None,
             epsilon: float | None = None) -> None:
    """Raise VeilError naming the first bad parameter (one line)."""
    if mechanism not in MECHANISMS:
        raise VeilError(f"mechanism: unknown {mechanism!r}; choose one of {', '.join(MECHANISMS)}"
                        + (" (secrets are accounted by components.accounting.secrets)" if mechanism == "secret" else ""))

    def _num(name: str, v: Any) -> float:
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise VeilError(f"{name}: {v!r} is not a number") from None
        if math.isnan(f):
            raise VeilError(f"{name}: NaN is not allowed")
        return f

    if sampling_rate is not None:
        q = _num("sampling_rate", sampling_rate)
        if not 0.0 < q <= 1.0:
            raise VeilError(f"sampling_rate: {sampling_rate} must be in (0, 1]")
    if noise_multiplier is not None:
        s = _num("noise_multiplier", noise_multiplier)
        if not (s > 0.0 and math.isfinite(s)):
            raise VeilError(f"noise_multiplier: {noise_multiplier} must be a finite number > 0")
    if delta is not None:
        d = _num("delta", delta)
        if not 0.0 < d < 1.0:
            raise VeilError(f"delta: {delta} must be in (0, 1)")
    if epsilon is not None:
        e = _num("epsilon", epsilon)
        if not (e > 0.0 and math.isfinite(e)):
            raise VeilError(f"epsilon: {epsilon} must be a finite number > 0")
    for name, v in (("steps", steps), ("k", k)):
        if v is None:
            continue
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise VeilError(f"{name}: {v!r} must be an integer ≥ 1")
        if int(v) < 1:
            raise VeilError(f"{name}: {v} must be an integer ≥ 1")
    if k is not None and int(k) > 1 and mechanism in ("record", "uls"):
        raise VeilError(f"k: {mechanism} counts one record/user per unit, k must be 1 (got {k}); "
                        "use els, group-tight or group-naive for k > 1")


def binomial_sensitivities(k: int, q: float) -> tuple[list[int], list[float]]:
    """Sensitivities 0..k with Binomial(k, q) weights (atoms of probability 0 dropped)."""
    sens = list(range(k + 1))
    probs = [float(p) for p in stats.binom.pmf(sens, k, q)]
    keep = [(c, p) for c, p in zip(sens, probs) if p > 0.0]
    if not any(c > 0 for c, _ in keep):
        raise VeilError(f"sampling_rate: {q} is so small that every Binomial({k}, q) atom above 0 underflows")
    total = sum(p for _, p in keep)
    return [c for c, _ in keep], [p / total for _, p in keep]


def step_event(mechanism: str, *, sampling_rate: float, noise_multiplier: float, k: int = 1) -> _de.DpEvent:
    q, s = float(sampling_rate), float(noise_multiplier)
    if mechanism in MIXTURE_MECHANISMS:
        sens, probs = binomial_sensitivities(int(k), q)
        return _de.MixtureOfGaussiansDpEvent(s, sens, probs)
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s))


def dp_event(mechanism: str, *, sampling_rate: float, noise_multiplier: float, steps: int,
             k: int = 1) -> _de.DpEvent:
    """The composed DpEvent that `epsilon` accounts (for group-naive: the record-level event)."""
    validate(mechanism, sampling_rate=sampling_rate, noise_multiplier=noise_multiplier, steps=steps, k=k)
    return dp_accounting.SelfComposedDpEvent(
        step_event(mechanism, sampling_rate=sampling_rate, noise_multiplier=noise_multiplier, k=k), int(steps))


def event_to_dict(event: Any) -> dict:
    """A DpEvent as a JSON-able dict: {"name": <class>, <fields>...}, nested events likewise."""
    nt = event.to_named_tuple() if hasattr(event, "to_named_tuple") else event
    return _nt_to_dict(nt)


def _nt_to_dict(value: Any) -> Any:
    if hasattr(value, "_fields") and "class_name" in value._fields:
        out: dict[str, Any] = {"name": value.class_name}
        for f in value._fields:
            if f not in ("module_name", "class_name"):
                out[f] = _nt_to_dict(getattr(value, f))
        return out
    if isinstance(value, (list, tuple)):
        return [_nt_to_dict(v) for v in value]
    if isinstance(value, float) or isinstance(value, int):
        return value
    if hasattr(value, "item"):  # numpy scalar
        return value.item()
    return value


def event_from_dict(d: dict) -> _de.DpEvent:
    """Inverse of event_to_dict for the events Veil writes (round-trip for certificates)."""
    name = d["name"]
    cls = getattr(_de, name, None)
    if cls is None:
        raise VeilError(f"dp_event: unknown event {name!r}")
    kwargs = {}
    for key, v in d.items():
        if key == "name":
            continue
        if isinstance(v, dict) and "name" in v:
            v = event_from_dict(v)
        elif isinstance(v, list) and v and isinstance(v[0], dict) and "name" in v[0]:
            v = [event_from_dict(x) for x in v]
        kwargs[key] = v
    return cls(**kwargs)
