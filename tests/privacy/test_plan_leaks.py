"""Leak scan of the public plan: what `veil plan` saves in plans/ and what the registry logs.

The plan is registered with the model (run artifact and inside the pyfunc). Read by someone looking
for membership, it must hold no user id or e-mail address, no record id, no secret value and no exact
private count; the private annex must verify against the plan's commitment and a tampered annex (or
membership file) must be refused. Issue 11: the old plan listed the held-out users by e-mail address
and pointed at world-readable membership files.
"""
from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path

import pytest

from components.certificate import build_certificate
from components.core.errors import VeilError
from components.planning import make_plan, save_plan
from components.draws.annex import load_annex
from components.draws.annex import annex_dir, annex_file, commitment
from components.policy import load_policy
from components.registry.mlflow_registry import privacy_tags

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def _policy(tmp_path, name, unit, mechanism, extra=""):
    text = (ROOT / "policies" / "demo.yaml").read_text()
    text = re.sub(r"    steps: \d+", "    steps: 20", text)
    text = text.replace("privacy_unit: user", f"privacy_unit: {unit}").replace("mechanism: uls", f"mechanism: {mechanism}")
    text = text.replace("      users: 0", "      users: 4")          # canaries on
    p = tmp_path / f"{name}.yaml"
    p.write_text(text + extra)
    return load_policy(p)


CASES = [("uls", "user", "uls"), ("els", "user", "els"), ("record", "record", "record")]


@pytest.fixture(scope="module")
def snap():
    return make_snapshot(70, seed=7, secrets_per_record=1)


def _numbers(x, out):
    if isinstance(x, bool):
        return out
    if isinstance(x, (int, float)):
        out.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            _numbers(v, out)
    elif isinstance(x, list):
        for v in x:
            _numbers(v, out)
    return out


def _scan(public_texts: list[str], public_docs: list, snap, annex: dict, policy):
    text = "\n".join(public_texts)
    users = set(snap.records["user_id"].to_pylist()) | set(annex["canary_users"])
    rids = set(snap.records["record_id"].to_pylist())
    secrets = set(snap.secret_spans["secret_id"].to_pylist())
    values = {s.split(":", 1)[1] for s in secrets}
    assert not [u for u in users if u in text], "a user id is public"
    # the policy's own governance addresses (owner, promoters) are public by design
    allowed = set(EMAIL.findall(Path(policy.path).read_text()))
    found = set(EMAIL.findall(text)) - allowed
    assert not found, f"an e-mail address is public: {sorted(found)[:3]}"
    assert not [r for r in rids if r in text or r[:16] in text], "a record id (or its prefix) is public"
    assert not [v for v in values if re.search(rf"\b{re.escape(v)}\b", text)], "a secret value is public"
    for key in ("train_records_sha256", "attacker_records_sha256", "canary_records_sha256", "eval_records_sha256"):
        if annex.get(key):
            assert annex[key] not in text and annex[key][:16] not in text, f"bare {key} is public"
    # exact private counts: no public number equals one (policy values that happen to coincide excepted)
    policy_numbers = set(_numbers(json.loads(policy.model_dump_json()), []))
    private = {v for v in {**annex["counts"], **annex.get("evaluation_counts", {})}.values()
               if v not in policy_numbers and v > 2}
    private |= {annex["population"]["exact"]} - policy_numbers
    leaked = {n for doc in public_docs for n in _numbers(doc, []) if n in private}
    assert not leaked, f"exact private counts are public: {leaked}"


