"""Asi & Liu's filtered ULS (seed 000, Alg. 3), opt-in: every user every step, unclipped per-user
means, a sparse-vector concentration test that may halt the run, and Gaussian noise ∝ τ on the
filtered mean. Under replace-one-user neighbouring the user count is public (docs/privacy/filtered-uls.md)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from components.core.canonical import described, epsilon_up, sum_up
from components.core.errors import VeilError
from components.mechanisms.base import Bounded, Calibrated, PlainStep, PlanContext, register
from components.mechanisms.gaussian import accounting_section
from components.mechanisms.uls import ULS

if TYPE_CHECKING:      # annotations only (numpy loads where a hook computes)
    import numpy as np


class FilteredULS(ULS):
    name = "uls-filtered"
    description = "filtered user-level DP-SGD (Asi & Liu 2024): full batch, sparse-vector concentration test"
    neighbouring = "replace_one_user"
    accounting_model = None          # sparse vector + full-batch Gaussian: no single PLD model
    takes_filter = True
    may_halt = True
    population_estimate = False      # replace-one: the user count is public
    clipped = False                  # noise ∝ τ on unclipped means
    ledger_curve = False             # (ε, δ) through a sparse vector: no Rényi curve to charge
    per_user_clip = False            # no clipping at all: random-chunk has nothing to bound
    auto_default = False
    contribution_kind = "filtered mean of unclipped per-user mean gradients (sensitivity 60τ/W_min)"

    def check_policy(self, spec) -> str | None:
        if spec.filter is None:
            return "@filter@ mechanism 'uls-filtered' needs filter.tau, and only it takes a filter"
        return super().check_policy(spec)

    def calibrate(self, ctx: PlanContext, bounded: Bounded) -> Calibrated:
        from components.accounting.filtered import calibrate_filtered, filtered_noise  # startup

        spec = ctx.spec
        n_units = int(bounded.n_units)
        target = {"epsilon": float(spec.target.epsilon), "delta": float(spec.target.delta)}
        ctx.say(f"calibrating σ (filtered ULS: sparse vector ε/2 + {ctx.steps} full-batch Gaussian steps at ε/2)")
        cal = calibrate_filtered(epsilon=target["epsilon"], delta=target["delta"], steps=ctx.steps)
        sigma = float(cal.noise_multiplier)
        # refuses (one line) when there are too few users for the bound
        noise = filtered_noise(epsilon=target["epsilon"], delta=target["delta"], steps=ctx.steps, n_users=n_units,
                               tau=float(spec.filter.tau), noise_multiplier=sigma)
        gauss = accounting_section(cal, "record")
        # ε_Gaussian is the calibration's (rounded up at the rounded σ); the filter's constants come from
        # libm's exp/log and are described to DESCRIBED_DIGITS (the trainer recomputes them): the plan is
        # the same on every machine (components.core.canonical)
        accounting = {**gauss, "mechanism": self.name, "epsilon": sum_up(target["epsilon"] / 2, gauss["epsilon"]),
                      "delta": target["delta"] / 2 + target["delta"] / 4,  # Gaussian δ/2 + e^ε·δ1 = δ/4
                      "epsilon_sparse_vector": target["epsilon"] / 2, "epsilon_gaussian": gauss["epsilon"],
                      "filter_noise": described(noise.to_dict())}
        population = {"unit": "users", "exact": n_units, "mechanism": "none", "epsilon": 0.0, "delta": 0.0,
                      "why": "replace-one-user neighbouring keeps the number of users fixed, so it is public under "
                             "this relation (the filter's noise is calibrated to it)"}
        return Calibrated(
            sampling_rate=1.0, expected_batch_size=n_units, noise_multiplier=sigma, target=target,
            accounting=accounting, population=population, population_private={"unit": "users", "exact": n_units},
            extra={"filter": {"tau": float(spec.filter.tau), "epsilon": target["epsilon"],
                              "delta": target["delta"], "variant": "veil"}},
            caveats=["filtered ULS may halt before its planned steps if users' gradients are not concentrated "
                     "within τ; see docs/privacy/filtered-uls.md for the bound and its assumptions"])

    # --- training -------------------------------------------------------------------------------
    def check_spec(self, spec, bad) -> None:
        f = spec.filter
        if not isinstance(f, dict) or not {"tau", "epsilon", "delta"} <= set(f):
            bad("filter", "uls-filtered needs {tau, epsilon, delta}")
        if not float(f["tau"]) > 0 or not float(f["epsilon"]) > 0 or not 0 < float(f["delta"]) < 1:
            bad("filter", f"need tau > 0, epsilon > 0, 0 < delta < 1; got {f}")
        if f.get("variant", "veil") not in ("veil", "seed"):
            bad("filter.variant", f"{f.get('variant')!r} is not one of veil, seed")
        if float(spec.sampling_rate) != 1.0:
            bad("sampling_rate", f"uls-filtered takes every user every step (1.0), got {spec.sampling_rate}")
        if spec.records_per_user is None or int(spec.records_per_user) < 1:
            bad("records_per_user", f"{self.name} needs an integer ≥ 1, got {spec.records_per_user}")
        if spec.selection == "random-chunk":
            bad("selection", f"random-chunk needs per-user clipping (uls), not {self.name}")

    def check_runtime(self, world_size: int) -> None:
        if world_size > 1:
            raise VeilError("uls-filtered runs in one process (it needs every user's gradient in one place)")

    def step_divisor(self, spec, rates: np.ndarray) -> float:
        return float(rates.sum())     # every user, every step: N is public under replace-one

    def batch_mode(self, spec) -> str:
        return "uls"

    def make_step(self, spec, model, optimizer, *, n_units: int, private_seed: int, dctx, expected: float):
        from components.accounting.filtered import filtered_noise  # startup
        from components.dpsgd.filtered import FilteredStep, SparseVector  # startup

        f = spec.filter
        variant = f.get("variant", "veil")
        noise = filtered_noise(epsilon=float(f["epsilon"]), delta=float(f["delta"]), steps=int(spec.steps),
                               n_users=n_units, tau=float(f["tau"]), noise_multiplier=float(spec.noise_multiplier),
                               variant=variant)
        svt = SparseVector(threshold=noise.threshold, threshold_scale=noise.threshold_scale,
                           query_scale=noise.query_scale, private_seed=private_seed)
        return _FilteredRunner(FilteredStep(model, optimizer, tau=float(f["tau"]), noise_std=noise.std, svt=svt,
                                            micro_batch_size=spec.micro_batch_size, private_seed=private_seed,
                                            per_record=spec.per_record, variant=variant), spec)

    # --- certificate ----------------------------------------------------------------------------
    def check_run(self, plan: Mapping, train_result: Mapping) -> None:
        f = dict(plan.get("filter") or {})
        if f.get("variant", "veil") != "veil":
            raise VeilError("uls-filtered with the paper's printed noise (variant 'seed') has no privacy proof we "
                            "could check: not certifiable; use variant 'veil'")
        if dict((train_result.get("extra") or {}).get("filter") or {}) != f:
            raise VeilError(f"training used filter {train_result.get('extra', {}).get('filter')} but the plan says {f}")

    def certified_steps(self, plan: Mapping, train_result: Mapping, started: int) -> int:
        """Noisy updates to charge: every started step except the one whose test halted the run."""
        halted = (train_result.get("extra") or {}).get("halted_at_step")
        return started - (1 if halted is not None and started > int(halted) else 0)

    def certify(self, plan: Mapping, train_result: Mapping, *, steps: int, caveats: list[str], **_inputs) -> dict:
        """ε/2 for the sparse vector + the full-batch Gaussian steps' ε at δ/2; δ = δ/2 + e^ε·δ1
        (components.accounting.filtered). `steps` are the Gaussian steps (certified_steps)."""
        from components.accounting import LIBRARY_VERSION  # startup
        from components.accounting.filtered import filtered_epsilon, filtered_noise  # startup

        f = dict(plan.get("filter") or {})
        pop = (plan.get("data") or {}).get("population") or {}
        if pop.get("exact") is None:
            raise VeilError("uls-filtered plan: its population section does not give the (public, replace-one) "
                            "user count")
        noise = filtered_noise(epsilon=float(f["epsilon"]), delta=float(f["delta"]), steps=int(plan["steps"]),
                               n_users=int(pop["exact"]), tau=float(f["tau"]),
                               noise_multiplier=float(plan["noise_multiplier"]))
        acc = filtered_epsilon(epsilon=float(f["epsilon"]), delta=float(f["delta"]),
                               noise_multiplier=float(plan["noise_multiplier"]), steps_run=steps)
        # as published (components.core.canonical): ε_Gaussian rounded up, ε the smallest float ≥ the
        # exact sum; the same on every machine, never below the computed figure. (δ_test = e^ε·δ1 is
        # δ/4 up to the last bit, exactly on a rounding boundary: rounding it would move it a whole
        # digit on one machine and not another, so it is left as computed.)
        eps_g = epsilon_up(float(acc["epsilon_gaussian"]))
        acc = {**acc, "epsilon_gaussian": eps_g, "epsilon": sum_up(float(acc["epsilon_sparse_vector"]), eps_g)}
        caveats.append("filtered ULS (Asi & Liu 2024, seed 000 Alg. 3) with Veil's own sensitivity bound "
                       "(docs/privacy/filtered-uls.md), under replace-one-user neighbouring with the user count public")
        return {
            "privacy_unit": self.privacy_unit,
            "neighbouring": self.neighbouring,
            "mechanism": self.name,
            "epsilon": float(acc["epsilon"]),
            "delta": float(acc["delta"]),
            "target": dict(plan["target"]),
            "within_target": acc["epsilon"] <= float(plan["target"]["epsilon"]) + 1e-12
                             and acc["delta"] <= float(plan["target"]["delta"]) * (1 + 1e-12),
            "accountant": {"name": "sparse vector (pure ε/2) + dp_accounting PLD of full-batch Gaussian steps",
                           "mechanism": self.name, "library": "veil + dp-accounting",
                           "library_version": LIBRARY_VERSION, "pessimistic": True, **acc},
            "dp_event": None,
            "filter": {**f, "halted_at_step": (train_result.get("extra") or {}).get("halted_at_step"),
                       "gaussian_steps": steps,
                       **{k: v for k, v in described(noise.to_dict()).items() if k != "variant"}},
            "contribution_bound": {"records_per_user": plan.get("records_per_user"),
                                   "selection": plan.get("selection"), "kind": self.contribution_kind},
        }

    def recompute_epsilon(self, doc: Mapping) -> float:
        from components.accounting.filtered import filtered_epsilon  # startup

        f = doc["filter"]
        return float(filtered_epsilon(epsilon=float(f["epsilon"]), delta=float(f["delta"]),
                                      noise_multiplier=float(doc["noise_multiplier"]),
                                      steps_run=int(f["gaussian_steps"]))["epsilon"])

    def within_target(self, doc: Mapping, epsilon: float) -> bool | None:
        return None     # ε and δ both: not a function of ε alone

    def user_pld(self, certificate: Mapping, discretization: float = 1e-3):
        return None

    def ledger_costs(self, plan: Mapping, rates, orders) -> dict:
        raise VeilError("ledger: a filtered-ULS release is (ε, δ)-DP through a sparse vector and a bad event of "
                        "probability δ₁; it has no Rényi curve the per-person filter could charge, so it cannot "
                        "be released against a lifetime ledger (use uls, els or group)")


class _FilteredRunner(PlainStep):
    """FilteredStep as a step runner: halts (no update) the first time the sparse-vector test fails."""

    def __init__(self, step, spec):
        super().__init__(step)
        self.spec = spec
        self.kept: list[float] = []

    def __call__(self, step: int, units, ids, lengths) -> tuple[float, int, bool]:
        loss_sum, n_rec, passed, kept = self.step(step, units, ids, lengths)
        if not passed:
            return loss_sum, n_rec, True
        self.kept.append(kept)
        return loss_sum, n_rec, False

    @property
    def sigma(self) -> float:
        return float(self.spec.noise_multiplier)

    def result_extra(self) -> dict:
        import numpy as np

        return {"filter": dict(self.spec.filter), "noise_std_on_mean": self.step.noise_std,
                "normalisation": "mean of the users kept by the filter + N(0, std²) on the mean (Alg. 3)",
                "kept_users_mean": float(np.mean(self.kept)) if self.kept else None}


register(FilteredULS)
