"""Issue 22: the snapshot's identity is a content hash, so no public document may carry it.

`snapshot_sha256` hashes every record id (each a content hash of user ‖ text) and the catalog's id is
`snap-<first 16 hex of the content hash>`. Anyone who knows every record but whether person u's are in
the data computes both for D and for D − u and reads membership off the plan, the certificate or the
registry tag: a deterministic, injective function of the data on a document that claims (ε, δ)-DP for
one person. The public documents carry a salted commitment instead (salt: the planner's keyed PRF of
the snapshot's sha256), the real id and sha256 stay in the plan's private annex.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from components.certificate import build_certificate
from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.planning import make_plan
from components.draws.annex import load_annex
from components.policy import load_policy
from components.publication import publish
from components.registry.mlflow_registry import privacy_tags

import importlib.util as _ilu

_h = _ilu.spec_from_file_location("bound_run", Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import FakeSnapshot, make_snapshot  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"


def _policy(tmp_path):
    text = re.sub(r"    steps: \d+", "    steps: 20", (ROOT / "policies" / "demo.yaml").read_text())
    p = tmp_path / "demo.yaml"
    p.write_text(text)
    return load_policy(p)


def _catalog_like(snap) -> FakeSnapshot:
    """The fixture's snapshot named as the catalog names one: `snap-<16 hex of the content hash>`."""
    digest = sha256_bytes(b"".join(r.encode() for r in snap.records.column("record_id").to_pylist()))
    return FakeSnapshot(f"snap-{digest[:16]}", digest, snap.records, snap.secret_spans)


def _without(snap, user: str) -> FakeSnapshot:
    keep = pc.not_equal(snap.records["user_id"], user)
    return _catalog_like(FakeSnapshot("", "", snap.records.filter(keep), snap.secret_spans))


def _leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v, path)
    else:
        yield path, x


def _public(pol, snap, private: Path):
    plan = make_plan(pol, snap, private_dir=private, created_at=WHEN).to_dict()
    cert = build_certificate(plan, {**bound_run.binding(plan), "steps_run": 20, "steps_attempted": 20,
                                    "mechanism": plan["mechanism"], "noise_multiplier": plan["noise_multiplier"],
                                    "sampling_rate": plan["sampling_rate"], "clip_norm": plan["clip_norm"],
                                    "private_seed_source": "os_entropy"}).to_dict()
    return plan, cert, privacy_tags(cert)


def _assert_no_snapshot_identity(snap, docs):
    marks = {snap.sha256, snap.sha256[:16], snap.sha256[:12], snap.snapshot_id}
    for name, doc in docs.items():
        for path, value in _leaves(doc):
            text = json.dumps(value) if not isinstance(value, str) else value
            hit = [m for m in marks if m in text]
            assert not hit, f"{name}:{path} carries the snapshot's content hash or id ({hit[0][:20]}…)"
            assert not path.endswith(("snapshot_sha256", "snapshot_id")), f"{name}:{path} is published"


def test_public_documents_carry_a_commitment_not_the_snapshots_identity(tmp_path):
    pol = _policy(tmp_path)
    d = _catalog_like(make_snapshot(40, seed=5))
    person = sorted(set(d.records["user_id"].to_pylist()))[7]
    d_minus = _without(d, person)
    assert d_minus.sha256 != d.sha256 and d_minus.snapshot_id != d.snapshot_id

    private = tmp_path / "private"      # one operator, one key: the same home plans both
    plan_d, cert_d, tags_d = _public(pol, d, private)
    plan_m, cert_m, tags_m = _public(pol, d_minus, private)
    for snap, (plan, cert, tags) in [(d, (plan_d, cert_d, tags_d)), (d_minus, (plan_m, cert_m, tags_m))]:
        _assert_no_snapshot_identity(snap, {"plan": plan, "certificate": cert, "registry.tag": tags})

    c_d = plan_d["data"]["snapshot_commitment"]
    assert re.fullmatch(r"[0-9a-f]{64}", c_d)
    assert cert_d["dataset"]["snapshot_commitment"] == c_d == tags_d["privacy.snapshot_commitment"]
    # D and D − u: different commitments (another snapshot), unlinkable without the key
    assert plan_m["data"]["snapshot_commitment"] != c_d
    # re-planning D gives the same commitment (same snapshot, same key): nothing new is released
    again = make_plan(pol, d, private_dir=private, created_at="2026-02-02T00:00:00+00:00").to_dict()
    assert again["data"]["snapshot_commitment"] == c_d

    # the real id and sha256 are in the private annex, which opens the commitment
    from components.draws.annex import plan_snapshot_ref

    assert plan_snapshot_ref(plan_d, load_annex(private, plan_d)) == (d.snapshot_id, d.sha256)
    assert plan_snapshot_ref(plan_m, load_annex(private, plan_m)) == (d_minus.snapshot_id, d_minus.sha256)
    with pytest.raises(VeilError, match="annex"):
        plan_snapshot_ref(plan_d)


def test_the_gate_refuses_the_old_snapshot_fields():
    with pytest.raises(VeilError):
        publish("plan", {"data": {"snapshot_sha256": "ab" * 32}})
    with pytest.raises(VeilError):
        publish("certificate", {"dataset": {"snapshot_id": "snap-0123456789abcdef"}})
    with pytest.raises(VeilError):
        publish("registry.tag", {"privacy.snapshot_id": "snap-0123456789abcdef"})
    publish("plan", {"data": {"snapshot_commitment": "ab" * 32}})


def test_a_certificate_from_before_the_commitment_still_satisfies_old_policies():
    from flows.retrain import promotion_gate

    old = {"dataset": {"snapshot_sha256": "cd" * 32, "snapshot_id": "snap-x"}, "epsilon": 1.0}
    new = {"dataset": {"snapshot_commitment": "ef" * 32}, "epsilon": 1.0}
    passed = {"verdict": "passed"}
    for cert in (old, new):
        assert promotion_gate(cert, passed, ["epsilon", "snapshot_sha256", "snapshot_id"])[0]
        assert promotion_gate(cert, passed, ["dataset.snapshot_sha256"])[0]
    assert promotion_gate(new, passed, ["snapshot_commitment"])[0]
    assert not promotion_gate(old, passed, ["snapshot_commitment"])[0]
    assert not promotion_gate({"epsilon": 1.0}, passed, ["snapshot_sha256"])[0]
