"""The per-person privacy ledger (issue 13): append-only, durable, one individual Rényi filter per person.

    reserve_release(settings, plan_like, persons[, secrets]) -> Reservation   between plan and train
    secret_costs(plan_like, targets) -> [SecretCost]               per-secret KL (secret-protection plans)
    Ledger.open(settings)                                           record(), summary(), burn_down()

The curves, costs and the filter's maths are components.renyi (below the mechanisms); this package
stores and filters the charges and asks the registry how each release prices its people (floor 5).

Default store: SQLite at settings.private_dir / "ledger.db"; `ledger_url` (VEIL_LEDGER_URL) names a
PostgreSQL database for a team. Derivations: docs/privacy/ledger.md.
"""
from components.ledger.ledger import Ledger, PlanAlreadyReleased, Reservation, default_url
from components.renyi.costs import Budget, PersonCost, SecretCost
from components.ledger.release import charge_population, release_costs, reserve_release, secret_costs

__all__ = ["Ledger", "Budget", "PersonCost", "PlanAlreadyReleased", "Reservation", "SecretCost", "default_url",
           "release_costs", "reserve_release", "secret_costs", "charge_population"]
