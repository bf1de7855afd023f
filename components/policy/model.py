"""The privacy policy document: what governance writes, as a strict pydantic model.

Every model forbids unknown keys and is frozen; a policy is data, not configuration to be patched.
Cross-field rules (γ ≥ κ, lifetime ≥ per-release, mechanism fits the unit, …) live next to the
fields they tie together and raise plain-worded `ValueError`s that the loader turns into
`file:line: field: message`.
"""
from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from components.core.identity import person_id_or_empty
from components.mechanisms import get as get_mechanism
from components.mechanisms import names as mechanism_names

API_VERSION = "veil.dev/v1"
KIND = "PrivacyPolicy"

PrivacyUnit = Literal["user", "record", "secret"]
def _registered_mechanism(v: str) -> str:
    """A policy names a registered mechanism (components.mechanisms) or lets `auto` choose. Checked
    against the live registry, so a mechanism registered by a plug-in module is a valid name."""
    allowed = (*mechanism_names(plannable=True), "auto")
    if v not in allowed:
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": ", ".join(f"'{a}'" for a in allowed)})
    return v


# The JSON schema lists the built-in names (policies/schema.json is generated from it).
Mechanism = Annotated[str, AfterValidator(_registered_mechanism),
                      WithJsonSchema({"enum": [*mechanism_names(plannable=True), "auto"], "type": "string"})]
Selection = Literal["random", "longest", "shortest", "ppl-high", "ppl-low", "random-chunk"]
RuleKind = Literal["literal", "regex", "path_glob", "detector"]

# Detectors the catalog implements (SHARED_CONTRACTS: built-in detectors).
# Must match catalog.tagging.BUILTIN_DETECTORS (a test checks; components never imports catalog).
BUILTIN_DETECTORS = ("credentials", "email", "phone", "payment_card", "iban", "national_id", "high_entropy")

# Which mechanisms can deliver a guarantee for which unit (each mechanism says its unit).
def mechanisms_for_unit(unit: str) -> tuple[str, ...]:
    return (*mechanism_names(unit=unit, plannable=True), "auto")


MECHANISMS_FOR_UNIT = {unit: mechanisms_for_unit(unit) for unit in ("user", "record", "secret")}  # built-ins

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


class _Strict(BaseModel):
    # strict: `steps: yes` or `epsilon: "8"` are mistakes, not values to coerce
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class Metadata(_Strict):
    name: str = Field(description="Short policy name, lower-case letters, digits, '-' or '_'.")
    owner: str = Field(min_length=1, description="Who answers for this policy (team or address).")
    description: str = Field(default="", description="What this policy is for, in plain words.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"'{v}' is not a valid name: use lower-case letters, digits, '-' or '_', "
                             "starting with a letter")
        return v


class Budget(_Strict):
    epsilon: float = Field(gt=0, description="ε > 0 (finite).")
    delta: float = Field(gt=0, lt=1, description="0 < δ < 1; pick δ well below 1 / (number of units).")


class Contribution(_Strict):
    max_records_per_user: int = Field(
        default=8, ge=1, le=100_000,
        description="k: records a user may contribute (ELS/group), or G: records averaged per sampled user (ULS).")
    selection: Selection = Field(
        default="random",
        description="How the k records are picked from each user's own records (seed 000 §2.5). "
                    "random-chunk (ULS only) draws contiguous chunks of the user's concatenated text.")


