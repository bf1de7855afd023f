"""Record-level DP-SGD: Poisson records, per-record clipping; protects one record, not a person."""
from __future__ import annotations

from components.mechanisms.base import Bounded, PlanContext, register
from components.mechanisms.gaussian import SubsampledGaussian


class Record(SubsampledGaussian):
    name = "record"
    description = "record-level DP-SGD"
    privacy_unit = "record"
    neighbouring = "add_remove_record"
    accounting_model = "record"
    auto_default = True
    contribution_kind = "records per user"

    def population_sensitivity(self, k: int) -> tuple[str, int, str]:
        return "records", 1, ("adding or removing one record changes the training records by at most that "
                              "record (every audit and selection decision is per record)")

    def bound(self, ctx: PlanContext, train) -> Bounded:
        return Bounded(chosen=train, n_units=train.num_rows, records_per_user=None)

    def ledger_population_rows(self, rows: int) -> int:
        return int(rows)  # each row is a unit of N: n rows cost n·ε_N by pure-DP group privacy


register(Record)
