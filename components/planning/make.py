"""Policy + snapshot → plan: audit reservations, contribution bounds, sampling rate, calibrated σ."""
from __future__ import annotations

import datetime as _dt
import io
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.planning.annex import annex_dir, commitment, laplace_noise, plan_key, save_annex, seal_annex
from components.planning.audit_split import AuditSplit, masked_texts, split_canaries, split_for_audit
from components.planning.plan import SCHEMA, Plan, seal
from components.planning.selection import REDRAWN_PER_VISIT, Scorer, select_records

NEIGHBOURING = {"user": "add_remove_user", "record": "add_remove_record", "secret": "secret_substitution"}
# Plan mechanism → accountant mechanism (components.accounting names).
ACCOUNTANT_MECHANISM = {"uls": "uls", "els": "els", "group": "group-tight", "record": "record"}


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
    return table.sort_by([("user_id", "ascending"), ("record_id", "ascending")])


def _library_version() -> str:
    try:
        return version("dp-accounting")
    except PackageNotFoundError:
        return "unknown"


def _accounting_section(cal: Any, accountant_mechanism: str) -> dict:
    d = cal.to_dict() if hasattr(cal, "to_dict") else dict(cal)
    return {
        "epsilon": float(d["epsilon"]),
        "delta": float(d["delta"]),
        "mechanism": accountant_mechanism,
        "dp_event": d.get("dp_event"),
        "accountant": (f"dp_accounting PLD ({d.get('accountant', 'pld')}, "
                       f"{'pessimistic' if d.get('pessimistic', True) else 'optimistic'}, "
                       f"discretization {d.get('discretization', 'default')}, "
                       f"{d.get('accountant_version', '')})").replace(", )", ")"),
        "library_version": d.get("library_version", _library_version()),
    }


def _calibrate(mechanism: str, *, epsilon: float, delta: float, q: float, steps: int, k: int,
               cache_dir: str | Path | None):
    from components.accounting import calibrate

    return calibrate(mechanism, epsilon=epsilon, delta=delta, sampling_rate=q, steps=steps, k=k,
                     cache_dir=cache_dir)


@dataclass(frozen=True)
class _Canaries:
    records: pa.Table          # snapshot schema, every canary record (trained and held out)
    users: list[str]
    merged: AuditSplit         # the real split with the canaries' split folded in


def _canaries(policy, split: AuditSplit, seed: int, key: bytes) -> _Canaries | None:
    """Synthetic canary users, half trained and half held out, with attacker samples.

    Their size is the policy's public `canaries.records_per_user`, never a statistic of the real users
    (a median of users' counts would let every user move the canaries); their split depends on the
    canary ids alone."""
    conf = policy.spec.audit.canaries
    if conf.users <= 0:
        return None
    from components.audit import make_canary_users

    m = policy.spec.audit.attacker_samples_per_user
    recs = make_canary_users(conf.users, int(conf.records_per_user), seed, substring_words=conf.substring_words)
    c_split = split_canaries(recs.select(["record_id", "user_id", "text"]), m=m, seed=seed, key=key)
    merged = AuditSplit(
        held_out_users=sorted(split.held_out_users + c_split.held_out_users),
        trained_users=sorted(split.trained_users + c_split.trained_users),
        attacker=pa.concat_tables([split.attacker, c_split.attacker]),
        train=pa.concat_tables([split.train, c_split.train.cast(split.train.schema)]),
        n_eligible=split.n_eligible, evaluation=split.evaluation)
    return _Canaries(records=recs, users=sorted(set(recs["user_id"].to_pylist())), merged=merged)


