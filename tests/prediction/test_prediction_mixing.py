"""Algorithm 1 pieces against brute force: the mixture, the selection, the draw, the calibration."""
from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "privacy"))
from _pmixed_exact import lam_bruteforce, softmax  # noqa: E402

from components.core.errors import VeilError  # noqa: E402
from components.prediction import mechanism as mech  # noqa: E402
from components.prediction.mixing import log_softmax64, mixture_log, poisson_select, sample_token  # noqa: E402
from components.prediction import mixing  # noqa: E402


def test_mixture_matches_bruteforce_over_a_large_vocabulary():
    rng = np.random.default_rng(0)
    V = 5000
    z0 = rng.normal(0, 4, V)
    members = [z0 + rng.normal(0, 2, V) for _ in range(3)]
    lp0 = log_softmax64(z0)
    lps = [log_softmax64(z) for z in members]
    r = 0.4
    got, lams = mixture_log(lps, lp0, r)
    p0 = np.exp(lp0)
    want = np.zeros(V)
    for lp in lps:
        lam = lam_bruteforce(np.exp(lp), p0, r, iters=80)
        want += (lam * np.exp(lp) + (1 - lam) * p0) / len(lps)
    assert np.allclose(np.exp(got), want, rtol=1e-6, atol=0)
    assert abs(np.exp(got).sum() - 1) < 1e-12
    assert np.max(np.abs(got - lp0)) <= r


def test_empty_selection_is_the_public_model():
    lp0 = log_softmax64(np.array([1.0, 2.0, 3.0]))
    got, lams = mixture_log([], lp0, 0.5)
    assert np.array_equal(got, lp0) and lams == []


def test_temperature_is_a_per_model_transform_in_float64():
    z = np.array([0.0, 1000.0, -1000.0], dtype=np.float32)
    lp = log_softmax64(z, temperature=2.0)
    assert lp.dtype == np.float64 and np.isfinite(lp).all()
    assert math.isclose(lp[0] - lp[1], -500.0)
    with pytest.raises(VeilError):
        log_softmax64(z, temperature=0.0)


def test_poisson_selection_is_bernoulli_per_member():
    g = random.Random(1)
    counts = np.zeros(10)
    sizes = []
    for _ in range(4000):
        s = poisson_select(10, 0.25, g)
        assert len(set(s)) == len(s)  # never with replacement
        counts[s] += 1
        sizes.append(len(s))
    assert np.allclose(counts / 4000, 0.25, atol=0.03)
    assert abs(np.var(sizes) - 10 * 0.25 * 0.75) < 0.25  # binomial, as independent Bernoullis give


def test_sampler_follows_the_distribution():
    g = random.Random(3)
    lp = np.log(np.array([0.7, 0.2, 0.1, 0.0]) + 1e-300)
    draws = np.bincount([sample_token(lp, g) for _ in range(20000)], minlength=4) / 20000
    assert np.allclose(draws, [0.7, 0.2, 0.1, 0.0], atol=0.015)
    assert draws[3] == 0


def test_calibration_returns_the_feasible_end():
    r = mech.calibrate_radius(epsilon=8.0, delta=1e-5, tokens=1024, q=0.03)
    assert mech.budget_epsilon(0.03, r, 1024, 1e-5) <= 8.0
    assert mech.budget_epsilon(0.03, r * (1 + 1e-6) + 1e-9, 1024, 1e-5) > 8.0 - 1e-6
    # more tokens or more sampling → a smaller radius
    assert mech.calibrate_radius(epsilon=8.0, delta=1e-5, tokens=4096, q=0.03) < r
    assert mech.calibrate_radius(epsilon=8.0, delta=1e-5, tokens=1024, q=0.3) < r


def test_token_epsilon_closed_form():
    q, r = 0.2, 0.7
    hi = 1 - q + q * (1 + math.exp(2 * r)) / 2
    lo = 1 - q + q * math.exp(-r)
    assert math.isclose(mech.token_epsilon(q, r), math.log(hi / lo))
    assert mech.token_epsilon(q, 0.0) == 0.0
    with pytest.raises(VeilError):
        mech.token_epsilon(0.0, 0.1)


