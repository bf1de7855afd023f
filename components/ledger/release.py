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
from components.renyi import rdp as _rdp
from components.ledger.ledger import Budget, Ledger, PersonCost, Reservation, SecretCost
from components.mechanisms import get as get_mechanism



NOT_COVERED = ("not covered: this release makes no person-level claim (its public N, q and σ move when a person "
               "is removed); nobody is charged or retired for it, and the per-person spend does not bound what it "
               "reveals about the people it trained on. Its secrets are charged per secret (KL)")


def _num(plan: Mapping, key: str) -> float:
    try:
        return float(plan[key])
    except (KeyError, TypeError, ValueError):
        raise VeilError(f"ledger: the plan has no usable {key!r}") from None


def person_rates(persons, default_rate: float) -> dict[str, list[float]]:
    """person id → the Poisson rate of each of their training rows."""
    if hasattr(persons, "column_names"):  # a pyarrow table of training rows
        if "user_id" not in persons.column_names:
            raise VeilError("ledger: the training rows have no 'user_id' column")
        users = persons.column("user_id").to_pylist()
        rates = persons.column("rate").to_pylist() if "rate" in persons.column_names else [default_rate] * len(users)
        # multi-owner rows (components.bounding.owners): a row is every owner's row, recipients included
        owners = persons.column("owners").to_pylist() if "owners" in persons.column_names else [None] * len(users)
        out: dict[str, list[float]] = {}
        for u, r, o in zip(users, rates, owners):
            if u is None:
                raise VeilError("ledger: a training row has no user_id")
            for who in sorted({str(u), *(str(x) for x in (o or ()) if x is not None and str(x) != "")}):
                out.setdefault(who, []).append(float(default_rate if r is None else r))
        return out
    if not isinstance(persons, Mapping):
        raise VeilError("ledger: persons must be a table of training rows or a mapping person → rows")
    out = {}
    for u, v in persons.items():
        if isinstance(v, bool):
            raise VeilError(f"ledger: rows of a person must be a count or a list of rates, got {v!r}")
        if isinstance(v, (int, np.integer)):
            if int(v) < 0:
                raise VeilError("ledger: a person's row count is negative")
            out[str(u)] = [float(default_rate)] * int(v)
        elif isinstance(v, Sequence) or isinstance(v, np.ndarray):
            out[str(u)] = [float(x) for x in v]
        else:
            raise VeilError(f"ledger: rows of a person must be a count or a list of rates, got {type(v).__name__}")
    return out


def _population_epsilon(plan: Mapping) -> float:
    """ε_N of the plan's DP population estimate N̂ (Laplace, pure DP); 0 when N is public."""
    pop = (plan.get("data") or {}).get("population") or {}
    return float(pop.get("epsilon") or 0.0) if pop.get("mechanism") == "laplace" else 0.0


def pure_dp_rdp(eps: float, orders) -> np.ndarray:
    """ε-DP implies ½ε²-zCDP (Bun & Steinke 2016, Prop. 3.3) and D_α ≤ D_∞ = ε: (α, min(ε, αε²/2))-RDP."""
    a = np.asarray(orders, dtype=float)
    return np.minimum(eps, a * eps * eps / 2.0)


def population_costs(plan: Mapping, persons, orders=_rdp.ORDERS) -> dict[str, PersonCost]:
    """Each counted person's RDP cost of the plan's population estimate N̂ alone: one person moves N by
    one unit (a user), or for record units by each of their rows, so n rows cost n·ε_N by pure-DP group
    privacy. Empty when N is public under the plan's relation."""
    eps_n = _population_epsilon(plan)
    if eps_n <= 0:
        return {}
    mech = get_mechanism(str(plan.get("mechanism")))
    out = {}
    for u, r in person_rates(persons, 0.0).items():
        out[u] = PersonCost(rows=len(r), sampling_rate=0.0,
                            rdp=pure_dp_rdp(eps_n * mech.ledger_population_rows(len(r)), orders))
    return out


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
    """Each person's RDP cost for this release (module rdp for the derivation). The population
    estimate's share is added unless it was charged on its own when the plan was published
    (`population_charged`: plans that carry a population release key); older plans pay it here.

    Empty for a mechanism that makes no person-level claim (secret protection: its public N, q and σ
    move when a person is removed, so no per-person curve bounds it): the release charges nobody, and
    `veil ledger` says its people are not covered."""
    if not get_mechanism(str(plan.get("mechanism"))).ledger_person_claim:
        return {}
    out = _release_costs(plan, persons, orders)
    if population_charged:
        return out
    for u, extra in population_costs(plan, persons, orders).items():
        c = out[u]
        out[u] = PersonCost(rows=c.rows, sampling_rate=c.sampling_rate, rdp=np.asarray(c.rdp) + np.asarray(extra.rdp))
    return out


def _release_costs(plan: Mapping, persons, orders) -> dict[str, PersonCost]:
    """The plan's mechanism prices each person's rows (components.mechanisms: `ledger_costs`)."""
    try:
        mech = get_mechanism(str(plan.get("mechanism")))
    except VeilError as e:
        raise VeilError(f"ledger: cannot charge this release: {e}") from None
    _num(plan, "noise_multiplier"), _num(plan, "steps")      # one clear line when the plan lacks them
    return mech.ledger_costs(plan, person_rates(persons, _num(plan, "sampling_rate")), orders)


def secret_costs(plan_like: Mapping, targets: Sequence) -> list[SecretCost]:
    """Each secret's KL in this release: exactly the certificate's accountant
    (components.accounting.secrets.report_secrets: T × the max-direction per-step KL of the
    Poisson-binomial mixture at the rates of the records holding it) at the plan's σ and planned T.
    `targets`: SecretTarget (secret id `class:value`, rates, κ, γ), e.g. flows.stages.secret_targets."""
    from components.accounting.secrets import report_secrets

    if not get_mechanism(str(plan_like.get("mechanism"))).secret_targets:
        raise VeilError("ledger: per-secret KL is charged for secret-protection plans only")
    sigma, steps = _num(plan_like, "noise_multiplier"), int(_num(plan_like, "steps"))
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
    """The release's RDP cost to a person with the most rows the plan lets one person have (its public
    records_per_user bound; one row where the plan has none) — its population estimate included: the
    largest cost anyone pays, computed from the plan's public fields alone. Zero curve for a mechanism
    that charges nobody."""
    k = max(1, int(plan_like.get("records_per_user") or 1))
    costs = release_costs(plan_like, {"_": k}, orders)
    return np.asarray(costs["_"].rdp, dtype=float) if costs else np.zeros(len(orders))


def releases_for_fresh_person(plan_like: Mapping, budget: Budget, orders=_rdp.ORDERS,
                              conversion: str = _rdp.CONVERSION, weights=None) -> float:
    """How many releases of this plan, one after the other, a person who has spent nothing is admitted to
    under the filter with this budget (∞ for a release that charges nobody). Public: a function of the
    plan's public fields, the budget and the ledger's grid and conversion (its order weights: the
    recorded ones, or None for the rule's for this budget)."""
    cost = fresh_person_cost(plan_like, orders)
    b = _rdp.rdp_budget(budget.epsilon, budget.delta, orders, conversion, weights)
    return float(_rdp.releases_left(np.zeros((1, len(orders))), cost, b)[0])


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
