"""Secret protection (seed 004): per-record Poisson rates from the secret LP bound every secret's
posterior γ (KL case of Lemma 3.2); the unit is a secret's value, neighbours substitute it."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from components.core.errors import VeilError
from components.mechanisms.base import Bounded, Calibrated, Mechanism, PlanContext, register

if TYPE_CHECKING:      # annotations only (numpy loads where a hook computes)
    import numpy as np

TAGGED_ONLY = ("the guarantee covers tagged occurrences only: a secret the tagger missed (no detector "
               "matched it) is trained on as an untagged record and gets nothing from the per-secret bounds "
               "below, and untagged records have no certified guarantee. Persons are not covered either: no "
               "add/remove-person bound holds (the public N, q and σ move when a person is removed)")


class Secret(Mechanism):
    name = "secret"
    description = "secret-protection DP-SGD: LP-weighted per-record Poisson rates, per-secret posterior bounds"
    privacy_unit = "secret"
    neighbouring = "secret_substitution"
    auto_default = True
    secret_targets = True
    has_epsilon = False
    # No person-level claim (issue 22, case 3): the public plan carries the exact record count, q = B/N and
    # a σ the LP computes from everyone's data — removing one person moved N 208→207 and σ 9.7395→9.8308 —
    # so a per-person Rényi charge would not bound anything. The ledger records the release, charges each
    # secret its KL (sound under secret substitution) and charges, and retires, nobody.
    ledger_person_claim = False

    # --- planning -------------------------------------------------------------------------------
    def bound(self, ctx: PlanContext, train) -> Bounded:
        from components.bounding.secret_plan import plan_secret_rates  # startup

        ctx.say("solving the secret LP")
        lp_section, rates, chosen = plan_secret_rates(ctx.policy, train, ctx.snapshot.secret_spans,
                                                      expected_batch_size=ctx.batch)
        return Bounded(chosen=chosen, n_units=chosen.num_rows, records_per_user=None, rates=rates,
                       extra={"secret_lp": lp_section})

    def calibrate(self, ctx: PlanContext, bounded: Bounded) -> Calibrated:
        from components.bounding.secret_plan import calibrate_secret  # startup

        chosen = bounded.chosen
        q = ctx.batch / max(1, chosen.num_rows)       # the mean per-record rate, for display and training
        ctx.say("calibrating σ for every secret")
        accounting, sigma, target = calibrate_secret(ctx.policy, chosen, bounded.rates, ctx.snapshot.secret_spans,
                                                     steps=ctx.steps, cache_dir=ctx.cache_dir)
        population = {"unit": "records", "exact": int(chosen.num_rows), "mechanism": "none", "epsilon": 0.0,
                      "delta": 0.0,
                      "why": "secret-substitution neighbours differ in a secret's value, never in how many records "
                             "there are: the record count is the same on both sides, so publishing it costs nothing "
                             "under this relation (it is not protected either)"}
        return Calibrated(sampling_rate=q, expected_batch_size=int(ctx.batch), noise_multiplier=sigma, target=target,
                          accounting=accounting, population=population,
                          population_private={"unit": "records", "exact": int(chosen.num_rows)})

    # --- training -------------------------------------------------------------------------------
    def check_spec(self, spec, bad) -> None:
        if not (float(spec.clip_norm) > 0.0):
            bad("clip_norm", f"must be > 0, got {spec.clip_norm}")
        if spec.filter is not None:
            bad("filter", f"only a filtered mechanism takes a filter, not {self.name}")
        if spec.selection == "random-chunk":
            bad("selection", f"random-chunk needs per-user clipping (uls), not {self.name}")

    def unit_rates(self, spec, data, tok, by_user) -> np.ndarray:
        from components.dpsgd.data import record_rates  # startup

        rates = record_rates(data)
        mean_rate = float(rates.sum()) / len(rates) if len(rates) else 0.0
        if len(rates) and abs(mean_rate - float(spec.sampling_rate)) > 1e-6 * max(1e-12, float(spec.sampling_rate)):
            raise VeilError(f"training data: rate: mean per-record rate {mean_rate:.9g} differs from the plan's "
                            f"sampling_rate {spec.sampling_rate:.9g}; pass the plan's train records and rates")
        return rates

    def step_divisor(self, spec, rates: np.ndarray) -> float:
        # Σ rates: the LP's rates are public plan parameters, not a count of private units
        return float(rates.sum())

    # --- certificate ----------------------------------------------------------------------------
    def certify(self, plan: Mapping, train_result: Mapping, *, steps: int, caveats: list[str],
                secret_targets=None, untagged_rate=None, **_inputs) -> dict:
        """Per-secret posterior bounds (seed 004, Lemma 3.2, KL case), aggregated per class: secret ids
        carry the secrets' values, so the certificate — a registered document — holds aggregates only."""
        from components.accounting import LIBRARY_VERSION  # startup
        from components.accounting.secrets import (  # startup
            DEFAULT_SENSITIVITY,
            DOMINANCE_NOTE,
            SENSITIVITY_REASON,
            published_bounds,
            report_secrets,
        )

        if not secret_targets:
            raise VeilError("secret-protection run: no secret targets to certify (the plan's records hold no secret "
                            "of the policy's classes)")
        sigma = float(plan["noise_multiplier"])
        reports = report_secrets(secret_targets, sigma, steps) if steps > 0 else []
        classes: dict[str, dict] = {}
        for t in secret_targets:
            cls = t.secret_id.split(":", 1)[0]
            classes.setdefault(cls, {"kappa": t.kappa, "gamma_target": t.gamma, "n_secrets": 0, "max_gamma": t.kappa,
                                     "max_kl": 0.0, "max_kl_per_step": 0.0, "all_within_target": True})["n_secrets"] += 1
        for r in reports:
            c = classes[r.secret_id.split(":", 1)[0]]
            c["max_kl"] = max(c["max_kl"], float(r.kl))
            c["all_within_target"] = c["all_within_target"] and bool(r.meets_target)
        for c in classes.values():
            if c["max_kl"] > 0:
                # KL composes linearly over steps (accounting.secrets.secret_kl): the per-step figure is
                # kept so that a verifier can recompute γ from this certificate's own steps
                # (components.certificate.verify). All three as published: rounded up, the same on
                # every machine (components.core.canonical); γ is monotone in KL, so the class' γ is
                # that of its largest KL.
                c["max_kl_per_step"], c["max_kl"], c["max_gamma"] = published_bounds(c["max_kl"], steps, c["kappa"])
                c["all_within_target"] = c["all_within_target"] and (c["gamma_target"] is None
                                                                 or c["max_gamma"] <= float(c["gamma_target"]))
        return {
            "privacy_unit": self.privacy_unit,
            "neighbouring": self.neighbouring,
            "mechanism": self.name,
            # No (ε, δ): the guarantee is a per-secret bound on an attacker's posterior (γ for prior κ).
            "epsilon": None,
            "delta": None,
            "secrets": classes,
            "coverage": TAGGED_ONLY,
            # classes the catalog tagged in the training data but the policy does not protect: their
            # secrets are trained on as untagged records
            "ignored_classes": sorted((plan.get("secret_lp") or {}).get("ignored_classes") or []),
            "assumptions": [
                DOMINANCE_NOTE,
                SENSITIVITY_REASON,
                "which records hold a secret (the tagging) is public; only the secret's value is protected "
                "(Definition 3.1)",
                "each secret's records are sampled at their planned Poisson rates; the rates (an LP over every "
                "record's tags) are treated as given",
            ],
            "untagged_records": untagged_section(plan, untagged_rate, steps),
            "target": dict(plan["target"]),
            "within_target": all(c["all_within_target"] for c in classes.values()),
            "accountant": {"name": "per-secret KL of the Poisson-binomial mixture (seed 004, Lemma 3.2)",
                           "mechanism": "secret", "library": "veil + dp-accounting",
                           "library_version": LIBRARY_VERSION,
                           "sensitivity": DEFAULT_SENSITIVITY, "sensitivity_reason": SENSITIVITY_REASON},
            "dp_event": None,
            "contribution_bound": {"kind": "per-record Poisson rates from the secret LP",
                                   "selection": plan.get("selection"), "records_per_user": None},
        }

    def recompute_epsilon(self, doc: Mapping) -> float:
        raise VeilError("a secret-protection certificate has per-secret posterior bounds, not an ε")

    def within_target(self, doc: Mapping, epsilon: float) -> bool | None:
        return None

    def describe(self, doc: Mapping) -> str:
        parts = [f"{cls} γ≤{c['max_gamma']:.3g} (κ={c['kappa']:g}, target {c['gamma_target']:g})"
                 for cls, c in sorted(doc["secrets"].items())]
        return "secret-level: " + "; ".join(parts)

    # --- ledger ---------------------------------------------------------------------------------
    def ledger_costs(self, plan: Mapping, rates: dict[str, list[float]], orders) -> dict:
        raise VeilError("ledger: a secret-protection release makes no person-level claim (its public N, q and σ "
                        "move when a person is removed); it is charged per secret only")


