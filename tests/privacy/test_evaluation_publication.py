"""What `veil evaluate` publishes: an attacker reading the model's MLflow run finds rates rounded to
4 digits and a caveat, never the exact number of evaluation people, records or tokens (with the public
fraction those estimate the private N that only N̂ may reveal), and nothing on the version's tags."""
from __future__ import annotations

import pytest

from components.core.errors import VeilError


@pytest.fixture
def run_id(settings):
    import mlflow

    client = mlflow.tracking.MlflowClient(settings.mlflow_tracking_uri)
    exp = client.create_experiment("evaluation-publication")
    return client, client.create_run(exp).info.run_id


def test_run_gets_rounded_rates_and_caveat_never_counts(settings, run_id):
    from components.registry import record_evaluation

    client, rid = run_id
    for name in ("eval_people", "eval_records", "eval_tokens", "perplexity", "n_eval_users"):
        with pytest.raises(VeilError, match="refusing to log"):
            record_evaluation(settings, rid, {"eval_perplexity": 9.5, name: 34})
    assert client.get_run(rid).data.metrics == {}          # all or nothing
    _rates_are_rounded_and_carry_the_caveat(settings, run_id)


def _rates_are_rounded_and_carry_the_caveat(settings, run_id):
    from components.registry import record_evaluation

    client, rid = run_id
    logged = record_evaluation(settings, rid, {"eval_perplexity": 9.678421126062595, "eval_next_token_accuracy":
                                               0.608630534494056, "eval_reference_perplexity": None})
    run = client.get_run(rid)
    assert run.data.metrics == logged == {"eval_perplexity": 9.678, "eval_next_token_accuracy": 0.6086}
    assert "not differentially private" in run.data.tags["evaluation.caveat"]
    assert not [k for k in run.data.tags if k.startswith(("privacy.", "audit."))]   # no certificate claim
