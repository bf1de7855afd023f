"""The ledger's RDP costs against independent computations, and the filter's soundness."""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rpa

from components.renyi import rdp as R

A = np.asarray(R.ORDERS)


def test_full_batch_gaussian_is_the_closed_form():
    # Gaussian mechanism, sensitivity 1, noise σ: D_α = α/(2σ²) per step (Mironov 2017, Prop. 7)
    for sigma, T in ((0.7, 1), (1.3, 25), (4.0, 400)):
        assert np.allclose(R.sampled_gaussian_rdp(1.0, sigma, T), T * A / (2 * sigma ** 2), rtol=1e-12)


def test_subsampled_gaussian_matches_dp_accountings_own_accountant():
    acc = dp_accounting.rdp.RdpAccountant(orders=list(A))
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1)), 300)
    ours = R.sampled_gaussian_rdp(0.02, 1.1, 300)
    ref = 300 * rpa._compute_rdp_poisson_subsampled_gaussian(0.02, 1.1, A)
    assert np.allclose(ours, ref, rtol=1e-12) and np.allclose(ours, acc._rdp, rtol=1e-12)
    # and the ε dp-accounting reads off it (no union pad) is below ours (with the pad): never optimistic
    eps_ref, _ = rpa.compute_epsilon(A, ours, 1e-5)
    for conv in (R.MARKOV, R.HOCKEY_STICK):
        assert R.epsilon_of_spend(ours, 1e-5, conversion=conv) >= eps_ref
    assert R.epsilon_of_spend(ours, 1e-5, conversion=R.WEIGHTED, weights=R.order_weights(4.0, 1e-5)) >= eps_ref


def test_rows_cost_is_the_person_level_gaussian_at_full_batch_and_grows_with_rows():
    # q = 1, n rows: the person moves the sum by n·C every step, so α·T·n²/(2σ²)
    for n in (1, 3, 8):
        assert np.allclose(R.rows_rdp([1.0] * n, 2.0, 10), 10 * A * n ** 2 / (2 * 4.0), rtol=1e-12)
    # n = 1 is the record-level subsampled Gaussian
    assert np.allclose(R.rows_rdp([0.05], 1.0, 40), R.sampled_gaussian_rdp(0.05, 1.0, 40))
    prev = np.zeros(len(A))
    for n in (1, 2, 4, 8):
        cur = R.rows_rdp([0.05] * n, 1.0, 40)
        fin = np.isfinite(prev)   # dp-accounting gives +inf (pessimistic) where its series does not converge
        assert np.all(cur[fin] >= prev[fin] - 1e-15) and np.all(np.isinf(cur[~fin]) | (cur[~fin] > 0))
        prev = cur
    assert np.all(R.rows_rdp([0.0, 0.0], 1.0, 40) == 0)


def test_rows_bound_dominates_the_exact_mixture_at_integer_orders():
    """Independent exact value: for P = N(0,σ²), Q = Σ_j Bin(n,q)_j N(j,σ²) and integer α,
    E_P[(Q/P)^α] = Σ_s (w^{*α})_s exp(s²/2σ²) with w_j = Bin_j·exp(−j²/2σ²) (expand the α-th power as α
    i.i.d. draws of j). Our per-person bound must be ≥ this direction of the mixture's RDP."""
    from scipy import special, stats

    n, q, sigma = 4, 0.1, 1.0
    bound = R.rows_rdp([q] * n, sigma, 1)
    for alpha in (2, 3, 4, 5, 6, 8, 10, 12, 16):
        j = np.arange(n + 1)
        w = stats.binom.pmf(j, n, q) * np.exp(-j ** 2 / (2 * sigma ** 2))
        conv = np.array([1.0])
        for _ in range(alpha):
            conv = np.convolve(conv, w)
        s = np.arange(len(conv))
        with np.errstate(divide="ignore"):
            exact = float(special.logsumexp(np.log(conv) + s ** 2 / (2 * sigma ** 2))) / (alpha - 1)
        i = int(np.where(A == alpha)[0][0])
        assert bound[i] >= exact * (1 - 1e-9)