class Protection(_Strict):
    kappa: float = Field(gt=0, lt=1, description="κ: the attacker's best prior chance of guessing the secret.")
    gamma: float = Field(gt=0, le=1, description="γ: the largest posterior chance of reconstruction allowed.")

    @model_validator(mode="after")
    def _gamma_at_least_kappa(self) -> "Protection":
        if self.gamma < self.kappa:
            raise ValueError(f"@gamma@ gamma ({self.gamma:g}) is below kappa ({self.kappa:g}): no mechanism can push "
                             "the attacker's success below a blind guess; raise gamma or lower kappa")
        return self

    @property
    def rho(self) -> float:
        """KL budget ρ = d_KL(Bernoulli(γ) ‖ Bernoulli(κ)) (seed 004, Lemma 3.2, KL case)."""
        g, k = self.gamma, self.kappa
        if g <= k:
            return 0.0
        first = g * math.log(g / k)
        second = 0.0 if g >= 1.0 else (1 - g) * math.log((1 - g) / (1 - k))
        return first + second


def _re2_problem(pattern: str) -> str | None:
    import re2

    opts = re2.Options()
    opts.log_errors = False
    try:
        re2.compile(pattern, opts)
        return None
    except re2.error as e:
        a = e.args[0] if e.args else e
        return a.decode(errors="replace") if isinstance(a, bytes) else str(a)


class TaggingRule(_Strict):
    kind: RuleKind = Field(description="literal | regex | path_glob | detector.")
    patterns: list[str] = Field(min_length=1, description="Literals, regular expressions, globs or detector names.")
    case_sensitive: bool = True

    @model_validator(mode="after")
    def _patterns_make_sense(self) -> "TaggingRule":
        for p in self.patterns:
            if not p:
                raise ValueError("@patterns@ empty pattern")
            if self.kind == "regex":
                try:
                    re.compile(p)
                except re.error as e:
                    raise ValueError(f"@patterns@ regex {p!r} does not compile: {e}") from None
                why = _re2_problem(p)
                if why:
                    # Tagging runs on RE2 (linear time: a pattern like (a+)+$ cannot hang an ingest);
                    # backreferences and lookarounds need backtracking, which is what hangs.
                    raise ValueError(f"@patterns@ regex {p!r} cannot run on RE2, the linear-time engine tagging "
                                     f"uses ({why}); drop backreferences and lookarounds (use \\b or a named "
                                     "group 'secret' to narrow the span)")
            if self.kind == "detector" and p not in BUILTIN_DETECTORS:
                raise ValueError(f"@patterns@ unknown detector {p!r}; built-in detectors: {', '.join(BUILTIN_DETECTORS)}")
        return self


class SecretClass(_Strict):
    name: str = Field(description="Secret class; secret ids are '<name>:<normalized value>'.")
    tier: str = Field(description="Governance tier (e.g. critical, high, moderate); sets κ/γ unless "
                                  "'protection' is given.")
    rules: list[TaggingRule] = Field(min_length=1)
    protection: Protection | None = Field(default=None, description="Overrides the tier's κ/γ.")

    @field_validator("name", "tier")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"'{v}' is not a valid name: use lower-case letters, digits, '-' or '_'")
        return v


class LPSettings(_Strict):
    c: float = Field(default=10.0, gt=0, description="C in Σ_{i∋s} w_i ≤ C·ρ_s: larger keeps more data "
                                                     "but needs more noise (sweep it with `veil plan --sweep-c`).")
    time_limit_s: float = Field(default=120.0, gt=0, description="HiGHS time limit; a timed-out solve stops the plan.")


class Secrets(_Strict):
    tiers: dict[str, Protection] = Field(default_factory=dict, description="Tier name → {kappa, gamma}.")
    classes: list[SecretClass] = Field(default_factory=list)
    untagged_records: Literal["keep", "drop"] = Field(
        default="keep", description="Secret unit: records holding no secret keep weight 1 (keep) or leave (drop).")
    lp: LPSettings = Field(default_factory=LPSettings)

    @model_validator(mode="after")
    def _classes_resolve(self) -> "Secrets":
        seen = set()
        for i, c in enumerate(self.classes):
            if c.name in seen:
                raise ValueError(f"@classes.{i}.name@ secret class '{c.name}' is defined twice")
            seen.add(c.name)
            if c.protection is None and c.tier not in self.tiers:
                known = ", ".join(sorted(self.tiers)) or "none defined"
                raise ValueError(f"@classes.{i}.tier@ secret class '{c.name}' has tier '{c.tier}' with no kappa/gamma: define it "
                                 f"under secrets.tiers (known tiers: {known}) or give the class a protection")
        return self

    def protection_of(self, class_name: str) -> Protection:
        for c in self.classes:
            if c.name == class_name:
                return c.protection or self.tiers[c.tier]
        raise KeyError(class_name)


