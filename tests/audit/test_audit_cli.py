"""`veil audit MODEL --json`: one JSON document with the contract keys; bad input exits 2."""
import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from _audit_tinylm import build_model, build_tokenizer, with_lora
from components.core.hashing import sha256_file
from flows.cli import app


@pytest.fixture
def fake_registry(settings, tmp_path, monkeypatch):
    tok = build_tokenizer()
    model = with_lora(build_model(tok)).eval()  # adapter B = 0: identical to the reference
    recs = pa.table({"record_id": [f"r{i}" for i in range(8)], "text": [f"alpha bravo {i}" for i in range(8)]})
    att = pa.table({"record_id": [f"r{i}" for i in range(8)], "user_id": [f"person{i // 2}@x.example" for i in range(8)],
                    "member": [i < 4 for i in range(8)]})
    f = tmp_path / "att.parquet"
    pq.write_table(att, f)
    from components.draws.annex import attach_annex

    plan = attach_annex(settings.private_dir,
                        {"sha256": "p", "training": {"seq_len": 32, "seed": 0}, "data": {"snapshot_id": "s1"},
                         "audit": {"thresholds": {"max_user_inference_auroc": 0.65, "max_secret_exposure": 4.0}}},
                        {"attacker_records_file": str(f), "attacker_records_sha256": sha256_file(f),
                         # the snapshot is named in the private annex only (the plan carries a commitment)
                         "plan_inputs": {"snapshot_id": "s1", "snapshot_sha256": "0" * 64}})
    loaded = SimpleNamespace(model=model, tokenizer=tok, plan=plan,
                             certificate={"privacy_unit": "user", "epsilon": 2.0, "delta": 1e-5, "sha256": "c"})
    import catalog.snapshots
    import components.registry
    monkeypatch.setattr(components.registry, "load_model", lambda uri, s: loaded)
    monkeypatch.setattr(catalog.snapshots, "load_snapshot",
                        lambda s, sid=None: SimpleNamespace(records=recs, secret_spans=pa.table(
                            {"record_id": pa.array([], pa.string())})))
    return loaded


def test_audit_json_contract(fake_registry):
    # 2 people in / 2 out: whatever the point estimate, no 95 % interval is narrow enough to decide
    r = CliRunner().invoke(app, ["audit", "models:/m/1", "--json", "--no-record", "--bootstrap", "10"])
    assert r.exit_code == 3, r.output
    doc = json.loads(r.stdout)
    assert list(doc)[:8] == ["verdict", "passed", "covered_by_certificate", "auroc", "auroc_interval",
                             "auroc_ceiling", "users_in", "users_out"]
    assert doc["verdict"] == "inconclusive" and doc["passed"] is False and doc["covered_by_certificate"] is False
    # too few people for any grid the public rule allows: no AUROC or interval, and people needed from the
    # published values (AUROC 1/2 without a bucket, the count buckets' lower ends)
    assert doc["users_in"] == [0, 10] and doc["users_out"] == [0, 10]
    assert doc["auroc"] is None and doc["auroc_interval"] is None and doc["auroc_grid"] is None
    assert doc["user_inference"]["people_needed_basis"].startswith("an audit that finds nothing")
    need = doc["user_inference"]["people_needed"]
    assert isinstance(need, dict) and need["in"] >= 10 and need["out"] >= 10
    assert doc["auroc_ceiling"] == pytest.approx(1 - (1 - 1e-5) ** 2 / (1 + 2.718281828459045 ** 2))
    assert "person0@x.example" not in r.stdout and "person3@x.example" not in r.stdout
    assert "tpr_at_fpr" not in doc and "auroc_std" not in doc


def test_audit_table_says_inconclusive(fake_registry):
    r = CliRunner().invoke(app, ["audit", "models:/m/1", "--no-record", "--bootstrap", "10"])
    assert r.exit_code == 3, r.output
    assert "INCONCLUSIVE" in r.stdout and "PASSED" not in r.stdout and "people needed" in r.stdout
    assert "person0@x.example" not in r.stdout


def test_audit_bad_policy_exits_2(fake_registry, tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("spec: [\n")
    r = CliRunner().invoke(app, ["audit", "models:/m/1", "--policy", str(bad), "--no-record"])
    assert r.exit_code == 2
