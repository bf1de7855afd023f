"""Policy + snapshot → plan: audit reservations, then the mechanism's contribution bound and
calibration (components.mechanisms), then the public plan and its private annex.

Nothing here knows a mechanism: `make_plan` orchestrates, the registered mechanism decides."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.mechanisms import Bounded, Calibrated, PlanContext, get
from components.mechanisms.auto import Resolved, resolve
from components.mechanisms.gaussian import PopulationRefusal
from components.draws.annex import annex_dir, commitment, plan_key, save_annex, seal_annex, snapshot_commitment
from components.draws.columns import distinct_count, sort_rows
from components.draws.eval_split import evaluation_sections
from components.planning.forecast import plan_forecast
from components.draws.audit_split import (AuditSplit, keep_trained_members, masked_texts, split_canaries,
                                          split_for_audit)
from components.audit.sizing import size_audit
from components.planning.plan import SCHEMA, Plan, seal
from components.draws.selection import Scorer
from components.audit.canaries import make_canary_users



@dataclass(frozen=True)
class Compute:
    """Optional overrides of the policy's compute budget, and data-derived inputs for `auto`.

    `user_grad_ratio(G)` estimates L_G / L (norm of a user's G-record mean gradient over a single
    record's) at the public base model — seed 001's f(G). Without it `auto` decides only where the
    answer holds for every ratio between 1/√G and 1, and otherwise takes ULS (see mechanism.py).
    """

    steps: int | None = None
    expected_batch_size: int | None = None
    user_grad_ratio: Callable[[int], float] | None = None
    base_model: tuple | None = None        # (model, tokenizer): estimate user_grad_ratio on the training data
    trainable_parameters: int | None = None  # d, for the utility forecast (modeling.lora.count_trainable_parameters)


def _compute(compute: Any) -> Compute:
    if compute is None:
        return Compute()
    if isinstance(compute, Compute):
        return compute
    if isinstance(compute, dict):
        return Compute(**compute)
    raise VeilError(f"plan: compute must be a Compute or a dict, got {type(compute).__name__}")


def _write_parquet(table: pa.Table, out_dir: Path, stem: str) -> tuple[str, str]:
    """Write `table` (0600) under a content-addressed name in the private annex folder; returns (the
    file's name, relative to that folder, and the sha256 of its bytes)."""
    import os

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    raw = buf.getvalue()
    digest = sha256_bytes(raw)
    path = (out_dir / f"{stem}-{digest[:16]}.parquet").resolve()
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        tmp.replace(path)
    return path.name, digest


def _sorted(table: pa.Table) -> pa.Table:
    return sort_rows(table, ["user_id", "record_id"])


@dataclass(frozen=True)
class _Canaries:
    records: pa.Table          # snapshot schema, every canary record (trained and held out)
    users: list[str]
    merged: AuditSplit         # the real split with the canaries' split folded in


def _members_trained(split: AuditSplit) -> bool:
    """Whether every member attacker row's person has a training row (a small split: the canaries')."""
    members = split.attacker.filter(split.attacker.column("member")).column("user_id")
    return bool(pc.all(pc.is_in(members, value_set=pc.unique(split.train.column("user_id")))).as_py()
                if len(members) else True)


def _like(canary_train: pa.Table, train: pa.Table) -> pa.Table:
    """Canary rows in the real rows' schema: a canary owns its own records (multi-owner `owners`)."""
    if "owners" in train.column_names and "owners" not in canary_train.column_names:
        users = canary_train.column("user_id").to_pylist()
        canary_train = canary_train.append_column("owners", pa.array([[u] for u in users], pa.list_(pa.string())))
    return canary_train.select(train.column_names).cast(train.schema)


def _canaries(policy, split: AuditSplit, seed: int, key: bytes) -> _Canaries | None:
    """Synthetic canary users, half trained and half held out, with attacker samples.

    Their size is the policy's public `canaries.records_per_user`, never a statistic of the real users
    (a median of users' counts would let every user move the canaries); their split depends on the
    canary ids alone."""
    conf = policy.spec.audit.canaries
    if conf.users <= 0:
        return None

    m = policy.spec.audit.attacker_samples_per_user
    recs = make_canary_users(conf.users, int(conf.records_per_user), seed, substring_words=conf.substring_words,
                             prefixes=conf.prefixes, key=key)
    c_split = split_canaries(recs.select(["record_id", "user_id", "text"]), m=m, seed=seed, key=key)
    merged = AuditSplit(
        held_out_users=sorted(split.held_out_users + c_split.held_out_users),
        attacker=pa.concat_tables([split.attacker, c_split.attacker]),
        train=pa.concat_tables([split.train, _like(c_split.train, split.train)]),
        n_eligible=split.n_eligible, evaluation=split.evaluation,
        members_trained=split.members_trained and _members_trained(c_split))
    return _Canaries(records=recs, users=sorted(set(recs["user_id"].to_pylist())), merged=merged)


def reserve_audit(policy, records: pa.Table, *, key: bytes, secret_spans: pa.Table | None = None,
                  per_record: bool = False, train_text: bool = True) -> tuple[AuditSplit, _Canaries | None]:
    """The audit split of `records` (record_id, user_id, text) under the policy's unit, canaries merged.

    Every decision about a unit depends on that unit alone (see audit_split); tests/privacy checks it.
    `per_record`: records with several owners — attacker samples are drawn per record, never from a
    count of a person's texts (a recipient's content would move their writer's choice; see
    docs/privacy/multi-owner.md); with an `owners` column in `records`, per slot of the attribution
    graph rather than per text (a text-keyed draw let one owner's content move other people's records).
    `train_text=False`: the split's training rows (and the canaries' merged into them) leave the text out —
    the draws still key on it and deduplicate by it; nothing else changes (`_reads_train_text`)."""
    spec = policy.spec
    unit = "record" if per_record else spec.privacy_unit
    # secret units: decisions must not move when a secret's value is substituted — compare masked texts
    content = masked_texts(records, secret_spans) if unit == "secret" else None
    # multi-owner records (an `owners` column): the attacker's draws per slot of the attribution graph,
    # so that for a fixed key one owner's content moves only that owner's records (audit_split._owner_slots)
    # The `owners` column stays on the rows (split.train keeps it): the bound reads each row's owners by
    # position, never by record id — an id names content, and u's content may copy another record's.
    owners = None
    if per_record and "owners" in records.column_names:
        owners = records.column("owners").to_pylist()
    if not train_text and owners is None:
        # the text decides through `content` alone; the rows the split copies for training are ids only
        # (at 10⁷ people the text is most of a record's bytes, and nothing downstream reads it)
        if content is None:
            content = records.column("text")
        records = records.drop_columns(["text"])
    split = split_for_audit(records, holdout=float(spec.audit.holdout_users), m=spec.audit.attacker_samples_per_user,
                            seed=spec.training.seed, key=key, unit=unit,
                            attacker_record_rate=float(spec.audit.attacker_record_rate), content=content,
                            evaluation=float(spec.evaluation.fraction), owners=owners)
    canaries = _canaries(policy, split, spec.training.seed, key)
    return (canaries.merged if canaries is not None else split), canaries


def bound_contributions(train: pa.Table, mechanism: str, *, k: int, selection: str, seed: int,
                        scorer: Scorer | None = None, key: bytes | None = None) -> pa.Table:
    """The rows a mechanism may train on: each user's choice from their own records (the mechanism's
    `bound`). For the neighbour-stability tests, which bound splits without a whole plan."""
    ctx = PlanContext(policy=None, snapshot=None, key=key, steps=0, batch=0, k=int(k), selection=selection,
                      seed=int(seed), scorer=scorer)
    return get(mechanism).bound(ctx, train).chosen


# Selections that read a record's text (its length, its perplexity); "random" and "random-chunk" do not.
_TEXT_SELECTIONS = ("longest", "shortest", "ppl-high", "ppl-low")


def _reads_train_text(policy, comp: Compute) -> bool:
    """Whether anything after the audit split reads the training rows' text: the selection (lengths,
    perplexities), or `auto` estimating gradient diversity at the base model. Otherwise the training
    table carries ids only (issue 27: the planner's memory at 10⁷ people). The mechanisms' bounds read
    ids, counts and owners (tests/planning/test_planning_text_free.py checks that a plan made without the
    text is byte-identical to one made with it)."""
    spec = policy.spec
    if spec.contribution.selection in _TEXT_SELECTIONS:
        return True
    return (spec.mechanism == "auto" and comp.base_model is not None and comp.user_grad_ratio is None
            and spec.privacy_unit == "user")


def _load_records(snapshot) -> pa.Table:
    records = snapshot.records
    for col in ("record_id", "user_id", "text"):
        if col not in records.column_names:
            raise VeilError(f"snapshot {snapshot.snapshot_id}: records have no '{col}' column")
    records = records.select(["record_id", "user_id", "text"])
    if records.num_rows == 0:
        raise VeilError(f"snapshot {snapshot.snapshot_id} has no records to plan on")
    return records


def _load_owners(snapshot) -> pa.Table | None:
    """(record_id, owners) where the people rules made every participant an owner, else None."""
    records = snapshot.records
    return records.select(["record_id", "owners"]) if "owners" in records.column_names else None


def _train_table(bounded) -> pa.Table:
    """The plan's training rows (record_id, user_id[, rate][, owners]): what N counts and the ledger charges."""
    train_tbl = bounded.chosen.select(["record_id", "user_id"])
    if bounded.rates is not None:
        train_tbl = train_tbl.append_column("rate", pa.array(bounded.rates, pa.float64()))
    if bounded.owners is not None:      # the ledger charges every owner of a trained record
        train_tbl = train_tbl.append_column("owners", bounded.owners)
    return train_tbl


def make_plan(policy, snapshot, *, private_dir: str | Path, compute: Compute | dict | None = None,
              scorer: Scorer | None = None, created_at: str | None = None,
              cache_dir: str | Path | None = None, progress: Callable[[str], None] | None = None,
              people: tuple[dict, dict] | None = None, ledger_filter: tuple | None = None) -> Plan:
    """Turn a policy and a snapshot into a sealed public plan and its private annex.

    The annex (held-out users, canary ids, the train/attacker/canary Parquet files and their sha256,
    exact counts, `auto`'s private statistics) and the files go to `private_dir/plans/`
    (`components.draws.annex`); the returned plan holds public values and commitments only.
    `snapshot` needs `.snapshot_id`, `.sha256`, `.records` (record_id, user_id, text, …) and
    `.secret_spans` (record_id, secret_id, secret_class, …). `scorer` gives base-model perplexities
    for the ppl selection strategies. `people`: (public, annex) sections of the policy's people rules
    already applied to the records (components.bounding.people.people_for_plan). `ledger_filter`: the
    ledger's (orders, conversion), for a policy's schedule (default: a new ledger's).
    Deterministic: the same inputs (and `created_at`, and the same
    private key) give the same plan and the same sha256.
    """
    say = progress or (lambda _msg: None)
    comp, spec = _compute(compute), policy.spec
    steps = int(comp.steps or spec.training.steps)
    if private_dir is None:
        raise VeilError("plan: private_dir is required (the annex and membership files live there)")
    key = plan_key(private_dir)
    out_dir = annex_dir(private_dir)
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    records, owners = _load_records(snapshot), _load_owners(snapshot)

    say("reserving audit users and attacker samples")
    split, canaries = reserve_audit(policy, records if owners is None else records.append_column("owners", owners["owners"]),
                                    key=key, secret_spans=getattr(snapshot, "secret_spans", None),
                                    per_record=owners is not None, train_text=_reads_train_text(policy, comp))
    # The training rows in (user, record) order once: the population digest and the train file both need
    # that order, and re-sorting sorted rows is a check, not a sort (issue 27: each sort of 10⁷ people's
    # rows is ≈ 30 CPU s). A plan does not depend on its rows' order (the same snapshot shuffled plans the same).
    split = dataclasses.replace(split, train=_sorted(split.train))
    chosen = resolve(policy, split.train, steps=steps, batch=int(comp.expected_batch_size or spec.training.expected_batch_size),
                     user_grad_ratio=comp.user_grad_ratio, base_model=comp.base_model, cache_dir=cache_dir, say=say)
    mech = get(chosen.mechanism)
    ctx = PlanContext(policy=policy, snapshot=snapshot, key=key, steps=steps, batch=chosen.batch, k=chosen.k,
                      selection=chosen.selection, seed=int(spec.training.seed), scorer=scorer,
                      cache_dir=cache_dir, say=say, owners=owners, ledger_filter=ledger_filter)

    say(f"selecting records ({chosen.selection}, k={chosen.k})")
    bounded = mech.bound(ctx, split.train)
    if bounded.n_units == 0:
        raise VeilError("plan: no training data left after holding out audit users and attacker samples")
    try:
        cal = mech.calibrate(ctx, bounded)
    except PopulationRefusal as e:
        # the refusal reads only N̂, yet it is observable: say whom that N̂ counted, for the planner to
        # charge it (flows.stages.plan_snapshot)
        e.persons = _train_table(bounded)
        e.plan_like = {"mechanism": mech.name, "data": {"population": dict(e.population)},
                       "lifetime_budget": None if spec.lifetime_budget is None else spec.lifetime_budget.model_dump()}
        raise

    # members are people the model actually trained on: the bound may have left a non-held-out person
    # with nothing (multi-owner), and their samples must not be scored as a member's. A bound that kept
    # the split's training rows whole (the same table) drops nobody the split had trained: nothing to do
    if not (split.members_trained and bounded.owners is None and bounded.chosen is split.train):
        cols = [bounded.chosen.column("user_id").cast(pa.string())]
        if bounded.owners is not None:
            cols.append(pc.drop_null(pc.list_flatten(bounded.owners)).cast(pa.string()))
        trained_people = pa.chunked_array([c for col in cols for c in getattr(col, "chunks", [col])], pa.string())
        split = dataclasses.replace(split, attacker=keep_trained_members(split.attacker, trained_people))
    train_tbl = _train_table(bounded)
    files = {"train_records": _write_parquet(_sorted(train_tbl), out_dir, "train"),
             "attacker_records": _write_parquet(_sorted(split.attacker), out_dir, "attacker")}
    if canaries is not None:
        files["canary_records"] = _write_parquet(_sorted(canaries.records), out_dir, "canaries")

    eval_public, eval_annex = evaluation_sections(spec.evaluation.fraction, split.evaluation,
                                                  lambda t, stem: _write_parquet(_sorted(t), out_dir, stem))
    # The private annex: everything that names a person or a record, and every exact private count.
    snap_salt, snap_commitment = snapshot_commitment(key, snapshot.snapshot_id, snapshot.sha256)
    annex, annex_commitment = seal_annex(key, {**_annex_body(policy, snapshot, split, canaries, files, bounded,
                                                             train_tbl, cal, chosen, snap_salt), **eval_annex,
                                            **({"people": people[1]} if people else {})})
    caveats = [*BASE_CAVEATS, *chosen.caveats, *bounded.caveats, *cal.caveats]
    if canaries is not None:
        caveats.append(f"{len(canaries.users)} synthetic canary users (seed 003 App. D.2) are part of the training "
                       "data; their records are in the canary records file, not the snapshot")
    body = _public_body(policy, snapshot, mech, ctx, bounded, cal, chosen, caveats,
                        commitment(annex["salt"], files["train_records"][1]), annex, annex_commitment, created_at,
                        snap_commitment)
    body["evaluation"] = eval_public
    if people:
        body["data"]["people"] = people[0]      # policy-named exclusions only; person counts stay in the annex
    body["utility_forecast"] = plan_forecast(body, comp.trainable_parameters)  # public fields (and d) only
    plan = Plan(seal(body))
    save_annex(private_dir, plan.sha256, annex)
    return plan


BASE_CAVEATS = (
    "ε covers the training run only: hyperparameters (learning rate, clip norm, C, steps) were not "
    "tuned privately and their tuning is not accounted",
    "sampling is Poisson; the guarantee does not hold for shuffled fixed-size batches",
)


def _annex_body(policy, snapshot, split: AuditSplit, canaries: _Canaries | None, files: dict, bounded: Bounded,
                train_tbl: pa.Table, cal: Calibrated, chosen: Resolved, snapshot_salt: str) -> dict:
    named = {}
    for name, (file, sha) in files.items():
        named[f"{name}_file"], named[f"{name}_sha256"] = file, sha
    return {
        # the snapshot's real id and sha256 (content hashes: private), and the salt that opens the
        # public data.snapshot_commitment
        "plan_inputs": {"snapshot_id": snapshot.snapshot_id, "snapshot_sha256": snapshot.sha256,
                        "snapshot_salt": snapshot_salt, "policy_sha256": policy.sha256},
        "held_out_users": list(split.held_out_users),
        "canary_users": list(canaries.users) if canaries is not None else [],
        **named,
        "counts": {"n_train_users": distinct_count(bounded.chosen.column("user_id")),
                   "n_train_records": int(train_tbl.num_rows), "n_units": int(bounded.n_units),
                   "n_held_out_users": len(split.held_out_users), "n_attacker_records": int(split.attacker.num_rows),
                   "n_audit_eligible_users": int(split.n_eligible)},
        "population": cal.population_private,
        "decision": chosen.private_decision,
    }


def _audit_people(population: dict, records_per_user) -> float | None:
    """The public count of people trained on, for sizing the audit: N̂ (or N where public) when the
    unit is the person; for record units N̂/k (each person has at most k records: fewer people is the
    conservative side for "can the audit settle"). None when neither is known."""
    n = population.get("estimate") if population.get("estimate") is not None else population.get("exact")
    if n is None:
        return None
    if population.get("unit") == "users":
        return max(0.0, float(n))
    if isinstance(records_per_user, int) and records_per_user > 0:
        return max(0.0, float(n) / records_per_user)
    return None


def _public_body(policy, snapshot, mech, ctx: PlanContext, bounded: Bounded, cal: Calibrated, chosen: Resolved,
                 caveats: list[str], train_commitment: str, annex: dict, annex_commitment: str,
                 created_at: str | None, snap_commitment: str) -> dict:
    spec, tr = policy.spec, policy.spec.training
    lora = tr.lora.model_dump() if tr.lora is not None else None
    if lora is not None and lora["target_modules"] is not None:
        lora["target_modules"] = list(lora["target_modules"])
    audit = spec.audit
    per_record = mech.privacy_unit == "record" or mech.multi_owner    # reserve_audit's per-record draws
    return {
        "schema": SCHEMA,
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "mechanism": mech.name,
        "privacy_unit": mech.privacy_unit,
        "neighbouring": mech.neighbouring,
        "target": cal.target,
        "sampling_rate": float(cal.sampling_rate),
        "noise_multiplier": float(cal.noise_multiplier),
        "steps": ctx.steps,
        "expected_batch_size": cal.expected_batch_size,
        "clip_norm": float(tr.clip_norm),
        "records_per_user": bounded.records_per_user,
        "selection": mech.plan_selection(chosen.selection),
        "training": {"learning_rate": float(tr.learning_rate), "seq_len": int(tr.seq_len),
                     "micro_batch_size": int(tr.micro_batch_size), "seed": int(tr.seed), "lora": lora,
                     # only when not the default: plans without them (all earlier ones) keep their bytes and hash
                     **({"sharding": tr.sharding} if tr.sharding != "none" else {}),
                     **({"precision": tr.precision} if tr.precision != "fp32" else {}),
                     # memory only (same update)
                     **({"gradient_checkpointing": True} if tr.gradient_checkpointing else {})},
        "accounting": cal.accounting,
        # the snapshot's id and sha256 are content hashes (a membership test for anyone who knows the rest
        # of the data): a salted commitment only; the annex holds them (plan_inputs)
        "data": {"snapshot_commitment": snap_commitment,
                 # salted: the bare sha256 of a membership file can be matched against guessed files
                 "train_records_commitment": train_commitment,
                 "population": cal.population},
        "audit": {"holdout_probability": float(audit.holdout_users),
                  "attacker_samples_per_user": int(audit.attacker_samples_per_user),
                  **({"attacker_record_rate": float(audit.attacker_record_rate)} if per_record else {}),
                  "split": ("per person: an independent keyed draw holds each user out; attacker samples come "
                            "from the user's own records" if not per_record else
                            "per record: users held out by their own keyed draw, each distinct record reserved "
                            "for the attacker by its own keyed draw"),
                  "canaries": {"users": int(audit.canaries.users),
                               "records_per_user": int(audit.canaries.records_per_user),
                               # echo canaries (`veil audit-synthetic`): the public openings, stated only
                               # when the policy gives them so that other plans keep their bytes
                               **({"prefixes": list(audit.canaries.prefixes),
                                   "suffix_words": int(audit.canaries.substring_words)}
                                  if audit.canaries.prefixes else {})},
                  "thresholds": {"max_user_inference_auroc": float(audit.max_user_inference_auroc),
                                 "max_secret_exposure": float(audit.max_secret_exposure),
                                 "max_exposed_fraction": float(audit.max_exposed_fraction)},
                  "sizing": size_audit(audit, people=_audit_people(cal.population, bounded.records_per_user),
                                       epsilon=cal.accounting.get("epsilon") if mech.privacy_unit == "user" else None,
                                       delta=cal.accounting.get("delta") if mech.privacy_unit == "user" else None,
                                       secret_classes=len(spec.secrets.classes) if spec.secrets else 0)},
        "annex": {"schema": annex["schema"], "commitment": annex_commitment,
                  "where": "VEIL_HOME private area (plans/<plan sha256>.annex.json); never registered"},
        "policy": {"name": policy.name, "path": policy.path, "sha256": policy.sha256},
        "lifetime_budget": None if spec.lifetime_budget is None else spec.lifetime_budget.model_dump(),
        "release": {"required_certificate_fields": list(spec.release.required_certificate_fields),
                    "promoters": list(spec.release.promoters)},
        "decision": chosen.decision,
        "caveats": caveats,
        **bounded.extra,
        **cal.extra,
    }
