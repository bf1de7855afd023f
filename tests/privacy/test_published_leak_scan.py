"""Run the whole pipeline on the demo organization, then read everything a registry reader or a
model consumer can read — the MLflow tracking database, every artifact under the artifact store
(the model package included: certificate, seal, public plan, pickled wrapper, adapter config), and
the CLI's `models --json` / `verify --json` output — as an attacker would, looking for any person's
id, any planted secret's value, any held-out person's id or an exact private count.

The issue this guards (issue 11): the plan registered in MLflow listed the held-out people by
e-mail address, and membership files were world-readable.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows import stages

pytestmark = [pytest.mark.slow]

# weights are public by design (they are the release) and binary: scanning them for ASCII ids
# would only find tokenizer merges of the public corpus
BINARY = (".safetensors", ".bin", ".pt", ".png")


def _public_bytes(home: Path) -> list[tuple[str, bytes]]:
    out = [("mlflow.db", (home / "mlflow.db").read_bytes())]
    for p in sorted((home / "mlflow-artifacts").rglob("*")):
        if p.is_file() and not p.name.endswith(BINARY):
            out.append((str(p.relative_to(home)), p.read_bytes()))
    return out


def test_nothing_published_names_a_person_a_secret_or_an_exact_count(veil_home, tmp_path, settings):
    from components.modeling import build_base_model
    from components.draws.annex import load_annex
    from flows.cli import app
    from flows.cli.core_cmds import run_stages

    org = stages.demo_data(settings)
    truth = json.loads(Path(org["truth"]).read_text())
    texts = [json.loads(line)["text"] for line in open(org["public"])][:300]
    base = build_base_model(texts, tmp_path / "base", vocab_size=512, n_layer=1, n_embd=32, n_head=2,
                            n_positions=64, steps=2, seq_len=64, batch_size=8, progress=False)
    doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
    doc["metadata"]["name"] = "leak-scan"
    doc["spec"]["training"].update(steps=2, expected_batch_size=8, seq_len=64, micro_batch_size=8)
    doc["spec"]["audit"]["attacker_samples_per_user"] = 2
    # 100 candidates, as before the planner sized audits (`auto` gives 500 at 6 bits): these tests
    # exercise the flow, not the audit's power, and 5× the secret scoring costs minutes in CI
    doc["spec"]["audit"]["candidates_per_secret"] = 100
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))

    result = run_stages(settings, str(policy), org["messages"], "jsonl", base_model_dir=str(base),
                        model_name="scan", mapping=stages.DEMO_MAPPING, truth=org["truth"])
    annex = load_annex(settings.private_dir, result["plan"])
    assert annex["held_out_users"]                                     # there is membership to leak

    runner = CliRunner()
    cli = [runner.invoke(app, args) for args in (["models", "--json"], ["verify", "models:/scan/1", "--json"])]
    assert all(r.exit_code == 0 for r in cli), [r.output for r in cli]
    published = _public_bytes(veil_home) + [(f"cli:{i}", r.output.encode()) for i, r in enumerate(cli)]

    people = [u["user"] for u in truth["users"]] + [u["name"] for u in truth["users"]]
    secret_values = sorted({str(s["value"]) for s in truth["secrets"] if len(str(s["value"])) >= 6})
    assert len(people) >= 400 and secret_values
    hits = [(where, needle) for where, blob in published
            for needle in people + secret_values if needle.encode() in blob]
    assert hits == [], hits[:10]

    # exact private counts: how many people trained (N), were held out, or had records
    plan = result["plan"]
    n_exact = annex["population"]["exact"]
    for where, blob in published:
        if where.endswith("plan.json"):
            d = json.loads(blob)
            assert "n_train_users" not in d["data"] and "held_out_users" not in d["audit"]
            assert d["data"]["population"]["estimate"] != n_exact     # a DP estimate, not the count
    assert plan["data"]["population"]["mechanism"] == "laplace"