def test_filter_budget_and_epsilon_of_spend_by_hand():
    # old ledgers (union-markov) and new ones (union-hockey-stick), each formula written out by hand
    by_conv = {R.MARKOV: lambda a: math.log(len(A) / 1e-6) / (a - 1),
               R.HOCKEY_STICK: lambda a: (math.log(len(A) / 1e-6) - math.log(a)) / (a - 1) - math.log(a / (a - 1))}
    for conv, pad in by_conv.items():
        b = R.rdp_budget(3.0, 1e-6, conversion=conv)
        assert np.allclose(b, [3.0 - pad(a) for a in A])
        rho = 0.01 * A                          # a zCDP-like curve
        by_hand = min(float(r) + pad(a) for a, r in zip(A, rho))
        assert R.epsilon_of_spend(rho, 1e-6, conversion=conv) == pytest.approx(by_hand, rel=1e-12)
        # admitted ⇔ ε_of_spend(spend + cost) ≤ budget ε
        for scale in np.linspace(0.1, 3, 30):
            assert R.admits(scale * rho, 0 * rho, b) == (R.epsilon_of_spend(scale * rho, 1e-6, conversion=conv) <= 3.0)
    # the new conversion keeps back less at every order: whoever the old one admitted, the new one admits
    assert np.all(R.rdp_budget(3.0, 1e-6, conversion=R.HOCKEY_STICK) > R.rdp_budget(3.0, 1e-6, conversion=R.MARKOV))
    assert R.CONVERSION == R.WEIGHTED


@pytest.mark.parametrize("conversion,rule", [(R.MARKOV, None), (R.HOCKEY_STICK, None),
                                             (R.WEIGHTED, R.WEIGHT_RULE_V1), (R.WEIGHTED, R.WEIGHT_RULE)])
def test_filter_is_sound_against_an_adaptive_analyst_monte_carlo(conversion, rule):
    """Fully adaptive Gaussian releases (each σ_t chosen from the previous outputs) to one person under
    the filter; the person's realised privacy loss L = Σ L_t must exceed ε with probability ≤ δ
    (union-markov bounds that tail), and the hockey-stick divergence E_P[(1 − e^{ε−L})₊] — what
    (ε, δ)-DP is — must be ≤ δ (what union-hockey-stick and weighted-hockey-stick bound; the tail may
    exceed δ). The weighted rules' shares sit where this budget's spend is cheapest, so they admit the
    most; both rules a ledger can be kept under (v1, issue 26's first weighted ledgers; v2, new ones)
    are run.

    Under P (person present) a full-batch Gaussian release with shift 1 and noise σ_t gives
    L_t ~ N(1/(2σ_t²), 1/σ_t²). The analyst picks a cheap release after a 'lucky' output and an
    expensive one otherwise — the pattern that breaks the natural PLD filter. δ is large so Monte-Carlo
    can see it; the bound is checked with a 4-standard-error margin."""
    rng = np.random.default_rng(0)
    eps, delta, n = 2.0, 0.05, 200_000
    budget = R.rdp_budget(eps, delta, conversion=conversion, weights=rule)
    sigmas = (1.2, 3.0, 6.0)
    curve = {s: A / (2 * s * s) for s in sigmas}
    L = np.zeros(n)
    spend = np.zeros((n, len(A)))
    last = np.zeros(n)
    for t in range(40):
        pick = np.where(last > 0.5, 0, np.where(last > -0.5, 1, 2)) if t else np.zeros(n, dtype=int)
        sig = np.asarray(sigmas)[pick]
        cost = A[None, :] / (2 * sig[:, None] ** 2)
        ok = R.admits_many(spend, cost, budget)
        spend[ok] += cost[ok]
        lt = rng.normal(1 / (2 * sig ** 2), 1 / sig)
        L += np.where(ok, lt, 0.0)
        last = np.where(ok, lt * sig ** 2, rng.normal(0, 1, n))  # the output the analyst sees
    assert np.all(np.any(spend <= budget[None, :], axis=1))
    if conversion == R.MARKOV:
        p = float((L > eps).mean())
        assert p <= delta + 4 * math.sqrt(delta * (1 - delta) / n)
    hs = np.maximum(0.0, 1.0 - np.exp(eps - L))      # hockey-stick integrand, in [0, 1)
    assert float(hs.mean()) <= delta + 4 * float(hs.std()) / math.sqrt(n)
    assert (L > 0.5 * eps).mean() > 0.01   # the test has teeth: the budget is actually used


