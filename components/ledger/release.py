"""From a plan and its people to a reservation: what the pipeline calls between plan and train.

    reserve_release(settings, plan_like, persons[, secrets=targets]) -> Reservation(release_id, admitted, retired, ...)
    secret_costs(plan_like, targets) -> [SecretCost]   each secret's KL in this release (secret plans)

`plan_like` is a plan document (or any mapping with mechanism, privacy_unit, sampling_rate,
noise_multiplier, steps, sha256 and optionally lifetime_budget). `persons` says whose rows the release
would train on: a pyarrow table of training rows (user_id[, rate]), or a mapping
person id → number of rows, or person id → the rows' Poisson rates (secret plans).
The caller must drop every row of the retired people before training (the charge assumes they are gone).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from components.core.errors import VeilError
from components.renyi import rdp as _rdp, costs as _costs
from components.ledger.ledger import Ledger, Reservation
from components.renyi.costs import Budget, PersonCost, SecretCost, plan_number
from components.mechanisms import get as get_mechanism


NOT_COVERED = ("not covered: this release makes no person-level claim (its public N, q and σ move when a person "
               "is removed); nobody is charged or retired for it, and the per-person spend does not bound what it "
               "reveals about the people it trained on. Its secrets are charged per secret (KL)")


def population_costs(plan: Mapping, persons, orders=_rdp.ORDERS) -> dict[str, PersonCost]:
    """Each counted person's RDP cost of the plan's population estimate N̂ alone (renyi.costs)."""
    return _costs.population_costs(_mechanism(plan), plan, persons, orders)


def charge_population(settings, plan: Mapping, persons, *, release_key: str | None,
                      ledger: Ledger | None = None):
    """Charge the plan's N̂ to everyone it counts (`persons`: the plan's training rows), before the plan is
    published (Ledger.charge_population). None when the plan has no population estimate to charge."""
    costs = population_costs(plan, persons)
    if not costs:
        return None
    if not release_key:
        raise VeilError("ledger: this plan's population estimate has no release key (planned by an older Veil); "
                        "plan it again")
    own = ledger is None
    led = Ledger.open(settings) if own else ledger
    try:
        pop = (plan.get("data") or {}).get("population") or {}
        costs = population_costs(plan, persons, led.orders)
        return led.charge_population(release_key=release_key, mechanism="laplace", costs=costs,
                                     budget=Budget.parse(plan.get("lifetime_budget")),
                                     params={"epsilon": pop.get("epsilon"), "sensitivity": pop.get("sensitivity"),
                                             "unit": pop.get("unit"), "plan_mechanism": plan.get("mechanism")})
    finally:
        if own:
            led.dispose()


def release_costs(plan: Mapping, persons, orders=_rdp.ORDERS, *, population_charged: bool = False
                  ) -> dict[str, PersonCost]:
    """Each person's RDP cost for this release, priced by the plan's mechanism (renyi.costs.release_costs:
    the population estimate's share added unless charged on its own; empty for a mechanism that makes
    no person-level claim)."""
    return _costs.release_costs(_mechanism(plan), plan, persons, orders, population_charged=population_charged)


def training_costs(plan: Mapping, persons, orders=_rdp.ORDERS) -> dict[str, PersonCost]:
    """The release's DP-SGD part alone, priced by the plan's mechanism (renyi.costs.training_costs)."""
    return _costs.training_costs(_mechanism(plan), plan, persons, orders)


def _mechanism(plan: Mapping):
    """The plan's registered mechanism, or one clear line."""
    try:
        return get_mechanism(str(plan.get("mechanism")))
    except VeilError as e:
        raise VeilError(f"ledger: cannot charge this release: {e}") from None


