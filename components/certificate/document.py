"""Build, hash, verify and amend privacy certificates."""
from __future__ import annotations

import datetime as _dt
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from components.core.errors import VeilError
from components.core.hashing import sha256_json

SCHEMA = "veil.certificate/v1"

# Training mechanism -> (accountant mechanism, privacy unit, neighbouring relation).
_ACCOUNTING = {
    "uls": ("uls", "user", "add_remove_user"),
    "els": ("els", "user", "add_remove_user"),
    "group": ("group-tight", "user", "add_remove_user"),
    "record": ("record", "record", "add_remove_record"),
}

REQUIRED_FIELDS = (
    "schema", "privacy_unit", "neighbouring", "epsilon", "delta", "accountant", "dp_event",
    "noise_multiplier", "sampling_rate", "steps", "clip_norm", "contribution_bound", "dataset",
    "policy", "plan_sha256", "code_version", "created_at", "sha256",
)


@dataclass(frozen=True)
class Certificate:
    """A certificate document (a plain dict) with accessors for the numbers consumers check."""

    doc: dict

    @property
    def sha256(self) -> str:
        return self.doc["sha256"]

    @property
    def epsilon(self) -> float:
        return float(self.doc["epsilon"])

    @property
    def delta(self) -> float:
        return float(self.doc["delta"])

    def to_dict(self) -> dict:
        return dict(self.doc)


def _seal(doc: dict) -> dict:
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return {**body, "sha256": sha256_json(body)}


def code_version(repo_dir: str | Path | None = None) -> str:
    """`veil <version>+g<commit>[.dirty]` when run from a git checkout, else the package version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("veil")
    except PackageNotFoundError:  # running from a source tree without install
        pkg = "0+unknown"
    root = Path(repo_dir) if repo_dir else Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"veil {pkg}"
    return f"veil {pkg}+g{commit}{'.dirty' if dirty else ''}"


def _accounting_mechanism(mechanism: str) -> tuple[str, str, str]:
    try:
        return _ACCOUNTING[mechanism]
    except KeyError:
        raise VeilError(
            f"mechanism {mechanism!r} cannot be certified; certifiable mechanisms: "
            f"{', '.join([*_ACCOUNTING, 'secret'])}") from None


def plan_data_fingerprint(plan: Mapping[str, Any]) -> str | None:
    """The plan's fingerprint of the training data the run must have read: the salted commitment to
    the train-records file's sha256 (the raw sha256 is in the private annex; the trainer, which holds
    the annex, commits the sha256 of the bytes it actually read under the same salt)."""
    return (plan.get("data") or {}).get("train_records_commitment")


def _bind_run(plan: Mapping[str, Any], train_result: Mapping[str, Any]) -> None:
    """Refuse a run that is not the plan's run: k and selection, the data it read, steps, weights."""
    from components.core.fingerprints import weights_fingerprint

    def refuse(what: str) -> None:
        raise VeilError(f"training result does not match plan {str(plan.get('sha256', '?'))[:12]}…: {what}: "
                        "not certifiable")

    k_plan, k_run = plan.get("records_per_user"), train_result.get("records_per_user")
    if (None if k_plan is None else int(k_plan)) != (None if k_run is None else int(k_run)):
        refuse(f"records per user k={k_run} but the plan says k={k_plan}")
    sel_run = (train_result.get("extra") or {}).get("selection", plan.get("selection"))
    if sel_run != plan.get("selection"):
        refuse(f"selection {sel_run!r} but the plan says {plan.get('selection')!r}")
    want = plan_data_fingerprint(plan)
    got = train_result.get("train_records_commitment")
    if got is None:
        refuse("it does not record which train-records file it read (older Veil, or data not from the plan)")
    if got != want:
        refuse(f"the train records it read commit to {got[:12]}… but the plan's commitment is {str(want)[:12]}…")
    attempted = max(int(train_result["steps_run"]), int(train_result.get("steps_attempted") or 0))
    if attempted > int(plan["steps"]):
        refuse(f"{attempted} steps were started but the plan has {int(plan['steps'])}")
    weights = train_result.get("weights") or {}
    wdir = train_result.get("adapter_dir") or train_result.get("model_dir")
    if not weights.get("sha256") or not wdir:
        refuse("it names no trained weights")
    if weights_fingerprint(wdir)["sha256"] != weights["sha256"]:
        refuse(f"the weights in {wdir} are not the ones training wrote (changed since)")


