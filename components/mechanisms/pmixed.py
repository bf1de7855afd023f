"""PMixED private prediction (seed 002, repaired): an ensemble of per-shard adapters mixed at every
sampled token under a pointwise mollifier (docs/privacy/pmixed.md). It trains nothing through the
DP-SGD engine and is certified by components.prediction (a budget in tokens); registered here so
that the ledger and the CLI know it as the mechanism of the releases it charges."""
from __future__ import annotations

from collections.abc import Mapping

from components.mechanisms.base import Mechanism, register


class PMixED(Mechanism):
    name = "pmixed"
    description = "private prediction: a partitioned ensemble mixed per token under a pointwise mollifier"
    privacy_unit = "user"
    neighbouring = "add_remove_user"
    plannable = False        # built by `veil pmixed build`, not planned for the DP-SGD engine
    certifiable = False      # its certificate is components.prediction's (the endpoint protocol)

    def ledger_costs(self, plan: Mapping, rates, orders) -> dict:
        """Every person sits in one shard; each answered token costs them the mechanism's per-token RDP
        (components.prediction.mechanism), whatever their row count."""
        from components.renyi.costs import PersonCost  # startup

        curve = plan["budget_rdp"]
        q = float(plan["sampling_rate"])
        return {u: PersonCost(rows=len(r), sampling_rate=q, rdp=curve) for u, r in rates.items()}


register(PMixED)
