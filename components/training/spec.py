"""What a training run does (`TrainSpec`) and what it did (`TrainResult`).

A spec is built from a plan (`TrainSpec.from_plan`) so the numbers the accountant used — q, σ, C,
T, k/G — are exactly the numbers the engine runs with.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from components.core.errors import VeilError

from components.mechanisms import get as get_mechanism
from components.mechanisms import names as mechanism_names

MECHANISMS = mechanism_names()   # every registered mechanism (components.mechanisms)
OPTIMIZERS = ("adam", "sgd")
SHARDINGS = ("none", "fsdp")   # components.training.sharding
PER_RECORD = ("auto", "mixed", "hooks", "ghost", "vmap")  # how per-record gradients are computed (same numbers)
PRECISIONS = ("fp32", "bf16", "fp16")  # components.dpsgd.precision


@dataclass(frozen=True)
class TrainSpec:
    """One DP training run.

    mechanism: a registered mechanism (components.mechanisms decides what follows): uls (Poisson
      users, mean over ≤G records per user, per-user clip), els/group
      (records already bounded to ≤k per user, Poisson records, per-record clip), record
      (Poisson records, per-record clip), secret (per-record Poisson rates from the data's
      `rate` column, per-record clip), nonprivate (Poisson records, no clip, no noise).
    sampling_rate: q — per user (uls) or per record; ignored for secret (rates come per record).
    noise_multiplier: σ; the noise on the clipped sum is N(0, σ²C²).
    expected_batch_size: the plan's expected units per step (informational; the engine divides by
      the expectation computed from the data it is given: q·N, or Σ rates).
    records_per_user: G for uls (records drawn per visit), k for els/group (checked, not applied).
    lora: {r, alpha, dropout, target_modules} or None for full fine-tuning.
    private_seed: drives batch sampling and noise. Leave None: it is then drawn from the OS at the
      first start and kept in the run folder only. A published seed would reveal the batches and
      the noise, and with them the privacy. Tests set it for reproducibility.
    per_record: "auto" (= "mixed" when every trainable layer has a registered sampler, else
      "vmap"); "mixed": per-layer samplers on one backward, ghost norm or instantiated per-record
      gradient chosen per layer by cost, clipped sum by book-keeping; "hooks": always instantiate;
      "ghost": ghost norms wherever possible; "vmap": torch.func. All give the same update.
    filter: uls-filtered only (Asi & Liu's Alg. 3, opt-in): {tau, epsilon, delta} — the
      concentration radius τ and the run's total (ε, δ) target [, variant: veil (default,
      certifiable) | seed (the paper's printed noise; no certificate)], from which the sparse-vector test
      and the Gaussian noise on the filtered mean are set (components.accounting.filtered). Every
      user every step (sampling_rate 1), no clipping (clip_norm unused), may halt early.
    selection: the plan's strategy. Only "random-chunk" changes what training does: under ULS each
      visit of a user draws G random seq_len-token chunks of the user's concatenated text instead
      of G of their records. Other strategies were applied by planning (the data holds their pick).
    sharding: "none" (every rank holds the whole model: data parallel) or "fsdp" (full fine-tuning
      under torchrun with weights, gradients and Adam state sharded across the ranks by FSDP2;
      components.training.sharding). Same update, same accounting, same ε.
    precision: "fp32" (default), "bf16" or "fp16" (static loss scale): the base model's dtype. Per-unit
      norms, clipping, the clipped sum, the noise and the trainable (LoRA or master) weights are
      float32 in all three (components/dpsgd/precision.py). Part of `identity()`: a checkpoint
      of another precision is not resumed.
    gradient_checkpointing: recompute each decoder layer's activations in the backward instead of
      keeping them (HF models; torch's non-reentrant checkpoint). Memory only: the update is the
      same (tests check every per_record path against the run without it), so it is not part of
      `identity()` and a run may resume with it switched. per_record "vmap" (torch.func) cannot
      run through it and is refused here; "auto" falling back to vmap is refused before step 1.
    """

    mechanism: str
    sampling_rate: float
    noise_multiplier: float
    clip_norm: float
    steps: int
    expected_batch_size: float | None = None
    records_per_user: int | None = None
    learning_rate: float = 1e-3
    seq_len: int = 128
    micro_batch_size: int = 16
    seed: int = 0
    lora: dict | None = None
    checkpoint_every: int = 50
    optimizer: str = "adam"
    private_seed: int | None = None
    per_record: str = "auto"
    selection: str | None = None
    filter: dict | None = None
    sharding: str = "none"
    precision: str = "fp32"
    gradient_checkpointing: bool = False

    def __post_init__(self):
        def bad(name, why):
            raise VeilError(f"train spec: {name}: {why}")

        if self.mechanism not in mechanism_names():
            bad("mechanism", f"{self.mechanism!r} is not one of {', '.join(mechanism_names())}")
        if not (float(self.noise_multiplier) >= 0.0) or math.isinf(float(self.noise_multiplier)):
            bad("noise_multiplier", f"must be a finite number ≥ 0, got {self.noise_multiplier}")
        if int(self.steps) < 0:
            bad("steps", f"must be ≥ 0, got {self.steps}")
        get_mechanism(self.mechanism).check_spec(self, bad)   # q, C, k, filter, selection: per mechanism
        if int(self.seq_len) < 2:
            bad("seq_len", f"must be ≥ 2, got {self.seq_len}")
        if int(self.micro_batch_size) < 1:
            bad("micro_batch_size", f"must be ≥ 1, got {self.micro_batch_size}")
        if int(self.checkpoint_every) < 1:
            bad("checkpoint_every", f"must be ≥ 1, got {self.checkpoint_every}")
        if not (float(self.learning_rate) > 0):
            bad("learning_rate", f"must be > 0, got {self.learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            bad("optimizer", f"{self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            bad("precision", f"{self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.per_record not in PER_RECORD:
            bad("per_record", f"{self.per_record!r} is not one of {', '.join(PER_RECORD)}")
        if self.sharding not in SHARDINGS:
            bad("sharding", f"{self.sharding!r} is not one of {', '.join(SHARDINGS)}")
        if self.sharding == "fsdp":
            if self.lora is not None:
                bad("sharding", "fsdp shards full fine-tuning (lora: null); a LoRA adapter is small enough to replicate")
            if self.per_record == "vmap":
                bad("sharding", "fsdp needs the per-layer samplers (per_record auto, mixed, hooks or ghost), not vmap")
        if not isinstance(self.gradient_checkpointing, bool):
            bad("gradient_checkpointing", f"must be true or false, got {self.gradient_checkpointing!r}")
        if self.gradient_checkpointing and self.per_record == "vmap":
            bad("gradient_checkpointing", "per_record 'vmap' (torch.func) cannot run through activation "
                "checkpointing; use per_record auto/mixed/hooks/ghost or gradient_checkpointing false")
        if self.lora is not None:
            if not isinstance(self.lora, dict) or "r" not in self.lora:
                bad("lora", "must be null or a mapping with at least 'r'")
            if int(self.lora["r"]) < 1:
                bad("lora.r", f"must be ≥ 1, got {self.lora['r']}")

    @classmethod
    def from_plan(cls, plan: dict, **overrides) -> "TrainSpec":
        """Map a `veil.plan/v1` document (SHARED_CONTRACTS) onto a spec; `overrides` win."""
        if hasattr(plan, "to_dict"):
            plan = plan.to_dict()
        try:
            tr = plan.get("training") or {}
            kw: dict[str, Any] = dict(
                mechanism=plan["mechanism"],
                sampling_rate=float(plan["sampling_rate"]) if plan.get("sampling_rate") is not None else 1.0,
                noise_multiplier=float(plan["noise_multiplier"]),
                clip_norm=float(plan["clip_norm"]),
                steps=int(plan["steps"]),
                expected_batch_size=(float(plan["expected_batch_size"])
                                     if plan.get("expected_batch_size") is not None else None),
                records_per_user=(int(plan["records_per_user"])
                                  if plan.get("records_per_user") is not None else None),
                selection=plan.get("selection"),
                filter=plan.get("filter"),
            )
        except KeyError as e:
            raise VeilError(f"plan: {e.args[0]}: missing (needed to train)") from None
        for key in ("learning_rate", "seq_len", "micro_batch_size", "seed", "lora", "sharding", "precision",
                    "gradient_checkpointing"):
            if key in tr and (tr[key] is not None or key == "lora"):
                kw[key] = tr[key]
        if "checkpoint_every" not in overrides:
            kw["checkpoint_every"] = max(1, min(50, int(kw["steps"]) // 10 or 1))
        kw.update(overrides)
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    def identity(self) -> dict:
        """The fields a resumed run must share with the run it resumes."""
        d = self.to_dict()
        d.pop("checkpoint_every")
        d.pop("private_seed")
        if d["sharding"] == "none":
            d.pop("sharding")   # checkpoints written before the setting existed still resume
        # memory only: the update is the same with or without it (tests/training/test_training_checkpointing.py)
        d.pop("gradient_checkpointing")
        return d


@dataclass
class TrainResult:
    steps_run: int
    mechanism: str
    noise_multiplier: float
    sampling_rate: float
    clip_norm: float
    expected_batch_size: float          # the divisor actually used (q·N or Σ rates)
    plan_expected_batch_size: float | None
    records_per_user: int | None
    batch_mean: float                   # realised units per step (users for uls, records else)
    batch_min: int
    batch_max: int
    empty_steps: int
    n_units: int                        # users (uls) or records the sampler drew from
    n_records: int
    losses: list[float]                 # mean loss of each step's sampled records — NOT private: never publish
    adapter_dir: str | None
    model_dir: str | None
    seconds: float
    seed: int
    private_seed_source: str            # "os_entropy" (secret) or "spec" (reproducible, not for release)
    resumed_from_step: int | None
    steps_attempted: int                # highest step ever started (a crashed run's steps count)
    world_size: int
    trainable_params: int
    extra: dict = field(default_factory=dict)
    # What the run read and wrote, for the certificate to bind (components.certificate checks them
    # against the plan and the files): the sha256 of the train-records file the data came from,
    # the trained weights' and the base model's / tokenizer's fingerprints, device and precision.
    train_records_sha256: str | None = None
    weights: dict | None = None
    base_model: dict | None = None
    tokenizer: dict | None = None
    device: str | None = None
    precision: str | None = None
    # Units whose gradient was not finite and contributed zero instead (their data alone decides
    # it). Private: one person's count; it stays in the run folder (PRIVATE_FIELDS).
    nonfinite_units: int = 0
    # "fsdp" when the weights, gradients and optimizer state were sharded across the ranks, else "none"
    sharding: str = "none"

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def public_dict(self) -> dict:
        """to_dict() without the fields that describe private batches (never print or log these)."""
        return {k: v for k, v in self.to_dict().items() if k not in PRIVATE_FIELDS}


# Statistics of private batches and exact private counts, kept only in the run folder's
# train_result.json: realised batch sizes and unit/record counts reveal N (which the plan only
# publishes as a DP estimate), and the raw sha256 of the train-records file would let anyone with the
# roster test membership hypotheses (the public form is the plan's salted commitment).
PRIVATE_FIELDS = ("losses", "nonfinite_units", "batch_mean", "batch_min", "batch_max", "empty_steps", "n_units",
                  "n_records", "train_records_sha256")
