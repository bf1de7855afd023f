"""Governance policies: YAML files validated into a frozen `Policy` (see policies/README.md).

    policy = load_policy("policies/demo.yaml")
    policy.sha256            # of the file's bytes; goes into every plan and certificate
    policy.tagging_rules()   # what the catalog tags as secrets
"""
from components.policy.loader import (
    PolicyError,
    PolicyProblem,
    check_policy,
    load_policy,
    load_prediction_policy,
    parse_policy,
)
from components.policy.model import (
    API_VERSION,
    BUILTIN_DETECTORS,
    KIND,
    MECHANISMS_FOR_UNIT,
    Policy,
    Protection,
)
from components.policy.schema import policy_json_schema, write_schema

__all__ = [
    "API_VERSION",
    "BUILTIN_DETECTORS",
    "KIND",
    "MECHANISMS_FOR_UNIT",
    "Policy",
    "PolicyError",
    "PolicyProblem",
    "Protection",
    "check_policy",
    "load_policy",
    "load_prediction_policy",
    "parse_policy",
    "policy_json_schema",
    "write_schema",
]