def _run_section(train_result: Mapping[str, Any]) -> dict:
    """What ran, as the certificate records it: weights, base model and tokenizer hashes, device."""
    w = train_result.get("weights") or {}
    return {"weights": {"kind": "lora-adapter" if train_result.get("adapter_dir") else "full-model",
                        "sha256": w.get("sha256"), "files": dict(w.get("files") or {})},
            "base_model": dict(train_result.get("base_model") or {}) or None,
            "tokenizer": dict(train_result.get("tokenizer") or {}) or None,
            "train_records_commitment": train_result.get("train_records_commitment"),
            "steps_attempted": max(int(train_result["steps_run"]), int(train_result.get("steps_attempted") or 0)),
            "device": train_result.get("device"), "precision": train_result.get("precision"),
            "world_size": train_result.get("world_size")}


def _checked_steps(plan: Mapping[str, Any], train_result: Mapping[str, Any]) -> tuple[int, list[str]]:
    """Refuse a run that used other numbers than its plan; return the steps to charge and caveats."""
    mechanism = plan["mechanism"]
    for key in ("noise_multiplier", "sampling_rate", "clip_norm"):
        if abs(float(train_result[key]) - float(plan[key])) > 1e-12 * max(1.0, abs(float(plan[key]))):
            raise VeilError(f"training used {key}={train_result[key]} but the plan says {plan[key]}: not certifiable")
    if train_result.get("mechanism", mechanism) != mechanism:
        raise VeilError(f"training ran {train_result['mechanism']!r} but the plan says {mechanism!r}")
    _bind_run(plan, train_result)
    # Steps started before a crash released gradients too: they count.
    steps = max(int(train_result["steps_run"]), int(train_result.get("steps_attempted") or 0))
    if steps < 0:
        raise VeilError(f"steps_run must be ≥ 0, got {steps}")
    caveats = list(plan.get("caveats", []))
    if train_result.get("private_seed_source") == "spec":
        caveats.append("batch sampling and noise were seeded from the plan (reproducible test run): "
                       "anyone holding the seed can remove the noise; not a valid release guarantee")
    return steps, caveats


def _population(plan: Mapping[str, Any]) -> dict:
    """The plan's public population section (how N entered: a Laplace estimate, or public by the
    neighbouring relation). A plan without one treated N as public: say so, never silently."""
    pop = (plan.get("data") or {}).get("population")
    if pop is None:
        return {"mechanism": "none", "epsilon": 0.0, "delta": 0.0,
                "why": "the plan gives no population estimate: the number of training units is treated as public"}
    return dict(pop)


def population_epsilon(doc: Mapping[str, Any]) -> float:
    """ε spent on the DP population estimate N̂ (0 when N is public under the neighbouring relation)."""
    return float(((doc.get("dataset") or {}).get("population") or {}).get("epsilon") or 0.0)


def _common(plan: Mapping[str, Any], steps: int, caveats: list[str], created_at: str | None,
            version: str | None, train_result: Mapping[str, Any]) -> dict:
    data = plan["data"]
    pop = _population(plan)
    if pop.get("mechanism") == "laplace":
        caveats = caveats + [
            f"population: the number of training {pop['unit']} N is private; it entered only through "
            f"N̂ = N + Laplace({pop['sensitivity']}/ε_N) = {pop['estimate']:.2f} with ε_N = {pop['epsilon']:.4g} "
            "(q = B/N̂, the step divisor is B), composed with DP-SGD by basic composition: ε = ε_N + ε_DP-SGD, "
            "δ unchanged"]
    elif data.get("population") is None:
        caveats = caveats + [pop["why"]]
    return {
        "run": _run_section(train_result),
        "noise_multiplier": float(plan["noise_multiplier"]),
        "sampling_rate": float(plan["sampling_rate"]),
        "steps": steps,
        "steps_planned": int(plan["steps"]),
        "expected_batch_size": plan.get("expected_batch_size"),
        "clip_norm": float(plan["clip_norm"]),
        "sampling": "poisson",
        "releases": "all intermediate models (the accountant composes every step)",
        # No exact private count and no bare membership hash: a salted commitment and the population
        # section (a DP estimate, or a count public under the neighbouring relation).
        "dataset": {"snapshot_id": data["snapshot_id"], "snapshot_sha256": data["snapshot_sha256"],
                    "train_records_commitment": data.get("train_records_commitment"),
                    "population": pop},
        "policy": {"name": plan["policy"].get("name"), "sha256": plan["policy"]["sha256"]},
        "plan_sha256": plan["sha256"],
        "caveats": caveats,
        "code_version": version or code_version(),
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "audit": None,
        "utility_forecast": _utility_forecast(plan, train_result),
    }


