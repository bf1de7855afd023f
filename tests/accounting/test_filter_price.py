"""The filter's price of one release against the release's PLD ε (issue 26).

The price is what a new ledger charges for a single release, as an ε at the same δ: the smallest budget
whose Rényi filter admits the release's cost curve (`rdp.epsilon_of_spend`). The release's own ε is
dp-accounting's PLD accountant on the same event, computed here directly (not through Veil's accounting
module). The price may never be below the PLD ε (the filter's guarantee is a valid (ε, δ) bound, the
PLD ε a pessimistic estimate of the exact one); the hockey-stick conversion must beat the old one; and
the ratio is held to what was measured (docs/privacy/ledger.md, "Price of one release").

Pinned here for `union-hockey-stick` (ledgers made by issue 26's first Veil keep it, and its numbers must not
move) and for `weighted-hockey-stick` (δ·w_α per order, the weights fixed by the lifetime budget) under
both its rules: `gaussian-centred/v1` (the first weighted ledgers keep it: its shares are pinned to the
formula they were made with) and `/v2` (new ledgers: within 1.15× of the PLD ε on the settings below,
issue 26's target). Weights sum to at most 1 on every budget, and the price — the smallest budget whose
filter admits the release(s), the weights being that budget's — is never below dp-accounting's PLD ε of
the same composition, nor below dp-accounting's own RDP accountant's ε on the same orders (its conversion
is the single-order one at the whole δ), checked at every budget below them."""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from scipy.stats import binom

from components.renyi import rdp as R

# (label, q, T, σ, δ, measured ratio ceiling): σ puts the PLD ε near 8 or 2
ULS = [("uls ε≈8 δ=1e-5", 0.2, 40, 1.077, 1e-5, 1.31),
       ("uls ε≈8 δ=1e-6", 0.05, 1000, 1.272, 1e-6, 1.21),
       ("uls ε≈2 δ=1e-6", 0.01, 2000, 1.246, 1e-6, 1.24),
       ("uls ε≈2 δ=1e-5", 0.2, 40, 2.802, 1e-5, 1.30)]


def _pld(event, delta: float, interval: float = 1e-3) -> float:
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def _check(price_new: float, price_old: float, pld: float, ceiling: float) -> None:
    assert price_new >= pld * (1 - 1e-3), (price_new, pld)       # never under the release's own ε
    assert price_new < price_old                                  # tighter than the pre-issue-26 conversion
    assert price_new / pld <= ceiling, (price_new / pld, ceiling)


@pytest.mark.parametrize("label,q,T,sigma,delta,ceiling", ULS, ids=[u[0] for u in ULS])
def test_uls_price_of_one_release(label, q, T, sigma, delta, ceiling):
    pld = _pld(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T), delta)
    cost = R.sampled_gaussian_rdp(q, sigma, T)
    _check(R.epsilon_of_spend(cost, delta, conversion=R.HOCKEY_STICK),
           R.epsilon_of_spend(cost, delta, conversion=R.MARKOV), pld, ceiling)


def test_els_price_of_one_release():
    """A person with k = 2 rows under ELS: the ledger's row cost (the aligned mixture's Rényi divergence)
    against dp-accounting's PLD of the same MixtureOfGaussiansDpEvent (the certificate's model)."""
    q, T, k, sigma, delta = 0.1, 100, 2, 3.5, 1e-5
    probs = [float(binom.pmf(j, k, q)) for j in range(k + 1)]
    pld = _pld(dp_accounting.SelfComposedDpEvent(MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs), T),
               delta, interval=5e-3)
    assert 2.0 < pld < 3.0
    cost = R.rows_rdp([q] * k, sigma, T)
    _check(R.epsilon_of_spend(cost, delta, conversion=R.HOCKEY_STICK),
           R.epsilon_of_spend(cost, delta, conversion=R.MARKOV), pld, 1.28)


def test_record_price_equals_one_row():
    """A record-level person with one row pays exactly the sampled Gaussian (the same event as ULS)."""
    q, T, sigma = 0.2, 40, 1.077
    assert np.allclose(R.rows_rdp([q], sigma, T), R.sampled_gaussian_rdp(q, sigma, T))


# --- the weighted conversion (new ledgers) ---------------------------------------------------------------

def test_weights_sum_to_at_most_one_and_are_checked():
    """Σ w_α ≤ 1 (the proof's Σ δ_α ≤ δ) for budgets across four orders of magnitude of ε and δ and two
    grids; every share > 0 (no order unusable); a tampered record is refused, never re-interpreted."""
    from components.core.errors import VeilError

    fine = tuple(1.0 + 0.25 * i for i in range(1, 80))
    for rule in R.WEIGHT_RULES:
        for orders in (R.ORDERS, fine):
            for eps in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 200.0):
                for delta in (1e-3, 1e-4, 1e-5, 1e-6, 1e-9):
                    w = R.order_weights(eps, delta, orders, rule)
                    assert w.shape == (len(orders),) and np.all(w > 0) and math.fsum(w) <= 1.0
                    assert np.array_equal(R.check_weights(list(w), orders, eps, delta, rule), w)
    w = R.order_weights(8.0, 1e-5)
    with pytest.raises(VeilError, match="Σ ≤ 1"):
        R.check_weights(w * 1.001, R.ORDERS, 8.0, 1e-5)
    with pytest.raises(VeilError, match="not gaussian-centred"):
        R.check_weights(np.roll(w, 1), R.ORDERS, 8.0, 1e-5)      # another rule's shares
    with pytest.raises(VeilError, match="not gaussian-centred"):
        R.check_weights(w, R.ORDERS, 9.0, 1e-5)                  # shares of another budget
    with pytest.raises(VeilError, match="not gaussian-centred/v1"):
        R.check_weights(w, R.ORDERS, 8.0, 1e-5, R.WEIGHT_RULE_V1)  # v2's shares where v1's are recorded
    with pytest.raises(VeilError, match="not one this Veil knows"):
        R.order_weights(8.0, 1e-5, rule="gaussian-centred/v0")
    with pytest.raises(VeilError):
        R.conversion_pad(1e-5, conversion=R.WEIGHTED)            # no weights: refused, not guessed


