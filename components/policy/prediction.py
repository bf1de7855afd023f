"""The prediction policy (kind: PredictionPolicy): what governance fixes for a PMixED endpoint.

Strict like the training policy (unknown keys, coercions and NaN are errors; one line naming the field).
Loaded by `components.policy.load_prediction_policy`; used by components.prediction and flows.pmixed.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.policy.model import People


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class Metadata(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    owner: str = Field(min_length=1)
    description: str = ""


class Target(_Strict):
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)


class Lora(_Strict):
    r: int = Field(default=8, ge=1)
    alpha: float = Field(default=16.0, gt=0)
    # 0 only: dropout draws from torch's process-global RNG, which shards training concurrently (threads)
    # would share — one shard's masks would then depend on how much data the others have.
    dropout: float = Field(default=0.0, ge=0, le=0)


class Training(_Strict):
    epochs: int = Field(default=3, ge=1)
    learning_rate: float = Field(default=5e-3, gt=0)
    seq_len: int = Field(default=64, ge=4)
    batch_size: int = Field(default=8, ge=1)
    lora: Lora = Lora()
    seed: int = 0


class Spec(_Strict):
    privacy_unit: Literal["user"] = "user"
    mechanism: Literal["pmixed"] = "pmixed"
    target: Target                       # (ε, δ) over the whole private-token budget
    lifetime_budget: Target | None = None  # the per-person ledger's budget, when the ledger is in use
    shards: int = Field(ge=1, le=4096)
    subsample_rate: float = Field(gt=0, le=1)
    token_budget: int = Field(ge=1)
    temperature: float = Field(default=1.0, gt=0)
    when_exhausted: Literal["public_only", "refuse"] = "public_only"
    max_tokens_per_request: int = Field(default=128, ge=1)
    # Each API key's lifetime share of the private tokens (None: first come, first served — one key can
    # spend the whole budget). A product setting, not a privacy one: the guarantee covers all T tokens
    # whoever asks; the quota only decides who gets them. Counted durably beside the budget.
    key_quota_tokens: int | None = Field(default=None, ge=1)
    task_runner: Literal["thread", "dask"] = "thread"
    training: Training = Training()
    # Who is a person (bots out, a person's identities merged), as for training policies: the keyed
    # partition puts one *person* in one shard, so a person with two addresses must be one id first,
    # or they would be in two shards with twice the influence (and two ledger budgets).
    people: People = Field(default_factory=People)

    @model_validator(mode="after")
    def _quota_fits(self) -> "Spec":
        if self.key_quota_tokens is not None and self.key_quota_tokens > self.token_budget:
            raise ValueError(f"key_quota_tokens: {self.key_quota_tokens} is more than the whole token_budget "
                             f"({self.token_budget})")
        return self

    @model_validator(mode="after")
    def _one_owner(self) -> "Spec":
        if self.people.ownership != "author":
            raise ValueError("people.ownership: PMixED partitions people into shards; a record with several owners "
                             "would belong to several shards — use 'author'")
        return self


class PredictionPolicy(_Strict):
    apiVersion: Literal["veil.dev/v1"]
    kind: Literal["PredictionPolicy"]
    metadata: Metadata
    spec: Spec