def _utility_forecast(plan: Mapping[str, Any], train_result: Mapping[str, Any]) -> dict | None:
    """The plan's utility forecast (components.planning.forecast), carried over; recomputed from the
    plan's public numbers and the run's trainable-parameter count d when the plan had no d (planned
    without the base model) or another one. Utility, not privacy: nothing here bounds a risk."""
    from components.planning.forecast import plan_forecast

    fc = plan.get("utility_forecast")
    d = train_result.get("trainable_params")
    if fc and fc.get("verdict") != "unknown" and (d is None or fc.get("trainable_parameters") == int(d)):
        return {**fc, "source": "plan"}
    if not d:
        return {**fc, "source": "plan"} if fc else None
    return {**plan_forecast(plan, int(d), with_hints=False), "source": "plan numbers, the run's d"}


def build_certificate(plan: Mapping[str, Any], train_result: Mapping[str, Any], *,
                      secret_targets: Sequence[Any] | None = None, untagged_rate: float | None = None,
                      created_at: str | None = None, version: str | None = None) -> Certificate:
    """Certify a finished training run against its plan.

    ε (or, for secret protection, every secret's posterior bound γ) is recomputed for the steps the
    run actually took, with the σ and q training actually used; a run whose σ, q or C differs from
    the plan's is refused rather than certified on the plan's word. Secret-protection runs need
    `secret_targets` (one `accounting.secrets.SecretTarget` per secret, from the plan's rates) and
    `untagged_rate`, the largest rate of a trained record that holds no protected secret (None when
    no such record was trained on), for the record-level guarantee untagged records get.
    """
    if plan["mechanism"] == "secret":
        return _build_secret_certificate(plan, train_result, secret_targets, created_at, version, untagged_rate)
    if plan["mechanism"] == "uls-filtered":
        return _build_filtered_certificate(plan, train_result, created_at, version)
    from components.accounting import epsilon as account

    mechanism = plan["mechanism"]
    acc_mech, unit, neighbouring = _accounting_mechanism(mechanism)
    steps, caveats = _checked_steps(plan, train_result)
    k = 1 if acc_mech in ("uls", "record") else int(plan["records_per_user"])
    delta = float(plan["target"]["delta"])
    if steps == 0:
        eps_sgd, event, meta = 0.0, {"name": "NoOpDpEvent"}, {}
    else:
        res = account(acc_mech, sampling_rate=float(plan["sampling_rate"]),
                      noise_multiplier=float(plan["noise_multiplier"]), steps=steps, delta=delta, k=k)
        eps_sgd, event = float(res.epsilon), res.dp_event
        if not math.isfinite(eps_sgd):
            raise VeilError(f"no finite ε reaches δ={delta:g} for this run: not certifiable")
        meta = {"library_version": res.library_version, "pessimistic": res.pessimistic,
                "discretization": res.discretization, "notes": list(res.notes)}
    # The population estimate N̂ was released with the plan (q depends on it), steps or not.
    eps_n = float(_population(plan).get("epsilon") or 0.0)
    eps_value = eps_n + eps_sgd
    doc = {
        "schema": SCHEMA,
        "privacy_unit": unit,
        "neighbouring": neighbouring,
        "mechanism": mechanism,
        "epsilon": eps_value,
        "delta": delta,
        "epsilon_parts": {"population_estimate": eps_n, "dp_sgd": eps_sgd,
                          "composition": "basic (ε adds, δ is DP-SGD's)"},
        "target": dict(plan["target"]),
        "within_target": eps_value <= float(plan["target"]["epsilon"]) + 1e-12,
        "accountant": {"name": "dp_accounting.pld.PLDAccountant", "mechanism": acc_mech,
                       "library": "dp-accounting", **meta},
        "dp_event": event,
        "contribution_bound": {
            "records_per_user": plan.get("records_per_user"),
            "selection": plan.get("selection"),
            # ULS bounds a user's influence by clipping their averaged gradient, whatever their count.
            "kind": "per-user clipped mean gradient" if mechanism == "uls" else "records per user",
        },
        **_common(plan, steps, caveats, created_at, version, train_result),
    }
    return Certificate(_seal(doc))