class LoRA(_Strict):
    r: int = Field(default=8, ge=1, le=1024)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | None = Field(default=None, description="None: detected per architecture.")


class Training(_Strict):
    steps: int = Field(default=150, ge=1, le=10_000_000)
    expected_batch_size: int = Field(
        default=24, ge=1, description="Expected users per step (ULS) or records per step (other mechanisms); "
                                      "under mechanism 'auto', the budget in gradients (records) per step.")
    clip_norm: float = Field(default=1.0, gt=0)
    learning_rate: float = Field(default=5e-3, gt=0)
    seq_len: int = Field(default=128, ge=8, le=65_536)
    micro_batch_size: int = Field(default=8, ge=1)
    lora: LoRA | None = Field(default_factory=LoRA, description="null: full fine-tuning.")
    seed: int = Field(default=0, ge=0)
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute each decoder layer's activations in the backward instead of keeping "
                                   "them: less memory, about one more forward of time; the update and ε are the same.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32",
        description="The base model's dtype in training: fp32, bf16, or fp16 (static loss scale). Per-unit norms, "
                    "clipping, the clipped sum, the noise and the LoRA/master weights stay float32; ε does not "
                    "depend on it.")
    sharding: Literal["none", "fsdp"] = Field(
        default="none", description="fsdp: full fine-tuning under torchrun with weights, gradients and Adam state "
                                    "sharded across the ranks (FSDP2); same update and ε as none.")

    @model_validator(mode="after")
    def _fsdp_is_full_fine_tuning(self):
        # refused here, before a plan exists: a training run refusing it would come after the charge
        if self.sharding == "fsdp" and self.lora is not None:
            raise ValueError("sharding: fsdp shards full fine-tuning; set lora: null (a LoRA adapter is replicated)")
        if self.sharding == "fsdp" and self.precision != "fp32":
            # float32 masters of sharded 16-bit weights are not built yet (components/training/sharding.py)
            raise ValueError("sharding: fsdp runs in precision fp32 only for now; set precision: fp32")
        return self


class Filter(_Strict):
    """Asi & Liu's filtered ULS (seed 000 Alg. 3), opt-in: every user every step, no clipping, noise
    proportional to τ; training halts if the users' gradients stop being concentrated."""
    tau: float = Field(gt=0, description="τ: the concentration radius (ℓ2 distance between users' mean gradients).")


class Canaries(_Strict):
    users: int = Field(default=0, ge=0, description="Synthetic canary users (seed 003 App. D.2); 0: none.")
    substring_words: int = Field(default=10, ge=1, le=200)
    records_per_user: int = Field(
        default=8, ge=2, le=10_000,
        description="Records each canary user writes. A public value: sizing canaries from the real users' "
                    "counts would make every user's data move the canaries.")
    prefixes: list[str] = Field(
        default_factory=list, max_length=10_000,
        description="Echo canaries ('The Canary's Echo', ICML 2025): public in-distribution openings (e.g. the "
                    "synthetic prompts' texts, a changelog bullet). When given, each canary record is one of "
                    "them followed by the canary's random suffix of substring_words words, drawn with the plan's "
                    "key; `veil audit-synthetic` measures how much of each suffix a synthetic corpus echoes. "
                    "Empty: the substring is inserted into filler text (seed 003).")

    @field_validator("prefixes")
    @classmethod
    def _prefixes(cls, v: list[str]) -> list[str]:
        for i, p in enumerate(v):
            if not p.strip():
                raise ValueError(f"prefixes[{i}]: empty; give the public opening of a record")
            if len(p) > 2000:
                raise ValueError(f"prefixes[{i}]: {len(p)} characters, at most 2000")
        if len(set(v)) != len(v):
            raise ValueError("prefixes: an entry appears twice; each record of a canary needs its own opening")
        return v

    @model_validator(mode="after")
    def _enough_prefixes(self) -> "Canaries":
        if self.prefixes and len(self.prefixes) < self.records_per_user:
            raise ValueError(f"@prefixes@ prefixes: {len(self.prefixes)} given, a canary's {self.records_per_user} "
                             "records (records_per_user) each need a distinct one")
        return self


