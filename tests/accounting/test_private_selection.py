"""Private selection with a random number of trials (Papernot & Steinke 2022): the distribution of K
and the ε of best-of-K, each against an independent computation."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

from components.accounting.private_selection import (draw_trials, expected_trials, gaussian_rdp, rdp_to_epsilon,
                                                     selection_rdp, tnb_pmf)
from components.core.errors import VeilError
from components.renyi.rdp import ORDERS

TNB = "truncated-negative-binomial"


@pytest.mark.parametrize("eta,gamma", [(0.0, 0.1), (1.0, 0.2), (0.5, 0.05), (-0.5, 0.1), (2.0, 0.3)])
def test_tnb_pmf_sums_to_one_and_mean_matches_closed_form(eta, gamma):
    ks = np.arange(1, 4000)
    p = np.array([tnb_pmf(int(k), eta, gamma) for k in ks])
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    assert (ks * p).sum() == pytest.approx(expected_trials(TNB, eta=eta, gamma=gamma), rel=1e-9)


def test_tnb_special_cases_are_the_named_distributions():
    # η = 1: geometric on {1, 2, …} with success probability γ
    for k in range(1, 20):
        assert tnb_pmf(k, 1.0, 0.25) == pytest.approx(stats.geom.pmf(k, 0.25), rel=1e-12)
    # η = 0: logarithmic (series) distribution with p = 1 − γ
    for k in range(1, 20):
        assert tnb_pmf(k, 0.0, 0.3) == pytest.approx(stats.logser.pmf(k, 0.7), rel=1e-12)
    # η ≠ 0: the negative binomial NB(η, γ) conditioned on K ≥ 1
    for k in range(1, 20):
        nb = stats.nbinom.pmf(k, 2.5, 0.2) / (1 - stats.nbinom.pmf(0, 2.5, 0.2))
        assert tnb_pmf(k, 2.5, 0.2) == pytest.approx(nb, rel=1e-10)


def test_draws_follow_the_distribution():
    rng = random.Random(7)
    n = 5000
    ks = [draw_trials(TNB, eta=0.0, gamma=0.2, rng=rng) for _ in range(n)]
    assert min(ks) >= 1
    mean, sd = np.mean(ks), np.std(ks)
    assert abs(mean - expected_trials(TNB, eta=0.0, gamma=0.2)) < 4 * sd / math.sqrt(n)
    pois = [draw_trials("poisson", mu=3.0, rng=rng) for _ in range(n)]
    assert abs(np.mean(pois) - 3.0) < 4 * math.sqrt(3.0 / n)
    assert np.mean(np.array(pois) == 0) == pytest.approx(math.exp(-3.0), abs=0.01)


def _tnb_eps_reference(lam: float, sigma: float, eta: float, gamma: float) -> float:
    """Theorem 2 written out for the Gaussian mechanism's closed-form curve ε(λ) = λ/(2σ²), with λ̂
    searched over a fine continuous grid (the code uses {1} ∪ the ledger's orders: never lower)."""
    ek = eta * (1 - gamma) / (gamma * (1 - gamma ** eta)) if eta != 0 else (1 / gamma - 1) / math.log(1 / gamma)
    hats = np.concatenate([[1.0], np.linspace(1.0001, 300.0, 30000)])
    term = (1 + eta) * (1 - 1 / hats) * hats / (2 * sigma ** 2) + (1 + eta) * math.log(1 / gamma) / hats
    return lam / (2 * sigma ** 2) + float(term.min()) + math.log(ek) / (lam - 1)


@pytest.mark.parametrize("eta,gamma,sigma", [(0.0, 0.1, 3.0), (1.0, 0.2, 5.0), (0.5, 0.3, 10.0)])
def test_tnb_epsilon_against_independent_computation(eta, gamma, sigma):
    orders = np.asarray(ORDERS)
    got = selection_rdp(orders, gaussian_rdp(orders, sigma), TNB, eta=eta, gamma=gamma)
    for lam, g in zip(orders, got):
        ref = _tnb_eps_reference(float(lam), sigma, eta, gamma)
        # the code's λ̂ grid is coarser than the reference's: it may only be (slightly) pessimistic
        assert g >= ref - 1e-9
        assert g <= ref + 0.05 * ref + 0.05
    # and the total (ε, δ): min over λ of ε'(λ) + log(1/δ)/(λ−1), computed independently
    delta = 1e-5
    eps, lam = rdp_to_epsilon(orders, got, delta)
    ref_eps = min(float(g) + math.log(1 / delta) / (float(a) - 1) for a, g in zip(orders, got))
    assert eps == pytest.approx(ref_eps, rel=1e-12)
    # best-of-K never costs less than one run
    one, _ = rdp_to_epsilon(orders, gaussian_rdp(orders, sigma), delta)
    assert eps > one


def test_poisson_epsilon_against_independent_computation():
    orders = np.asarray(ORDERS)
    sigma, mu = 4.0, 2.0
    curve = gaussian_rdp(orders, sigma)
    got = selection_rdp(orders, curve, "poisson", mu=mu)
    for lam, g in zip(orders, got):
        eps_hat = math.log(1 + 1 / (lam - 1))
        # δ̂ of the Gaussian mechanism at ε̂ via RDP conversion, minimised over the same orders
        dhat = min(1.0, math.exp(min((a - 1) * (a / (2 * sigma ** 2) - eps_hat) for a in orders)))
        assert g == pytest.approx(lam / (2 * sigma ** 2) + mu * dhat + math.log(mu) / (lam - 1), rel=1e-9)


def test_bad_parameters_are_one_line_errors():
    with pytest.raises(VeilError, match="gamma"):
        expected_trials(TNB, eta=0.0, gamma=1.5)
    with pytest.raises(VeilError, match="eta"):
        expected_trials(TNB, eta=-1.0, gamma=0.5)
    with pytest.raises(VeilError, match="mu"):
        expected_trials("poisson", mu=0)
    with pytest.raises(VeilError, match="distribution"):
        expected_trials("geometric")
