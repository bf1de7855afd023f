"""The private-prediction slot: the RDP → (ε, δ) conversion any per-token accountant ends in."""
from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from components.accounting.prediction import PerTokenRenyiAccountant, compose_rdp, rdp_to_epsilon
from components.core.errors import VeilError


def test_rdp_conversion_matches_dp_accounting_for_gaussian():
    orders = np.array([1.5, 2, 3, 4, 8, 16, 32, 64])
    sigma, T, delta = 3.0, 50, 1e-6
    rdp = compose_rdp(*([orders / (2 * sigma ** 2)] * T))
    ours, _ = rdp_to_epsilon(orders, rdp, delta)
    ref, _ = rdp_lib.compute_epsilon(orders, rdp, delta)
    assert ref <= ours + 1e-12 and ours <= ref * 1.05 + 1e-9


def test_rdp_conversion_rejects_bad_input():
    with pytest.raises(VeilError):
        rdp_to_epsilon([1.0, 2.0], [0.1, 0.2], 1e-5)
    with pytest.raises(VeilError):
        rdp_to_epsilon([2.0], [0.1], 1.5)


def test_protocol_is_a_protocol_not_an_implementation():
    class Dummy:
        orders = (2.0,)

        def token_rdp(self, *, ensemble_size, subsample_rate, radius):
            return np.zeros(1)

        def spend(self, tokens):
            return None

        def epsilon(self, delta):
            return 0.0

    assert isinstance(Dummy(), PerTokenRenyiAccountant)
    assert not isinstance(object(), PerTokenRenyiAccountant)
