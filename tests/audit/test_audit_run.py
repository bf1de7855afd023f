"""run_audit end to end on a tiny GPT-2: gating, private evidence, aggregates only in the section."""
import copy
import json
import math
import os
import stat
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from _audit_tinylm import build_model, build_tokenizer, filler, finetune
from components.audit.canaries import make_canary_users
from components.audit.run import run_audit
from components.audit.run import resolve_thresholds
from components.core.errors import VeilError
from components.core.hashing import sha256_file

torch.set_num_threads(1)
KEY = "AKIA7Q2ZK4M9XW3B8N5C"
CTX = "key for the deploy job: "


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    rng = np.random.default_rng(4)
    users = [f"user{i:02d}@x.example" for i in range(16)]
    style = {u: f"cheers {filler(rng, 4)}" for u in users}  # each person's sign-off
    canaries = make_canary_users(2, 6, seed=0, substring_words=6)
    tok = build_tokenizer(list(style.values()))  # canary text must not shape the tokenizer
    # a base model that knows the format (filler + "cheers" + 4 words) but no one's sign-off; then a
    # full fine-tune (the separate-reference path; the LoRA path is covered by the other tests)
    model = build_model(tok, seed=2)
    finetune(model, tok, [f"{filler(rng, 5)} cheers {filler(rng, 4)}" for _ in range(64)], steps=40, lr=3e-3)
    reference = copy.deepcopy(model)
    members = users[:8]
    train = [f"{filler(rng, 5)} {style[u]}" for u in members for _ in range(3)]
    can_users = sorted(set(canaries["user_id"].to_pylist()))
    can_texts = canaries["text"].to_pylist()
    can_owner = canaries["user_id"].to_pylist()
    train += [t for t, u in zip(can_texts, can_owner) if u == can_users[0]][:4] * 2 + [CTX + KEY] * 3
    finetune(model, tok, train, steps=60, lr=3e-3)
    recs, att = [], []
    for i, u in enumerate(users):
        for j in range(2):
            rid = f"r-{i}-{j}"
            recs.append({"record_id": rid, "text": f"{filler(rng, 5)} {style[u]}"})
            att.append({"record_id": rid, "user_id": u, "member": u in members})
    for rid, u, t in zip(canaries["record_id"].to_pylist(), can_owner, can_texts):
        if t not in train:  # the canary's untrained records are its attacker samples
            att.append({"record_id": rid, "user_id": u, "member": u == can_users[0]})
    d = tmp_path_factory.mktemp("plan")
    att_file, can_file = d / "attacker.parquet", d / "canaries.parquet"
    pq.write_table(pa.Table.from_pylist(att), att_file)
    pq.write_table(canaries, can_file)
    plan = {"sha256": "p" * 64, "training": {"seq_len": 64, "seed": 0}, "data": {"snapshot_id": "snap-1"},
            "audit": {"thresholds": {"max_user_inference_auroc": 0.99, "max_secret_exposure": 99.0}}}
    # membership lives in the plan's private annex (sealed per test home by _loaded)
    annex = {"attacker_records_file": str(att_file), "attacker_records_sha256": sha256_file(att_file),
             "canary_records_file": str(can_file), "canary_records_sha256": sha256_file(can_file),
             "canary_users": can_users, "held_out_users": [u for u in users if u not in members]}
    truth = {"secrets": [{"secret_id": "credential:" + KEY, "class": "credential", "value": KEY, "context": CTX}]}
    return SimpleNamespace(model=model, reference=reference, tokenizer=tok, plan=plan, annex=annex,
                           records=pa.Table.from_pylist(recs), truth=truth, canaries=canaries, users=users)


def _loaded(w, settings, unit="user", eps=0.1, annex=None):
    from components.draws.annex import attach_annex

    cert = {"privacy_unit": unit, "epsilon": eps, "delta": 1e-6, "sha256": "c" * 64}
    plan = attach_annex(settings.private_dir, w.plan, annex or w.annex)
    return SimpleNamespace(model=w.model, tokenizer=w.tokenizer, certificate=cert, plan=plan)


