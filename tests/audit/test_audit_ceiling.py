"""The AUROC/TPR ceiling of (ε, δ)-DP, checked against integration, Monte-Carlo and tight mechanisms."""
import math

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from components.audit.ceiling import (auroc_ceiling, auroc_ceiling_from_pld, auroc_ceiling_from_profile,
                                      tpr_ceiling, tradeoff)
from components.audit.metrics import auroc
from components.core.errors import VeilError

CASES = [(0.0, 0.0), (0.0, 0.1), (0.5, 1e-6), (1.0, 1e-5), (2.0, 0.01), (4.0, 1e-6), (8.0, 1e-6)]


def test_closed_forms():
    assert auroc_ceiling(0.0, 0.0) == pytest.approx(0.5)
    # δ = 0: randomized response is tight, AUROC = e^ε / (1 + e^ε)
    assert auroc_ceiling(1.0, 0.0) == pytest.approx(math.e / (1 + math.e))
    assert auroc_ceiling(0.0, 1.0) == pytest.approx(1.0)
    assert auroc_ceiling(math.inf, 0.0) == 1.0
    # the seed's table (δ = 1e-6): 0.62, 0.73, 0.88, 0.98
    for eps, want in [(0.5, 0.62), (1, 0.73), (2, 0.88), (4, 0.98)]:
        assert auroc_ceiling(eps, 1e-6) == pytest.approx(want, abs=0.005)


@pytest.mark.parametrize("eps,delta", CASES)
def test_matches_numeric_integration(eps, delta):
    area, _ = integrate.quad(lambda a: 1.0 - tradeoff(a, eps, delta), 0, 1, points=[
        (1 - delta) / (1 + math.exp(eps)), 1 - delta], limit=200)
    assert auroc_ceiling(eps, delta) == pytest.approx(area, abs=1e-9)


@pytest.mark.parametrize("eps,delta", [(0.5, 0.05), (1.0, 1e-3), (3.0, 0.02)])
def test_monte_carlo_privacy_region_area(eps, delta):
    # AUROC ceiling = area of the privacy region {(FPR, TPR): TPR <= 1 - f(FPR)}
    rng = np.random.default_rng(1)
    pts = rng.random((400_000, 2))
    inside = pts[:, 1] <= tpr_ceiling(pts[:, 0], eps, delta)
    se = math.sqrt(0.25 / len(pts))
    assert abs(inside.mean() - auroc_ceiling(eps, delta)) < 5 * se


@pytest.mark.parametrize("eps,delta", [(0.7, 0.05), (2.0, 0.1)])
def test_tight_mechanism_reaches_ceiling_by_monte_carlo(eps, delta):
    # The mechanism whose ROC is exactly 1 - f_{ε,δ}: with probability δ reveal membership, else
    # randomized response with parameter ε. Simulate members/non-members and measure AUROC.
    rng = np.random.default_rng(7)
    n = 200_000
    member = rng.random(n) < 0.5
    reveal = rng.random(n) < delta
    p_true = math.exp(eps) / (1 + math.exp(eps))
    rr = np.where(rng.random(n) < p_true, member, ~member)
    score = np.where(reveal, np.where(member, 2.0, -1.0), rr.astype(float))
    got = auroc(score, member)
    assert got == pytest.approx(auroc_ceiling(eps, delta), abs=0.006)


def test_tpr_ceiling_points():
    eps, delta = 1.0, 1e-3
    assert tpr_ceiling(0.0, eps, delta) == pytest.approx(delta)
    assert tpr_ceiling(0.01, eps, delta) == pytest.approx(delta + math.e * 0.01)
    assert tpr_ceiling(1.0, eps, delta) == pytest.approx(1.0)
    assert tpr_ceiling(0.5, 0.0, 0.0) == pytest.approx(0.5)
    xs = np.linspace(0, 1, 101)
    ys = tpr_ceiling(xs, 2.0, 1e-5)
    assert np.all(np.diff(ys) >= -1e-12) and np.all(ys >= xs - 1e-12)