class Audit(_Strict):
    holdout_users: float = Field(
        default=0.25, ge=0, lt=1,
        description="Probability in [0, 1) that a user is never trained on; each user is drawn independently "
                    "(a count is refused: it would need the number of users, which is private).")
    attacker_samples_per_user: int = Field(default=4, ge=1, description="m: records per user kept out of "
                                                                         "training for the attacker.")
    attacker_record_rate: float = Field(
        default=0.1, ge=0, lt=1,
        description="Record-level units: each distinct record is kept out for the attacker independently with "
                    "this probability (m per user would let one record move another).")
    max_user_inference_auroc: float = Field(default=0.65, ge=0.5, le=1)
    max_secret_exposure: float = Field(default=4.0, ge=0, description="Largest allowed exposure (bits).")
    canaries: Canaries = Field(default_factory=Canaries)
    # Everything a verdict depends on is here, so the scheduled flow and `veil run` audit exactly as the
    # plan sized it (components.audit.sizing.size_audit); `veil audit` flags only override.
    require: Literal["passed", "not_failed"] = Field(
        default="passed",
        description="What the promotion gate requires of the audit: 'passed' (the data show every gate below its "
                    "limit), or 'not_failed' (no gate shown above its limit; inconclusive promotes) for "
                    "organizations too small for a passing audit. Stated on the certificate and the plan.")
    candidates_per_secret: int | Literal["auto"] = Field(
        default="auto",
        description="Random candidates each secret is ranked among (secret exposure). 'auto': the planner takes "
                    "the first of 10, 20, 50, 100, … with R + 1 >= 2^(max_secret_exposure + 2).")
    secrets_per_class: int = Field(
        default=100, ge=1, le=100_000,
        description="At most this many secrets of each class are audited (chosen by keyed hash); the plan says "
                    "how many a class needs to pass.")
    max_exposed_fraction: float = Field(
        default=0.1, gt=0, lt=1,
        description="Secret exposure: the fraction of a class's secrets that may lie above max_secret_exposure "
                    "beyond chance before the class fails (a binomial test over the class; a secret significant "
                    "on its own fails it regardless).")

    @field_validator("candidates_per_secret")
    @classmethod
    def _candidates(cls, v):
        if isinstance(v, int) and not isinstance(v, bool) and not 1 <= v <= 1_000_000:
            raise ValueError(f"{v} candidates: give 'auto' or a count from 1 to 1000000")
        return v

    @field_validator("holdout_users", mode="before")
    @classmethod
    def _holdout(cls, v):
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1:
            raise ValueError(f"{v:g} is a count of users; give a probability in [0, 1) instead: each person is held "
                             "out by an independent draw, and turning a count into a probability would need the "
                             "number of users, which is private")
        return v

    @model_validator(mode="after")
    def _canaries_fit(self) -> "Audit":
        if self.canaries.users and self.canaries.records_per_user < self.attacker_samples_per_user + 2:
            raise ValueError(f"@canaries.records_per_user@ canaries.records_per_user ({self.canaries.records_per_user}) "
                             f"must be at least attacker_samples_per_user + 2 ({self.attacker_samples_per_user + 2})")
        return self


