"""The Poisson-subsampled Gaussian family: ULS, ELS, group privacy and record-level DP-SGD.

They share everything but three choices, which each module states: the Poisson unit (a user or a
record), the contribution bound (every record, ≤ k, exactly k) and the accounting model of one step
(a Gaussian of sensitivity 1, or the Binomial(k, q) mixture of Gaussians). Under add/remove
neighbouring the number N of units is private: q = B/N̂ with N̂ = N + Laplace(Δ/ε_N), paid from ε
by basic composition (docs/privacy/threat-model.md).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from components.core.canonical import described_event, epsilon_up, round_sig, sum_up
from components.core.errors import VeilError
from components.draws.annex import laplace_noise, population_digest, prf
from components.mechanisms.base import Bounded, Calibrated, Mechanism, PlanContext, population_epsilon


def library_version() -> str:
    # (importlib.metadata here, not at module top: ~20 ms of email parsing every command paid that
    # reads a policy, for a version only a plan or certificate records)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-accounting")
    except PackageNotFoundError:
        return "unknown"


def accounting_section(cal: Any, model: str) -> dict:
    """A calibration as the plan's accounting section."""
    d = cal.to_dict() if hasattr(cal, "to_dict") else dict(cal)
    return {
        "epsilon": float(d["epsilon"]),
        "delta": float(d["delta"]),
        "mechanism": model,
        "dp_event": described_event(d.get("dp_event")),
        "accountant": (f"dp_accounting PLD ({d.get('accountant', 'pld')}, "
                       f"{'pessimistic' if d.get('pessimistic', True) else 'optimistic'}, "
                       f"discretization {d.get('discretization', 'default')}, "
                       f"{d.get('accountant_version', '')})").replace(", )", ")"),
        "library_version": d.get("library_version", library_version()),
    }


def population_estimate(key: bytes, *, mechanism: str, unit: str, sensitivity: int, why: str, k: int,
                        n_exact: int, epsilon_total: float, fraction: float, counted: str) -> tuple[dict, dict]:
    """(public section, annex section) of the DP estimate N̂ = N + Laplace(Δ/ε_N).

    The noise is keyed on what N counts (`counted`: draws.annex.population_digest of the trained
    units) and on the release's parameters: re-planning the same population gives the same N̂ (nothing
    new is released, no averaging), and any other population draws fresh noise — a release of its own,
    which the ledger charges to everyone it counts (`release_key`, ledger.charge_population)."""
    eps_n = float(fraction) * float(epsilon_total)
    scale = sensitivity / eps_n
    parts = ("population/v2", counted, mechanism, int(k), repr(float(scale)))
    noise = laplace_noise(key, scale, *parts)
    # N̂ is rounded (post-processing of the Laplace release) so that libm's last bits in the draw
    # (log1p) cannot change q = B/N̂ and with it the plan's identity from one machine to another
    # (components.core.canonical); the annex keeps the noise actually added, N̂ − N.
    estimate = round_sig(float(n_exact) + noise, what="population estimate")
    noise = estimate - float(n_exact)
    public = {"unit": unit, "estimate": estimate, "mechanism": "laplace", "epsilon": eps_n, "delta": 0.0,
              "sensitivity": sensitivity, "scale": scale, "sensitivity_reason": why,
              "composition": "basic: the certificate's ε is ε_N + ε_DP-SGD at the same δ"}
    return public, {"unit": unit, "exact": int(n_exact), "noise": noise,
                    "release_key": prf(key, "population-release", *parts).hex()}


class PopulationRefusal(VeilError):
    """The planner refused because N̂ < B (`SubsampledGaussian.calibrate`).

    The decision reads only the DP estimate N̂ and the public batch B: it is a post-processing of the
    Laplace release. But it is observable — no plan, no model, this message with N̂ in it — so the N̂
    that made it is a release like a published one, and the planner charges it to everyone it counted
    before the refusal leaves (`flows.stages.plan_snapshot`, issue 22). `population`/`release_key` say
    which N̂; `persons` (the counted training rows, set by `make_plan`) and `plan_like` (what the ledger
    prices it from) are private and never pickled: a copy (a Prefect state) is a plain VeilError with
    the message only."""

    def __init__(self, message: str, *, population: dict, release_key: str):
        super().__init__(message)
        self.population = dict(population)
        self.release_key = release_key
        self.persons = None          # pyarrow table of the counted rows (user_id[, rate, owners]): private
        self.plan_like: dict | None = None

    def __reduce__(self):
        return (VeilError, (str(self),))


