"""The promotion gate: when a version may carry a gated alias (issue 28: checked at load, not only
when `veil retrain` moves the alias).

`promotion_gate` is the rule `veil retrain` promotes by: an audit that meets the policy's
`audit.require` and a certificate carrying the policy's `release.required_certificate_fields`.
`alias_gate` applies the same rule when a gated alias is loaded or verified — whoever moved it (MLflow's
own API moves an alias without asking Veil) — from what the release itself holds: the registered
certificate (verified and sealed: its audit section), the sealed public plan (the policy's `release`
rules and `audit.require`) and, when the plan names promoters, the version's approval tags.
"""
from __future__ import annotations

from typing import Mapping
from components.audit.verdict import gate_decision

PRODUCTION = "production"
LATEST = "latest-certified"
# The aliases whose meaning is a gate: `production` (what `veil retrain` promotes to) and
# `latest-certified` (the newest version whose audit did not fail).
GATED_ALIASES = (PRODUCTION, LATEST)


# The flat names policies use for certificate fields that live in a section of the certificate
# (`veil.certificate/v1`): without them `policy_sha256` — in every shipped policy — is never found.
FIELD_PATHS = {"policy_sha256": "policy.sha256", "policy_name": "policy.name",
               "snapshot_commitment": "dataset.snapshot_commitment",
               "train_records_commitment": "dataset.train_records_commitment",
               "device": "run.device", "precision": "run.precision"}
# Issue 22: certificates no longer carry the snapshot's id or sha256 (content hashes, a membership test);
# they bind the snapshot by `dataset.snapshot_commitment`. A policy that still requires the old names
# (every shipped policy names `snapshot_sha256`) asks that the certificate bind its snapshot, which the
# commitment does: the old names are aliases of it. A certificate from before the change still
# satisfies them with the field it has.
SNAPSHOT_ALIASES = {"snapshot_sha256": "dataset.snapshot_sha256", "snapshot_id": "dataset.snapshot_id",
                    "dataset.snapshot_sha256": "dataset.snapshot_sha256", "dataset.snapshot_id": "dataset.snapshot_id"}


def _field(cert: dict, path: str):
    if path in SNAPSHOT_ALIASES:
        found = _at(cert, "dataset.snapshot_commitment")
        return found if found is not None else _at(cert, SNAPSHOT_ALIASES[path])
    found = _at(cert, path)
    return found if found is not None or path not in FIELD_PATHS else _at(cert, FIELD_PATHS[path])


def _at(cert: dict, path: str):
    node = cert
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def promotion_gate(cert: dict, audit_summary: dict | None, required: list[str],
                   require: str | None = None) -> tuple[bool, str]:
    """(promote?, why). An audit that meets the policy's `audit.require` (`passed`, or `not_failed` for an
    organization too small for a passing audit; stated on the certificate's audit section) and a
    certificate with every required field promote. `require` defaults to the audit section's own."""
    missing = [f for f in required if _field(cert, f) is None]
    if audit_summary is None:
        return False, "not audited"
    verdict = audit_summary.get("verdict")
    gate = audit_summary.get("gate") or {}
    req = require or gate.get("require") or "passed"
    decided = gate_decision(verdict, req, audit_summary.get("reasons") or [])
    if not decided["meets"]:
        rule = ("only a passed audit is promoted" if req == "passed"
                else "audit.require is 'not_failed': only a failed audit is held back")
        return False, f"{decided['reason']} ({rule})"
    if missing:
        return False, f"certificate lacks the policy's required field(s) {', '.join(missing)}"
    said = "audit passed" if verdict == "passed" else f"audit {verdict}, and the policy requires only '{req}'"
    return True, f"{said} and the certificate has every required field ({', '.join(required)})"


def alias_gate(alias: str, certificate: Mapping | None, plan: Mapping | None,
               version_tags: Mapping[str, str] | None = None) -> str | None:
    """None when the version may carry `alias`, else why not (one line, public: verdicts, policy
    values and tag values only). `certificate`: the registered (verified) certificate; `plan`: the
    sealed public plan. Aliases other than GATED_ALIASES are not gated."""
    if alias not in GATED_ALIASES:
        return None
    cert = dict(certificate or {})
    audit = cert.get("audit") if isinstance(cert.get("audit"), dict) else None
    if alias == LATEST:
        # what `veil retrain` and `veil run` move it to: a certified version whose audit did not fail
        # (`veil register` alone sets it before any audit: an unaudited version is certified)
        if audit is not None and audit.get("verdict") == "failed":
            return f"{LATEST} is on a version whose audit failed ({audit.get('verdict')})"
        return None
    if audit is None:
        return f"{alias} is on a version that was never audited (the policy promotes only an audited release)"
    plan = dict(plan or {})
    release = plan.get("release") or {}
    required = list(release.get("required_certificate_fields") or [])
    require = ((plan.get("audit") or {}).get("sizing") or {}).get("require")
    ok, why = promotion_gate(cert, audit, required, require)
    if not ok:
        return f"{alias} is on a version that fails the policy's promotion gate: {why}"
    promoters = [str(p).strip() for p in release.get("promoters") or []]
    if promoters:
        tags = dict(version_tags or {})
        by = (tags.get("veil.approval.by") or "").strip()
        if tags.get("veil.approval.decision") != "approved" or by not in promoters:
            return (f"{alias} is on a version no promoter approved (the policy's release.promoters: "
                    f"{', '.join(promoters)})")
    return None
