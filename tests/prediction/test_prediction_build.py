"""`veil pmixed build` end to end on a tiny snapshot and base: partition by person, shards trained, certificate
recomputed independently, registered in MLflow without the adapters."""
from __future__ import annotations

import json
import math

import pytest

from components.core.errors import VeilError

POLICY = """apiVersion: veil.dev/v1
kind: PredictionPolicy
metadata: {name: tiny-pmixed, owner: tests}
spec:
  target: {epsilon: 4.0, delta: 1.0e-5}
  shards: 3
  subsample_rate: 0.5
  token_budget: 6
  when_exhausted: WHEN
  max_tokens_per_request: 8
  training: {epochs: 1, learning_rate: 1.0e-2, seq_len: 32, batch_size: 4, lora: {r: 2, alpha: 8.0}, seed: 0}
"""


def make_built(settings, tiny_base, tiny_people, tmp_path, when="public_only"):
    from catalog.ingest import ingest_source
    from flows.pmixed import build

    src = tmp_path / "people.jsonl"
    with src.open("w") as f:
        for i, (u, t) in enumerate(zip(tiny_people.column("user_id").to_pylist(), tiny_people.column("text").to_pylist())):
            f.write(json.dumps({"id": f"r{i}", "user": u, "text": t}) + "\n")
    ingest_source(src, "jsonl", settings=settings, id_field="id")
    pol = tmp_path / "p.yaml"
    pol.write_text(POLICY.replace("WHEN", when))
    return build(settings, pol, base_dir=tiny_base, use_prefect=False)


def test_build_registers_a_certified_ensemble_without_adapters(settings, tiny_base, tiny_people, tmp_path, capfd):
    from mlflow import MlflowClient

    from _output import assert_quiet
    from components.accounting.prediction import rdp_to_epsilon
    from components.prediction import partition as part
    from components.prediction.release import private_root

    capfd.readouterr()
    out = make_built(settings, tiny_base, tiny_people, tmp_path)
    seen = capfd.readouterr()
    assert_quiet(seen.out + seen.err, "pmixed build's output")    # issue 26
    assert out["shards"] == 3 and out["model_uri"].startswith("models:/tiny-pmixed/")
    c = out["certificate"]
    # independent recomputation of the certificate's ε from its public parameters
    q, r, T = c["ensemble"]["subsample_rate"], c["ensemble"]["radius"], c["token_budget"]
    e = math.log((1 - q + q * (1 + math.exp(2 * r)) / 2) / (1 - q + q * math.exp(-r)))
    curve = [T * min(e, a * e * e / 2) for a in c["per_token"]["orders"]]
    assert math.isclose(rdp_to_epsilon(c["per_token"]["orders"], curve, c["delta"])[0], c["epsilon"], rel_tol=1e-12)
    assert c["epsilon"] <= 4.0 and c["epsilon"] > 3.9  # calibrated to the target, not far below it
    # the registry holds certificate, manifest and the public base — no adapter weights
    client = MlflowClient(settings.mlflow_tracking_uri)
    run_id = client.get_model_version("tiny-pmixed", out["model_uri"].rsplit("/", 1)[1]).run_id
    names = []

    def walk(path=None):
        for a in client.list_artifacts(run_id, path):
            (walk(a.path) if a.is_dir else names.append(a.path))
    walk()
    assert not [n for n in names if "adapter" in n], names
    # every person's records are in their own shard: shard = keyed hash of that person alone
    key = part.load_or_create_key(settings.private_dir)
    assert all(part.shard_of(key, u, 3) == part.shard_of(key, u.upper() + " ", 3)
               for u in tiny_people.column("user_id").to_pylist())
    facts = json.loads((private_root(settings) / c["ensemble_id"] / "partition.json").read_text())
    assert sum(facts["sizes_people"]) == len(set(tiny_people.column("user_id").to_pylist()))
    assert "sizes_people" not in json.dumps(c)  # shard sizes (counts of people) are private