class Population(_Strict):
    """The number of training units is private (add/remove neighbours change it). Veil publishes only
    a Laplace estimate of it, paid for from the target ε."""
    epsilon_fraction: float = Field(
        default=0.02, gt=0, le=0.5,
        description="Share of the target ε spent on the DP estimate N̂ of the number of training units "
                    "(q = B/N̂); DP-SGD gets the rest.")


class Evaluation(_Strict):
    """Evaluation people (`veil evaluate`): reserved at plan time, never trained on nor audited."""
    fraction: float = Field(
        default=0.1, ge=0, lt=1,
        description="Probability in [0, 1) that a person is reserved for evaluation; each person is drawn "
                    "independently (like audit.holdout_users), before the audit's holdout. 0: no evaluation split.")
    # The registry gets evaluation metrics only as a DP release charged to the evaluation people
    # (components.evaluation.dp): these three price and shape it. The exact figures stay on the
    # operator's terminal.
    epsilon: float = Field(
        default=1.0, gt=0, le=10,
        description="ε of each published evaluation (`veil evaluate`, and the pipelines' evaluation step): the "
                    "Gaussian noise on the per-person clipped metrics is calibrated (analytic Gaussian) so that "
                    "adding or removing one evaluation person is (epsilon, delta)-DP; every evaluation person is "
                    "charged its Rényi curve in the ledger (kind 'evaluation').")
    delta: float = Field(
        default=1e-6, gt=0, lt=0.01,
        description="δ of each published evaluation (with `epsilon`).")
    nll_clip: float = Field(
        default=8.0, gt=0, le=50,
        description="Public range [0, nll_clip] (nats per token) each person's mean negative log-likelihood is "
                    "clipped to before it is summed: one person moves the published sum by at most this. "
                    "Perplexities above exp(nll_clip) are reported as exp(nll_clip).")


class Schedule(_Strict):
    """How many releases the lifetime budget must last (issue 26): the planner lowers each release's ε
    until that many releases of the plan fit, one after the other, under the ledger's filter for a person
    with the most rows the plan allows (docs/privacy/ledger.md, "Schedule")."""
    releases: int = Field(ge=1, le=10_000, description="Releases of this policy one person must be able to take "
                                                       "under lifetime_budget, e.g. 52 for a year of weekly retraining.")
    cadence: str = Field(default="", max_length=80, description="What the releases are, in words (e.g. 'weekly "
                                                                "retraining, one year'); shown on the plan.")


class Release(_Strict):
    required_certificate_fields: list[str] = Field(
        default_factory=lambda: ["epsilon", "delta", "privacy_unit", "mechanism", "policy_sha256"])
    promoters: list[str] = Field(default_factory=list, description="Who may promote a model to production.")
    approval_timeout_seconds: int = Field(
        default=86400, ge=1,
        description="How long a retraining waits (paused, on the Prefect server) for one of `promoters` to "
                    "approve a release that passed its gates; past it the release is not promoted.")