def reserve_audit(policy, records: pa.Table, *, key: bytes, secret_spans: pa.Table | None = None
                  ) -> tuple[AuditSplit, _Canaries | None]:
    """The audit split of `records` (record_id, user_id, text) under the policy's unit, canaries merged.

    Every decision about a unit depends on that unit alone (see audit_split); tests/privacy checks it."""
    spec = policy.spec
    unit = spec.privacy_unit
    # secret units: decisions must not move when a secret's value is substituted — compare masked texts
    content = masked_texts(records, secret_spans) if unit == "secret" else None
    split = split_for_audit(records, holdout=float(spec.audit.holdout_users), m=spec.audit.attacker_samples_per_user,
                            seed=spec.training.seed, key=key, unit=unit,
                            attacker_record_rate=float(spec.audit.attacker_record_rate), content=content,
                            evaluation=float(spec.evaluation.fraction))
    canaries = _canaries(policy, split, spec.training.seed, key)
    return (canaries.merged if canaries is not None else split), canaries


def bound_contributions(train: pa.Table, mechanism: str, *, k: int, selection: str, seed: int,
                        scorer: Scorer | None = None, key: bytes | None = None) -> pa.Table:
    """The rows training may touch for a user-level mechanism: each user's choice from their own records.

    ULS with random / random-chunk keeps every record (the trainer draws G afresh at every visit);
    deterministic strategies fix each user's k records here; ELS/group bound to k (group: exactly k).
    Record and secret units train on every unreserved record (the secret LP then weights them)."""
    if mechanism in ("uls", "uls-filtered"):
        if selection in ("random",) + REDRAWN_PER_VISIT:
            return train
        return select_records(train, k, selection, seed=seed, scorer=scorer, key=key)
    if mechanism in ("els", "group"):
        return select_records(train, k, selection, seed=seed, scorer=scorer, exactly_k=(mechanism == "group"),
                              key=key)
    return train


# Largest change one privacy unit makes to the count N that q = B/N divides by (the Laplace
# sensitivity), per mechanism; k = records_per_user. See _population.
def _population_sensitivity(mechanism: str, k: int) -> tuple[str, int, str]:
    if mechanism == "uls":
        return "users", 1, "adding or removing one person changes the number of training users by at most 1"
    if mechanism == "els":
        return "records", k, (f"N counts the bounded records Σ min(n_u, k); one person adds or removes at most "
                              f"k = {k} of them")
    if mechanism == "group":
        return "records", k, f"every person contributes exactly k = {k} (resampled) records"
    if mechanism == "record":
        return "records", 1, ("adding or removing one record changes the training records by at most that "
                              "record (every audit and selection decision is per record)")
    raise VeilError(f"plan: no population estimate for mechanism {mechanism!r}")  # pragma: no cover


def _population(key: bytes, *, mechanism: str, k: int, n_exact: int, epsilon_total: float, fraction: float,
                snapshot, policy) -> tuple[dict, dict]:
    """(public section, annex section) of the DP estimate N̂ = N + Laplace(Δ/ε_N).

    The noise comes from the planner's keyed PRF over the plan's inputs: re-planning the same snapshot
    with the same policy gives the same N̂, so nothing new is released (no averaging)."""
    unit, sens, why = _population_sensitivity(mechanism, k)
    eps_n = float(fraction) * float(epsilon_total)
    scale = sens / eps_n
    noise = laplace_noise(key, scale, "population", snapshot.sha256, policy.sha256, mechanism, int(k))
    estimate = float(n_exact) + noise
    public = {"unit": unit, "estimate": estimate, "mechanism": "laplace", "epsilon": eps_n, "delta": 0.0,
              "sensitivity": sens, "scale": scale, "sensitivity_reason": why,
              "composition": "basic: the certificate's ε is ε_N + ε_DP-SGD at the same δ"}
    return public, {"unit": unit, "exact": int(n_exact), "noise": noise}