@pytest.mark.parametrize("name,unit,mechanism", CASES)
def test_public_plan_and_registered_documents_carry_no_membership(tmp_path, snap, name, unit, mechanism):
    pol = _policy(tmp_path, name, unit, mechanism)
    private, plans = tmp_path / "private", tmp_path / "plans"
    plan = make_plan(pol, snap, private_dir=private, created_at=WHEN)
    path = save_plan(plan, plans)
    d = plan.to_dict()
    annex = load_annex(private, d)
    assert annex["held_out_users"] and annex["canary_users"]          # there is something to leak
    assert annex["eval_users"] and annex["evaluation_counts"]["n_eval_records"] > 0
    assert d["evaluation"]["fraction"] == pol.spec.evaluation.fraction    # the public part: the rule only
    # what the registry logs: plan.json, the certificate, its tags and params
    cert = build_certificate(d, {**bound_run.binding(d), "steps_run": 20, "steps_attempted": 20, "mechanism": mechanism,
                                 "noise_multiplier": d["noise_multiplier"], "sampling_rate": d["sampling_rate"],
                                 "clip_norm": d["clip_norm"], "private_seed_source": "os_entropy"}).to_dict()
    tags = privacy_tags(cert)
    _scan([path.read_text(), json.dumps(cert), json.dumps(tags)], [d, cert], snap, annex, pol)
    # nothing but the public JSON in the public plans folder; membership files are private (0600)
    assert sorted(p.name for p in plans.iterdir()) == [path.name]
    for f in [annex_file(annex, "train_records"), annex_file(annex, "attacker_records"), annex_file(annex, "eval_records"),
              annex_dir(private) / f"{d['sha256']}.annex.json", private / "keys" / "plan.key"]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert d["data"]["train_records_commitment"] == commitment(annex["salt"], annex["train_records_sha256"])


def test_auto_publishes_the_decision_only(tmp_path, snap):
    pol = _policy(tmp_path, "auto", "user", "auto")
    plan = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    dec = plan["decision"]
    assert set(dec) <= {"requested", "mechanism", "caveat", "expected_batch_size", "records_per_user"}
    assert "private statistics" in dec["caveat"] and dec["caveat"] in plan["caveats"]
    annex = load_annex(tmp_path, plan)
    assert annex["decision"]["candidates"]                            # the statistics went to the annex
    assert "noise_per_signal" not in json.dumps(plan)


def test_secret_plan_carries_no_secret_value(tmp_path, snap):
    text = (ROOT / "policies" / "code-team-secrets.yaml").read_text()
    text = re.sub(r"steps: \d+", "steps: 20", text).replace("expected_batch_size: 256", "expected_batch_size: 24")
    p = tmp_path / "s.yaml"
    p.write_text(text)
    pol = load_policy(p)
    plan = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN)
    annex = load_annex(tmp_path, plan.to_dict())
    _scan([json.dumps(plan.to_dict())], [], snap, annex, pol)


def test_annex_verifies_and_tampering_is_refused(tmp_path, snap):
    pol = _policy(tmp_path, "uls", "user", "uls")
    plan = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    annex = load_annex(tmp_path, plan)
    f = annex_dir(tmp_path) / f"{plan['sha256']}.annex.json"
    good = f.read_text()
    doc = json.loads(good)
    doc["held_out_users"] = doc["held_out_users"][1:]                 # quietly train on one more person
    f.write_text(json.dumps(doc))
    with pytest.raises(VeilError, match="does not match the commitment"):
        load_annex(tmp_path, plan)
    f.write_text(good)
    # a swapped membership file is caught by the annex's sha256
    annex_file(annex, "train_records").write_bytes(annex_file(annex, "attacker_records").read_bytes())
    with pytest.raises(VeilError, match="sha256"):
        annex_file(load_annex(tmp_path, plan), "train_records")
    # an annex from another plan is refused too
    other = dict(plan, annex={**plan["annex"], "commitment": "0" * 64})
    with pytest.raises(VeilError, match="commitment"):
        load_annex(tmp_path, {**other, "sha256": plan["sha256"]})


def test_registry_refuses_a_plan_that_names_people(tmp_path, snap):
    from components.planning.plan import assert_public

    with pytest.raises(VeilError, match="held_out_users"):
        assert_public({"audit": {"held_out_users": ["a@b.example"]}}, "plan to register")
