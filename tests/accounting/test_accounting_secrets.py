"""Secret accounting (seed 004): Lemma 3.2 inversion, per-secret mixture KL, calibration."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from components.accounting.secrets import (
    SecretTarget,
    calibrate_secrets,
    count_pmf,
    gamma_from_kl,
    kl_budget,
    mixture_kl,
    report_secrets,
    secret_kl,
)
from components.core.errors import VeilError


def test_kl_budget_reference_values_and_inverse():
    # research note 004 §1.5 (κ = 1e-3)
    assert kl_budget(1e-3, 0.05) == pytest.approx(0.1478, abs=1e-4)
    assert kl_budget(1e-3, 0.5) == pytest.approx(2.761, abs=1e-3)
    assert gamma_from_kl(1.0, 1e-3) == pytest.approx(0.221, abs=1e-3)
    assert gamma_from_kl(0.01, 1e-3) == pytest.approx(0.0082, abs=1e-4)
    for kappa in (1e-6, 1e-3, 0.2):
        for gamma in (kappa, kappa * 1.5, 0.3, 0.9, 1.0):
            if gamma < kappa:
                continue
            g = gamma_from_kl(kl_budget(kappa, gamma), kappa)
            assert gamma - 1e-12 <= g <= gamma + 1e-9
    assert gamma_from_kl(0.0, 0.01) == 0.01
    assert gamma_from_kl(math.log(100), 0.01) == 1.0


def test_bad_kappa_gamma():
    with pytest.raises(VeilError, match="kappa"):
        kl_budget(0.0, 0.5)
    with pytest.raises(VeilError, match="gamma"):
        kl_budget(0.1, 0.05)


def test_gamma_bound_holds_against_monte_carlo_map_attacker():
    """N equally likely candidates, output = one-hot(secret) + N(0, σ²I): pairwise KL is 1/σ²; the MAP
    attacker's success must stay below Lemma 3.2's γ for κ = 1/N."""
    rng = np.random.default_rng(0)
    n_cand, trials = 50, 4000
    for sigma in (0.5, 1.0, 2.0):
        truth = rng.integers(0, n_cand, size=trials)
        out = rng.normal(0.0, sigma, size=(trials, n_cand))
        out[np.arange(trials), truth] += 1.0
        success = float(np.mean(out.argmax(axis=1) == truth))
        bound = gamma_from_kl(1.0 / sigma ** 2, 1.0 / n_cand)
        assert success <= bound + 3 * math.sqrt(bound * (1 - bound) / trials)


def _quad_kl(pmf, sigma, sens):
    """Both KL directions by adaptive quadrature of the densities themselves (independent of the
    Gauss–Hermite code path)."""
    mu = np.arange(len(pmf)) * sens
    logw = np.log(np.maximum(pmf, 1e-300))
    norm = 1.0 / (sigma * math.sqrt(2 * math.pi))

    def ell(x):  # log q(x)/p(x)
        return special.logsumexp(logw + (x * mu - 0.5 * mu ** 2) / sigma ** 2)

    def q(x):
        return float(np.sum(pmf * np.exp(-0.5 * ((x - mu) / sigma) ** 2))) * norm

    def p(x):
        return math.exp(-0.5 * (x / sigma) ** 2) * norm

    lo, hi = -12 * sigma, mu[-1] + 12 * sigma
    qp = integrate.quad(lambda x: q(x) * ell(x), lo, hi, limit=500, points=list(mu[:30]))[0]
    pq = integrate.quad(lambda x: -p(x) * ell(x), lo, hi, limit=500)[0]
    return qp, pq


@pytest.mark.parametrize("rates,sigma,sens", [
    ([0.01] * 60, 5.0, 1.0),      # research note 004 §5.2: 7.3407/1000 and 7.1664/1000 per step
    ([0.3, 0.5, 0.9], 1.5, 2.0),
    ([0.05] * 5 + [1.0], 3.0, 2.0),
])
def test_mixture_kl_matches_quadrature(rates, sigma, sens):
    pmf = count_pmf(rates)
    ours = mixture_kl(pmf, sigma, sens)
    ref = _quad_kl(pmf, sigma, sens)
    assert ours[0] == pytest.approx(ref[0], rel=1e-6)
    assert ours[1] == pytest.approx(ref[1], rel=1e-6)


def test_count_pmf_is_poisson_binomial():
    rates = [0.1, 0.5, 0.5, 0.9]
    rng = np.random.default_rng(1)
    draws = (rng.random((200_000, 4)) < rates).sum(axis=1)
    emp = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(count_pmf(rates), emp, atol=4e-3)
    assert count_pmf([]).tolist() == [1.0]


def test_always_sampled_record_is_a_plain_gaussian():
    r = secret_kl([1.0], noise_multiplier=2.0, steps=10, sensitivity=2.0)
    assert r.kl == pytest.approx(10 * 2.0 ** 2 / (2 * 2.0 ** 2), rel=1e-9)
    assert "2" in r.sensitivity_reason and r.sensitivity == 2.0


@pytest.mark.parametrize("p,sigma", [(0.01, 1.0), (0.1, 2.0), (0.5, 1.0)])
def test_sensitivity_two_mixture_bounds_worst_substitution(p, sigma):
    """One secret record substituted: its clipped gradient flips from +C to −C (distance 2C).
    Pair: (1−p)N(0)+pN(1) vs (1−p)N(0)+pN(−1). The Δ=2 mixture's KL must not be below it."""
    def dens(x, m):
        return (1 - p) * stats.norm.pdf(x, 0, sigma) + p * stats.norm.pdf(x, m, sigma)
    sub = integrate.quad(lambda x: dens(x, 1.0) * math.log(dens(x, 1.0) / dens(x, -1.0)), -15, 15, limit=300)[0]
    ours = secret_kl([p], sigma, steps=1, sensitivity=2.0)
    assert ours.kl >= sub
    assert secret_kl([p], sigma, steps=1, sensitivity=1.0).kl < sub  # why Δ=1 would be wrong


