"""Privacy certificates: what a registered model can reveal, as a versioned, self-hashed JSON document.

The certificate's ε is *recomputed* from the steps training actually ran (never copied from the
plan), through the same accountant the plan used. A consumer re-verifies the hash and, with
`recompute_epsilon`, the ε from the recorded mechanism parameters.
"""
from components.certificate.document import (
    SCHEMA,
    Certificate,
    attach_audit,
    build_certificate,
    code_version,
    describe,
    recompute_epsilon,
    verify_certificate,
)

__all__ = [
    "SCHEMA",
    "Certificate",
    "attach_audit",
    "build_certificate",
    "code_version",
    "describe",
    "recompute_epsilon",
    "verify_certificate",
]