def test_build_charges_every_person_the_whole_budget_in_the_ledger(settings, tiny_base, tiny_people, tmp_path):
    ledger = pytest.importorskip("components.ledger")
    import numpy as np

    from components.prediction.mechanism import token_rdp

    out = make_built(settings, tiny_base, tiny_people, tmp_path)
    c = out["certificate"]
    assert "admitted" not in c["ledger"] and "retired" not in c["ledger"]   # exact counts of people: private
    assert c["ledger"]["ledger_release_id"] is not None
    led = ledger.Ledger.open(settings)
    try:
        spend = led.spend(sorted(set(tiny_people.column("user_id").to_pylist())))
        want = c["token_budget"] * token_rdp(c["ensemble"]["subsample_rate"], c["ensemble"]["radius"], led.orders)
        assert all(np.allclose(v, want, rtol=1e-12) for v in spend.values())
    finally:
        led.dispose()


def test_removing_one_person_changes_only_their_shard(settings):
    from components.prediction import partition as part

    key = part.load_or_create_key(settings.private_dir)
    people = [f"p{i}@x" for i in range(200)]
    a = part.partition(key, people, 8)
    b = part.partition(key, people[1:], 8)
    assert all(a[p] == b[p] for p in people[1:])
    sizes = part.shard_sizes(a, 8)
    assert min(sizes) > 10  # balanced in expectation (200/8 = 25)


def test_bad_policy_is_one_line(tmp_path):
    from components.policy import load_prediction_policy

    p = tmp_path / "bad.yaml"
    p.write_text(POLICY.replace("WHEN", "public_only").replace("shards: 3", "shards: 0"))
    with pytest.raises(VeilError, match="spec.shards"):
        load_prediction_policy(p)


def test_shipped_demo_prediction_policy_is_valid():
    from components.prediction import mechanism as mech
    from components.policy import load_prediction_policy

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    pol, _ = load_prediction_policy(root / "policies" / "demo-pmixed.yaml")
    s = pol.spec
    assert s.privacy_unit == "user" and s.when_exhausted in ("public_only", "refuse")
    r = mech.calibrate_radius(epsilon=s.target.epsilon, delta=s.target.delta, tokens=s.token_budget, q=s.subsample_rate)
    assert r > 0.05  # the demo's budget leaves a usable radius


def test_sizing_says_what_the_budget_buys_per_request_and_key():
    from components.prediction.sizing import sizing

    s = sizing(token_budget=512, max_tokens_per_request=64)
    assert (s["full_private_requests"], s["min_private_requests"], s["requests_per_key"]) == (8, 64, None)
    assert any("8 private answers" in h for h in s["hints"]) and any("first key" in h for h in s["hints"])
    q = sizing(token_budget=10_000, max_tokens_per_request=50, key_quota_tokens=400, keys=30)
    assert (q["requests_per_key"], q["keys_at_full_quota"], q["private_tokens_per_key"]) == (6, 25, 333)  # 10000//30 = 333 < the quota: 6 answers of 50
    assert any("30 keys at 400" in h for h in q["hints"])
    assert sizing(token_budget=10_000, max_tokens_per_request=50, key_quota_tokens=400)["hints"] == []


def test_cli_plan_shows_sizing_before_build_and_refuses_a_quota_over_the_budget(tmp_path, veil_home):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    veil = [sys.executable, "-c", "import sys; from flows.cli import main; sys.argv[0] = 'veil'; main()"]
    env = {**os.environ, "VEIL_HOME": str(veil_home), "PYTHONPATH": str(root)}
    p = tmp_path / "p.yaml"
    p.write_text(POLICY.replace("WHEN", "public_only").replace("token_budget: 6", "token_budget: 64\n  key_quota_tokens: 16"))
    r = subprocess.run(veil + ["pmixed", "plan", "--policy", str(p), "--keys", "3", "--json"], cwd=root, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    z = doc["sizing"]
    assert (z["full_private_requests"], z["requests_per_key"], z["keys_at_full_quota"]) == (8, 2, 4)
    assert [t["token_budget"] for t in doc["tradeoff"]] == [32, 64, 128, 256]
    radii = [t["radius"] for t in doc["tradeoff"]]
    assert radii == sorted(radii, reverse=True) and math.isclose(radii[1], doc["radius"])
    r = subprocess.run(veil + ["pmixed", "plan", "--policy", str(p)], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "2 full-length answers" in r.stderr and "4 keys" in r.stderr
    p.write_text(POLICY.replace("WHEN", "public_only").replace("token_budget: 6", "token_budget: 6\n  key_quota_tokens: 7"))
    r = subprocess.run(veil + ["pmixed", "plan", "--policy", str(p)], cwd=root, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "key_quota_tokens" in r.stderr
