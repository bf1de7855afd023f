"""Group privacy (seed 000, Algorithm 1): every user resampled to exactly k records, record-level
DP-SGD, a person accounted as a group of k (tight: the Binomial(k, q) mixture)."""
from __future__ import annotations

from components.mechanisms.base import Bounded, PlanContext, register
from components.mechanisms.gaussian import UserBounded


class Group(UserBounded):
    name = "group"
    description = "group privacy: exactly k records per user, record-level DP-SGD, tight group accounting"
    accounting_model = "group-tight"
    exactly_k = True

    def population_sensitivity(self, k: int) -> tuple[str, int, str]:
        return "records", k, f"every person contributes exactly k = {k} (resampled) records"

    def bound(self, ctx: PlanContext, train) -> Bounded:
        out = super().bound(ctx, train)
        out.caveats.append("group privacy resamples users with fewer than k records up to k (duplicates)")
        return out


register(Group)
