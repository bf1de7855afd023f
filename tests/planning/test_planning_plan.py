"""make_plan / save_plan / load_plan: deterministic, audit data never trained on, hashes that hold."""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from components.accounting import epsilon as account
from components.core.errors import VeilError
from components.core.hashing import sha256_file, sha256_json
from components.planning import load_plan, make_plan, save_plan
from components.draws.annex import load_annex
from components.draws.annex import annex_file
from components.policy import load_policy, parse_policy

sys.path.insert(0, str(Path(__file__).parent))
from _planning_fixtures import make_snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "policies" / "demo.yaml"
DEMO_STEPS = re.search(r"    steps: \d+", DEMO.read_text()).group(0).strip()
DEMO_BATCH = re.search(r"expected_batch_size: \d+", DEMO.read_text()).group(0)
WHEN = "2026-01-01T00:00:00+00:00"
CONTRACT_KEYS = {"schema", "created_at", "sha256", "mechanism", "privacy_unit", "neighbouring", "target",
                 "sampling_rate", "noise_multiplier", "steps", "expected_batch_size", "clip_norm",
                 "records_per_user", "selection", "training", "accounting", "data", "audit", "policy", "annex"}


def _open(plan, private_dir):
    """(public doc, annex, train rows, attacker rows) of a plan."""
    d = plan.to_dict()
    a = load_annex(private_dir, d)
    return d, a, pq.read_table(annex_file(a, "train_records")), pq.read_table(annex_file(a, "attacker_records"))


@pytest.fixture(scope="module")
def snap():
    return make_snapshot(60, seed=1)


@pytest.fixture(scope="module")
def demo_plan(snap, tmp_path_factory):
    out = tmp_path_factory.mktemp("plans")
    return make_plan(load_policy(DEMO), snap, private_dir=out, created_at=WHEN), out


def test_plan_has_the_contract_keys(demo_plan):
    plan, _ = demo_plan
    d = plan.to_dict()
    assert CONTRACT_KEYS <= set(d)
    assert d["schema"] == "veil.plan/v2"
    assert (d["mechanism"], d["privacy_unit"], d["neighbouring"]) == ("uls", "user", "add_remove_user")
    assert set(d["training"]) == {"learning_rate", "seq_len", "micro_batch_size", "seed", "lora"}
    assert set(d["training"]["lora"]) == {"r", "alpha", "dropout", "target_modules"}
    assert {"epsilon", "delta", "mechanism", "dp_event", "accountant", "library_version"} <= set(d["accounting"])
    # the snapshot's id and sha256 are content hashes: a salted commitment only (issue 22)
    assert set(d["data"]) == {"snapshot_commitment", "train_records_commitment", "population"}
    assert {"holdout_probability", "attacker_samples_per_user", "canaries", "thresholds"} <= set(d["audit"])
    assert set(d["annex"]) == {"schema", "commitment", "where"}
    assert set(d["policy"]) == {"name", "path", "sha256"}
    assert d["sha256"] == sha256_json({k: v for k, v in d.items() if k != "sha256"})


def test_uls_sampling_rate_and_sigma_meet_the_target(demo_plan):
    d, a, train, _ = _open(*demo_plan)
    n_users = len(set(train["user_id"].to_pylist()))
    pop = d["data"]["population"]
    assert a["population"]["exact"] == n_users and a["counts"]["n_train_users"] == n_users
    assert pop["estimate"] == pytest.approx(n_users + a["population"]["noise"])
    assert (pop["sensitivity"], pop["epsilon"]) == (1, pytest.approx(0.02 * d["target"]["epsilon"]))
    assert d["sampling_rate"] == pytest.approx(d["expected_batch_size"] / pop["estimate"])
    # ε recomputed independently of the plan's own accounting section: ε_N + DP-SGD
    eps = pop["epsilon"] + account("uls", sampling_rate=d["sampling_rate"], noise_multiplier=d["noise_multiplier"],
                                   steps=d["steps"], delta=d["target"]["delta"]).epsilon
    assert eps <= d["target"]["epsilon"] + 1e-9
    # published rounded up to 6 significant digits: never below the independent value, at most one
    # last-digit step above it (the accountants agree to ~1e-9 across CPUs, not bit for bit)
    assert eps * (1 - 1e-9) <= d["accounting"]["epsilon"] <= eps * (1 + 1e-9) + 10 ** (math.floor(math.log10(eps)) - 5)
    # σ is the smallest that meets the target: 2 % less noise breaks it
    eps_less = pop["epsilon"] + account("uls", sampling_rate=d["sampling_rate"],
                                        noise_multiplier=0.98 * d["noise_multiplier"], steps=d["steps"],
                                        delta=d["target"]["delta"]).epsilon
    assert eps_less > d["target"]["epsilon"]