class People(_Strict):
    """Who is a person: accounts that are not people, identities that are one person, and who owns a
    record. Applied by the catalog (catalog.people) when a snapshot is read for training/planning."""
    exclude: list[str] = Field(
        default_factory=list,
        description="Accounts that are not people (bots, service users): globs on account ids and on author "
                    "names, case-insensitive; only '*' and '?' are special ('[bot]' is literal), e.g. "
                    "'*[bot]@*', 'dependabot*', 'pre-commit-ci*'.")
    aliases: list[list[str]] = Field(
        default_factory=list,
        description="Each list is one person's identities across sources (addresses, account ids); the first "
                    "is the id the person gets.")
    ownership: Literal["author", "all-participants"] = Field(
        default="author",
        description="'author': a record belongs to its writer (mail: the sender). 'all-participants': also "
                    "to every recipient (mail To/Cc), each of whom it can reveal something about; every owner "
                    "then counts the record against their contribution bound k (docs/privacy/multi-owner.md).")
    multi_owner_order: Literal["fewest-owners", "random"] = Field(
        default="fewest-owners",
        description="Under 'all-participants', the keyed order in which records compete for their owners' "
                    "budgets: 'fewest-owners' first (a mail to fifty people does not use up fifty budgets "
                    "before a two-person thread is seen) or 'random'.")

    @model_validator(mode="after")
    def _consistent(self) -> "People":
        # Entries are compared under the one identity rule (components.core.identity), the rule the
        # planner and the ledger apply: a list of one address's case and spacing variants is a valid
        # (if redundant) merge; an entry that is another list's entry in another spelling is refused.
        # Every message names the entry as written (the field path locates it: file, line, field).
        seen: dict[str, tuple[int, str]] = {}
        for i, group in enumerate(self.aliases):
            if len(group) < 2:
                raise ValueError(f"@aliases.{i}@ alias list {group!r} has {len(group)} entr"
                                 f"{'y' if len(group) == 1 else 'ies'}: list at least two identities of one person")
            for j, a in enumerate(group):
                pid = person_id_or_empty(a)
                if not pid:
                    raise ValueError(f"@aliases.{i}.{j}@ identity {a!r} is empty once case, spacing and invisible "
                                     "characters are normalised")
                if pid in seen and seen[pid][0] != i:
                    k, other = seen[pid]
                    same = "" if other == a else f" (as {other!r}, the same identity under Veil's identity rule)"
                    raise ValueError(f"@aliases.{i}.{j}@ identity {a!r} is also in alias list {k + 1}{same}: one "
                                     "identity, one person — merge the two lists into one")
                seen.setdefault(pid, (i, a))
        for i, pat in enumerate(self.exclude):
            if not pat.strip() or pat.strip("*?") == "":
                raise ValueError(f"@exclude.{i}@ pattern {pat!r} would exclude every account")
        return self


