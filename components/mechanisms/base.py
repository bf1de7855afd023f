"""The interface every privacy mechanism implements, and the registry that holds them.

A mechanism is everything Veil knows about one way of training privately, in one object: which
privacy unit and neighbouring relation it protects; how a policy becomes plan parameters (which
records it may train on, the population estimate, σ calibrated to the target); how the engine
samples and batches its units and which step runs them; its certificate section, the ε a verifier
recomputes from a certificate, and what an audit may compare against; what each person is charged
in the lifetime ledger. Planning, the engine, the certificate, the audit, the ledger and the CLI ask
the registry (`get(name)`) and never branch on a mechanism's name themselves.

Registration follows Opacus' per-layer gradient samplers: each module defines one subclass and
calls `register(...)` on it; `components.mechanisms` imports the built-in modules once. A new
mechanism is one file (tests/mechanisms/test_toy_mechanism.py defines one and runs it from policy
to certificate).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from components.core.errors import VeilError

if TYPE_CHECKING:      # annotations only: numpy and pyarrow load where a hook computes (`veil policy check`
    import numpy as np  # reads the registry's attributes and loads neither)
    import pyarrow as pa


@dataclass(frozen=True)
class PlanContext:
    """What a mechanism's planning hooks may read: the policy, the snapshot, the planner's PRF key,
    the compute budget after overrides and `auto`, and the private folder for cached calibrations."""

    policy: Any
    snapshot: Any
    key: bytes
    steps: int
    batch: int                       # expected units per step
    k: int                           # records_per_user (k or G)
    selection: str
    seed: int = 0                    # the policy's training seed (deterministic selection strategies)
    scorer: Any = None
    cache_dir: str | Path | None = None
    owners: pa.Table | None = None   # record_id, owners (list): every record's owners where the policy says so
    say: Callable[[str], None] = lambda _m: None
    # the ledger's (orders, conversion, order weights) a schedule is fitted under (public constants of the
    # ledger; weights None: the weighted rule's for the policy's budget, which a new ledger fixes with it);
    # None: a new ledger's (components.renyi.rdp ORDERS, CONVERSION, None)
    ledger_filter: tuple | None = None

    @property
    def spec(self):
        return self.policy.spec


@dataclass
class Bounded:
    """The rows a mechanism trains on after its contribution bound, and how many units it samples."""

    chosen: pa.Table                  # record_id, user_id, text (rows that may be trained on)
    n_units: int                      # what q = B/N divides: users or records (private)
    records_per_user: int | None      # the plan's public k / G (None where it does not apply)
    rates: np.ndarray | None = None   # per-row Poisson rates when they differ per row (secret)
    extra: dict = field(default_factory=dict)      # plan sections of this mechanism (e.g. secret_lp)
    caveats: list[str] = field(default_factory=list)
    owners: pa.Array | None = None    # each chosen row's owners (multi-owner): the ledger charges every one


@dataclass
class Calibrated:
    """Plan parameters set by calibration: q, the public divisor B, σ, the target, the accounting
    section, and the population section (public) with its exact count (annex)."""

    sampling_rate: float
    expected_batch_size: int
    noise_multiplier: float
    target: dict
    accounting: dict
    population: dict
    population_private: dict
    extra: dict = field(default_factory=dict)
    caveats: list[str] = field(default_factory=list)


class Mechanism:
    """Base class: class attributes describe the mechanism, methods are its hooks (module docstring).

    Hooks a mechanism does not support raise VeilError with a line saying so (e.g. a training-only
    mechanism is not certifiable, a filtered run has no Rényi curve for the ledger)."""

    name: ClassVar[str]
    privacy_unit: ClassVar[str]                 # "user", "record", "secret" or "owner" (multi-owner, fixed graph)
    neighbouring: ClassVar[str]
    description: ClassVar[str] = ""
    plannable: ClassVar[bool] = True            # a policy may name it
    certifiable: ClassVar[bool] = True
    accounting_model: ClassVar[str | None] = None   # components.accounting's model of one step, if PLD-accounted
    samples_users: ClassVar[bool] = False       # the engine's Poisson unit: a user (else a record)
    bounds_records: ClassVar[bool] = False      # takes records_per_user (k or G) and a selection strategy
    per_user_clip: ClassVar[bool] = False       # a unit's gradient is one clipped mean (random-chunk allowed)
    takes_filter: ClassVar[bool] = False        # the policy's `filter` section belongs to it
    may_halt: ClassVar[bool] = False            # its step may stop training early (the result says where)
    auto_default: ClassVar[bool] = False        # what `auto` picks for its unit when there is no choice to make
    secret_targets: ClassVar[bool] = False      # certificate and ledger need the plan's per-secret targets
    has_epsilon: ClassVar[bool] = True          # its guarantee is an (ε, δ) (else per-secret posterior bounds)
    ledger_curve: ClassVar[bool] = True         # has a Rényi curve the per-person ledger can charge
    # its release says something about each person under add/remove-person (so the ledger charges persons);
    # False where the public plan moves when a person is removed and no person-level bound exists (secret)
    ledger_person_claim: ClassVar[bool] = True
    multi_owner: ClassVar[bool] = False         # bounds each person across every record they own (sender or recipient)
    owners_variant: ClassVar[str | None] = None  # the registered mechanism that runs this one when every participant owns
    ledger_relation: ClassVar[str] = "add_remove"  # the relation its ledger curve is under ("add_remove" or "replace")
    population_estimate: ClassVar[bool] = False  # q divides by a Laplace estimate N̂ paid from ε (add/remove)
    clipped: ClassVar[bool] = True              # noise is σ·C on clipped unit gradients (the utility forecast's model)

    # --- policy → plan ---------------------------------------------------------------------------
    def check_policy(self, spec) -> str | None:
        """A policy-level error ("@field@ message") or None."""
        if spec.filter is not None and not self.takes_filter:
            takers = "' or '".join(n for n, m in _REGISTRY.items() if m.takes_filter)
            return f"@filter@ filter is set but mechanism is '{self.name}'; it needs '{takers}'"
        if spec.contribution.selection == "random-chunk" and not self.per_user_clip:
            clippers = "', '".join(n for n, m in _REGISTRY.items() if m.per_user_clip and m.plannable)
            return (f"@contribution.selection@ selection 'random-chunk' works with mechanism '{clippers}' only "
                    f"('{self.name}' needs fixed records)")
        return None

    def bound(self, ctx: PlanContext, train: pa.Table) -> Bounded:
        raise VeilError(f"mechanism {self.name!r} cannot be planned")

    def calibrate(self, ctx: PlanContext, bounded: Bounded) -> Calibrated:
        raise VeilError(f"mechanism {self.name!r} cannot be planned")

    def plan_selection(self, selection: str) -> str | None:
        return selection if self.bounds_records else None

    def batch_unit(self) -> str:
        return "users" if self.samples_users else "records"

    # --- training ---------------------------------------------------------------------------------
    def check_spec(self, spec, bad: Callable[[str, str], None]) -> None:
        if not (0.0 < float(spec.sampling_rate) <= 1.0):
            bad("sampling_rate", f"must be in (0, 1], got {spec.sampling_rate}")
        if not (float(spec.clip_norm) > 0.0):
            bad("clip_norm", f"must be > 0, got {spec.clip_norm}")
        if spec.filter is not None and not self.takes_filter:
            bad("filter", f"only a filtered mechanism takes a filter, not {self.name}")
        if self.bounds_records and (spec.records_per_user is None or int(spec.records_per_user) < 1):
            bad("records_per_user", f"{self.name} needs an integer ≥ 1, got {spec.records_per_user}")
        if spec.selection == "random-chunk" and not self.per_user_clip:
            bad("selection", f"random-chunk needs per-user clipping (uls), not {self.name}")

    def check_runtime(self, world_size: int) -> None:
        """Refuse a distributed layout the mechanism cannot run in."""

    def unit_rates(self, spec, data: pa.Table, tok, by_user: list) -> np.ndarray:
        """Each Poisson unit's inclusion probability (users or records, in `tok`'s order)."""
        import numpy as np

        n = len(tok.users) if self.samples_users else tok.n_records
        return np.full(n, float(spec.sampling_rate))

    def step_divisor(self, spec, rates: np.ndarray) -> float:
        """What the step divides the noisy sum by: the plan's public B (q·N would put the private N
        into every update's scale)."""
        if spec.expected_batch_size is not None:
            return float(spec.expected_batch_size)
        return float(rates.sum())

    def batch_mode(self, spec) -> str:
        """BatchBuilder mode: "records", "uls" (≤ G records per user) or "uls-chunks"."""
        if not self.samples_users:
            return "records"
        return "uls-chunks" if spec.selection == "random-chunk" else "uls"

    def make_step(self, spec, model, optimizer, *, n_units: int, private_seed: int, dctx, expected: float):
        """The step runner: `runner(step, units, ids, lengths) -> (Σ loss, records, halted)`."""
        from components.dpsgd.step import DPStep  # startup

        return PlainStep(DPStep(model, optimizer, private=True, clip_norm=float(spec.clip_norm),
                                noise_multiplier=float(spec.noise_multiplier), expected_batch_size=expected,
                                micro_batch_size=spec.micro_batch_size, private_seed=private_seed, dctx=dctx,
                                per_record=spec.per_record))

    # --- certificate ------------------------------------------------------------------------------
    def certify(self, plan: Mapping, train_result: Mapping, *, steps: int, caveats: list[str],
                **inputs) -> dict:
        """The mechanism's part of the certificate (the common part is added by the certificate)."""
        raise VeilError(f"mechanism {self.name!r} cannot be certified")

    def certified_steps(self, plan: Mapping, train_result: Mapping, started: int) -> int:
        return started

    def check_run(self, plan: Mapping, train_result: Mapping) -> None:
        """Refuse a run whose mechanism-specific parameters differ from the plan's."""

    def recompute_epsilon(self, doc: Mapping) -> float:
        raise VeilError(f"a {self.name} certificate has no ε to recompute")

    def within_target(self, doc: Mapping, epsilon: float) -> bool | None:
        """What `within_target` must say for this ε (None: not a function of ε alone)."""
        target = (doc.get("target") or {}).get("epsilon")
        return None if target is None else float(epsilon) <= float(target) + 1e-12

    def describe(self, doc: Mapping) -> str:
        eps_n = population_epsilon(doc)
        acc = doc.get("accountant") or {}
        return (f"{doc['privacy_unit']}-level ε={doc['epsilon']:.4f}, δ={doc['delta']:g} "
                f"({acc.get('mechanism')}, {'pessimistic ' if acc.get('pessimistic') else ''}PLD"
                + (f"; includes ε_N={eps_n:.3g} for the population estimate" if eps_n else "") + ")")

    def accounting_k(self, records_per_user) -> int:
        """The k the accounting model takes (1 where one unit is one Gaussian of sensitivity 1)."""
        return 1

    def coverage(self, doc: Mapping) -> str | None:
        """What a certificate of this mechanism does and does not protect, where its unit name alone could
        be misread (`veil verify` prints it); None where the unit says it."""
        return None

    # --- audit ------------------------------------------------------------------------------------
    def user_pld(self, certificate: Mapping, discretization: float = 1e-3):
        """The composed PLD of a whole user under this mechanism, or None (no user-level PLD)."""
        if self.privacy_unit != "user" or self.accounting_model is None:
            return None
        from components.accounting import composed_pld  # startup

        if certificate.get("privacy_unit") != self.privacy_unit:
            return None
        q, sigma, steps = (float(certificate["sampling_rate"]), float(certificate["noise_multiplier"]),
                           int(certificate["steps"]))
        if steps <= 0 or sigma <= 0:
            return None
        k = self.accounting_k((certificate.get("contribution_bound") or {}).get("records_per_user"))
        if k < 1:
            return None
        return composed_pld(self.accounting_model, q, sigma, steps, k, discretization)

    # --- ledger -----------------------------------------------------------------------------------
    def ledger_costs(self, plan: Mapping, rates: dict[str, list[float]], orders) -> dict:
        """person → PersonCost (rows, sampling rate, RDP curve at `orders`) for this release."""
        raise VeilError(f"ledger: cannot charge mechanism {self.name!r}")

    def rows_curve(self, rates, sigma: float, steps: int, orders) -> np.ndarray:
        """One person's Poisson-sampled rows' RDP under this mechanism's relation (add/remove:
        `renyi.rdp.rows_rdp`); the Gaussian family's `ledger_costs` prices every person with it."""
        from components.renyi import rdp as _rdp  # startup

        return _rdp.rows_rdp(rates, sigma, steps, orders)

    def ledger_population_rows(self, rows: int) -> int:
        """How many units of N one person's `rows` are (the population estimate's group size)."""
        return 1

    def ledger_group_size(self, rows: int) -> int:
        """Sensitivity multiple of one person with `rows` charged rows (the non-adaptive PLD estimate)."""
        return max(1, int(rows))