def _filtered_gaussian_steps(train_result: Mapping[str, Any], steps: int) -> int:
    """Noisy updates to charge: every started step except the one whose test halted the run."""
    halted = (train_result.get("extra") or {}).get("halted_at_step")
    return steps - (1 if halted is not None and steps > int(halted) else 0)


def _build_filtered_certificate(plan, train_result, created_at, version) -> Certificate:
    """Asi & Liu's filtered ULS (veil variant only): ε/2 for the sparse vector + the full-batch
    Gaussian steps' ε at δ/2; δ = δ/2 + e^ε·δ1 (components.accounting.filtered)."""
    from components.accounting import LIBRARY_VERSION
    from components.accounting.filtered import filtered_epsilon, filtered_noise

    f = dict(plan.get("filter") or {})
    if f.get("variant", "veil") != "veil":
        raise VeilError("uls-filtered with the paper's printed noise (variant 'seed') has no privacy proof we "
                        "could check: not certifiable; use variant 'veil'")
    if dict((train_result.get("extra") or {}).get("filter") or {}) != f:
        raise VeilError(f"training used filter {train_result.get('extra', {}).get('filter')} but the plan says {f}")
    started, caveats = _checked_steps(plan, train_result)
    steps = _filtered_gaussian_steps(train_result, started)
    pop = _population(plan)
    if pop.get("exact") is None:
        raise VeilError("uls-filtered plan: its population section does not give the (public, replace-one) user count")
    n_users = int(pop["exact"])
    noise = filtered_noise(epsilon=float(f["epsilon"]), delta=float(f["delta"]), steps=int(plan["steps"]),
                           n_users=n_users, tau=float(f["tau"]), noise_multiplier=float(plan["noise_multiplier"]))
    acc = filtered_epsilon(epsilon=float(f["epsilon"]), delta=float(f["delta"]),
                           noise_multiplier=float(plan["noise_multiplier"]), steps_run=steps)
    caveats.append("filtered ULS (Asi & Liu 2024, seed 000 Alg. 3) with Veil's own sensitivity bound "
                   "(docs/privacy/filtered-uls.md), under replace-one-user neighbouring with the user count public")
    doc = {
        "schema": SCHEMA,
        "privacy_unit": "user",
        "neighbouring": "replace_one_user",
        "mechanism": "uls-filtered",
        "epsilon": float(acc["epsilon"]),
        "delta": float(acc["delta"]),
        "target": dict(plan["target"]),
        "within_target": acc["epsilon"] <= float(plan["target"]["epsilon"]) + 1e-12
                         and acc["delta"] <= float(plan["target"]["delta"]) * (1 + 1e-12),
        "accountant": {"name": "sparse vector (pure ε/2) + dp_accounting PLD of full-batch Gaussian steps",
                       "mechanism": "uls-filtered", "library": "veil + dp-accounting",
                       "library_version": LIBRARY_VERSION, "pessimistic": True, **acc},
        "dp_event": None,
        "filter": {**f, "halted_at_step": (train_result.get("extra") or {}).get("halted_at_step"),
                   "gaussian_steps": steps, **{k: v for k, v in noise.to_dict().items() if k != "variant"}},
        "contribution_bound": {"records_per_user": plan.get("records_per_user"), "selection": plan.get("selection"),
                               "kind": "filtered mean of unclipped per-user mean gradients (sensitivity 60τ/W_min)"},
        **_common(plan, started, caveats, created_at, version, train_result),
    }
    return Certificate(_seal(doc))


# δ at which an untagged record's record-level ε is certified (the secret plan has no δ of its own).
UNTAGGED_DELTA = 1e-5
TAGGED_ONLY = ("the guarantee covers tagged occurrences only: a secret the tagger missed (no detector "
               "matched it) is trained on as an untagged record and gets nothing from the per-secret bounds "
               "below, only the untagged records' record-level guarantee (if any)")


