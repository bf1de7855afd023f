"""Build, hash, verify and amend privacy certificates."""
from __future__ import annotations

import datetime as _dt
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.publication import publish
from components.mechanisms import get as get_mechanism, names as mechanism_names
from components.core.fingerprints import weights_fingerprint

SCHEMA = "veil.certificate/v1"

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


def plan_data_fingerprint(plan: Mapping[str, Any]) -> str | None:
    """The plan's fingerprint of the training data the run must have read: the salted commitment to
    the train-records file's sha256 (the raw sha256 is in the private annex; the trainer, which holds
    the annex, commits the sha256 of the bytes it actually read under the same salt)."""
    return (plan.get("data") or {}).get("train_records_commitment")


def _bind_run(plan: Mapping[str, Any], train_result: Mapping[str, Any]) -> None:
    """Refuse a run that is not the plan's run: k and selection, the data it read, steps, weights."""

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
            "world_size": train_result.get("world_size"),
            # only for a sharded run (absent: every rank held the whole model), so that earlier
            # certificates and their recomputation stay byte-identical
            **({"sharding": train_result["sharding"]} if train_result.get("sharding") not in (None, "none") else {})}


def _checked_steps(plan: Mapping[str, Any], train_result: Mapping[str, Any]) -> tuple[int, list[str]]:
    """Refuse a run that used other numbers than its plan; return the steps to charge and caveats."""
    mechanism = plan["mechanism"]
    for key in ("noise_multiplier", "sampling_rate", "clip_norm"):
        if abs(float(train_result[key]) - float(plan[key])) > 1e-12 * max(1.0, abs(float(plan[key]))):
            raise VeilError(f"training used {key}={train_result[key]} but the plan says {plan[key]}: not certifiable")
    if train_result.get("mechanism", mechanism) != mechanism:
        raise VeilError(f"training ran {train_result['mechanism']!r} but the plan says {mechanism!r}")
    _bind_run(plan, train_result)
    get_mechanism(mechanism).check_run(plan, train_result)
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


def _snapshot_fields(data: Mapping[str, Any]) -> dict:
    """The certificate's snapshot binding: the plan's salted commitment (issue 22: the snapshot's id and
    sha256 are content hashes, a membership test for anyone who knows the rest of the data). A plan from
    before the commitment is refused: certifying it would publish the content hash again."""
    if not data.get("snapshot_commitment"):
        raise VeilError("plan: no data.snapshot_commitment (a plan from before issue 22 names its snapshot by "
                        "content hash, which would leak membership): it cannot be certified by this Veil; certify it with the "
                        "Veil that planned it (re-planning the same data is a new release, charged again)")
    return {"snapshot_commitment": data["snapshot_commitment"]}


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
        # the snapshot's id and sha256 are content hashes: the plan's salted commitment only
        "dataset": {**_snapshot_fields(data),
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
    from components.planning.forecast import plan_forecast  # startup

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
    the plan's is refused rather than certified on the plan's word. The plan's mechanism
    (components.mechanisms) writes its own section; this module adds what every certificate holds.
    Secret-protection runs need `secret_targets` (one `accounting.secrets.SecretTarget` per secret,
    from the plan's rates) and `untagged_rate`, the largest rate of a trained record that holds no
    protected secret (None when no such record was trained on).
    """
    mech = get_mechanism(plan["mechanism"])
    if not mech.certifiable:
        certifiable = [n for n in mechanism_names() if get_mechanism(n).certifiable]
        raise VeilError(f"mechanism {mech.name!r} cannot be certified; certifiable mechanisms: "
                        f"{', '.join(certifiable)}")
    started, caveats = _checked_steps(plan, train_result)
    steps = mech.certified_steps(plan, train_result, started)
    section = mech.certify(plan, train_result, steps=steps, caveats=caveats, secret_targets=secret_targets,
                           untagged_rate=untagged_rate)
    doc = {"schema": SCHEMA, **section, **_common(plan, started, caveats, created_at, version, train_result)}
    return Certificate(publish("certificate", _seal(doc)))


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
    return get_mechanism(doc["mechanism"]).recompute_epsilon(doc)


def attach_audit(doc: Mapping[str, Any], audit: Mapping[str, Any]) -> Certificate:
    """A new certificate carrying the audit's aggregates; `supersedes` links the previous hash."""
    verify_certificate(doc)
    forbidden = {"scores", "per_user", "user_scores"} & set(audit)
    if forbidden:
        raise VeilError(f"audit section must hold aggregates only, got {', '.join(sorted(forbidden))}")
    body = {k: v for k, v in doc.items() if k != "sha256"}
    body["audit"] = dict(audit)
    body["supersedes"] = doc["sha256"]
    return Certificate(publish("certificate", _seal(body)))


def describe(doc: Mapping[str, Any]) -> str:
    """The guarantee in one line, for tables and logs."""
    return get_mechanism(doc["mechanism"]).describe(doc)
