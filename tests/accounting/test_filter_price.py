"""The filter's price of one release against the release's PLD ε (issue 26).

The price is what a new ledger charges for a single release, as an ε at the same δ: the smallest budget
whose Rényi filter admits the release's cost curve (`rdp.epsilon_of_spend`). The release's own ε is
dp-accounting's PLD accountant on the same event, computed here directly (not through Veil's accounting
module). The price may never be below the PLD ε (the filter's guarantee is a valid (ε, δ) bound, the
PLD ε a pessimistic estimate of the exact one); the hockey-stick conversion must beat the old one; and
the ratio is held to what was measured (docs/privacy/ledger.md, "Price of one release") — 1.15× is not
reached by a filter that lets each person's order be chosen from 20 (the single-order floor alone is
1.07–1.12×; the union over orders costs the rest)."""
from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from scipy.stats import binom

from components.ledger import rdp as R

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
    _check(R.epsilon_of_spend(cost, delta), R.epsilon_of_spend(cost, delta, conversion=R.MARKOV), pld, ceiling)


def test_els_price_of_one_release():
    """A person with k = 2 rows under ELS: the ledger's row cost (the aligned mixture's Rényi divergence)
    against dp-accounting's PLD of the same MixtureOfGaussiansDpEvent (the certificate's model)."""
    q, T, k, sigma, delta = 0.1, 100, 2, 3.5, 1e-5
    probs = [float(binom.pmf(j, k, q)) for j in range(k + 1)]
    pld = _pld(dp_accounting.SelfComposedDpEvent(MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs), T),
               delta, interval=5e-3)
    assert 2.0 < pld < 3.0
    cost = R.rows_rdp([q] * k, sigma, T)
    _check(R.epsilon_of_spend(cost, delta), R.epsilon_of_spend(cost, delta, conversion=R.MARKOV), pld, 1.28)


def test_record_price_equals_one_row():
    """A record-level person with one row pays exactly the sampled Gaussian (the same event as ULS)."""
    q, T, sigma = 0.2, 40, 1.077
    assert np.allclose(R.rows_rdp([q], sigma, T), R.sampled_gaussian_rdp(q, sigma, T))