def _untagged_section(plan, untagged_rate: float | None, steps: int) -> dict:
    """What a record holding no protected secret gets: it is sampled at its LP rate (≤ untagged_rate)
    and clipped to C like every record, so the Poisson-subsampled Gaussian gives it a record-level
    (ε, δ) under add/remove of that record, with every other record's rate held fixed."""
    from components.accounting import epsilon as account

    policy = (plan.get("secret_lp") or {}).get("untagged_records")
    if untagged_rate is None or untagged_rate <= 0:
        return {"policy": policy, "trained_on": False, "max_rate": None, "epsilon": None, "delta": None,
                "guarantee": "no record without a protected secret was trained on: nothing to cover"}
    sigma = float(plan["noise_multiplier"])
    out = {"policy": policy, "trained_on": True, "max_rate": float(untagged_rate), "delta": UNTAGGED_DELTA,
           "neighbouring": "add_remove_record (other records' rates held fixed)"}
    if steps == 0:
        return {**out, "epsilon": 0.0, "guarantee": "record-level: no step was run"}
    res = account("record", sampling_rate=float(untagged_rate), noise_multiplier=sigma, steps=steps,
                  delta=UNTAGGED_DELTA)
    eps = float(res.epsilon)
    if not math.isfinite(eps):
        return {**out, "epsilon": None, "guarantee": f"none: no finite record-level ε at δ={UNTAGGED_DELTA:g}"}
    return {**out, "epsilon": eps, "accountant": {"name": "dp_accounting.pld.PLDAccountant", "mechanism": "record",
                                                 "pessimistic": res.pessimistic, "discretization": res.discretization},
            "guarantee": (f"record-level ε={eps:.4g} at δ={UNTAGGED_DELTA:g} (Poisson rate ≤ {untagged_rate:.4g}, "
                          f"σ={sigma:g}, {steps} steps): about whether a record is in training, not about a "
                          "secret it may hold")}


def _build_secret_certificate(plan, train_result, targets, created_at, version, untagged_rate=None) -> Certificate:
    """Per-secret posterior bounds (seed 004, Lemma 3.2, KL case), aggregated per class.

    Secret ids carry the secrets' values, so the certificate — a registered, shareable document —
    holds per-class aggregates only.
    """
    from components.accounting import LIBRARY_VERSION
    from components.accounting.secrets import DEFAULT_SENSITIVITY, DOMINANCE_NOTE, SENSITIVITY_REASON, report_secrets

    if not targets:
        raise VeilError("secret-protection run: no secret targets to certify (the plan's records hold no secret "
                        "of the policy's classes)")
    steps, caveats = _checked_steps(plan, train_result)
    sigma = float(plan["noise_multiplier"])
    reports = report_secrets(targets, sigma, steps) if steps > 0 else []
    classes: dict[str, dict] = {}
    for t in targets:
        cls = t.secret_id.split(":", 1)[0]
        classes.setdefault(cls, {"kappa": t.kappa, "gamma_target": t.gamma, "n_secrets": 0, "max_gamma": t.kappa,
                                 "max_kl": 0.0, "max_kl_per_step": 0.0, "all_within_target": True})["n_secrets"] += 1
    for r in reports:
        c = classes[r.secret_id.split(":", 1)[0]]
        c["max_gamma"] = max(c["max_gamma"], float(r.gamma))
        c["max_kl"] = max(c["max_kl"], float(r.kl))
        # KL composes linearly over steps (accounting.secrets.secret_kl): kept so that a verifier can
        # recompute γ from this certificate's own steps (components.certificate.verify).
        c["max_kl_per_step"] = max(c["max_kl_per_step"], float(r.kl) / steps)
        c["all_within_target"] = c["all_within_target"] and bool(r.meets_target)
    doc = {
        "schema": SCHEMA,
        "privacy_unit": "secret",
        "neighbouring": "secret_substitution",
        "mechanism": "secret",
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
        "untagged_records": _untagged_section(plan, untagged_rate, steps),
        "target": dict(plan["target"]),
        "within_target": all(c["all_within_target"] for c in classes.values()),
        "accountant": {"name": "per-secret KL of the Poisson-binomial mixture (seed 004, Lemma 3.2)",
                       "mechanism": "secret", "library": "veil + dp-accounting", "library_version": LIBRARY_VERSION,
                       "sensitivity": DEFAULT_SENSITIVITY, "sensitivity_reason": SENSITIVITY_REASON},
        "dp_event": None,
        "contribution_bound": {"kind": "per-record Poisson rates from the secret LP",
                               "selection": plan.get("selection"), "records_per_user": None},
        **_common(plan, steps, caveats, created_at, version, train_result),
    }
    return Certificate(_seal(doc))


