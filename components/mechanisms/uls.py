"""ULS — user-level sampling (seeds 000 §2.5, 001): Poisson users, each sampled user's gradient is the
clipped mean over ≤ G of their records (or G random chunks of their text), Gaussian noise once."""
from __future__ import annotations

from collections.abc import Mapping

from components.mechanisms.base import Bounded, PlanContext, register
from components.mechanisms.gaussian import SubsampledGaussian


class ULS(SubsampledGaussian):
    name = "uls"
    description = "user-level DP-SGD: Poisson users, per-user clipped mean gradient"
    privacy_unit = "user"
    neighbouring = "add_remove_user"
    accounting_model = "uls"
    samples_users = True
    bounds_records = True
    per_user_clip = True
    auto_default = True
    contribution_kind = "per-user clipped mean gradient"

    def population_sensitivity(self, k: int) -> tuple[str, int, str]:
        return "users", 1, "adding or removing one person changes the number of training users by at most 1"

    def bound(self, ctx: PlanContext, train) -> Bounded:
        """random / random-chunk keep every record (the trainer draws G afresh at every visit, so the
        bound holds by the clipped mean); deterministic strategies fix each user's k records here."""
        from components.draws.columns import distinct_count  # startup
        from components.draws.selection import REDRAWN_PER_VISIT, select_records  # startup

        caveats = []
        if ctx.selection in ("random",) + REDRAWN_PER_VISIT:
            chosen = train
            caveats.append(f"ULS draws {'chunks' if ctx.selection == 'random-chunk' else 'records'} afresh at "
                           "every visit of a user; the bound holds because a user's gradient is one clipped mean")
        else:
            chosen = select_records(train, ctx.k, ctx.selection, seed=ctx.seed, scorer=ctx.scorer,
                                    key=ctx.key)
        return Bounded(chosen=chosen, n_units=distinct_count(chosen.column("user_id")),
                       records_per_user=int(ctx.k), caveats=caveats)

    def ledger_costs(self, plan: Mapping, rates: dict[str, list[float]], orders) -> dict:
        """One Poisson draw per person per step, whatever their row count: the sampled Gaussian's RDP."""
        from components.renyi import rdp as _rdp  # startup
        from components.renyi.costs import PersonCost  # startup

        q = float(plan["sampling_rate"])
        curve = _rdp.sampled_gaussian_rdp(q, float(plan["noise_multiplier"]), int(plan["steps"]), orders)
        made: dict[int, PersonCost] = {}    # one (immutable) cost per row count, shared by its people
        out = {}
        for u, r in rates.items():
            c = made.get(len(r))
            if c is None:
                c = made[len(r)] = PersonCost(rows=len(r), sampling_rate=q, rdp=curve)
            out[u] = c
        return out

    def ledger_group_size(self, rows: int) -> int:
        return 1


register(ULS)
