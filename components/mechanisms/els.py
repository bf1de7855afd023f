"""ELS — example-level sampling over ≤ k records per user (seed 001): Poisson records from the
bounded set, per-record clipping; one person is up to k records, accounted tightly as the
Binomial(k, q) mixture of Gaussians (Charles et al.)."""
from __future__ import annotations

from components.mechanisms.base import register
from components.mechanisms.gaussian import UserBounded


class ELS(UserBounded):
    name = "els"
    description = "user-level DP-SGD over ≤ k records per user, per-record clipping"
    accounting_model = "els"
    owners_variant = "els-owners"    # people.ownership: all-participants (components/mechanisms/els_owners.py)

    def population_sensitivity(self, k: int) -> tuple[str, int, str]:
        return "records", k, (f"N counts the bounded records Σ min(n_u, k); one person adds or removes at most "
                              f"k = {k} of them")


register(ELS)
