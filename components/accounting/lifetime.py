"""A privacy unit's lifetime spend: every release trained on the same people, composed.

Releases whose certificate carries a PLD-accountable mechanism (record, uls, els, group-tight, all
add/remove neighbouring) are composed tightly: their privacy-loss distributions are convolved and ε
is read at the δ left over. Releases certified some other way (group-naive, filtered ULS) enter by
basic composition of their (ε, δ): ε adds up, δ comes off the budget first. Both are upper bounds.

One caveat, reported as `mixed_neighbouring`: a filtered-ULS certificate is stated for replace-one-user
neighbouring (N public), the others for add/remove. Its (ε, δ) is added as it stands; the two
relations are not interchangeable in general, so such a total is an estimate, not a proof.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from components.accounting import events as ev
from components.core.errors import VeilError
from components.accounting.accountant import FLOAT_ALLOWANCE, _composed

LIFETIME_DISCRETIZATION = 1e-4


@dataclass(frozen=True)
class Release:
    """One release: either a PLD-accountable run or a fixed (ε, δ) guarantee."""

    label: str
    mechanism: str | None = None
    sampling_rate: float | None = None
    noise_multiplier: float | None = None
    steps: int = 0
    k: int = 1
    epsilon: float | None = None
    delta: float | None = None
    neighbouring: str = "add_remove_user"

    @property
    def composable(self) -> bool:
        return self.mechanism in ev.PLD_MODELS


@dataclass(frozen=True)
class LifetimeSpend:
    epsilon: float              # total ε at `delta` (math.inf if the fixed parts use up δ)
    delta: float
    releases: int
    composed_tightly: int       # releases in the PLD convolution
    composed_basic: int         # releases added by basic composition
    mixed_neighbouring: bool = False  # releases under different neighbouring relations were added up

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def lifetime_epsilon(releases: list[Release], delta: float) -> LifetimeSpend:
    if not 0 < delta < 1:
        raise VeilError(f"lifetime budget: delta must be in (0, 1), got {delta}")
    pld = None
    fixed_eps, fixed_delta, n_tight = 0.0, 0.0, 0
    for r in releases:
        if r.composable:
            if r.steps <= 0:
                continue
            ev.validate(r.mechanism, sampling_rate=r.sampling_rate, noise_multiplier=r.noise_multiplier,
                        steps=r.steps, k=r.k)
            part = _composed(r.mechanism, float(r.sampling_rate), float(r.noise_multiplier), int(r.steps),
                             int(r.k), LIFETIME_DISCRETIZATION)
            pld = part if pld is None else pld.compose(part)
            n_tight += 1
        else:
            if r.epsilon is None or r.delta is None:
                raise VeilError(f"lifetime budget: release {r.label} has neither a mechanism nor an (ε, δ)")
            fixed_eps += float(r.epsilon)
            fixed_delta += float(r.delta)
    left = delta - fixed_delta
    if left <= 0:
        eps = math.inf
    elif pld is None:
        eps = fixed_eps
    else:
        e = float(pld.get_epsilon_for_delta(left))
        eps = fixed_eps + (e * (1.0 + FLOAT_ALLOWANCE) if math.isfinite(e) else math.inf)
    return LifetimeSpend(epsilon=eps, delta=delta, releases=len(releases), composed_tightly=n_tight,
                         composed_basic=len(releases) - n_tight,
                         mixed_neighbouring=len({r.neighbouring for r in releases}) > 1)