def verify_certificate(doc: Mapping[str, Any], *, expected_sha256: str | None = None) -> Certificate:
    """Check schema, required fields and the self-hash; raise VeilError naming what is wrong."""
    if not isinstance(doc, Mapping):
        raise VeilError("certificate: expected a JSON object")
    if doc.get("schema") != SCHEMA:
        raise VeilError(f"certificate: schema {doc.get('schema')!r} is not {SCHEMA!r}")
    missing = [f for f in REQUIRED_FIELDS if f not in doc]
    if missing:
        raise VeilError(f"certificate: missing field(s) {', '.join(missing)}")
    body = {k: v for k, v in doc.items() if k != "sha256"}
    actual = sha256_json(body)
    if actual != doc["sha256"]:
        raise VeilError(f"certificate: sha256 mismatch (document says {doc['sha256'][:12]}…, content hashes to {actual[:12]}…)")
    if expected_sha256 is not None and expected_sha256 != doc["sha256"]:
        raise VeilError(f"certificate: sha256 {doc['sha256'][:12]}… is not the registered {expected_sha256[:12]}…")
    return Certificate(dict(doc))


def recompute_epsilon(doc: Mapping[str, Any]) -> float:
    """Recompute ε from the certificate's own parameters (a consumer's independent check)."""
    from components.accounting import epsilon as account

    if doc["privacy_unit"] == "secret":
        raise VeilError("a secret-protection certificate has per-secret posterior bounds, not an ε")
    if doc["accountant"]["mechanism"] == "uls-filtered":
        from components.accounting.filtered import filtered_epsilon

        f = doc["filter"]
        return float(filtered_epsilon(epsilon=float(f["epsilon"]), delta=float(f["delta"]),
                                      noise_multiplier=float(doc["noise_multiplier"]),
                                      steps_run=int(f["gaussian_steps"]))["epsilon"])
    eps_n = population_epsilon(doc)
    if int(doc["steps"]) == 0:
        return eps_n
    acc_mech = doc["accountant"]["mechanism"]
    k = 1 if acc_mech in ("uls", "record") else int(doc["contribution_bound"]["records_per_user"])
    return eps_n + float(account(acc_mech, sampling_rate=float(doc["sampling_rate"]),
                                 noise_multiplier=float(doc["noise_multiplier"]), steps=int(doc["steps"]),
                                 delta=float(doc["delta"]), k=k).epsilon)


def attach_audit(doc: Mapping[str, Any], audit: Mapping[str, Any]) -> Certificate:
    """A new certificate carrying the audit's aggregates; `supersedes` links the previous hash."""
    verify_certificate(doc)
    forbidden = {"scores", "per_user", "user_scores"} & set(audit)
    if forbidden:
        raise VeilError(f"audit section must hold aggregates only, got {', '.join(sorted(forbidden))}")
    body = {k: v for k, v in doc.items() if k != "sha256"}
    body["audit"] = dict(audit)
    body["supersedes"] = doc["sha256"]
    return Certificate(_seal(body))


def describe(doc: Mapping[str, Any]) -> str:
    """The guarantee in one line, for tables and logs."""
    if doc["privacy_unit"] == "secret":
        parts = [f"{cls} γ≤{c['max_gamma']:.3g} (κ={c['kappa']:g}, target {c['gamma_target']:g})"
                 for cls, c in sorted(doc["secrets"].items())]
        return "secret-level: " + "; ".join(parts)
    eps_n = population_epsilon(doc)
    return (f"{doc['privacy_unit']}-level ε={doc['epsilon']:.4f}, δ={doc['delta']:g} "
            f"({doc['accountant']['mechanism']}, {'pessimistic ' if doc['accountant'].get('pessimistic') else ''}PLD"
            + (f"; includes ε_N={eps_n:.3g} for the population estimate" if eps_n else "") + ")")
