"""The one-run ε lower bound (Steinke, Nasr & Jagielski 2023) against independent computations."""
import math

import numpy as np
from scipy.stats import beta as beta_dist, binom

from components.audit.metrics import (balance_by_thinning, one_run_epsilon, one_run_epsilon_lower_bound,
                                      one_run_p_value)


def test_pure_dp_bound_is_the_clopper_pearson_logit():
    # δ = 0: the p-value is P[Binomial(r, q) >= v]; the bound is the ε whose q is the exact one-sided
    # Clopper–Pearson lower end, computed here from the Beta quantile instead of by bisection.
    for r, v, b in [(100, 80, 0.05), (1000, 600, 0.01), (40, 40, 0.05), (10, 9, 0.2)]:
        q = beta_dist.ppf(b, v, r - v + 1)
        want = math.log(q / (1 - q)) if q > 0.5 else 0.0
        assert abs(one_run_epsilon(r, r, v, 0.0, b) - want) < 1e-5
        assert abs(one_run_p_value(r, r, v, want, 0.0) - binom.sf(v - 1, r, q)) < 1e-9
    assert one_run_epsilon(100, 100, 50, 0.0, 0.05) == 0.0         # chance accuracy proves nothing


def test_delta_term_matches_its_definition_and_weakens_the_bound():
    m, r, v, eps, d = 500, 200, 150, 1.0, 1e-4
    q = 1 / (1 + math.exp(-eps))
    f = lambda x: binom.sf(x - 1, r, q)                              # noqa: E731
    want = f(v) + 2 * m * d * max((f(v - i) - f(v)) / i for i in range(1, v + 1))
    assert abs(one_run_p_value(m, r, v, eps, d) - min(1.0, want)) < 1e-12
    assert one_run_epsilon(m, r, v, 1e-4, 0.05) < one_run_epsilon(m, r, v, 1e-8, 0.05) <= \
        one_run_epsilon(m, r, v, 0.0, 0.05)


def _randomized_response(eps, m, rng):
    """ε-DP randomized response on each person's bit; the score is the released bit."""
    z = rng.random(m) < 0.5
    keep = rng.random(m) < math.exp(eps) / (1 + math.exp(eps))
    return np.where(keep, z, ~z).astype(float) + 1e-9 * rng.random(m), z


def test_monte_carlo_bound_is_valid_at_its_confidence_and_tight_with_many_people():
    eps = 2.0
    over, trials = 0, 60
    for seed in range(trials):
        s, z = _randomized_response(eps, 200, np.random.default_rng(seed))
        over += one_run_epsilon_lower_bound(s, z, 0.0, confidence=0.9)["epsilon_lower_bound"] > eps
    assert over <= 0.1 * trials + 3                                     # at most β of the runs overshoot (+3: binomial slack over 60 runs)
    s, z = _randomized_response(eps, 40_000, np.random.default_rng(7))
    got = one_run_epsilon_lower_bound(s, z, 0.0, confidence=0.95)
    assert 0.9 * eps < got["epsilon_lower_bound"] <= eps and got["guesses"] == 40_000


def test_thinning_gives_fair_independent_coins():
    rng = np.random.default_rng(1)
    y = rng.random(200_000) < 0.75                                  # held out with probability 0.25
    keep = balance_by_thinning(y, 0.75, rng.random(y.size))
    assert keep[~y].all() and abs(y[keep].mean() - 0.5) < 0.005
    y2 = rng.random(200_000) < 0.2
    keep2 = balance_by_thinning(y2, 0.2, rng.random(y2.size))
    assert keep2[y2].all() and abs(y2[keep2].mean() - 0.5) < 0.005


def test_audit_thins_the_held_out_split_and_leaves_canaries_out():
    import pyarrow as pa

    from components.audit.run import _one_run

    rng = np.random.default_rng(4)
    n = 3000
    member = rng.random(n) < 0.75                                   # held out with probability 0.25
    score = np.where(member, 1.0, -1.0) + rng.normal(0, 0.5, n)     # a strong attack
    scores = pa.table({"user_id": [f"u{i}" for i in range(n)], "member": member, "m": [2] * n, "score": score})
    canary = pa.array([i < 10 for i in range(n)])
    got = _one_run(scores, canary, {"audit": {"holdout_probability": 0.25}}, None, b"k" * 32, 8.0, 1e-6, 0)
    assert got["computed"] and 1000 < got["people"] < 2000 and 1.0 < got["epsilon_lower_bound"] <= 8.0
    assert not got["exceeds_certified"]
    assert not _one_run(scores, canary, {"audit": {"holdout_probability": 0.25, "attacker_record_rate": 0.1}},
                        None, b"k" * 32, 8.0, 1e-6, 0)["computed"]