def test_held_out_users_and_attacker_records_are_never_trained_on(demo_plan, snap):
    d, a, train, att = _open(*demo_plan)
    assert sha256_file(annex_file(a, "train_records")) == a["train_records_sha256"]
    assert sha256_file(annex_file(a, "attacker_records")) == a["attacker_records_sha256"]
    held = set(a["held_out_users"])
    assert held and not held & set(train["user_id"].to_pylist())
    assert not set(att["record_id"].to_pylist()) & set(train["record_id"].to_pylist())
    # …nor any record with the same text as an attacker sample of that user
    text = dict(zip(snap.records["record_id"].to_pylist(), snap.records["text"].to_pylist()))
    att_texts = {(u, text[r]) for r, u in zip(att["record_id"].to_pylist(), att["user_id"].to_pylist())}
    assert not {(u, text[r]) for r, u in zip(train["record_id"].to_pylist(), train["user_id"].to_pylist())} & att_texts
    # members are exactly the trained users with attacker samples; non-members the held-out users
    member = dict(zip(att["user_id"].to_pylist(), att["member"].to_pylist()))
    assert {u for u, m in member.items() if not m} == held
    assert {u for u, m in member.items() if m} <= set(train["user_id"].to_pylist())
    m = d["audit"]["attacker_samples_per_user"]
    assert all(c == m for c in att.group_by("user_id").aggregate([("record_id", "count")])["record_id_count"].to_pylist())
    # every planned record exists in the snapshot and belongs to the user the plan says
    owner = dict(zip(snap.records["record_id"].to_pylist(), snap.records["user_id"].to_pylist()))
    assert all(owner[r] == u for r, u in zip(train["record_id"].to_pylist(), train["user_id"].to_pylist()))


def test_plan_is_deterministic_and_independent_of_record_order(demo_plan, snap, tmp_path):
    plan, out = demo_plan
    again = make_plan(load_policy(DEMO), snap, private_dir=out, created_at=WHEN)
    assert again.sha256 == plan.sha256 and again.to_dict() == plan.to_dict()
    shuffled = type(snap)(snap.snapshot_id, snap.sha256, snap.records.take(list(range(snap.records.num_rows))[::-1]),
                          snap.secret_spans)
    third = make_plan(load_policy(DEMO), shuffled, private_dir=out, created_at=WHEN)
    assert third.sha256 == plan.sha256