def test_v1_weights_are_the_formula_the_first_weighted_ledgers_were_made_with():
    """Ledgers made under gaussian-centred/v1 keep it: its shares must not move with later rules. They are
    recomputed here from the v1 formula itself (centre α*·e^{−0.15}, a Gaussian of width 0.15 in log α,
    2 % of δ spread uniformly); α*, the best order of the spend ρ·α whose single-order ε at δ is the
    budget's, by a root search on ρ written here (not `gaussian_best_order`)."""
    from scipy.optimize import brentq

    a = np.asarray(R.ORDERS)
    fine = np.exp(np.linspace(math.log(1.001), math.log(1e4), 20001))
    for eps, delta in ((16.0, 1e-4), (32.0, 1e-4), (8.0, 1e-5), (2.0, 1e-6)):
        pad1 = (-math.log(delta) - np.log(fine)) / (fine - 1) + np.log1p(-1 / fine)
        log_rho = brentq(lambda x: float(np.min(math.exp(x) * fine + pad1)) - eps, math.log(1e-9), math.log(1e3),
                         xtol=1e-12)
        centre = math.log(fine[np.argmin(math.exp(log_rho) * fine + pad1)]) - 0.15
        k = np.exp(-((np.log(a) - centre) ** 2) / (2 * 0.15 ** 2))
        want = 0.98 * k / k.sum() + 0.02 / len(a)
        want = want / want.sum()
        got = R.order_weights(eps, delta, rule=R.WEIGHT_RULE_V1)
        assert np.max(np.abs(got - want)) < 1e-9, (eps, delta, got, want)


def _rdp_accountant_epsilon(event, n: int, delta: float) -> float:
    """dp-accounting's RDP accountant on the ledger's orders; 0 (no bound) for an event it does not take
    (0.6.0 refuses MixtureOfGaussiansDpEvent: ELS is checked against the PLD alone)."""
    acc = dp_accounting.rdp.RdpAccountant(orders=list(R.ORDERS))
    if not acc.supports(event):
        return 0.0
    acc.compose(event, n)
    return float(acc.get_epsilon(delta))


# (label, event builder, cost curve, δ, PLD interval, measured ceiling of the weighted price at n = 1, 2
# under v1; v2's is 1.15, the issue's target, for all)
def _uls(q, T, sigma):
    return (dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T),
        R.sampled_gaussian_rdp(q, sigma, T))


def _els(q, T, k, sigma):
    probs = [float(binom.pmf(j, k, q)) for j in range(k + 1)]
    return (dp_accounting.SelfComposedDpEvent(MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs), T),
            R.rows_rdp([q] * k, sigma, T))


WEIGHTED = [("uls ε≈8 δ=1e-5", lambda: _uls(0.2, 40, 1.077), 1e-5, 1e-3, 1.16),
            ("uls ε≈8 δ=1e-6", lambda: _uls(0.05, 1000, 1.272), 1e-6, 1e-3, 1.11),
            ("uls ε≈2 δ=1e-6", lambda: _uls(0.01, 2000, 1.246), 1e-6, 1e-3, 1.13),
            ("els k=2 ε≈2.5 δ=1e-5", lambda: _els(0.1, 100, 2, 3.5), 1e-5, 5e-3, 1.17)]
TARGET = 1.15


@pytest.mark.parametrize("rule", [R.WEIGHT_RULE_V1, R.WEIGHT_RULE])
@pytest.mark.parametrize("label,make,delta,interval,ceiling", WEIGHTED, ids=[w[0] for w in WEIGHTED])
def test_weighted_price_never_below_pld_nor_rdp(label, make, delta, interval, ceiling, rule):
    event, cost = make()
    if rule == R.WEIGHT_RULE:
        ceiling = TARGET
    for n in (1, 2):
        pld = _pld(dp_accounting.SelfComposedDpEvent(event, n), delta, interval)
        rdp_eps = _rdp_accountant_epsilon(event, n, delta)
        price = R.filter_price(n * cost, delta, conversion=R.WEIGHTED, rule=rule)
        # the price found by the scan is admitted by the filter at its own weights …
        assert R.admits(n * cost, 0 * cost, R.rdp_budget(price, delta, conversion=R.WEIGHTED, weights=rule))
        # … and no budget below the PLD ε (nor the RDP accountant's ε) admits the composition, whatever
        # weights that budget fixes: the filter never claims less than the independent accountants
        floor = max(pld * (1 - 1e-3), rdp_eps)
        assert price >= floor, (price, pld, rdp_eps)
        for e in np.linspace(0.3 * floor, floor * (1 - 1e-9), 60):
            assert not R.admits(n * cost, 0 * cost, R.rdp_budget(e, delta, conversion=R.WEIGHTED, weights=rule)), e
        # tighter than the uniform conversion, and within what was measured (bench/filter_price.py)
        assert price < R.filter_price(n * cost, delta, conversion=R.HOCKEY_STICK)
        assert price / pld <= ceiling, (n, price / pld, ceiling)
