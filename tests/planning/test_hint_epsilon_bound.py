"""The utility hints price ε by an RDP bound (components/planning/forecast.py:_eps) for speed; a hint is
only sufficient if that bound is never below the PLD accountant's ε for the same event."""
import pytest

from components.accounting import epsilon
from components.planning.forecast import _eps


@pytest.mark.parametrize("mech,q,sigma,steps,k", [
    ("uls", 0.05, 1.0, 50, 1), ("uls", 0.3, 0.6, 20, 1), ("record", 0.01, 0.8, 100, 1),
    ("els", 0.05, 1.2, 30, 3), ("group-tight", 0.02, 1.5, 40, 2)])
def test_hint_epsilon_is_never_below_the_pld_epsilon(mech, q, sigma, steps, k):
    pld = epsilon(mech, sampling_rate=q, noise_multiplier=sigma, steps=steps, delta=1e-5, k=k).epsilon
    bound = _eps(mech, q=q, sigma=sigma, steps=steps, delta=1e-5, k=k)
    assert pld <= bound <= 3.0 * pld + 1.0, (pld, bound)