def test_prepaid_blocks_never_pass_the_budget(tmp_path):
    from components.prediction.budget import TokenBudget

    tb = TokenBudget(f"sqlite:///{tmp_path / 'l.db'}")
    tb.create("e", 10, "refuse")
    a, b = tb.prepaid("e", 4), tb.prepaid("e", 4)
    drawn = 0
    for _ in range(20):
        drawn += a()
        drawn += b()
    assert drawn == 10 and tb.spent("e") == 10 and tb.remaining("e") == 0
    assert tb.charge_upto("e", 5) == 0
    with pytest.raises(VeilError):
        tb.create("e", 11, "refuse")  # a budget never tops up
    tb.dispose()


def test_lambda_survives_extreme_ratios_and_radii():
    from components.prediction.mixing import in_ball, mix_log, solve_lambda

    lp0 = np.log(np.array([0.5, 0.5 - 1e-300, 1e-300]))
    lp = np.log(np.array([0.3, 0.3, 0.4]))          # a token 10^299 × likelier than under p0
    assert solve_lambda(lp, lp0, 1e6) == 1.0          # an unbounded radius admits the member as is
    lam = solve_lambda(lp, lp0, 0.5)
    assert 0 < lam < 1e-298 and in_ball(mix_log(lp, lp0, lam), lp0, 0.5)


def test_a_token_impossible_for_every_model_is_never_served():
    """Issue 22, case 7: a −inf logit (a token the public model and every member rule out) made the
    mixture NaN there, and the sampler then returned that impossible token (the last one) every time."""
    base = np.array([1.0, 2.0, 0.5, 0.3, 0.1, -np.inf])
    lp0 = mixing.log_softmax64(base)
    members = [mixing.log_softmax64(base + np.array([0.2, -0.1, 0.3, 0.5, -0.2, 0.0]) * (i + 1)) for i in range(3)]
    logp, _ = mixing.mixture_log(members, lp0, 0.5)
    assert not np.any(np.isnan(logp))
    assert np.isneginf(logp[-1]) and np.all(np.isfinite(logp[:-1]))
    assert math.isclose(float(np.exp(logp).sum()), 1.0, rel_tol=1e-12)
    rng = random.Random(5)
    draws = [mixing.sample_token(logp, rng) for _ in range(2000)]
    assert 5 not in draws and set(draws) == {0, 1, 2, 3, 4}
    # even a uniform at the very top of [0, 1) never lands on a trailing impossible token
    class Top:
        def random(self):
            return 1.0 - 2.0 ** -53
    assert mixing.sample_token(np.log(np.array([0.5, 0.5, 0.0])), Top()) == 1
    # a −inf the public model has but a member lacks: that member is mollified back to p₀ there
    lone = mixing.log_softmax64(np.array([1.0, 2.0, 0.5, 0.3, 0.1, 0.0]))
    logp, lams = mixing.mixture_log([lone], lp0, 0.5)
    assert lams == [0.0] and np.isneginf(logp[-1]) and not np.any(np.isnan(logp))


def test_nan_never_reaches_the_sampler():
    with pytest.raises(VeilError, match="NaN"):
        mixing.log_softmax64(np.array([0.0, np.nan, 1.0]))
    with pytest.raises(VeilError, match="NaN"):
        mixing.log_softmax64(np.array([0.0, np.inf, 1.0]))
    with pytest.raises(VeilError, match="every logit"):
        mixing.log_softmax64(np.array([-np.inf, -np.inf]))
    with pytest.raises(VeilError, match="NaN"):
        mixing.sample_token(np.array([-1.0, np.nan, -2.0]), random.Random(0))
    with pytest.raises(VeilError, match="no token"):
        mixing.sample_token(np.array([-np.inf, -np.inf]), random.Random(0))
