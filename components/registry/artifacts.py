"""What a registered release is made of, in MLflow's terms: the run's artifact names, the `privacy.*` tags
a certificate implies, and the readers for the run's JSON artifacts and the model package's artifacts.

The floor under the registry's two sides: `mlflow_registry` (register, load, list) and `verification`
(every check on a release) both read a release through these, and neither imports the other for them.
MLflow itself is imported only inside the readers that call it.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

from components.core.errors import VeilError

CERT_ARTIFACT = "certificate.json"
SEAL_ARTIFACT = "seal.json"
PLAN_ARTIFACT = "plan.json"
# Tags the registry keeps for its own bookkeeping (lifetime and ledger spend, the signer's fingerprint):
# not claims of the certificate, so verification does not expect them to follow from it.
NOT_CERTIFICATE_TAGS = ("privacy.lifetime_", "privacy.ledger", "privacy.signing_key")
# The run's tag naming the plan it registers (public: the plan and its sha256 are): a registration
# killed after MLflow registered its version is found by it instead of registered twice.
PLAN_TAG = "veil.plan_sha256"


def privacy_tags(cert: Mapping[str, Any]) -> dict[str, str]:
    tags = {
        "privacy.certificate_sha256": cert["sha256"],
        "privacy.schema": cert["schema"],
        "privacy.unit": cert["privacy_unit"],
        "privacy.neighbouring": cert["neighbouring"],
        "privacy.mechanism": cert["mechanism"],
        "privacy.noise_multiplier": repr(float(cert["noise_multiplier"])),
        "privacy.sampling_rate": repr(float(cert["sampling_rate"])),
        "privacy.steps": str(cert["steps"]),
        "privacy.clip_norm": repr(float(cert["clip_norm"])),
        "privacy.accountant": cert["accountant"]["name"],
        "privacy.policy_sha256": cert["policy"]["sha256"],
    }
    ds = cert.get("dataset") or {}
    if ds.get("snapshot_commitment"):
        tags["privacy.snapshot_commitment"] = ds["snapshot_commitment"]
    elif ds.get("snapshot_id"):
        # a certificate from before issue 22 was registered with its snapshot id: expected as it was
        # (verification of already-registered models); the gate refuses publishing it anew
        tags["privacy.snapshot_id"] = ds["snapshot_id"]
    if cert["epsilon"] is not None:
        tags["privacy.epsilon"] = repr(float(cert["epsilon"]))
        tags["privacy.delta"] = repr(float(cert["delta"]))
    for cls, c in (cert.get("secrets") or {}).items():
        tags[f"privacy.secret.{cls}.max_gamma"] = repr(float(c["max_gamma"]))
        tags[f"privacy.secret.{cls}.kappa"] = repr(float(c["kappa"]))
    audit = cert.get("audit") or {}
    for key in ("auroc", "auroc_ceiling", "passed", "verdict"):
        if audit.get(key) is not None:   # an AUROC too few people allow publishing is null: no tag, not "None"
            tags[f"audit.{key}"] = str(audit[key])
    if "covered_by_certificate" in audit:   # the audit's public section says it is not covered
        tags["audit.covered_by_certificate"] = str(bool(audit["covered_by_certificate"])).lower()
    return tags


def package_artifacts(package_dir: str | Path) -> dict[str, str]:
    """The pyfunc's artifact name -> local path, read from the package's MLmodel."""
    from mlflow.models import Model

    root = Path(package_dir)
    try:
        flavor = Model.load(str(root / "MLmodel")).flavors["python_function"]
    except Exception:  # noqa: BLE001 - any unreadable package is named for the user
        raise VeilError(f"{root}: not an MLflow pyfunc model package") from None
    return {name: str(root / a["path"]) for name, a in (flavor.get("artifacts") or {}).items()}


def run_json(client, run_id: str, name: str) -> Any:
    """The run's artifact `name`, parsed; a missing or non-JSON artifact is a VeilError naming it."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, name, tmp)
        except Exception:  # noqa: BLE001 - a missing artifact is a failed check, not a crash
            raise VeilError(f"run {run_id[:8]}: no {name} artifact") from None
        try:
            return json.loads(Path(path).read_text())
        except ValueError:
            raise VeilError(f"run {run_id[:8]}: {name} is not JSON") from None