class Spec(_Strict):
    privacy_unit: PrivacyUnit
    mechanism: Mechanism = "auto"
    target: Budget | None = Field(default=None, description="(ε, δ) per release; required unless the unit is "
                                                            "'secret' (then each class's κ/γ is the target).")
    lifetime_budget: Budget | None = Field(default=None, description="Total (ε, δ) one unit may spend over "
                                                                     "all releases.")
    schedule: Schedule | None = Field(default=None, description="How many releases lifetime_budget must last; the "
                                                                 "planner calibrates each release's ε to fit them.")
    contribution: Contribution = Field(default_factory=Contribution)
    secrets: Secrets = Field(default_factory=Secrets)
    training: Training = Field(default_factory=Training)
    filter: Filter | None = Field(default=None, description="Required by (and only for) mechanism 'uls-filtered'.")
    audit: Audit = Field(default_factory=Audit)
    population: Population = Field(default_factory=Population)
    evaluation: Evaluation = Field(default_factory=Evaluation)
    release: Release = Field(default_factory=Release)
    people: People = Field(default_factory=People, description="Who is a person: excluded accounts, aliases, "
                                                                 "record ownership.")

    @model_validator(mode="after")
    def _consistent(self) -> "Spec":
        allowed = mechanisms_for_unit(self.privacy_unit)
        if self.mechanism not in allowed:
            raise ValueError(f"@mechanism@ mechanism '{self.mechanism}' cannot protect privacy_unit '{self.privacy_unit}'; "
                             f"use one of: {', '.join(allowed)}")
        if self.target is None and self.privacy_unit != "secret":
            raise ValueError(f"@target@ target (epsilon, delta) is required for privacy_unit '{self.privacy_unit}'")
        if self.privacy_unit == "secret" and not self.secrets.classes:
            raise ValueError("@secrets.classes@ privacy_unit 'secret' needs at least one class under secrets.classes")
        if self.mechanism != "auto":
            problem = get_mechanism(self.mechanism).check_policy(self)
            if problem:
                raise ValueError(problem)
        elif self.filter is not None:
            takers = "' or '".join(n for n in mechanism_names(plannable=True) if get_mechanism(n).takes_filter)
            raise ValueError(f"@filter@ filter is set but mechanism is 'auto'; it needs '{takers}'")
        if self.people.ownership == "all-participants" and (self.privacy_unit != "user" or (
                self.mechanism != "auto" and get_mechanism(self.mechanism).owners_variant is None)):
            owners_ok = ", ".join(n for n in mechanism_names(unit="user", plannable=True)
                                  if get_mechanism(n).owners_variant is not None)
            raise ValueError("@people.ownership@ ownership 'all-participants' bounds each person's records across "
                             f"every record they own; it needs privacy_unit 'user' with mechanism {owners_ok} or auto "
                             f"(got {self.privacy_unit}/{self.mechanism}: user-sampled mechanisms sample whole users, "
                             "and a shared record belongs to several)")
        if self.schedule is not None:
            if self.lifetime_budget is None or self.target is None:
                raise ValueError("@schedule@ a schedule is fitted under lifetime_budget: set lifetime_budget (and a "
                                 "per-release target, the most ε a release may take)")
            no_person = self.privacy_unit == "secret"   # the secret unit makes no per-person claim
            chosen = None if self.mechanism == "auto" else get_mechanism(self.mechanism)
            if no_person or (chosen is not None and not (chosen.ledger_curve and chosen.ledger_person_claim)):
                raise ValueError(f"@schedule@ {self.privacy_unit}/{self.mechanism} releases have no per-person Rényi "
                                 "charge in the ledger; a schedule cannot be fitted under its filter")
        if self.lifetime_budget is not None and self.target is not None:
            if self.lifetime_budget.epsilon < self.target.epsilon:
                raise ValueError(f"@lifetime_budget.epsilon@ lifetime_budget epsilon ({self.lifetime_budget.epsilon:g}) is below the "
                                 f"per-release target ({self.target.epsilon:g})")
            if self.lifetime_budget.delta < self.target.delta:
                raise ValueError(f"@lifetime_budget.delta@ lifetime_budget delta ({self.lifetime_budget.delta:g}) is below the "
                                 f"per-release target ({self.target.delta:g})")
        return self


class Policy(_Strict):
    """A privacy policy as governance wrote it. `sha256` is of the file's bytes."""

    apiVersion: Literal["veil.dev/v1"]
    kind: Literal["PrivacyPolicy"]
    metadata: Metadata
    spec: Spec

    _sha256: str = PrivateAttr(default="")
    _path: str = PrivateAttr(default="")

    @property
    def sha256(self) -> str:
        return self._sha256

    @property
    def path(self) -> str:
        return self._path

    @property
    def name(self) -> str:
        return self.metadata.name

    def tagging_rules(self) -> list[dict]:
        """Rules the catalog applies, one dict per rule (SHARED_CONTRACTS format)."""
        out = []
        for c in self.spec.secrets.classes:
            for r in c.rules:
                out.append({"secret_class": c.name, "kind": r.kind, "patterns": list(r.patterns),
                            "case_sensitive": bool(r.case_sensitive)})
        return out

    def people(self) -> dict:
        """The `people` section as plain data (catalog.people applies it)."""
        return self.spec.people.model_dump()

    def secret_protection(self) -> dict[str, Protection]:
        """Secret class → its (κ, γ) after applying tiers."""
        return {c.name: self.spec.secrets.protection_of(c.name) for c in self.spec.secrets.classes}

    def summary(self) -> dict:
        s = self.spec
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "privacy_unit": s.privacy_unit,
                "mechanism": s.mechanism,
                "target": None if s.target is None else s.target.model_dump(),
                "secret_classes": [c.name for c in s.secrets.classes]}
