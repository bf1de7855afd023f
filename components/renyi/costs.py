"""What a release costs one person, one secret, and the lifetime budget it is measured against.

Pricing a plan's people needs the plan's mechanism: it is passed in (`mech`, a registered
`components.mechanisms.base.Mechanism`), never looked up here, because the registry sits above this
floor. `components.ledger.release` looks it up and calls these; the mechanisms call them with
themselves (the schedule's fit of σ to a lifetime budget).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from components.core.errors import VeilError
from components.renyi import rdp as _rdp


@dataclass(frozen=True)
class Budget:
    epsilon: float
    delta: float

    @classmethod
    def parse(cls, b) -> "Budget | None":
        if b is None:
            return None
        if isinstance(b, Budget):
            return b
        get = b.get if isinstance(b, Mapping) else (lambda k: getattr(b, k))
        out = cls(float(get("epsilon")), float(get("delta")))
        _rdp.rdp_budget(out.epsilon, out.delta)  # validates
        return out


@dataclass(frozen=True)
class PersonCost:
    """One person's cost in one release: their rows, their q' and the RDP curve on the ledger's orders."""
    rows: int
    sampling_rate: float
    rdp: np.ndarray = field(compare=False)


@dataclass(frozen=True)
class SecretCost:
    """One secret's KL in one release (components.accounting.secrets: T × per-step KL at the rates of the
    records holding it) and its class' prior κ and lifetime posterior target γ. `secret_id` is the
    catalog's `class:value`: it stays in memory; the ledger stores only its HMAC pseudonym."""
    secret_id: str
    secret_class: str
    kl: float
    kappa: float
    gamma: float
    records: int = 0


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
    # people with the same row count share one list of rates (nothing mutates them): 10⁶ people, a few lists
    same: dict[int, list[float]] = {}
    for u, v in persons.items():
        if isinstance(v, bool):
            raise VeilError(f"ledger: rows of a person must be a count or a list of rates, got {v!r}")
        if isinstance(v, (int, np.integer)):
            if int(v) < 0:
                raise VeilError("ledger: a person's row count is negative")
            r = same.get(int(v))
            if r is None:
                r = same[int(v)] = [float(default_rate)] * int(v)
            out[str(u)] = r
        elif isinstance(v, Sequence) or isinstance(v, np.ndarray):
            out[str(u)] = [float(x) for x in v]
        else:
            raise VeilError(f"ledger: rows of a person must be a count or a list of rates, got {type(v).__name__}")
    return out


def plan_population_epsilon(plan: Mapping) -> float:
    """ε_N of the plan's DP population estimate N̂ (Laplace, pure DP); 0 when N is public."""
    pop = (plan.get("data") or {}).get("population") or {}
    return float(pop.get("epsilon") or 0.0) if pop.get("mechanism") == "laplace" else 0.0


def pure_dp_rdp(eps: float, orders) -> np.ndarray:
    """ε-DP implies ½ε²-zCDP (Bun & Steinke 2016, Prop. 3.3) and D_α ≤ D_∞ = ε: (α, min(ε, αε²/2))-RDP."""
    a = np.asarray(orders, dtype=float)
    return np.minimum(eps, a * eps * eps / 2.0)


def plan_number(plan: Mapping, key: str) -> float:
    try:
        return float(plan[key])
    except (KeyError, TypeError, ValueError):
        raise VeilError(f"ledger: the plan has no usable {key!r}") from None


def population_costs(mech, plan: Mapping, persons, orders=_rdp.ORDERS) -> dict[str, PersonCost]:
    """Each counted person's RDP cost of the plan's population estimate N̂ alone: one person moves N by
    one unit (a user), or for record units by each of their rows, so n rows cost n·ε_N by pure-DP group
    privacy (`mech.ledger_population_rows`). Empty when N is public under the plan's relation."""
    eps_n = plan_population_epsilon(plan)
    if eps_n <= 0:
        return {}
    out = {}
    made: dict[int, PersonCost] = {}       # one (immutable) cost per row count, shared by its people
    for u, r in person_rates(persons, 0.0).items():
        c = made.get(len(r))
        if c is None:
            c = made[len(r)] = PersonCost(rows=len(r), sampling_rate=0.0,
                                          rdp=pure_dp_rdp(eps_n * mech.ledger_population_rows(len(r)), orders))
        out[u] = c
    return out


def training_costs(mech, plan: Mapping, persons, orders=_rdp.ORDERS) -> dict[str, PersonCost]:
    """The release's DP-SGD part alone, as `mech` prices each person's rows (`ledger_costs`): no
    population estimate, and no check that the mechanism makes a person-level claim."""
    plan_number(plan, "noise_multiplier"), plan_number(plan, "steps")      # one clear line when the plan lacks them
    return mech.ledger_costs(plan, person_rates(persons, plan_number(plan, "sampling_rate")), orders)


def release_costs(mech, plan: Mapping, persons, orders=_rdp.ORDERS, *, population_charged: bool = False
                  ) -> dict[str, PersonCost]:
    """Each person's RDP cost for this release of `mech` (module rdp for the derivation). The population
    estimate's share is added unless it was charged on its own when the plan was published
    (`population_charged`: plans that carry a population release key); older plans pay it here.

    Empty for a mechanism that makes no person-level claim (secret protection: its public N, q and σ
    move when a person is removed, so no per-person curve bounds it): the release charges nobody, and
    `veil ledger` says its people are not covered."""
    if not mech.ledger_person_claim:
        return {}
    out = training_costs(mech, plan, persons, orders)
    if population_charged:
        return out
    for u, extra in population_costs(mech, plan, persons, orders).items():
        c = out[u]
        out[u] = PersonCost(rows=c.rows, sampling_rate=c.sampling_rate, rdp=np.asarray(c.rdp) + np.asarray(extra.rdp))
    return out


def fresh_person_cost(mech, plan_like: Mapping, orders=_rdp.ORDERS) -> np.ndarray:
    """The release's RDP cost to a person with the most rows the plan lets one person have (its public
    records_per_user bound; one row where the plan has none) — its population estimate included: the
    largest cost anyone pays, computed from the plan's public fields alone. Zero curve for a mechanism
    that charges nobody."""
    k = max(1, int(plan_like.get("records_per_user") or 1))
    costs = release_costs(mech, plan_like, {"_": k}, orders)
    return np.asarray(costs["_"].rdp, dtype=float) if costs else np.zeros(len(orders))


def releases_for_fresh_person(mech, plan_like: Mapping, budget: Budget, orders=_rdp.ORDERS,
                              conversion: str = _rdp.CONVERSION, weights=None) -> float:
    """How many releases of this plan, one after the other, a person who has spent nothing is admitted to
    under the filter with this budget (∞ for a release that charges nobody). Public: a function of the
    plan's public fields, the budget and the ledger's grid and conversion (its order weights: the
    recorded ones, or a rule's name — the ledger's, until its budget is fixed — for that rule's shares
    for this budget, or None for a new ledger's rule)."""
    cost = fresh_person_cost(mech, plan_like, orders)
    b = _rdp.rdp_budget(budget.epsilon, budget.delta, orders, conversion, weights)
    return float(_rdp.releases_left(np.zeros((1, len(orders))), cost, b)[0])