def untagged_section(plan: Mapping, untagged_rate: float | None, steps: int) -> dict:
    """What a record holding no protected secret gets: no certified guarantee (issue 22, case 3).

    It used to state a record-level (ε, δ) "under add/remove of that record, every other record's rate
    held fixed". No relation makes that true: adding or removing a record changes the LP's rates, N
    and σ (all public); replacing an untagged record's content moves the audit split (which keys on the
    texts) and so other records. Under the relation this release does satisfy — secret substitution,
    every record fixed — an untagged record does not change at all, so there is nothing to state. Its
    largest Poisson rate (public under the relation: the LP reads tags, not values) and the per-step
    noise are said for information only."""
    policy = (plan.get("secret_lp") or {}).get("untagged_records")
    if untagged_rate is None or untagged_rate <= 0:
        return {"policy": policy, "trained_on": False, "max_rate": None, "epsilon": None, "delta": None,
                "guarantee": "no record without a protected secret was trained on: nothing to cover"}
    return {"policy": policy, "trained_on": True, "max_rate": float(untagged_rate), "epsilon": None, "delta": None,
            "guarantee": ("none certified: records without a protected secret are trained (Poisson rate ≤ "
                          f"{float(untagged_rate):.4g}, clipped to C, noise σ={float(plan['noise_multiplier']):g}·C "
                          "per step), but no record-level or person-level ε holds for them — adding, removing or "
                          "rewriting a record moves the LP's rates, N, σ or the audit split, which are public; the "
                          "release's relation (secret substitution) keeps every record fixed. Treat their content "
                          "as unprotected")}


register(Secret)
