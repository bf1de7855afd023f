"""The gate's declarations for evaluation metrics, PMixED answers and the governance ledger view: what
goes out is declared with its kind, and the fields these releases must never carry are refused."""
from __future__ import annotations

import pytest

from components.core.errors import VeilError
from components.publication import Kind, publish
from components.publication.gate import field_for


def test_evaluation_metrics_are_declared_dp_with_their_price():
    for name in ("eval_perplexity", "eval_next_token_accuracy", "eval_base_perplexity",
                 "eval_base_next_token_accuracy", "eval_reference_perplexity", "eval_reference_next_token_accuracy"):
        f = field_for("registry.metric", name)
        assert f is not None and f.kind is Kind.DP and "evaluation" in f.charge and "nll_clip" in f.sensitivity
    publish("registry.tag", {"evaluation.epsilon": "1.0", "evaluation.ledger_release_id": "3"})
    for bad in ("eval_people", "eval_records", "eval_tokens", "eval_exact_perplexity"):
        with pytest.raises(VeilError, match="not declared"):
            publish("registry.metric", {bad: 1.0})


def test_pmixed_answers_carry_sampled_tokens_only():
    doc = {"text": "hello", "tokens": 2, "budget_remaining_tokens": 998}
    assert publish("pmixed.response", doc) is doc
    for extra in ("logprobs", "lambda", "selected", "seed"):
        with pytest.raises(VeilError, match="not declared"):
            publish("pmixed.response", {**doc, extra: 0.5})


def test_governance_ledger_view_refuses_counts_of_people():
    publish("cli.ledger", {"budget": {"epsilon": 4.0, "delta": 1e-5}, "releases": 2, "orders": [2.0, 4.0],
                           "spend_definition": "…", "secrets_definition": "…", "note": "…"})
    for bad in ("people", "retired", "spend", "pld_estimate", "secrets"):
        with pytest.raises(VeilError, match="not declared"):
            publish("cli.ledger", {bad: 4})
