"""Machine-independent numbers for everything that enters a plan's identity (and a certificate).

Why: σ comes out of a bisection over ε values that dp-accounting computes with numpy FFTs and
exp/log, whose SIMD code paths (and glibc's FMA variants of exp/log/pow) differ from one CPU to the
next in the last bits: the same snapshot and policy gave σ = 1.4612873274278622 on one machine and
1.4612873274295506 on another, so the plan's sha256 — its identity in the run folder and the ledger
— depended on the machine. A killed retraining resumed elsewhere would re-plan under a new identity.

The rule (docs/privacy/plan-identity.md):
  * σ (any noise multiplier a calibration returns) is rounded UP to SIGMA_DIGITS significant
    digits. Rounding up only adds noise, so every guarantee computed at the rounded σ holds;
  * ε, and for secret plans KL and γ, are then recomputed at the rounded σ and rounded UP to
    EPSILON_DIGITS significant digits: the published figure is never below what the accountant
    computes (pessimistic);
  * other numbers that come out of floating-point library code and are only described in a plan
    (a DP estimate N̂, Binomial weights of a mixture event, the filter's derived constants) are
    rounded to the nearest DESCRIBED_DIGITS significant digits.

A last-bit difference then changes a published number only when the exact value lies within that
difference of a rounding boundary: with the relative differences seen between CPUs (≤ 1e-10 for ε,
≤ 2e-11 for σ) and 6 digits, about one plan in 10⁴ to 10⁵; a plan is never made less private by it.

All rounding is exact decimal arithmetic on the float's exact binary value (`Decimal(float)`), and
the result is checked against the input (`math.nextafter` when converting back to a float lands
below it), so the rounding itself cannot misround in the unsafe direction.
"""
from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal

from components.core.errors import VeilError

SIGMA_DIGITS = 6       # σ: ≤ 1e-5 relative extra noise, far inside the calibration's 1e-3 tolerance
EPSILON_DIGITS = 6     # ε, KL, γ: rounded up; ≤ 1e-5 relative above the accountant's value
DESCRIBED_DIGITS = 10  # descriptive numbers (N̂, mixture weights, filter constants): nearest

RULE = (f"σ rounded up to {SIGMA_DIGITS} significant digits; ε (KL, γ) recomputed at that σ and rounded up to "
        f"{EPSILON_DIGITS}; other library-computed numbers rounded to {DESCRIBED_DIGITS}")


def _round(x: float | Decimal, digits: int, rounding: str) -> Decimal:
    exact = x if isinstance(x, Decimal) else Decimal(float(x))
    if exact.is_zero():
        return exact
    # `Context.plus` rounds to `prec` significant digits with the given rounding, exactly.
    return Context(prec=int(digits), rounding=rounding).plus(exact)


def _checked(x: float | Decimal, digits: int, what: str) -> None:
    value = float(x)
    if not math.isfinite(value):
        raise VeilError(f"{what}: {value} is not a finite number; nothing to round")
    if not 1 <= int(digits) <= 17:
        raise VeilError(f"{what}: {digits} significant digits is outside 1..17")


def ceil_sig(x: float | Decimal, digits: int, *, what: str = "number") -> float:
    """The smallest float ≥ x that is the float of a decimal with at most `digits` significant digits
    (up to the one float step a decimal may need): never below x, whatever the binary ↔ decimal
    conversions do. Idempotent: a float that already is such a decimal's (1.46129, whose double is a
    hair above 1.46129) is returned as it is, not moved up a digit."""
    _checked(x, digits, what)
    exact = x if isinstance(x, Decimal) else Decimal(float(x))
    if not isinstance(x, Decimal) and float(_round(exact, digits, ROUND_FLOOR)) == float(x):
        return float(x)
    out = float(_round(exact, digits, ROUND_CEILING))
    # float(Decimal) rounds to nearest: for a decimal that is not a float it may land one step below
    # the decimal, and so possibly below x itself. Step up until it is not.
    while Decimal(out) < exact:
        out = math.nextafter(out, math.inf)
    return out


def round_sig(x: float, digits: int = DESCRIBED_DIGITS, *, what: str = "number") -> float:
    """x to the nearest `digits` significant digits (for numbers whose direction does not matter)."""
    _checked(x, digits, what)
    return float(_round(float(x), digits, ROUND_HALF_EVEN))


def sigma_up(sigma: float) -> float:
    """A calibrated noise multiplier as it is published and trained with (rounded up: more noise)."""
    return ceil_sig(sigma, SIGMA_DIGITS, what="noise_multiplier")


def epsilon_up(eps: float) -> float:
    """A privacy loss (ε, KL, γ) as published: rounded up. ∞ stays ∞ (no finite ε)."""
    if math.isinf(eps) and eps > 0:
        return eps
    return ceil_sig(eps, EPSILON_DIGITS, what="epsilon")


def sum_up(*parts: float) -> float:
    """The sum of published figures (ε_N + ε_DP-SGD), as the smallest float ≥ the exact sum: the
    float sum of two floats is deterministic (IEEE), but may round below the exact sum by half a step."""
    exact = sum((Decimal(float(p)) for p in parts), Decimal(0))
    out = math.fsum(float(p) for p in parts)
    while Decimal(out) < exact:
        out = math.nextafter(out, math.inf)
    return out


def described(obj, digits: int = DESCRIBED_DIGITS):
    """Every float inside a JSON-like value rounded to `digits` significant digits (ints, strings kept)."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return round_sig(obj, digits) if math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {k: described(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [described(v, digits) for v in obj]
    return obj


def described_event(event):
    """A DpEvent's description with a mixture's Binomial weights (scipy's pmf, libm inside) rounded to
    DESCRIBED_DIGITS: the accountant recomputes them from q and k, the plan only describes them.
    σ and q are left as they are (already canonical; a verifier compares them with the plan's)."""
    if isinstance(event, dict):
        return {k: (described(v) if k == "sampling_probs" else described_event(v)) for k, v in event.items()}
    if isinstance(event, list):
        return [described_event(v) for v in event]
    return event
