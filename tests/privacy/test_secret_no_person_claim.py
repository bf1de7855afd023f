"""Secret-protection releases make no person-level claim (issue 22, case 3).

Attacks this file pins (each failed on the code before the fix):
* a secret release's public plan carries the exact record count N, q = B/N and a σ the LP computes from
  everyone's data, so removing one person moves public numbers (measured: N 208→207, σ 9.7395→9.8308) —
  yet the ledger charged each person a Rényi curve as if add/remove were covered, and retired people
  against it: a per-person entry that bounds nothing;
* the certificate's `untagged_records` section stated a record-level ε "under add/remove of that record,
  every other record's rate held fixed", a relation the pipeline does not satisfy (the LP's rates, N and
  σ move with any record; rewriting one moves the audit split).
The per-secret KL charge stays (sound under secret substitution)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from components.accounting.secrets import SecretTarget
from components.certificate import build_certificate, verify_certificate
from components.ledger import Budget, Ledger, PersonCost, reserve_release
from components.ledger.report import ledger_report

_h = importlib.util.spec_from_file_location("bound_run", Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = importlib.util.module_from_spec(_h)
_h.loader.exec_module(bound_run)

SIGMA, T = 3.0, 50
SECRET = "credential:AKIAEXAMPLE0000000001"


def _plan(sha="ab"):
    return {"schema": "veil.plan/v1", "sha256": sha * 32, "mechanism": "secret", "privacy_unit": "secret",
            "target": {"epsilon": None, "delta": None, "secrets": {"credential": {"kappa": 1e-3, "gamma": 0.05}}},
            "sampling_rate": 0.02, "noise_multiplier": SIGMA, "steps": T, "expected_batch_size": 8, "clip_norm": 1.0,
            "records_per_user": None, "selection": "all", "neighbouring": "secret_substitution",
            "secret_lp": {"untagged_records": "keep", "ignored_classes": []},
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32},
            "policy": {"name": "code", "sha256": "01" * 32}}


def _persons():
    return {"alice@corp.example": [0.02, 0.05, 0.3], "bob@corp.example": [0.05]}


def test_a_secret_release_charges_and_retires_no_person_and_the_ledger_says_so(settings):
    led = Ledger.open(settings)
    try:
        # bob has spent almost everything: a person-level charge would retire him
        budget = Budget(16.0, 1e-4)
        cap = led.rdp_budget(budget)
        led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=budget,
                    costs={"bob@corp.example": PersonCost(rows=1, sampling_rate=1.0, rdp=np.maximum(cap, 0.0))})
        before = led.spend(list(_persons()))
        res = reserve_release(settings, _plan(), _persons(), ledger=led,
                              secrets=[SecretTarget.make(SECRET, [0.02], 1e-3, 0.05)])
        after = led.spend(list(_persons()))
        assert res.secrets_charged == (SECRET,), "the per-secret KL charge stays"
        for p in _persons():
            assert np.array_equal(before[p], after[p]), f"{p} was charged for a release that bounds nothing about them"
        assert res.retired == () and res.admitted == ()
        assert led.secret_spend([SECRET])[SECRET] > 0
    finally:
        led.dispose()
    doc = ledger_report(settings, estimate=False)
    nc = doc["persons_not_covered"]
    assert nc["releases"] == 1 and "no person-level claim" in nc["statement"]


def _cert(untagged_rate):
    plan = _plan()
    res = {**bound_run.binding(plan), "steps_run": T, "steps_attempted": T, "mechanism": "secret",
           "noise_multiplier": SIGMA, "sampling_rate": 0.02, "clip_norm": 1.0, "private_seed_source": "os_entropy"}
    targets = [SecretTarget.make(SECRET, [0.02], 1e-3, 0.05)]
    return build_certificate(plan, res, secret_targets=targets, untagged_rate=untagged_rate).to_dict()


def test_untagged_records_get_no_record_level_epsilon_on_the_certificate():
    cert = verify_certificate(_cert(0.03)).doc
    u = cert["untagged_records"]
    assert u["trained_on"] and u["max_rate"] == pytest.approx(0.03)
    assert u["epsilon"] is None and u["delta"] is None and "neighbouring" not in u
    assert "none certified" in u["guarantee"] and "unprotected" in u["guarantee"]
    assert "Persons are not covered" in cert["coverage"]
