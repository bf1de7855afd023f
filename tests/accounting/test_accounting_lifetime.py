"""Lifetime composition: tight (PLD) parts against dp-accounting, fixed (ε, δ) parts by basic
composition, and the flag for releases under different neighbouring relations."""
import math

import dp_accounting
import pytest

from components.accounting.lifetime import Release, lifetime_epsilon
from components.core.errors import VeilError

ULS = Release(label="uls", mechanism="uls", sampling_rate=0.05, noise_multiplier=1.1, steps=40)


def test_tight_part_matches_dp_accounting_and_fixed_parts_add():
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    step = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1))
    acc.compose(dp_accounting.SelfComposedDpEvent(step, 40), 3)
    tight = lifetime_epsilon([ULS] * 3, 1e-5)
    assert acc.get_epsilon(1e-5) <= tight.epsilon <= acc.get_epsilon(1e-5) * 1.01
    assert not tight.mixed_neighbouring and tight.composed_tightly == 3

    fixed = Release(label="f", epsilon=2.0, delta=4e-6, neighbouring="replace_one_user")
    both = lifetime_epsilon([ULS] * 3 + [fixed], 1e-5)
    acc2 = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc2.compose(dp_accounting.SelfComposedDpEvent(step, 40), 3)
    want = acc2.get_epsilon(1e-5 - 4e-6) + 2.0      # δ of the fixed part comes off first
    assert want <= both.epsilon <= want * 1.01
    assert both.mixed_neighbouring and both.composed_basic == 1


def test_fixed_parts_that_use_up_delta_give_infinity_and_bad_releases_are_refused():
    big = Release(label="b", epsilon=1.0, delta=2e-5)
    assert math.isinf(lifetime_epsilon([ULS, big], 1e-5).epsilon)
    with pytest.raises(VeilError, match="neither a mechanism nor"):
        lifetime_epsilon([Release(label="x")], 1e-5)
