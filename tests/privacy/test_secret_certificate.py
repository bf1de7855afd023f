"""Secret-unit certificates say what they do not cover (issue 11, item 7): tagged occurrences only,
the classes the policy ignores, their assumptions, and what untagged records get — no certified
guarantee (issue 22, case 3: the record-level ε it used to state held under no true relation)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pytest

from components.accounting.secrets import DOMINANCE_NOTE, SecretTarget
from components.certificate import build_certificate, verify_certificate
from components.bounding.secret_plan import untagged_max_rate

_h = importlib.util.spec_from_file_location("bound_run", Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = importlib.util.module_from_spec(_h)
_h.loader.exec_module(bound_run)

SIGMA, T = 3.0, 50


def _plan(untagged="keep"):
    return {"schema": "veil.plan/v1", "sha256": "ab" * 32, "mechanism": "secret", "privacy_unit": "secret",
            "target": {"epsilon": None, "delta": None, "secrets": {"credential": {"kappa": 1e-3, "gamma": 0.05}}},
            "sampling_rate": 0.02, "noise_multiplier": SIGMA, "steps": T, "expected_batch_size": 8, "clip_norm": 1.0,
            "records_per_user": None, "selection": "all",
            "secret_lp": {"untagged_records": untagged, "ignored_classes": ["phone", "email"]},
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32},
            "policy": {"name": "code", "sha256": "01" * 32}}


def _cert(untagged_rate, untagged="keep"):
    plan = _plan(untagged)
    res = {**bound_run.binding(plan), "steps_run": T, "steps_attempted": T, "mechanism": "secret",
           "noise_multiplier": SIGMA, "sampling_rate": 0.02, "clip_norm": 1.0, "private_seed_source": "os_entropy"}
    targets = [SecretTarget.make("credential:AKIA1", [0.02], 1e-3, 0.05)]
    return build_certificate(plan, res, secret_targets=targets, untagged_rate=untagged_rate).to_dict()


def test_secret_certificate_states_coverage_ignored_classes_and_assumptions():
    cert = verify_certificate(_cert(0.03)).doc
    assert "tagged occurrences only" in cert["coverage"] and "missed" in cert["coverage"]
    assert cert["ignored_classes"] == ["email", "phone"]
    assert DOMINANCE_NOTE in cert["assumptions"] and any("not proved" in a for a in cert["assumptions"])
    assert any("tagging) is public" in a for a in cert["assumptions"])
    assert "AKIA" not in json.dumps(cert)


def test_untagged_records_get_no_certified_guarantee():
    # issue 22, case 3: the record-level ε this section used to state held under no relation the
    # pipeline satisfies (tests/privacy/test_secret_no_person_claim.py)
    u = _cert(0.03)["untagged_records"]
    assert u["trained_on"] and u["max_rate"] == 0.03 and u["policy"] == "keep"
    assert u["epsilon"] is None and "none certified" in u["guarantee"]


def test_untagged_records_not_trained_on_say_so():
    u = _cert(None, untagged="drop")["untagged_records"]
    assert u == {**u, "trained_on": False, "epsilon": None, "policy": "drop"}
    assert "no record without a protected secret" in u["guarantee"]


def test_untagged_rate_is_the_largest_rate_of_a_row_without_a_protected_secret():
    rows = pa.table({"record_id": ["r1", "r2", "r3", "r4"], "user_id": ["u"] * 4,
                     "rate": [0.09, 0.04, 0.05, 0.0]})
    spans = pa.table({"record_id": ["r1", "r3"], "secret_id": ["credential:x", "phone:y"],
                      "secret_class": ["credential", "phone"]})
    # r1 holds a protected secret; r3 only an ignored class (trained as untagged); r4 is not trained
    assert untagged_max_rate(rows, spans, {"credential"}) == 0.05
    assert untagged_max_rate(rows.slice(0, 1), spans, {"credential"}) is None
