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


def test_the_plan_line_says_before_training_whether_the_audit_can_pass():
    # issue 26: the scheduled flow's log said nothing about the audit until the audit (30 min later) said
    # "inconclusive"; the plan's own published statement now goes to the log right after planning
    import logging

    from flows.pipeline import log_plan, plan_log_fields

    plan = {"audit": {"sizing": {"statement": "this audit cannot pass at this size, and the policy requires "
                                              "'passed': the release will not be promoted",
                                 "cannot_pass": ["user inference: nobody is held out (audit.holdout_users: 0)"]}},
            "schedule": {"releases": 52, "epsilon_per_release": 3.1, "lowered": True}}
    audit, when = plan_log_fields(plan)["plan_audit"]
    assert "will not be promoted: user inference: nobody is held out" in audit
    assert when == "schedule of 52 releases: ε per release 3.1 (lowered from the target)"
    assert plan_log_fields({})["plan_audit"] == ["no audit sizing in this plan", ""]

    seen = []

    class _Log(logging.Logger):
        def info(self, msg, *args, **kw):
            seen.append(msg % args)

    log_plan(_Log("t"), plan)                        # through the publication gate: the field is declared
    assert seen and seen[0].startswith("plan: this audit cannot pass") and seen[0].endswith("(lowered from the target)")