def make_plan(policy, snapshot, *, private_dir: str | Path, compute: Compute | dict | None = None,
              scorer: Scorer | None = None, created_at: str | None = None,
              cache_dir: str | Path | None = None, progress: Callable[[str], None] | None = None) -> Plan:
    """Turn a policy and a snapshot into a sealed public plan and its private annex.

    The annex (held-out users, canary ids, the train/attacker/canary Parquet files and their sha256,
    exact counts, `auto`'s private statistics) and the files go to `private_dir/plans/`
    (`components.planning.annex`); the returned plan holds public values and commitments only.
    `snapshot` needs `.snapshot_id`, `.sha256`, `.records` (record_id, user_id, text, …) and
    `.secret_spans` (record_id, secret_id, secret_class, …). `scorer` gives base-model perplexities
    for the ppl selection strategies. Deterministic: the same inputs (and `created_at`, and the same
    private key) give the same plan and the same sha256.
    """
    say = progress or (lambda _msg: None)
    comp = _compute(compute)
    spec = policy.spec
    tr = spec.training
    steps = int(comp.steps or tr.steps)
    batch = int(comp.expected_batch_size or tr.expected_batch_size)
    if private_dir is None:
        raise VeilError("plan: private_dir is required (the annex and membership files live there)")
    key = plan_key(private_dir)
    out_dir = annex_dir(private_dir)
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    records = snapshot.records
    for col in ("record_id", "user_id", "text"):
        if col not in records.column_names:
            raise VeilError(f"snapshot {snapshot.snapshot_id}: records have no '{col}' column")
    records = records.select(["record_id", "user_id", "text"])
    if records.num_rows == 0:
        raise VeilError(f"snapshot {snapshot.snapshot_id} has no records to plan on")

    say("reserving audit users and attacker samples")
    unit = spec.privacy_unit
    split, canaries = reserve_audit(policy, records, key=key, secret_spans=getattr(snapshot, "secret_spans", None))
    caveats: list[str] = [
        "ε covers the training run only: hyperparameters (learning rate, clip norm, C, steps) were not "
        "tuned privately and their tuning is not accounted",
        "sampling is Poisson; the guarantee does not hold for shuffled fixed-size batches",
    ]

    mechanism = spec.mechanism
    decision: dict[str, Any] = {"requested": spec.mechanism}
    private_decision: dict[str, Any] | None = None
    k = spec.contribution.max_records_per_user
    selection = spec.contribution.selection
    if mechanism == "auto":
        from components.planning.mechanism import choose_mechanism

        ratio = comp.user_grad_ratio
        if ratio is None and comp.base_model is not None and spec.privacy_unit == "user":
            from components.planning.gradient_diversity import estimate_user_grad_ratio

            say("estimating per-user gradient diversity at the base model")
            g_values = [g for g in (1, 2, 4, 8, 16, 32, 64) if g <= k]
            ratio = estimate_user_grad_ratio(comp.base_model[0], comp.base_model[1], split.train, g_values=g_values,
                                             seq_len=tr.seq_len, seed=tr.seed)
        private_decision = {}
        if ratio is not None and getattr(ratio, "table", None):
            private_decision["user_grad_ratio"] = {str(g): v for g, v in sorted(ratio.table.items())}
        say("comparing mechanisms for 'auto'")
        choice = choose_mechanism(policy, split.train, steps=steps, expected_batch_size=batch,
                                  user_grad_ratio=ratio, cache_dir=cache_dir)
        mechanism = choice.mechanism
        # The reasons and candidates quote noise levels at q = B/N and Σ min(n_u, k): private. Publish
        # the decision alone, with its caveat.
        private_decision.update(choice.to_dict())
        auto_caveat = ("mechanism 'auto': the choice used private statistics (users' record counts"
                       + (" and gradient norms of their records at the base model" if ratio is not None else "")
                       + "), without noise; the choice is not accounted")
        decision.update({"mechanism": mechanism, "caveat": auto_caveat})
        caveats.append(auto_caveat)
        if mechanism in ("uls", "els", "group"):
            batch, k = choice.expected_batch_size, choice.records_per_user
            decision.update({"expected_batch_size": int(batch), "records_per_user": int(k)})
        if selection in REDRAWN_PER_VISIT and mechanism != "uls":
            selection = "random"
    else:
        decision.update({"mechanism": mechanism, "reason": f"the policy names '{mechanism}'"})

    extra: dict[str, Any] = {}
    rate_col: np.ndarray | None = None
    say(f"selecting records ({selection}, k={k})")
    if mechanism in ("uls", "uls-filtered"):
        chosen = bound_contributions(split.train, mechanism, k=k, selection=selection, seed=tr.seed, scorer=scorer,
                                     key=key)
        n_units = len(set(chosen.column("user_id").to_pylist()))
        records_per_user: int | None = k
        if selection in REDRAWN_PER_VISIT or selection == "random":
            caveats.append(f"ULS draws {'chunks' if selection == 'random-chunk' else 'records'} afresh at every "
                           "visit of a user; the bound holds because a user's gradient is one clipped mean")
    elif mechanism in ("els", "group"):
        chosen = bound_contributions(split.train, mechanism, k=k, selection=selection, seed=tr.seed, scorer=scorer,
                                     key=key)
        n_units = chosen.num_rows
        records_per_user = k
        if mechanism == "group":
            caveats.append("group privacy resamples users with fewer than k records up to k (duplicates)")
    elif mechanism == "record":
        chosen = split.train
        n_units = chosen.num_rows
        records_per_user = None
    elif mechanism == "secret":
        from components.planning.secret_plan import plan_secret_rates

        chosen = split.train
        say("solving the secret LP")
        lp_section, rate_col, chosen = plan_secret_rates(policy, chosen, snapshot.secret_spans,
                                                         expected_batch_size=batch)
        extra["secret_lp"] = lp_section
        n_units = chosen.num_rows
        records_per_user = None
    else:  # pragma: no cover - the policy model rejects other names
        raise VeilError(f"plan: unknown mechanism {mechanism!r}")

    if n_units == 0:
        raise VeilError("plan: no training data left after holding out audit users and attacker samples")
    n_train_users = len(set(chosen.column("user_id").to_pylist()))
    population_private: dict[str, Any] = {}

    if mechanism == "uls-filtered":
        from components.accounting.filtered import calibrate_filtered, filtered_noise

        q, batch = 1.0, n_units                   # every user, every step
        target = {"epsilon": float(spec.target.epsilon), "delta": float(spec.target.delta)}
        say(f"calibrating σ (filtered ULS: sparse vector ε/2 + {steps} full-batch Gaussian steps at ε/2)")
        cal = calibrate_filtered(epsilon=target["epsilon"], delta=target["delta"], steps=steps)
        sigma = float(cal.noise_multiplier)
        extra["filter"] = {"tau": float(spec.filter.tau), "epsilon": target["epsilon"], "delta": target["delta"],
                           "variant": "veil"}
        # refuses (one line) when there are too few users for the bound
        noise = filtered_noise(epsilon=target["epsilon"], delta=target["delta"], steps=steps, n_users=n_units,
                               tau=float(spec.filter.tau), noise_multiplier=sigma)
        gauss = _accounting_section(cal, "record")
        accounting = {**gauss, "mechanism": "uls-filtered", "epsilon": target["epsilon"] / 2 + gauss["epsilon"],
                      "delta": target["delta"] / 2 + target["delta"] / 4,  # Gaussian δ/2 + e^ε·δ1 = δ/4
                      "epsilon_sparse_vector": target["epsilon"] / 2, "epsilon_gaussian": gauss["epsilon"],
                      "filter_noise": noise.to_dict()}
        caveats.append("filtered ULS may halt before its planned steps if users' gradients are not concentrated "
                       "within τ; see docs/privacy/filtered-uls.md for the bound and its assumptions")
        population = {"unit": "users", "exact": int(n_units), "mechanism": "none", "epsilon": 0.0, "delta": 0.0,
                      "why": "replace-one-user neighbouring keeps the number of users fixed, so it is public under "
                             "this relation (the filter's noise is calibrated to it)"}
        population_private = {"unit": "users", "exact": int(n_units)}
    elif mechanism == "secret":
        from components.planning.secret_plan import calibrate_secret

        q = batch / max(1, chosen.num_rows)       # the mean per-record rate, for display and training
        say("calibrating σ for every secret")
        cal_section, sigma, target = calibrate_secret(policy, chosen, rate_col, snapshot.secret_spans,
                                                      steps=steps, cache_dir=cache_dir)
        accounting = cal_section
        population = {"unit": "records", "exact": int(chosen.num_rows), "mechanism": "none", "epsilon": 0.0,
                      "delta": 0.0,
                      "why": "secret-substitution neighbours differ in a secret's value, never in how many records "
                             "there are: the record count is the same on both sides, so publishing it costs nothing "
                             "under this relation (it is not protected either)"}
        population_private = {"unit": "records", "exact": int(chosen.num_rows)}
    else:
        target = {"epsilon": float(spec.target.epsilon), "delta": float(spec.target.delta)}
        # N is private under add/remove neighbours: q = B/N̂ with N̂ a Laplace estimate, paid from ε.
        population, population_private = _population(
            key, mechanism=mechanism, k=int(k), n_exact=int(n_units), epsilon_total=target["epsilon"],
            fraction=float(spec.population.epsilon_fraction), snapshot=snapshot, policy=policy)
        unit_word = population["unit"]
        if population["estimate"] < batch:
            raise VeilError(f"spec.training.expected_batch_size: {batch} {unit_word} per step but the (DP) estimate "
                            f"of the {unit_word} that can be trained on is {population['estimate']:.1f}; lower it")
        q = batch / population["estimate"]
        eps_n = float(population["epsilon"])
        eps_sgd_target = target["epsilon"] - eps_n
        acc_mech = ACCOUNTANT_MECHANISM[mechanism]
        say(f"calibrating σ ({acc_mech}, q={q:.4g}, T={steps}, ε_DP-SGD={eps_sgd_target:.4g} after ε_N={eps_n:.3g})")
        cal = _calibrate(acc_mech, epsilon=eps_sgd_target, delta=target["delta"], q=q, steps=steps,
                         k=1 if mechanism in ("uls", "record") else k, cache_dir=cache_dir)
        sigma = float(cal.noise_multiplier)
        accounting = _accounting_section(cal, acc_mech)
        eps_sgd = accounting["epsilon"]
        accounting.update({"epsilon": eps_n + eps_sgd, "epsilon_dp_sgd": eps_sgd, "epsilon_population": eps_n})
        if accounting["epsilon"] > target["epsilon"] * (1 + 1e-9):
            raise VeilError(f"accounting: calibrated σ={sigma:g} gives ε={accounting['epsilon']:g} (ε_N {eps_n:g} + "
                            f"DP-SGD {eps_sgd:g}) above the target {target['epsilon']:g}; refusing to plan")
        caveats.append(f"the number of training {unit_word} is private: only a Laplace estimate N̂ "
                       f"(ε_N = {eps_n:.4g}, sensitivity {population['sensitivity']}) is used and published; "
                       f"q = B/N̂ and the step's divisor B depend on N̂ alone, and ε includes ε_N")

    train_tbl = chosen.select(["record_id", "user_id"])
    if rate_col is not None:
        train_tbl = train_tbl.append_column("rate", pa.array(rate_col, pa.float64()))
    train_tbl = _sorted(train_tbl)
    train_file, train_sha = _write_parquet(train_tbl, out_dir, "train")
    attacker_file, attacker_sha = _write_parquet(_sorted(split.attacker), out_dir, "attacker")

    canary_file = canary_sha = None
    if canaries is not None:
        canary_file, canary_sha = _write_parquet(_sorted(canaries.records), out_dir, "canaries")
        caveats.append(f"{len(canaries.users)} synthetic canary users (seed 003 App. D.2) are part of the training "
                       "data; their records are in the canary records file, not the snapshot")

    from components.planning.eval_split import evaluation_sections
    eval_public, eval_annex = evaluation_sections(spec.evaluation.fraction, split.evaluation,
                                                  lambda t, stem: _write_parquet(_sorted(t), out_dir, stem))
    # The private annex: everything that names a person or a record, and every exact private count.
    annex, annex_commitment = seal_annex(key, {
        "plan_inputs": {"snapshot_id": snapshot.snapshot_id, "snapshot_sha256": snapshot.sha256,
                        "policy_sha256": policy.sha256},
        "held_out_users": list(split.held_out_users),
        "canary_users": list(canaries.users) if canaries is not None else [],
        "train_records_file": train_file, "train_records_sha256": train_sha,
        "attacker_records_file": attacker_file, "attacker_records_sha256": attacker_sha,
        **({"canary_records_file": canary_file, "canary_records_sha256": canary_sha} if canaries is not None else {}),
        "counts": {"n_train_users": int(n_train_users), "n_train_records": int(train_tbl.num_rows),
                   "n_units": int(n_units), "n_held_out_users": len(split.held_out_users),
                   "n_attacker_records": int(split.attacker.num_rows),
                   "n_audit_eligible_users": int(split.n_eligible)},
        "population": population_private,
        "decision": private_decision,
        **eval_annex,
    })
    lora = tr.lora.model_dump() if tr.lora is not None else None
    if lora is not None and lora["target_modules"] is not None:
        lora["target_modules"] = list(lora["target_modules"])
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "mechanism": mechanism,
        "privacy_unit": unit,
        "neighbouring": NEIGHBOURING[unit],
        "target": target,
        "sampling_rate": float(q),
        "noise_multiplier": float(sigma),
        "steps": steps,
        "expected_batch_size": batch,
        "clip_norm": float(tr.clip_norm),
        "records_per_user": records_per_user,
        "selection": selection if mechanism in ("uls", "uls-filtered", "els", "group") else None,
        "training": {"learning_rate": float(tr.learning_rate), "seq_len": int(tr.seq_len),
                     "micro_batch_size": int(tr.micro_batch_size), "seed": int(tr.seed), "lora": lora},
        "accounting": accounting,
        "data": {"snapshot_id": snapshot.snapshot_id, "snapshot_sha256": snapshot.sha256,
                 # salted: the bare sha256 of a membership file can be matched against guessed files
                 "train_records_commitment": commitment(annex["salt"], train_sha),
                 "population": population},
        "audit": {"holdout_probability": float(spec.audit.holdout_users),
                  "attacker_samples_per_user": int(spec.audit.attacker_samples_per_user),
                  **({"attacker_record_rate": float(spec.audit.attacker_record_rate)} if unit == "record" else {}),
                  "split": ("per person: an independent keyed draw holds each user out; attacker samples come "
                            "from the user's own records" if unit != "record" else
                            "per record: users held out by their own keyed draw, each distinct record reserved "
                            "for the attacker by its own keyed draw"),
                  "canaries": {"users": int(spec.audit.canaries.users),
                               "records_per_user": int(spec.audit.canaries.records_per_user)},
                  "thresholds": {"max_user_inference_auroc": float(spec.audit.max_user_inference_auroc),
                                 "max_secret_exposure": float(spec.audit.max_secret_exposure)}},
        "evaluation": eval_public,
        "annex": {"schema": annex["schema"], "commitment": annex_commitment,
                  "where": "VEIL_HOME private area (plans/<plan sha256>.annex.json); never registered"},
        "policy": {"name": policy.name, "path": policy.path, "sha256": policy.sha256},
        "lifetime_budget": None if spec.lifetime_budget is None else spec.lifetime_budget.model_dump(),
        "release": {"required_certificate_fields": list(spec.release.required_certificate_fields),
                    "promoters": list(spec.release.promoters)},
        "decision": decision,
        "caveats": caveats,
        **extra,
    }
    plan = Plan(seal(body))
    save_annex(private_dir, plan.sha256, annex)
    return plan