def _gaussian_delta(eps, mu):
    return norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_gaussian_mechanism_is_below_every_eps_delta_ceiling_and_profile_is_tight(mu):
    # μ-GDP's best test has AUROC Φ(μ/√2); every (ε, δ(ε)) it satisfies must give a ceiling above
    # that, and the whole δ(ε) profile must give back Φ(μ/√2) (its trade-off curve is the envelope).
    truth = norm.cdf(mu / math.sqrt(2))
    eps = np.linspace(0, 12, 1201)
    deltas = np.clip(_gaussian_delta(eps, mu), 0, 1)
    for e, d in zip(eps[::50], deltas[::50]):
        assert auroc_ceiling(float(e), float(d)) >= truth - 1e-9
    prof = auroc_ceiling_from_profile(eps, deltas)
    assert truth - 1e-9 <= prof <= truth + 2e-3


def test_pld_profile_matches_gaussian():
    from dp_accounting.pld import privacy_loss_distribution as pldlib
    sigma = 1.0
    pld = pldlib.from_gaussian_mechanism(standard_deviation=sigma, sensitivity=1.0,
                                         value_discretization_interval=1e-3)
    truth = norm.cdf(1 / (sigma * math.sqrt(2)))
    got = auroc_ceiling_from_pld(pld)
    assert truth - 1e-6 <= got <= truth + 3e-3


def test_bad_input_is_a_veil_error():
    with pytest.raises(VeilError):
        auroc_ceiling(-1.0, 1e-5)
    with pytest.raises(VeilError):
        auroc_ceiling(1.0, 2.0)


def _cert(mech, q, sigma, steps, k=None, eps=8.0, delta=1e-5):
    return {"privacy_unit": "user", "mechanism": {"group-tight": "group"}.get(mech, mech),
            "epsilon": eps, "delta": delta, "accountant": {"mechanism": mech},
            "sampling_rate": q, "noise_multiplier": sigma, "steps": steps,
            "contribution_bound": {"records_per_user": k}}


def test_certificate_pld_ceiling_gaussian_and_cross_implementation():
    from components.audit.ceiling import certificate_ceilings
    sigma = 1.5
    truth = norm.cdf(1 / (sigma * math.sqrt(2)))  # q = 1, T = 1: one Gaussian mechanism
    got = certificate_ceilings(_cert("uls", 1.0, sigma, 1))["auroc_ceiling_pld"]
    assert truth - 1e-6 <= got <= truth + 3e-3
    # ELS with k = 1 is the same Poisson-subsampled Gaussian, through the mixture implementation
    a = certificate_ceilings(_cert("uls", 0.1, 1.2, 50))["auroc_ceiling_pld"]
    b = certificate_ceilings(_cert("els", 0.1, 1.2, 50, k=1))["auroc_ceiling_pld"]
    assert a == pytest.approx(b, abs=3e-3)
    # the whole profile can only be tighter than one (ε, δ) point of it
    from components.accounting import epsilon as account
    e = account("uls", sampling_rate=0.12, noise_multiplier=1.18, steps=150, delta=1e-5).epsilon
    c = certificate_ceilings(_cert("uls", 0.12, 1.18, 150, eps=e))
    assert c["auroc_ceiling_pld"] <= c["auroc_ceiling"] and c["auroc_ceiling"] == pytest.approx(auroc_ceiling(e, 1e-5))
    assert certificate_ceilings({"privacy_unit": "record", "epsilon": 1.0, "delta": 1e-5}) == {
        "auroc_ceiling": 1.0, "auroc_ceiling_pld": None}


def test_pld_tpr_ceiling_is_the_gaussian_tradeoff_from_above():
    # one Gaussian mechanism (sensitivity 1, noise σ) is μ-GDP with μ = 1/σ: the exact trade-off is
    # G_μ(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong, Roth & Su 2019), so the TPR ceiling is 1 − G_μ(α)
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from scipy.stats import norm

    from components.audit.ceiling import tpr_ceiling_from_pld

    sigma = 0.8
    pld = pld_lib.from_gaussian_mechanism(sigma, sensitivity=1.0, value_discretization_interval=1e-3,
                                          pessimistic_estimate=True)
    fpr = np.logspace(-4, -0.01, 60)
    exact = 1.0 - norm.cdf(norm.ppf(1.0 - fpr) - 1.0 / sigma)
    got = tpr_ceiling_from_pld(fpr, pld)
    assert np.all(got >= exact - 1e-9)                     # never below the truth
    assert np.max(got - exact) < 0.02                      # and close to it
