"""Base or privacy: the run summary's diagnosis of what limits utility (components/evaluation/bottleneck.py)."""
from __future__ import annotations

import math

from components.evaluation.bottleneck import diagnose, line

FACTS = {"n_params": 850_000, "config": {"n_layer": 2, "n_embd": 128, "steps": 200}, "eval_loss_after": math.log(60)}


def test_reference_decides_when_there_is_one():
    # issue 26's corpus: base 534.6 → DP 501.3. A reference that itself only reaches 480: the base limits.
    d = diagnose({"base_perplexity": 534.6, "perplexity": 501.3, "reference_perplexity": 480.0}, {"verdict": "marginal"},
                 FACTS)
    assert d["limit"] == "base" and "61%" in d["why"] and "veil base-model" in d["fix"]
    assert "2×128" in d["why"] and "200 pretraining steps" in d["why"] and "perplexity 60" in d["why"]
    # a reference at 150: DP closes 9% — privacy limits, whatever the forecast says
    d = diagnose({"base_perplexity": 534.6, "perplexity": 501.3, "reference_perplexity": 150.0}, {"verdict": "ok"})
    assert d["limit"] == "privacy" and "9%" in d["why"] and "hints" in d["fix"]


def test_forecast_and_base_perplexity_without_a_reference():
    ev = {"base_perplexity": 534.6, "perplexity": 501.3}
    assert diagnose(ev, {"verdict": "hopeless"})["limit"] == "privacy"
    assert diagnose(ev, {"verdict": "ok"})["limit"] == "base"
    both = diagnose(ev, {"verdict": "marginal"})
    assert both["limit"] == "base and privacy" and "then the forecast's hints" in both["fix"]
    assert line(both).startswith("BASE AND PRIVACY limits utility: fine-tuning moved perplexity only 534.6 → 501.3")
    # a fluent base that the fine-tune barely moved, no forecast: Veil says it cannot tell
    assert diagnose({"base_perplexity": 30.0, "perplexity": 29.0}, None)["limit"] == "unknown"
    # a real gain from a fluent base: nothing to report
    assert diagnose({"base_perplexity": 40.0, "perplexity": 20.0}, {"verdict": "ok"})["limit"] == "neither"
    # a weak base and a real gain: the base is still what keeps the text from being useful
    assert diagnose({"base_perplexity": 900.0, "perplexity": 300.0}, {"verdict": "ok"})["limit"] == "base"
    assert diagnose({"base_perplexity": None, "perplexity": 3.0})["limit"] == "unknown"
