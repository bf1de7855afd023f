"""Verify a registered release in MLflow: the model package, the run's certificate and seal, tags, metrics.

`components.certificate.verify` checks documents and files; this module fetches them from MLflow
(the registered model version, its run, the logged model package) and adds the registry's checks:
the version's `privacy.certificate_sha256` pointer, the run's (post-audit) certificate and its seal,
the relation between that certificate and the package's embedded one, and the `privacy.*` /
`audit.*` tags and privacy metrics, which must say exactly what the certificate says.
"""
from __future__ import annotations

import json
import math
from contextvars import ContextVar
import tempfile
from pathlib import Path
from typing import Any, Mapping

from components.audit.public import public_metrics, public_tags
from components.certificate.document import verify_certificate
from components.certificate.seal import check_seal, trusted_keys
from components.certificate.verify import (
    Verification,
    check_amendment,
    recheck_guarantee,
    verify_package,
)
from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.core.settings import load_settings
from components.registry.artifacts import (  # noqa: F401 (package_artifacts, the names: this module's too)
    CERT_ARTIFACT, NOT_CERTIFICATE_TAGS, PLAN_ARTIFACT, SEAL_ARTIFACT, package_artifacts, privacy_tags, run_json,
)
from components.registry.gate import GATED_ALIASES, alias_gate

# Set by `load_model` around its own load of the package, which it verified a moment before (registry
# side included, and the alias its URI names): the package's `load_context` then checks the package
# only. Lets the audit load by version a version someone moved a gated alias onto, and a release an
# audit left halfway (components.registry.mlflow_registry._interrupted_audit), to audit it.
REGISTRY_CHECKED_BY_CALLER: ContextVar[bool] = ContextVar("veil_registry_checked", default=False)

def _same_number(a: Any, b: Any) -> bool:
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-15)


def _check_tags(where: str, tags: Mapping[str, str], cert: Mapping[str, Any]) -> None:
    expected = privacy_tags(cert)
    if isinstance(cert.get("audit"), dict):
        # record_audit tags the audit's gate (require, met, reason) and one-run bound from the public
        # section the certificate now holds: they are the certificate's, not forged (issue 26: every
        # audited model was refused by every load path)
        expected.update(public_tags(cert["audit"]))
    wrong = sorted(k for k, val in expected.items() if tags.get(k) != val)
    # Every other privacy/audit claim is forged, except the registry's own bookkeeping (lifetime and
    # ledger spend, the signer's fingerprint), which the certificate does not state.
    extra = sorted(k for k in tags if k.startswith(("privacy.", "audit.")) and k not in expected
                   and not k.startswith(NOT_CERTIFICATE_TAGS))
    if wrong or extra:
        raise VeilError(f"{where} tag(s) {', '.join(wrong + extra)} do not match the certificate")


def _check_metrics(metrics: Mapping[str, float], cert: Mapping[str, Any]) -> None:
    expected: dict[str, float] = {}
    if cert.get("epsilon") is not None:
        expected["privacy_epsilon"] = float(cert["epsilon"])
    for cls, c in (cert.get("secrets") or {}).items():
        expected[f"privacy_secret_max_gamma_{cls}"] = float(c["max_gamma"])
    if cert.get("audit"):
        # record_audit logs exactly the public section's metrics (bucket edges, ceilings, verdict)
        expected.update(public_metrics(cert["audit"]))
    wrong = sorted(k for k, val in expected.items() if not _same_number(metrics.get(k), val))
    if wrong:
        raise VeilError(f"run metric(s) {', '.join(wrong)} do not match the certificate")


def check_registry_side(client, run_id: str, versions: list, embedded: dict | None, embedded_seal: dict | None,
                        trusted: Mapping[str, Any], v: Verification) -> dict | None:
    """Add the registry's checks for `run_id` (and its registered `versions`) to `v`; return the
    registered certificate when it verifies."""
    run = client.get_run(run_id)
    registered = v.run("hash", lambda: verify_certificate(run_json(client, run_id, CERT_ARTIFACT)).to_dict())
    seal = v.run("signature", run_json, client, run_id, SEAL_ARTIFACT)
    if seal is not None:
        v.run("signature", check_seal, seal, trusted)
        if registered is not None:
            v.record("signature", seal.get("certificate_sha256") == registered["sha256"],
                     "the run's seal is for another certificate")
        if embedded_seal is not None:
            v.record("signature", seal.get("bindings") == embedded_seal.get("bindings"),
                     "the run's seal binds other files than the model package's seal")
    plan = v.run("plan", run_json, client, run_id, PLAN_ARTIFACT)
    if plan is not None:
        sealed_plan = ((embedded_seal or {}).get("bindings") or {}).get("plan")
        v.record("plan", sha256_json(plan) == sealed_plan, "the run's plan.json is not the sealed plan")
    if registered is None:
        v.record("embedded_matches_registered", False, "the registered certificate does not verify")
        return None
    for mv in versions:
        v.record("hash", mv.tags.get("privacy.certificate_sha256") == registered["sha256"],
                 f"version {mv.version}'s privacy.certificate_sha256 tag is not the run's certificate")
    if embedded is not None:
        v.run("embedded_matches_registered", check_amendment, registered, embedded)
    else:
        v.record("embedded_matches_registered", False, "the model's embedded certificate does not verify")
    got = v.run("epsilon_recomputed", recheck_guarantee, registered)
    if got is not None:
        v.epsilon, v.gamma = got
    v.run("tags", _check_tags, "run", run.data.tags, registered)
    for mv in versions:
        v.run("tags", _check_tags, f"version {mv.version}", mv.tags, registered)
    v.run("metrics", _check_metrics, run.data.metrics, registered)
    v.certificate_sha256 = registered["sha256"]
    v.certificate = registered
    return registered