def _mp_renyi(weights, sigma, alpha):
    """Both directions of the aligned mixture's Rényi divergence by mpmath's adaptive quadrature
    (30 digits): an independent computation of what `mixture_rdp` integrates on a grid."""
    import mpmath as mp

    mp.mp.dps = 30
    a, s = mp.mpf(alpha), mp.mpf(sigma)
    P = lambda z: mp.exp(-z * z / 2)                                        # noqa: E731
    Q = lambda z: sum(mp.mpf(w) * mp.exp(-(z - j / s) ** 2 / 2) for j, w in enumerate(weights))  # noqa: E731
    cuts = [-mp.inf, -1, 0, len(weights) / s, mp.inf]
    rem = mp.quad(lambda z: Q(z) ** a * P(z) ** (1 - a), cuts) / mp.sqrt(2 * mp.pi)
    add = mp.quad(lambda z: P(z) ** a * Q(z) ** (1 - a), cuts) / mp.sqrt(2 * mp.pi)
    return float(mp.log(rem) / (a - 1)), float(mp.log(add) / (a - 1))


def test_mixture_rdp_is_the_sampled_gaussian_for_one_row():
    """n = 1: the mixture is PoissonSampled(q, Gaussian(σ)); dp-accounting's integer-order values are
    exact there. Ours may only be above them, by the stated safety margin at most."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    ints = [a for a in A if float(a).is_integer()]
    for q, sigma in ((0.1, 1.0), (0.01, 0.8), (0.3, 3.0)):
        acc = RdpAccountant(ints)
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), 1)
        ref = np.asarray(acc._rdp)
        ours = R.mixture_rdp([q], sigma, ints)
        ok = np.isfinite(ours)
        assert ok.sum() >= 8
        assert np.all(ours[ok] >= ref[ok] * (1 - 1e-9))
        assert np.all(ours[ok] <= ref[ok] * (1 + 1e-5) + 1e-10)


@pytest.mark.parametrize("rates,sigma,alpha", [([0.1] * 4, 1.0, 2.0), ([0.1] * 4, 1.0, 1.5),
                                               ([0.2, 0.05, 0.1], 2.0, 2.5), ([0.05] * 8, 4.0, 8.0)])
def test_mixture_rdp_matches_adaptive_quadrature_in_both_directions(rates, sigma, alpha):
    w = np.array([1.0])
    for r in rates:
        w = np.convolve(w, [1 - r, r])
    rem, add = _mp_renyi(w, sigma, alpha)
    ours = float(R.mixture_rdp(rates, sigma, [alpha])[0])
    assert ours >= max(rem, add) * (1 - 1e-9)
    assert ours <= max(rem, add) * (1 + 1e-5) + 1e-10


def test_rows_cost_takes_the_mixture_when_it_is_tighter():
    """A person with 16 rows: the worst-fixed-shift bound charges PoissonSampled(q', σ/16); the
    mixture the certificate accounts is several times smaller, and the cost is the smaller one."""
    q, sigma, steps = 0.17, 66.0, 50
    shift = R.sampled_gaussian_rdp(1 - (1 - q) ** 16, sigma / 16, steps)
    cost = R.rows_rdp([q] * 16, sigma, steps)
    assert np.all(cost <= shift)
    assert R.epsilon_of_spend(cost, 1e-7, conversion=R.HOCKEY_STICK) < \
        R.epsilon_of_spend(shift, 1e-7, conversion=R.HOCKEY_STICK) / 4
