"""Monotonicity of ε (property tests on small grids) and Opacus as an independent reference."""
from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.accounting import epsilon

_SETTINGS = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _eps(mech="els", q=0.02, sigma=1.5, T=40, k=2, delta=1e-5):
    return epsilon(mech, sampling_rate=q, noise_multiplier=sigma, steps=T, delta=delta, k=k).epsilon


@_SETTINGS
@given(sigma=st.floats(0.6, 4.0), factor=st.floats(1.05, 2.0), mech=st.sampled_from(["els", "uls"]))
def test_epsilon_decreases_in_sigma(sigma, factor, mech):
    k = 3 if mech == "els" else 1
    assert _eps(mech, sigma=sigma * factor, k=k) <= _eps(mech, sigma=sigma, k=k)


@_SETTINGS
@given(q=st.floats(0.002, 0.3), factor=st.floats(1.1, 3.0))
def test_epsilon_increases_in_q(q, factor):
    assert _eps(q=q) <= _eps(q=min(1.0, q * factor))


@_SETTINGS
@given(T=st.integers(1, 60), extra=st.integers(1, 60))
def test_epsilon_increases_in_steps(T, extra):
    assert _eps(T=T) <= _eps(T=T + extra)


@_SETTINGS
@given(k=st.integers(1, 6), extra=st.integers(1, 4))
def test_epsilon_increases_in_k(k, extra):
    assert _eps(k=k, q=0.05) <= _eps(k=k + extra, q=0.05)


@pytest.mark.parametrize("q,sigma,T,delta", [(0.01, 1.0, 300, 1e-5)])
def test_record_level_agrees_with_opacus(q, sigma, T, delta):
    """Opacus' RDP accountant is an upper bound (looser than PLD); its PRV accountant estimates ε to
    ±eps_error and returns the upper end."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    ours = epsilon("record", sampling_rate=q, noise_multiplier=sigma, steps=T, delta=delta).epsilon
    rdp = RDPAccountant()
    rdp.history = [(sigma, q, T)]
    prv = PRVAccountant()
    prv.history = [(sigma, q, T)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps_rdp = rdp.get_epsilon(delta)
        eps_prv = prv.get_epsilon(delta, eps_error=0.01)
    assert ours <= eps_rdp
    assert eps_prv - 0.02 - 1e-3 <= ours <= eps_prv + 1e-3