def verify_version(client, mv, trusted: Mapping[str, Any], package_dir: str | Path | None = None,
                   read_package=package_artifacts) -> Verification:
    """Every check for one registered model version (the package is downloaded unless given; `client`
    is MLflow's, or components.registry.local_store's reader with its `read_package`)."""
    v = Verification()
    with tempfile.TemporaryDirectory() as tmp:
        if package_dir is None:
            import mlflow

            try:
                package_dir = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=tmp)
            except Exception as e:  # noqa: BLE001
                v.record("weights", False, f"model package {mv.source} cannot be downloaded ({type(e).__name__})")
                return v
        try:
            arts = read_package(package_dir)
        except VeilError as e:
            v.record("weights", False, str(e))
            return v
        v, embedded, embedded_seal = verify_package(arts, trusted, v)
        check_registry_side(client, mv.run_id, [mv], embedded, embedded_seal, trusted, v)
    return v


def verify_loaded_package(artifacts: Mapping[str, str]) -> tuple[Verification, dict | None, dict | None]:
    """What the pyfunc's `load_context` runs before it serves anything.

    The package is checked on its own (offline). When MLflow's tracking URI is set and holds the
    run that logged this package, the registry side is checked too, so a consumer of
    `models:/NAME@ALIAS` is refused when the registered certificate, its seal, tags or metrics were
    edited. A package read away from its registry has only its own (sealed) certificate to show.
    Returns (verification, embedded certificate, registered certificate or None).
    """
    trusted = trusted_keys(load_settings())
    v, embedded, embedded_seal = verify_package(artifacts, trusted)
    if REGISTRY_CHECKED_BY_CALLER.get():
        v.notes.append("registry side checked by Veil's load_model before loading")
        return v, embedded, None
    root = Path(artifacts["certificate"]).parent.parent
    run_id = _package_run_id(root)
    client = _registry_client()
    if run_id is None or client is None:
        v.notes.append("registry not consulted (no tracking URI set or no run id in the package)")
        return v, embedded, None
    try:
        client.get_run(run_id)
    except Exception:  # noqa: BLE001 - a package away from its registry: the package checks stand alone
        v.notes.append(f"run {run_id[:8]} is not in this tracking server: registry side not checked")
        return v, embedded, None
    versions = client.search_model_versions(f"run_id='{run_id}'")
    registered = check_registry_side(client, run_id, list(versions), embedded, embedded_seal, trusted, v)
    # a plain `mlflow.pyfunc.load_model("models:/NAME@production")` does not tell the package which
    # alias it came by: every gated alias on its versions must be one the policy's gate allows
    for mv in versions:
        check_alias_gates(client, client.get_model_version(mv.name, mv.version), v)
    return v, embedded, registered


def _package_run_id(root: Path) -> str | None:
    if not (root / "MLmodel").is_file():
        return None
    from mlflow.models import Model

    try:
        return Model.load(str(root / "MLmodel")).run_id
    except Exception:  # noqa: BLE001
        return None


def _registry_client():
    import mlflow
    from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

    if not is_tracking_uri_set():
        return None
    return mlflow.MlflowClient()


def check_alias_gates(client, mv, v: Verification, aliases: list[str] | None = None) -> None:
    """Add the `promotion_gate` check (issue 28): each gated alias (components.registry.gate) named in
    `aliases` — by default every alias the registry points at this version — must be one the policy's
    promotion gate allows on it, whoever moved it. Read from the verified registered certificate (its
    audit section), the sealed plan (the policy's release rules) and the version's approval tags. Runs
    only on a release whose other checks passed (an invalid one is refused already)."""
    if aliases is None:
        aliases = [a for a in (getattr(mv, "aliases", None) or []) if a in GATED_ALIASES]
    aliases = [a for a in aliases if a in GATED_ALIASES]
    if not aliases or not v.valid:
        return
    plan = v.run("promotion_gate", run_json, client, mv.run_id, PLAN_ARTIFACT)
    if plan is None:
        return
    for alias in aliases:
        why = alias_gate(alias, v.certificate, plan, dict(mv.tags or {}))
        v.record("promotion_gate", why is None, f"{why}: move it back to a version that passed its gates "
                 f"(MlflowClient().set_registered_model_alias) or run `veil retrain` to audit and promote")
