"""`veil privacy …`: the JSON contract, one-line errors with exit 2, and secrets from a plan."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _run(args):
    return runner.invoke(app, args, catch_exceptions=False)


def test_epsilon_json_contract(veil_home):
    r = _run(["privacy", "epsilon", "--mechanism", "els", "--sampling-rate", "0.05", "--noise-multiplier", "2",
              "--steps", "50", "--delta", "1e-5", "--k", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {"epsilon", "delta", "mechanism", "dp_event", "seconds"} <= set(doc)
    assert doc["mechanism"] == "els" and doc["delta"] == 1e-5 and doc["epsilon"] > 0
    assert doc["dp_event"]["name"] == "SelfComposedDpEvent"


def test_epsilon_table(veil_home):
    r = _run(["privacy", "epsilon", "--mechanism", "uls", "--sampling-rate", "0.05", "--noise-multiplier", "2",
              "--steps", "50", "--delta", "1e-5"])
    assert r.exit_code == 0 and "ε" in r.stdout


def test_calibrate_json_contract_and_cache(veil_home):
    args = ["privacy", "calibrate", "--mechanism", "uls", "--epsilon", "3", "--delta", "1e-5",
            "--sampling-rate", "0.05", "--steps", "50", "--json"]
    doc = json.loads(_run(args).stdout)
    assert {"noise_multiplier", "epsilon", "seconds"} <= set(doc)
    assert doc["epsilon"] <= 3 and doc["cached"] is False
    assert json.loads(_run(args).stdout)["cached"] is True
    assert any((veil_home / "cache" / "accounting" / "calibrations").iterdir())


@pytest.mark.parametrize("flag,value,field", [
    ("--sampling-rate", "0", "sampling_rate"),
    ("--sampling-rate", "1.2", "sampling_rate"),
    ("--noise-multiplier", "0", "noise_multiplier"),
    ("--delta", "1", "delta"),
    ("--k", "0", "k"),
    ("--mechanism", "gauss", "mechanism"),
])
def test_bad_parameters_exit_2_with_one_line(veil_home, flag, value, field):
    args = {"--mechanism": "els", "--sampling-rate": "0.01", "--noise-multiplier": "1", "--steps": "10",
            "--delta": "1e-5", "--k": "2"}
    args[flag] = value
    r = _run(["privacy", "epsilon", *[x for kv in args.items() for x in kv], "--json"])
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in r.stderr


def _write_plan(tmp: Path, *, mechanism="secret", policy_path=None, rates=True) -> Path:
    from components.planning.plan import SCHEMA, seal

    train = {"record_id": ["r1", "r2", "r3", "r4", "r5"], "user_id": ["u1", "u1", "u2", "u3", "u3"]}
    if rates:
        train["rate"] = [0.05, 0.05, 0.02, 0.0, 0.3]
    pq.write_table(pa.table(train), tmp / "train.parquet")
    spans = pa.table({
        "record_id": ["r1", "r2", "r3", "r4", "r5", "r5", "r9"],
        "secret_id": ["codename:KESTREL", "codename:KESTREL", "codename:KESTREL", "codename:KESTREL",
                      "email:a.b@acme-corp.example", "email:a.b@acme-corp.example", "codename:OSPREY"],
        "secret_class": ["codename"] * 4 + ["email", "email", "codename"],
        "detector": ["rule"] * 7, "detector_version": ["1"] * 7,
        "start": [0, 0, 0, 0, 0, 10, 0], "end": [5, 5, 5, 5, 5, 15, 5]})
    pq.write_table(spans, tmp / "spans.parquet")
    body = {
        "schema": SCHEMA, "created_at": "2026-01-01T00:00:00+00:00", "mechanism": mechanism,
        "privacy_unit": "secret" if mechanism == "secret" else "user",
        "neighbouring": "secret_substitution", "target": {"epsilon": None, "delta": None},
        "sampling_rate": 0.05, "noise_multiplier": 2.0, "steps": 100, "expected_batch_size": 1,
        "clip_norm": 1.0, "records_per_user": None, "selection": None, "training": {}, "accounting": {},
        "data": {"snapshot_commitment": "x"},
        "audit": {}, "policy": {"name": "demo", "path": policy_path, "sha256": "z"},
    }
    # the training rows live in the plan's private annex, in this Veil home's private area
    from components.core.hashing import sha256_file
    from components.core.settings import load_settings
    from components.draws.annex import ANNEX_SCHEMA, plan_key, save_annex, seal_annex

    private = load_settings().private_dir
    sealed, digest = seal_annex(plan_key(private), {
        "train_records_file": str(tmp / "train.parquet"), "train_records_sha256": sha256_file(tmp / "train.parquet"),
        "held_out_users": []})
    body["annex"] = {"schema": ANNEX_SCHEMA, "commitment": digest}
    plan = seal(body)
    save_annex(private, plan["sha256"], sealed)
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_secrets_from_a_plan_worst_first(veil_home, tmp_path):
    from components.accounting.secrets import secret_kl

    plan = _write_plan(tmp_path, policy_path=str(REPO / "policies" / "demo.yaml"))
    r = _run(["privacy", "secrets", "--plan", str(plan), "--spans", str(tmp_path / "spans.parquet"), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sensitivity"] == 2.0 and "2" in doc["sensitivity_reason"]
    by_class = {s["secret_class"]: s for s in doc["secrets"]}
    assert set(by_class) == {"codename", "email"}          # OSPREY is in no training record
    code = by_class["codename"]
    # KESTREL: records r1, r2, r3 at their plan rates (r4 has rate 0)
    assert code["kl"] == pytest.approx(secret_kl([0.05, 0.05, 0.02], 2.0, 100).kl, rel=1e-12)
    assert code["kappa"] == 1e-3 and code["gamma_target"] == 0.01      # policy tier "critical"
    assert by_class["email"]["n_records"] == 1                             # r5 holds it twice: once
    assert "KESTREL" not in r.stdout and "a.b@" not in r.stdout            # values are not printed
    ratios = [s["gamma"] / s["gamma_target"] for s in doc["secrets"]]
    assert ratios == sorted(ratios, reverse=True)


def test_secrets_uls_counts_users_and_needs_kappa(veil_home, tmp_path):
    from components.accounting.secrets import secret_kl

    plan = _write_plan(tmp_path, mechanism="uls", rates=False)
    base = ["privacy", "secrets", "--plan", str(plan), "--spans", str(tmp_path / "spans.parquet")]
    r = _run(base + ["--json"])
    assert r.exit_code == 2 and "--kappa" in r.stderr
    r = _run(base + ["--kappa", "0.01", "--gamma", "0.5", "--json", "--show-values"])
    doc = json.loads(r.stdout)
    kestrel = next(s for s in doc["secrets"] if s["secret_id"] == "codename:KESTREL")
    # users u1 (r1, r2), u2 (r3), u3 (r4): three users at the user rate q = 0.05
    assert kestrel["n_records"] == 3
    assert kestrel["kl"] == pytest.approx(secret_kl([0.05] * 3, 2.0, 100).kl, rel=1e-12)
    r = _run(base + ["--kappa", "0.01", "--gamma", "0.5"])
    assert r.exit_code == 0 and "KESTREL" not in r.stdout


def test_secrets_bad_plan_exit_2(veil_home, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    r = _run(["privacy", "secrets", "--plan", str(bad)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