def population_epsilon(doc: Mapping[str, Any]) -> float:
    """ε spent on the DP population estimate N̂ (0 when N is public under the neighbouring relation)."""
    return float(((doc.get("dataset") or {}).get("population") or {}).get("epsilon") or 0.0)


class PlainStep:
    """DPStep as a step runner: it never halts."""

    def __init__(self, step):
        self.step = step

    def __call__(self, step: int, units, ids, lengths) -> tuple[float, int, bool]:
        loss_sum, n_rec = self.step(step, units, ids, lengths)
        return loss_sum, n_rec, False

    @property
    def sigma(self) -> float:
        return self.step.sigma

    @property
    def per_unit(self):
        return self.step.per_unit

    @property
    def nonfinite_units(self) -> int:
        return int(self.step.nonfinite_units)

    def result_extra(self) -> dict:
        return {}

    def close(self) -> None:
        self.step.close()


# --- the registry ----------------------------------------------------------------------------------
_REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: type[Mechanism] | Mechanism) -> Mechanism:
    """Add a mechanism (class or instance) under its `name`; a second one under a taken name is refused."""
    inst = mechanism() if isinstance(mechanism, type) else mechanism
    if inst.name in _REGISTRY and type(_REGISTRY[inst.name]) is not type(inst):
        raise VeilError(f"mechanism {inst.name!r} is already registered")
    _REGISTRY[inst.name] = inst
    return inst


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get(name: str) -> Mechanism:
    try:
        return _REGISTRY[str(name)]
    except KeyError:
        raise VeilError(f"mechanism {name!r} is not registered; registered: {', '.join(_REGISTRY)}") from None


def names(*, unit: str | None = None, plannable: bool | None = None) -> tuple[str, ...]:
    return tuple(n for n, m in _REGISTRY.items()
                 if (unit is None or m.privacy_unit == unit) and (plannable is None or m.plannable == plannable))
