"""One end-to-end run through Prefect: ingest → plan → DP fine-tune → certificate → registry → audit.

Sized to run in about a minute: a tiny base model and a handful of DP steps on the demo organization.
"""
import json

import pytest
import yaml
from typer.testing import CliRunner

from components.core.settings import load_settings
from flows import stages

pytestmark = [pytest.mark.slow, pytest.mark.prefect]


@pytest.fixture
def tiny_policy(tmp_path):
    doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
    doc["metadata"]["name"] = "e2e-tiny"
    doc["spec"]["training"].update(steps=4, expected_batch_size=8, seq_len=64, micro_batch_size=8)
    doc["spec"]["audit"]["attacker_samples_per_user"] = 2
    # 100 candidates, as before the planner sized audits (`auto` gives 500 at 6 bits): these tests
    # exercise the flow, not the audit's power, and 5× the secret scoring costs minutes in CI
    doc["spec"]["audit"]["candidates_per_secret"] = 100
    # and at most 10 secrets of each class (the demo org has 188): their scoring was most of the audit's
    # time. Every class is still audited; none could pass with fewer than about 100 anyway.
    doc["spec"]["audit"]["secrets_per_class"] = 10
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, doc


@pytest.fixture
def tiny_base(tmp_path, settings):
    from components.modeling import build_base_model

    org = stages.demo_data(settings)
    texts = [json.loads(l)["text"] for l in open(org["public"])][:400]
    base = build_base_model(texts, tmp_path / "base", vocab_size=512, n_layer=1, n_embd=32, n_head=2,
                            n_positions=64, steps=4, seq_len=64, batch_size=8, progress=False)
    return org, base


def test_pipeline_through_prefect(prefect_harness, veil_home, tiny_policy, tiny_base, capfd):
    from datetime import datetime, timezone

    from flows.cli import app
    from flows.pipeline import pipeline_flow

    policy_path, policy = tiny_policy
    org, base = tiny_base
    capfd.readouterr()
    since = datetime.now(timezone.utc)
    result = pipeline_flow(str(policy_path), org["messages"], "jsonl", home=str(veil_home),
                           base_model_dir=str(base), model_name="e2e", truth=org["truth"],
                           mapping=stages.DEMO_MAPPING)

    # what `veil run` shows: the terminal (this process' fds) and the run's Prefect log hold Veil's lines only
    from _output import assert_quiet, harness_log_text

    seen = capfd.readouterr()
    assert_quiet(seen.out + seen.err, "the pipeline's terminal output")
    log = harness_log_text(since)
    assert_quiet(log, "the pipeline's Prefect log")
    for step in ("ingested", "base model ready", "planned", "trained", "registered", "audited", "evaluated"):
        assert f"step: {step}" in log, log[-3000:]

    ing, plan, cert, reg = result["ingest"], result["plan"], result["certificate"], result["registration"]
    assert ing["read"] == ing["accepted"] + ing["quarantined"] + ing["duplicates"]
    assert ing["users"] >= 200
    assert plan["mechanism"] == "uls" and plan["steps"] == 4
    # the certificate states user-level ε within the policy's target, for the steps actually run
    assert cert["privacy_unit"] == "user" and cert["steps"] == result["train"]["steps_run"] == 4
    assert 0 < cert["epsilon"] <= policy["spec"]["target"]["epsilon"]
    # the certificate binds the snapshot by its salted commitment, never its content-hash id (issue 22)
    assert cert["dataset"]["snapshot_commitment"] == plan["data"]["snapshot_commitment"] == \
        stages.snapshot_commitment_of(load_settings(veil_home), ing["snapshot_id"])
    assert ing["snapshot_id"] not in json.dumps(cert) and ing["snapshot_id"] not in json.dumps(plan)
    assert cert["audit"] is not None and "auroc" in cert["audit"] and cert["audit"]["covered_by_certificate"] is False
    assert reg["model_uri"] == "models:/e2e/1"

    # the registry holds the version with the audited certificate; the CLI lists it as JSON
    r = CliRunner().invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    row = next(x for x in rows if x["name"] == "e2e" and x["version"] == "1")
    assert row["certificate"]["sha256"] == cert["sha256"]
    assert row["certificate"]["epsilon"] == cert["epsilon"]

    # a consumer loads the model and gets the verified certificate with it
    from components.registry import load_model

    loaded = load_model("models:/e2e@latest-certified", load_settings(veil_home))
    assert loaded.certificate["sha256"] == cert["sha256"]
    assert loaded.plan["sha256"] == plan["sha256"]

    # the pipeline evaluated the model on the plan's evaluation people (base → DP), and logged rates only
    ev = result["evaluation"]
    assert ev is not None and ev["eval_people"] > 0 and ev["eval_records"] >= ev["eval_people"]
    assert 1 < ev["perplexity"] < 600 and 1 < ev["base_perplexity"] < 600   # a 512-token vocabulary
    import mlflow

    run = mlflow.tracking.MlflowClient(load_settings(veil_home).mlflow_tracking_uri).get_run(reg["run_id"])
    # the run holds the DP release (charged to the evaluation people), never the exact figures
    assert run.data.metrics["eval_perplexity"] == ev["published"]["metrics"]["eval_perplexity"]
    assert run.data.metrics["eval_perplexity"] != pytest.approx(ev["perplexity"], rel=1e-6)
    assert "evaluation.caveat" in run.data.tags
    assert not [k for k in run.data.metrics if "people" in k or "records" in k]
    assert result["plan"]["utility_forecast"]["verdict"] in ("ok", "marginal", "hopeless")
    assert cert["utility_forecast"]["trainable_parameters"] == result["train"]["trainable_params"]