def test_another_seed_gives_another_split(snap, tmp_path):
    text = DEMO.read_text().replace("    seed: 0\n", "    seed: 1\n")
    other = tmp_path / "seed1.yaml"
    other.write_text(text)
    # a fixed planner key: the population noise is a keyed draw, and an unlucky fresh key can put N̂
    # below the batch on this small org (a refusal, not what this test is about)
    (tmp_path / "keys").mkdir(mode=0o700)
    (tmp_path / "keys" / "plan.key").write_bytes(b"\x05" * 32)
    a = make_plan(load_policy(DEMO), snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    b = make_plan(load_policy(other), snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    assert load_annex(tmp_path, a)["held_out_users"] != load_annex(tmp_path, b)["held_out_users"]


def test_save_and_load_round_trip_and_detect_tampering(demo_plan, tmp_path):
    plan, _ = demo_plan
    path = save_plan(plan, tmp_path)
    assert path.name == f"{plan.sha256}.json"
    loaded = load_plan(path)
    assert loaded.sha256 == plan.sha256 and loaded.to_dict() == plan.to_dict()
    assert save_plan(loaded, tmp_path) == path                      # idempotent
    doc = json.loads(path.read_text())
    doc["noise_multiplier"] *= 0.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(VeilError, match="sha256 mismatch"):
        load_plan(bad)
    bad.write_text("{not json")
    with pytest.raises(VeilError, match="not valid JSON"):
        load_plan(bad)
    with pytest.raises(VeilError, match="no such plan"):
        load_plan(tmp_path / "missing.json")


def test_batch_larger_than_the_population_is_refused(snap, tmp_path):
    text = DEMO.read_text().replace(DEMO_BATCH, "expected_batch_size: 500")
    p = tmp_path / "big.yaml"
    p.write_text(text)
    with pytest.raises(VeilError, match="expected_batch_size") as e:
        make_plan(load_policy(p), snap, private_dir=tmp_path)
    # the refusal names both ways out: N̂'s noise (its public scale, the ε share that sets it) and the batch
    assert "epsilon_fraction" in str(e.value) and "Laplace noise of scale" in str(e.value)
    assert "\n" not in str(e.value)


def test_els_and_group_bound_records_per_user(snap, tmp_path):
    for mech in ("els", "group"):
        text = (DEMO.read_text().replace("mechanism: uls", f"mechanism: {mech}")
                .replace(DEMO_BATCH, "expected_batch_size: 16").replace(DEMO_STEPS, "steps: 20"))
        p = tmp_path / f"{mech}.yaml"
        p.write_text(text)
        d, a, train, _ = _open(make_plan(load_policy(p), snap, private_dir=tmp_path, created_at=WHEN), tmp_path)
        counts = train.group_by("user_id").aggregate([("record_id", "count")])["record_id_count"].to_pylist()
        k = d["records_per_user"]
        assert max(counts) <= k
        if mech == "group":
            assert set(counts) == {k}                           # resampled up to exactly k
        pop = d["data"]["population"]
        assert a["population"]["exact"] == train.num_rows and pop["sensitivity"] == k   # one user moves ≤ k records
        assert d["sampling_rate"] == pytest.approx(d["expected_batch_size"] / pop["estimate"])
        assert d["accounting"]["mechanism"] == {"els": "els", "group": "group-tight"}[mech]
        eps = pop["epsilon"] + account(d["accounting"]["mechanism"], sampling_rate=d["sampling_rate"],
                      noise_multiplier=d["noise_multiplier"], steps=d["steps"], delta=d["target"]["delta"],
                      k=k).epsilon
        assert eps <= d["target"]["epsilon"] + 1e-9


def test_uls_random_keeps_every_unreserved_record(demo_plan, snap):
    """ULS draws G records afresh per visit: the plan must leave all of a trained user's records in."""
    d, a, train, att = _open(*demo_plan)
    train = set(train["record_id"].to_pylist())
    text = dict(zip(snap.records["record_id"].to_pylist(), snap.records["text"].to_pylist()))
    reserved = {(u, text[r]) for r, u in zip(att["record_id"].to_pylist(), att["user_id"].to_pylist())}
    held = set(a["held_out_users"]) | set(a.get("eval_users", ()))  # audit holdout and evaluation people
    assert a.get("eval_users"), "the default policy reserves evaluation people"
    expected = {r for r, u in zip(snap.records["record_id"].to_pylist(), snap.records["user_id"].to_pylist())
                if u not in held and (u, text[r]) not in reserved}
    assert train == expected


def test_canary_users_are_split_trained_and_resolvable(snap, tmp_path):
    from components.draws.data import training_records

    p = tmp_path / "canary.yaml"
    p.write_text(DEMO.read_text().replace("      users: 0", "      users: 6"))
    d, a, _, att = _open(make_plan(load_policy(p), snap, private_dir=tmp_path, created_at=WHEN), tmp_path)
    canaries = set(a["canary_users"])
    assert len(canaries) == 6
    member = dict(zip(att["user_id"].to_pylist(), att["member"].to_pylist()))
    assert sum(member[u] for u in canaries) == 3 and sum(not member[u] for u in canaries) == 3
    data = training_records(d, a, snap.records)
    trained = set(data["user_id"].to_pylist())
    assert {u for u in canaries if member[u]} <= trained
    assert not {u for u in canaries if not member[u]} & trained
    assert data.num_rows == a["counts"]["n_train_records"]
    canary_file = pq.read_table(annex_file(a, "canary_records"))
    assert set(canary_file.group_by("user_id").aggregate([("record_id", "count")])["record_id_count"].to_pylist()) \
        == {8}                                             # the policy's public size, not the users' median
    sub = {u: json.loads(m)["substring"] for u, m in zip(canary_file["user_id"].to_pylist(),
                                                          canary_file["metadata"].to_pylist())}
    for u, t in zip(data["user_id"].to_pylist(), data["text"].to_pylist()):
        if u in canaries:
            assert sub[u] in t                             # canary texts come from the canary file
    # the canary file is checked against its hash
    annex_file(a, "canary_records").write_bytes(b"tampered")
    with pytest.raises(VeilError, match="sha256"):
        training_records(d, a, snap.records)


def test_record_level_plan(snap, tmp_path):
    p = tmp_path / "record.yaml"
    p.write_text(DEMO.read_text().replace("privacy_unit: user", "privacy_unit: record")
                 .replace("mechanism: uls", "mechanism: record").replace(DEMO_STEPS, "steps: 20"))
    d, a, train, att = _open(make_plan(load_policy(p), snap, private_dir=tmp_path, created_at=WHEN), tmp_path)
    assert (d["mechanism"], d["neighbouring"], d["records_per_user"], d["selection"]) == \
        ("record", "add_remove_record", None, None)
    pop = d["data"]["population"]
    assert a["population"]["exact"] == train.num_rows and pop["sensitivity"] == 1
    assert d["sampling_rate"] == pytest.approx(d["expected_batch_size"] / pop["estimate"])
    assert d["audit"]["attacker_record_rate"] == 0.1 and att.num_rows > 0
    eps = pop["epsilon"] + account("record", sampling_rate=d["sampling_rate"], noise_multiplier=d["noise_multiplier"],
                  steps=d["steps"], delta=d["target"]["delta"]).epsilon
    assert eps <= d["target"]["epsilon"] + 1e-9


def test_gradient_checkpointing_reaches_the_plan_only_when_on(demo_plan, snap, tmp_path):
    """Memory only: named in the plan's training when on (other plans stay byte-for-byte), read by the
    spec, and the accounting is the same."""
    from components.training import TrainSpec

    off, out = demo_plan[0].to_dict(), demo_plan[1]
    assert "gradient_checkpointing" not in off["training"] and not TrainSpec.from_plan(off).gradient_checkpointing
    p = tmp_path / "ckpt.yaml"
    p.write_text(DEMO.read_text().replace(f"    {DEMO_STEPS}", f"    {DEMO_STEPS}\n    gradient_checkpointing: true"))
    on = make_plan(load_policy(p), snap, private_dir=out, created_at=WHEN).to_dict()   # the same private keys
    assert on["training"]["gradient_checkpointing"] is True and TrainSpec.from_plan(on).gradient_checkpointing
    assert (on["noise_multiplier"], on["sampling_rate"], on["accounting"]["epsilon"]) == \
        (off["noise_multiplier"], off["sampling_rate"], off["accounting"]["epsilon"])