def test_calibrate_secrets_meets_every_target_minimally():
    targets = [SecretTarget.make("codename:KESTREL", [0.02] * 30, 1e-3, 0.2),
               SecretTarget.make("email:a@b", [0.02] * 3, 1e-3, 0.05),
               SecretTarget.make("phone:1", [0.05], 1e-2, 0.5)]
    cal = calibrate_secrets(targets, steps=200)
    assert all(r.meets_target and r.gamma <= r.gamma_target + 1e-12 for r in cal.secrets)
    assert cal.binding_secret in {t.secret_id for t in targets}
    lower = report_secrets(targets, cal.noise_multiplier * (1 - 3e-3), 200)
    assert any(not r.meets_target for r in lower)
    worst = cal.secrets[0]
    assert worst.gamma / worst.gamma_target == max(r.gamma / r.gamma_target for r in cal.secrets)
    assert cal.to_dict()["sensitivity"] == 2.0


@pytest.mark.parametrize("rates,sigma", [([0.1, 0.2, 0.3], 1.0), ([0.9, 0.9], 1.5), ([0.05] * 10, 1.0)])
def test_sensitivity_two_mixture_bounds_aligned_flips_of_several_records(rates, sigma):
    """All records holding the secret flip +C → −C together: Σ_j π_j N(j) vs Σ_j π_j N(−j)."""
    pmf = count_pmf(rates)
    j = np.arange(len(pmf))
    norm = 1 / (sigma * math.sqrt(2 * math.pi))

    def dens(x, sign):
        return float(np.sum(pmf * np.exp(-0.5 * ((x - sign * j) / sigma) ** 2))) * norm

    lim = len(pmf) + 12 * sigma
    sub = integrate.quad(lambda x: dens(x, 1) * math.log(dens(x, 1) / dens(x, -1)), -lim, lim, limit=400)[0]
    assert secret_kl(rates, sigma, steps=1, sensitivity=2.0).kl >= sub
