"""Small pieces of retrain_flow, no server: the policy's flat field names are found in the
certificate's sections, and the base model is compared by content, not path."""
from __future__ import annotations

import shutil

from flows.retrain import base_content, promotion_gate


def test_policy_field_names_resolve_into_certificate_sections():
    cert = {"epsilon": 1.0, "policy": {"sha256": "ab"}, "dataset": {"snapshot_sha256": "cd"}, "run": {"device": "cpu"}}
    req = ["epsilon", "policy_sha256", "snapshot_sha256", "device", "run.device"]
    assert promotion_gate(cert, {"verdict": "passed"}, req)[0]
    ok, why = promotion_gate({**cert, "policy": {}}, {"verdict": "passed"}, req)
    assert not ok and "policy_sha256" in why
    ok, why = promotion_gate(cert, {"verdict": "passed"}, ["noise_multiplier"])
    assert not ok and "noise_multiplier" in why


def test_gate_follows_the_policys_requirement():
    cert = {"epsilon": 1.0}
    inconclusive = {"verdict": "inconclusive", "reasons": ["user inference: INCONCLUSIVE — too few people"],
                    "gate": {"require": "not_failed"}}
    ok, why = promotion_gate(cert, inconclusive, ["epsilon"], "passed")
    assert not ok and "too few people" in why and "only a passed audit" in why
    ok, why = promotion_gate(cert, inconclusive, ["epsilon"], "not_failed")
    assert ok and "not_failed" in why
    # without an explicit requirement the certificate's audit section states it
    assert promotion_gate(cert, inconclusive, ["epsilon"])[0]
    assert not promotion_gate(cert, {**inconclusive, "gate": {"require": "passed"}}, ["epsilon"])[0]
    failed = {"verdict": "failed", "reasons": ["secret exposure: class email: memorised"]}
    ok, why = promotion_gate(cert, failed, ["epsilon"], "not_failed")
    assert not ok and "memorised" in why
    assert not promotion_gate(cert, {"verdict": None}, ["epsilon"], "not_failed")[0]


def test_base_is_compared_by_content_not_path(tmp_path):
    base = tmp_path / "base"
    (base / "sub").mkdir(parents=True)
    (base / "config.json").write_text('{"n_layer": 1}')
    (base / "sub" / "w.bin").write_bytes(b"\0" * 64)
    h = base_content(str(base))
    moved = tmp_path / "elsewhere" / "base-copy"
    shutil.copytree(base, moved)
    assert base_content(str(moved)) == h           # same files elsewhere: same base
    (base / "sub" / "w.bin").write_bytes(b"\1" * 64)
    assert base_content(str(base)) != h            # replaced in place: a new base
    (base / "sub" / "w.bin").write_bytes(b"\0" * 64)
    assert base_content(str(base)) == h
    (base / "sub" / "w.bin").rename(base / "w.bin")
    assert base_content(str(base)) != h            # a renamed file is a different directory