def secret_costs(plan_like: Mapping, targets: Sequence) -> list[SecretCost]:
    """Each secret's KL in this release: exactly the certificate's accountant
    (components.accounting.secrets.report_secrets: T × the max-direction per-step KL of the
    Poisson-binomial mixture at the rates of the records holding it) at the plan's σ and planned T.
    `targets`: SecretTarget (secret id `class:value`, rates, κ, γ), e.g. flows.stages.secret_targets."""
    from components.accounting.secrets import report_secrets  # startup

    if not get_mechanism(str(plan_like.get("mechanism"))).secret_targets:
        raise VeilError("ledger: per-secret KL is charged for secret-protection plans only")
    sigma, steps = plan_number(plan_like, "noise_multiplier"), int(plan_number(plan_like, "steps"))
    targets = list(targets)
    if not targets or steps <= 0:
        return []
    return [SecretCost(secret_id=r.secret_id, secret_class=r.secret_id.split(":", 1)[0], kl=float(r.kl),
                       kappa=float(r.kappa), gamma=float(r.gamma_target), records=int(r.n_records))
            for r in report_secrets(targets, sigma, steps)]


def reserve_release(settings, plan_like: Mapping, persons, *, ledger: Ledger | None = None,
                    secrets: Sequence | None = None, population_release_key: str | None = None) -> Reservation:
    """Reserve the release's cost for everyone the filter admits, before any training.

    The plan's own lifetime_budget (if any) must equal the ledger's; the ledger's budget applies to
    every release once set. Whatever the release's fate, the charges stay. `secrets` (secret plans):
    the plan's SecretTargets, charged per secret in the same transaction (Reservation.secrets_dropped:
    the caller must drop every record holding one of those)."""
    own = ledger is None
    led = Ledger.open(settings) if own else ledger
    try:
        # A plan whose N̂ was charged when it was published pays only its training here; the ledger must
        # hold that charge, or the reservation pays it (never neither).
        charged = bool(population_release_key) and led.population_release(population_release_key) is not None
        costs = release_costs(plan_like, persons, led.orders, population_charged=charged)
        sec = secret_costs(plan_like, secrets) if secrets is not None else None
        params = {k: plan_like.get(k) for k in ("sampling_rate", "noise_multiplier", "steps", "clip_norm",
                                                 "records_per_user", "neighbouring") if k in plan_like}
        if not get_mechanism(str(plan_like.get("mechanism"))).ledger_person_claim:
            params["persons"] = NOT_COVERED
        return led.reserve(kind=str(plan_like.get("privacy_unit") or "user"), mechanism=str(plan_like["mechanism"]),
                           plan_sha256=plan_like.get("sha256"), params=params, costs=costs,
                           budget=Budget.parse(plan_like.get("lifetime_budget")), secrets=sec)
    finally:
        if own:
            led.dispose()


def fresh_person_cost(plan_like: Mapping, orders=_rdp.ORDERS) -> np.ndarray:
    """The release's RDP cost to a person with the most rows the plan allows (renyi.costs)."""
    return _costs.fresh_person_cost(_mechanism(plan_like), plan_like, orders)


def releases_for_fresh_person(plan_like: Mapping, budget: Budget, orders=_rdp.ORDERS,
                              conversion: str = _rdp.CONVERSION, weights=None) -> float:
    """How many releases of this plan a person who has spent nothing is admitted to (renyi.costs)."""
    return _costs.releases_for_fresh_person(_mechanism(plan_like), plan_like, budget, orders, conversion, weights)


def forecast_release(settings, plan_like: Mapping, persons, *, ledger: Ledger | None = None,
                     population_release_key: str | None = None) -> dict | None:
    """What the ledger would do with this plan's release now and after: per person, how many more
    releases of it they are admitted to (min and median over the plan's people), and how many people
    its next reservation would retire — computed exactly as `reserve_release` prices and filters it
    (Ledger.forecast). None without a budget (nobody is ever retired). PRIVATE: counts of people."""
    own = ledger is None
    led = Ledger.open(settings) if own else ledger
    try:
        budget = led.budget() or Budget.parse(plan_like.get("lifetime_budget"))
        if budget is None:
            return None
        charged = bool(population_release_key) and led.population_release(population_release_key) is not None
        costs = release_costs(plan_like, persons, led.orders, population_charged=charged)
        return led.forecast(mechanism=str(plan_like["mechanism"]), costs=costs, budget=budget)
    finally:
        if own:
            led.dispose()
