"""Every read the audit makes of membership data goes through `audit_reservations`.

Held-out users, canary users and the attacker / canary record files say who was trained on: they
are what the certificate protects. They live in the plan's private annex (`settings.private_dir`,
`components.draws.annex`); plans from before the annex kept them in the plan's `audit` section.
Keeping one reader means nothing else in the audit names them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

KEYS = ("held_out_users", "canary_users", "attacker_records_file", "attacker_records_sha256",
        "canary_records_file", "canary_records_sha256")


@dataclass(frozen=True)
class AuditReservations:
    """Membership reservations of one plan. Private: never log, register or print them."""

    held_out_users: tuple[str, ...] = ()
    canary_users: tuple[str, ...] = ()
    attacker_records_file: str | None = None
    attacker_records_sha256: str | None = None
    canary_records_file: str | None = None
    canary_records_sha256: str | None = None
    source: str = field(default="plan")    # "plan" or "annex": where they were read from

    def __repr__(self) -> str:  # never print ids by accident (logs, tracebacks)
        return (f"AuditReservations(source={self.source!r}, held_out_users=<{len(self.held_out_users)}>, "
                f"canary_users=<{len(self.canary_users)}>, attacker_records_file="
                f"{'set' if self.attacker_records_file else None})")


def audit_reservations(plan: Mapping[str, Any], annex: Mapping[str, Any] | None = None) -> AuditReservations:
    """The plan's audit reservations: from `annex["audit"]` when an annex is given, else from the
    plan's own `audit` section (plans written before the annex existed)."""
    if annex is not None:
        # The annex (components.draws.annex) keeps these keys at its top level, file names relative
        # to its own folder (`_dir`); an `audit` sub-mapping is accepted too.
        src = annex["audit"] if isinstance(annex.get("audit"), Mapping) else annex
        base = annex.get("_dir")
    else:
        src, base = (plan or {}).get("audit") or {}, None

    def path(key: str) -> str | None:
        rel = src.get(key) or None
        if rel is None or base is None or Path(rel).is_absolute():
            return rel
        return str(Path(base) / rel)

    return AuditReservations(
        held_out_users=tuple(src.get("held_out_users") or ()),
        canary_users=tuple(src.get("canary_users") or ()),
        attacker_records_file=path("attacker_records_file"),
        attacker_records_sha256=src.get("attacker_records_sha256") or None,
        canary_records_file=path("canary_records_file"),
        canary_records_sha256=src.get("canary_records_sha256") or None,
        source="annex" if annex is not None else "plan")