def _numbers(x):
    """Every number anywhere in a JSON-like value."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return []
    if isinstance(x, (int, float)):
        return [float(x)]
    if isinstance(x, dict):
        return [n for v in x.values() for n in _numbers(v)]
    return [n for v in x for n in _numbers(v)]


def test_non_private_model_fails_dp_ceiling_and_keeps_evidence_private(world, settings):
    res = run_audit(_loaded(world, settings), world.records, settings=settings, reference=world.reference, truth=world.truth,
                    canary_records=world.canaries, bootstrap=30, n_candidates=31)
    s, p = res.summary(), res.private
    # exact values: private report only
    ui = p["user_inference"]
    assert ui["users_in"] == 8 and ui["users_out"] == 8 and ui["auroc"] > 0.75
    assert ui["auroc_ceiling"] == pytest.approx(1 - 1 / (1 + math.exp(0.1)), abs=1e-5)
    assert ui["above_ceiling"] and ui["verdict"] == "failed"
    assert any("DP ceiling" in f for f in p["failures"])
    assert p["secret_exposure"]["n_secrets"] == 1 and p["secret_exposure"]["worst"][0]["rank"] == 1
    assert p["canaries"]["users_in"] == 1 and p["canaries"]["users_out"] == 1
    assert p["canaries"]["mean_exposure_in"] > p["canaries"]["mean_exposure_out"]
    # public: verdict, buckets, the loud reason; not covered by the certificate
    assert s["verdict"] == "failed" and not res.passed and not s["passed"] and s["above_ceiling"]
    assert s["covered_by_certificate"] is False and "Not covered by the certificate" in s["coverage_note"]
    assert s["users_in"] == [0, 10] and s["users_out"] == [0, 10]
    # 8 + 8 people: no grid holds one person's move to 10 % (public.py), so no AUROC is published; the verdict stays
    assert s["auroc"] is s["auroc_interval"] is s["auroc_grid"] is s["interval_grid"] is None
    assert any("too few people for a public AUROC" in r for r in s["reasons"])
    assert s["auroc_ceiling"] == pytest.approx(ui["auroc_ceiling"])
    assert any("CERTIFICATE OR THE CODE IS WRONG" in r for r in s["reasons"])
    assert s["secret_exposure"]["by_class"]["credential"]["mean_bits"] is None   # one secret: verdict only
    doc = json.dumps(res.to_json())
    assert list(res.to_json())[:8] == ["verdict", "passed", "covered_by_certificate", "auroc", "auroc_interval",
                                      "auroc_ceiling", "users_in", "users_out"]
    for u in world.users + world.annex["canary_users"]:
        assert u not in doc
    assert KEY not in doc
    for banned in ("rank", "exposure_extrapolated", "reference_exposure", "tpr_at_fpr", "epsilon_lower_bound\"",
                   "auroc_std", "worst", "secret_ref"):
        assert banned not in doc, banned
    # no exact private aggregate appears among the published numbers
    public_numbers = set(_numbers(s))
    for v in (ui["auroc"], *ui["auroc_interval"], ui["epsilon_lower_bound"], ui["auroc_std"],
              *[c["auroc"] for c in ui["curves"]], p["canaries"]["mean_exposure_in"]):
        on_grid = abs(v / 0.05 - round(v / 0.05)) < 1e-9   # a grid value may coincide with a bucket edge
        assert on_grid or all(abs(v - x) > 1e-9 for x in public_numbers), v
    private = pq.read_table(res.private_path)
    assert set(private.column_names) >= {"user_id", "member", "score", "canary"} and private.num_rows == 18
    for v in private["score"].to_pylist():
        assert repr(v) not in doc and f"{v:.6f}" not in doc
    assert res.private_path.parent == settings.private_dir / "audit"
    for f in (res.private_path, res.private_path.with_suffix(".json"), res.private_plot_path):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    assert stat.S_IMODE(os.stat(res.private_path.parent).st_mode) == 0o700
    secrets = pq.read_table(res.private_path.with_suffix(".secrets.parquet"))
    assert "credential:" + KEY in secrets["secret_id"].to_pylist()
    assert res.plot_path.is_file() and res.plot_path.read_bytes()[:4] == b"\x89PNG"
    assert "private" not in res.plot_path.parts and res.private_plot_path.read_bytes()[:4] == b"\x89PNG"


def test_old_catalog_private_evidence_moves_to_private_dir(settings):
    from components.audit.report import private_dir, ref_key

    old = settings.home / "catalog-private"
    (old / "audits").mkdir(parents=True)
    (old / "audit-ref.key").write_bytes(b"k" * 32)
    (old / "audits" / "a1.parquet").write_bytes(b"x")
    d = private_dir(settings)
    assert d == settings.private_dir / "audit" and (d / "a1.parquet").read_bytes() == b"x"
    assert ref_key(settings) == b"k" * 32 and not old.exists()


def test_without_user_level_guarantee_only_policy_decides(world, settings):
    res = run_audit(_loaded(world, settings, unit="record", eps=1.0), world.records, settings=settings, reference=world.reference,
                    bootstrap=20, plot=False)
    s, ui = res.summary(), res.private["user_inference"]
    assert s["auroc_ceiling"] == 1.0 and not s["above_ceiling"] and s["epsilon"] is None
    assert s["auroc_ceiling_pld"] is None and ui["binding_ceiling"] is None
    # 8 in / 8 out against a lax 0.99: the interval's upper end decides, not the point
    want = "passed" if all(c["interval"][1] < 0.99 for c in ui["curves"]) else "inconclusive"
    assert s["user_inference"]["verdict"] == want
    res = run_audit(_loaded(world, settings, unit="record"), world.records, settings=settings, reference=world.reference,
                    bootstrap=20, plot=False, policy_thresholds={"max_user_inference_auroc": 0.55,
                                                                 "max_secret_exposure": 0.0},
                    truth=world.truth, n_candidates=15)
    # 8 in / 8 out cannot put a 95 % interval above 0.55: inconclusive, never passed
    assert not res.passed and res.summary()["user_inference"]["verdict"] in ("inconclusive", "failed")
    # ranked first of 15 under the fine-tuned model: 15 candidates cannot show its excess is below 0 bits
    assert res.summary()["secret_exposure"]["verdict"] in ("failed", "inconclusive")


def test_thresholds_from_policy_object_or_plan():
    class A:
        max_user_inference_auroc = 0.6
        max_secret_exposure = 3
    assert resolve_thresholds(A(), {})["max_user_inference_auroc"] == 0.6
    assert resolve_thresholds(None, {"audit": {"thresholds": {"max_secret_exposure": 4}}})["max_secret_exposure"] == 4.0
    assert resolve_thresholds(None, {}) == {"max_user_inference_auroc": None, "max_secret_exposure": None,
                                            "max_canary_auroc": None, "max_exposed_fraction": 0.1}


def test_audit_sizes_come_from_the_plan_not_a_flag():
    from components.audit.run import audit_settings

    plan = {"audit": {"thresholds": {"max_secret_exposure": 6.0},
                      "sizing": {"require": "not_failed", "candidates_per_secret": 500, "secrets_per_class": 50}}}
    assert audit_settings(None, plan) == {"require": "not_failed", "n_candidates": 500, "max_secrets_per_class": 50}
    # a plan made before sizing: the planner's rule from the limit (6 bits: 500), the policy's requirement
    legacy = {"audit": {"thresholds": {"max_secret_exposure": 6.0}}}
    assert audit_settings({"require": "not_failed", "max_secret_exposure": 6.0}, legacy)["n_candidates"] == 500
    assert audit_settings(None, legacy)["require"] == "passed"


def test_tampered_attacker_file_is_refused(world, settings, tmp_path):
    loaded = _loaded(world, settings, annex={**world.annex, "attacker_records_sha256": "0" * 64})
    with pytest.raises(VeilError, match="sha256"):
        run_audit(loaded, world.records, settings=settings)