def _count(x: float) -> int | None:
    """A count of releases for a document: None for ∞ (a release that costs nothing)."""
    return None if x == float("inf") else int(x)


class SubsampledGaussian(Mechanism):
    """Poisson sampling at q = B/N̂, clipped unit gradients, Gaussian noise σC once per step."""

    accounting_model: ClassVar[str]
    population_estimate = True
    contribution_kind: ClassVar[str] = "records per user"

    # --- planning -------------------------------------------------------------------------------
    def population_sensitivity(self, k: int) -> tuple[str, int, str]:
        """(unit word, Δ, why): the largest change one privacy unit makes to N."""
        raise NotImplementedError

    def calibrate(self, ctx: PlanContext, bounded: Bounded) -> Calibrated:
        from components.accounting import calibrate as calibrate_sigma  # startup

        spec = ctx.spec
        target = {"epsilon": float(spec.target.epsilon), "delta": float(spec.target.delta)}
        unit, sens, why = self.population_sensitivity(int(ctx.k))
        population, private = population_estimate(
            ctx.key, mechanism=self.name, unit=unit, sensitivity=sens, why=why, k=int(ctx.k),
            n_exact=int(bounded.n_units), epsilon_total=target["epsilon"],
            fraction=float(spec.population.epsilon_fraction), counted=population_digest(ctx.key, bounded.chosen))
        batch = int(ctx.batch)
        if population["estimate"] < batch:
            # (N̂'s noise is public in scale only; a small population may fall under the batch by noise
            # alone, and re-planning the same inputs draws the same noise: say which knobs move it)
            raise PopulationRefusal(
                f"spec.training.expected_batch_size: {batch} {unit} per step but the (DP) estimate of the {unit} "
                f"that can be trained on is {population['estimate']:.1f} (Laplace noise of scale "
                f"{population['scale']:.3g}: spec.population.epsilon_fraction "
                f"{float(spec.population.epsilon_fraction):g} of ε; the estimate is charged ε_N to the people "
                "it counts, as a published one is); lower the batch, or give the estimate a larger share of ε",
                population=population, release_key=private["release_key"])
        q = batch / population["estimate"]
        eps_n = float(population["epsilon"])
        eps_sgd_target = target["epsilon"] - eps_n
        model = self.accounting_model
        ctx.say(f"calibrating σ ({model}, q={q:.4g}, T={ctx.steps}, ε_DP-SGD={eps_sgd_target:.4g} "
                f"after ε_N={eps_n:.3g})")
        cal = calibrate_sigma(model, epsilon=eps_sgd_target, delta=target["delta"], sampling_rate=q,
                              steps=ctx.steps, k=self.accounting_k(ctx.k), cache_dir=ctx.cache_dir)
        sigma = float(cal.noise_multiplier)
        accounting = accounting_section(cal, model)
        eps_sgd = accounting["epsilon"]     # the calibration's, at the rounded σ, rounded up
        accounting.update({"epsilon": sum_up(eps_n, eps_sgd), "epsilon_dp_sgd": eps_sgd, "epsilon_population": eps_n})
        if accounting["epsilon"] > target["epsilon"] * (1 + 1e-9):
            raise VeilError(f"accounting: calibrated σ={sigma:g} gives ε={accounting['epsilon']:g} (ε_N {eps_n:g} + "
                            f"DP-SGD {eps_sgd:g}) above the target {target['epsilon']:g}; refusing to plan")
        extra = {}
        if spec.schedule is not None:
            cal, schedule = self._fit_schedule(ctx, bounded, q, population, eps_n, cal, model, target)
            sigma = float(cal.noise_multiplier)
            accounting = accounting_section(cal, model)
            eps_sgd = accounting["epsilon"]
            accounting.update({"epsilon": sum_up(eps_n, eps_sgd), "epsilon_dp_sgd": eps_sgd,
                               "epsilon_population": eps_n})
            schedule["epsilon_per_release"] = accounting["epsilon"]
            extra["schedule"] = schedule
        caveat = (f"the number of training {unit} is private: only a Laplace estimate N̂ "
                  f"(ε_N = {eps_n:.4g}, sensitivity {sens}) is used and published; "
                  f"q = B/N̂ and the step's divisor B depend on N̂ alone, and ε includes ε_N")
        return Calibrated(sampling_rate=q, expected_batch_size=batch, noise_multiplier=sigma, target=target,
                          accounting=accounting, population=population, population_private=private,
                          caveats=[caveat], extra=extra)

    def _fit_schedule(self, ctx: PlanContext, bounded: Bounded, q: float, population: dict, eps_n: float, cal,
                      model: str, target: dict):
        """The policy's schedule (issue 26): lower this release's DP-SGD ε until `schedule.releases` releases
        of the plan, one after the other, fit under the lifetime budget's filter for the person who pays the
        most (the most rows the plan allows; N̂'s charge included), on the ledger's grid and conversion.
        σ is found by bisection on the filter's own test (the RDP cost falls as σ grows), then the
        calibration is asked for that σ's PLD ε and its σ checked to fit — so the plan's σ is one the
        filter admits `releases` times, and its ε the largest (to the calibration's tolerance) that does.
        Returns (the calibration, the plan's public `schedule` section)."""
        from components.accounting import calibrate as calibrate_sigma, epsilon as account  # startup
        from components.renyi import rdp as _rdp  # startup
        from components.renyi.costs import Budget, releases_for_fresh_person  # startup

        spec = ctx.spec
        n = int(spec.schedule.releases)
        budget = Budget.parse(spec.lifetime_budget.model_dump())
        orders, conversion, *rest = ctx.ledger_filter or (_rdp.ORDERS, _rdp.CONVERSION, None)
        weights = rest[0] if rest else None
        k = self.accounting_k(ctx.k)

        def left(sigma: float) -> float:
            return releases_for_fresh_person(
                self, {"mechanism": self.name, "sampling_rate": q, "noise_multiplier": float(sigma), "steps": ctx.steps,
                 "records_per_user": bounded.records_per_user, "data": {"population": population}},
                budget, tuple(orders), conversion, weights)

        first = float(cal.noise_multiplier)
        doc = {"releases": n, "cadence": spec.schedule.cadence, "target_epsilon": target["epsilon"],
               "lifetime_budget": {"epsilon": budget.epsilon, "delta": budget.delta}, "conversion": conversion,
               "rule": "each release's ε is the largest (target at most) for which `releases` releases of this plan "
                       "fit under the ledger's Rényi filter for a person with the most rows the plan allows"}
        if left(first) >= n:
            return cal, {**doc, "lowered": False, "releases_for_a_new_person": _count(left(first))}
        ctx.say(f"schedule: {n} releases do not fit at ε={target['epsilon']:g}; lowering this release's ε")
        lo, hi = first, 2.0 * first
        while left(hi) < n:
            lo, hi = hi, 2.0 * hi
            if hi > 1e4:
                raise VeilError(f"spec.schedule.releases: {n} releases cannot fit under the lifetime budget "
                                f"ε={budget.epsilon:g}, δ={budget.delta:g} at any noise: the population estimate's "
                                f"share (ε_N={eps_n:.3g} a release) alone does not fit {n} times; lower the schedule "
                                "or spec.population.epsilon_fraction, or raise lifetime_budget")
        while hi / lo > 1.0 + 1e-4:
            mid = (lo * hi) ** 0.5
            lo, hi = (lo, mid) if left(mid) >= n else (mid, hi)
        goal = float(account(model, sampling_rate=q, noise_multiplier=hi, steps=ctx.steps, delta=target["delta"],
                             k=k).epsilon)
        for _ in range(20):
            got = calibrate_sigma(model, epsilon=goal, delta=target["delta"], sampling_rate=q, steps=ctx.steps,
                                  k=k, cache_dir=ctx.cache_dir)
            if left(float(got.noise_multiplier)) >= n:
                fit = _count(left(float(got.noise_multiplier)))
                return got, {**doc, "lowered": True, "releases_for_a_new_person": fit}
            goal *= 0.999          # the calibration's σ is within its tolerance below σ*: ask for a little less
        raise VeilError(f"spec.schedule.releases: could not calibrate σ so that {n} releases fit (σ* = {hi:.5g}); "
                        "this is a bug: report it")

    # --- certificate ----------------------------------------------------------------------------
    def certify(self, plan: Mapping, train_result: Mapping, *, steps: int, caveats: list[str], **_inputs) -> dict:
        from components.accounting import epsilon as account  # startup

        model = self.accounting_model
        delta = float(plan["target"]["delta"])
        if steps == 0:
            eps_sgd, event, meta = 0.0, {"name": "NoOpDpEvent"}, {}
        else:
            res = account(model, sampling_rate=float(plan["sampling_rate"]),
                          noise_multiplier=float(plan["noise_multiplier"]), steps=steps, delta=delta,
                          k=self.accounting_k(plan.get("records_per_user")))
            # rounded up like the plan's (components.core.canonical): the same on every machine, and
            # never below what a verifier recomputes
            eps_sgd, event = float(res.epsilon), described_event(res.dp_event)
            if not math.isfinite(eps_sgd):
                raise VeilError(f"no finite ε reaches δ={delta:g} for this run: not certifiable")
            eps_sgd = epsilon_up(eps_sgd)
            meta = {"library_version": res.library_version, "pessimistic": res.pessimistic,
                    "discretization": res.discretization, "notes": list(res.notes)}
        # The population estimate N̂ was released with the plan (q depends on it), steps or not.
        pop = (plan.get("data") or {}).get("population") or {}
        eps_n = float(pop.get("epsilon") or 0.0)
        eps_value = sum_up(eps_n, eps_sgd)
        return {
            "privacy_unit": self.privacy_unit,
            "neighbouring": self.neighbouring,
            "mechanism": self.name,
            "epsilon": eps_value,
            "delta": delta,
            "epsilon_parts": {"population_estimate": eps_n, "dp_sgd": eps_sgd,
                              "composition": "basic (ε adds, δ is DP-SGD's)"},
            "target": dict(plan["target"]),
            "within_target": eps_value <= float(plan["target"]["epsilon"]) + 1e-12,
            "accountant": {"name": "dp_accounting.pld.PLDAccountant", "mechanism": model,
                           "library": "dp-accounting", **meta},
            "dp_event": event,
            "contribution_bound": {"records_per_user": plan.get("records_per_user"),
                                   "selection": plan.get("selection"), "kind": self.contribution_kind},
        }

    def recompute_epsilon(self, doc: Mapping) -> float:
        from components.accounting import epsilon as account  # startup

        stated = (doc.get("accountant") or {}).get("mechanism")
        if stated != self.accounting_model:
            raise VeilError(f"certificate: mechanism {self.name!r} is accounted as {self.accounting_model!r}, "
                            f"but the certificate's accountant says {stated!r}")
        eps_n = population_epsilon(doc)
        if int(doc["steps"]) == 0:
            return eps_n
        k = self.accounting_k((doc.get("contribution_bound") or {}).get("records_per_user"))
        return eps_n + float(account(self.accounting_model, sampling_rate=float(doc["sampling_rate"]),
                                     noise_multiplier=float(doc["noise_multiplier"]), steps=int(doc["steps"]),
                                     delta=float(doc["delta"]), k=k).epsilon)

    # --- ledger ---------------------------------------------------------------------------------
    def ledger_costs(self, plan: Mapping, rates: dict[str, list[float]], orders) -> dict:
        """Each of a person's rows is its own Poisson draw at its rate; their rows' RDP (module
        components.renyi.rdp for the derivation)."""
        import numpy as np

        from components.renyi.costs import PersonCost  # startup

        sigma, steps = float(plan["noise_multiplier"]), int(plan["steps"])
        cache: dict[tuple, tuple[float, np.ndarray]] = {}
        made: dict[tuple, PersonCost] = {}     # one (immutable) cost per (rates, rows), shared by its people
        out = {}
        for u, r in rates.items():
            key = tuple(sorted(x for x in r if x > 0))
            c = made.get((key, len(r)))
            if c is None:
                if key not in cache:
                    p = np.asarray(key, dtype=float)
                    q_any = (float(-np.expm1(np.log1p(-p).sum())) if len(p) and np.all(p < 1)
                             else (1.0 if len(p) else 0.0))
                    cache[key] = (q_any, self.rows_curve(key, sigma, steps, orders))
                c = made[(key, len(r))] = PersonCost(rows=len(r), sampling_rate=cache[key][0], rdp=cache[key][1])
            out[u] = c
        return out


class UserBounded(SubsampledGaussian):
    """User-level mechanisms over records bounded per user (ELS, group): records are the Poisson unit,
    one person is up to k of them, accounted as the Binomial(k, q) mixture."""

    privacy_unit = "user"
    neighbouring = "add_remove_user"
    bounds_records = True
    exactly_k: ClassVar[bool] = False

    def accounting_k(self, records_per_user) -> int:
        return int(records_per_user or 0)

    def bound(self, ctx: PlanContext, train) -> Bounded:
        from components.draws.selection import select_records  # startup

        chosen = select_records(train, ctx.k, ctx.selection, seed=ctx.seed, scorer=ctx.scorer,
                                exactly_k=self.exactly_k, key=ctx.key)
        return Bounded(chosen=chosen, n_units=chosen.num_rows, records_per_user=int(ctx.k))
