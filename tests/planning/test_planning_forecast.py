"""Utility forecast: the noise-to-signal numbers against an independent computation, the verdicts of a
demo-sized and a tiny organization, and hints that — applied and re-calibrated — stop being hopeless."""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from components.accounting import calibrate
from components.planning import make_plan
from components.planning.forecast import HOPELESS_AT, OK_BELOW, describe, plan_forecast, ratios, verdict
from components.policy import load_policy, parse_policy

sys.path.insert(0, str(Path(__file__).parent))
from _planning_fixtures import make_snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "policies" / "demo.yaml"
WHEN = "2026-01-01T00:00:00+00:00"


def _demo_d() -> int:
    """The demo base's LoRA size by hand: GPT-2 with n_embd 128, 2 layers, r = 8 on c_attn (128→384),
    attn.c_proj (128→128) and mlp.c_proj (512→128); each adapter is r·(in + out) parameters."""
    r, e = 8, 128
    return 2 * r * ((e + 3 * e) + (e + e) + (4 * e + e))


def test_ratios_match_a_monte_carlo_of_the_noised_mean():
    """Independent: draw the step's noise N(0, σ²C² I_d)/B and measure its norm against C."""
    sigma, b, c, d, t = 1.3, 16, 0.7, 5000, 100
    rng = np.random.default_rng(0)
    noise = rng.normal(0.0, sigma * c, size=(200, d)) / b
    measured = float(np.linalg.norm(noise, axis=1).mean()) / c         # noise norm / largest signal norm
    per_step, run = ratios(noise_multiplier=sigma, expected_batch_size=b, steps=t, trainable_parameters=d)
    assert per_step == pytest.approx(measured, rel=0.01)
    # per coordinate: std σC/B against C/√d — the same ratio
    assert per_step == pytest.approx(float(noise.std()) / (c / math.sqrt(d)), rel=0.01)
    # over the run: T steps of noise sum to √T·σC√d/B, T full signals to T·C
    summed = rng.normal(0.0, sigma * c, size=(50, t, 400)).sum(axis=1) / b
    run_measured = float(np.linalg.norm(summed, axis=1).mean()) * math.sqrt(d / 400) / (t * c)
    assert run == pytest.approx(run_measured, rel=0.03)


def test_verdict_thresholds():
    assert verdict(HOPELESS_AT) == "hopeless" and verdict(HOPELESS_AT * 0.999) == "marginal"
    assert verdict(OK_BELOW) == "marginal" and verdict(OK_BELOW * 0.999) == "ok"


def test_trainable_parameter_count_matches_the_architecture(tmp_path):
    from transformers import GPT2Config

    from components.modeling import BaseModelConfig
    from components.modeling.lora import count_trainable_parameters

    cfg = BaseModelConfig()
    GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
               n_head=cfg.n_head).save_pretrained(tmp_path)
    lora = load_policy(DEMO).spec.training.lora.model_dump()
    assert count_trainable_parameters(tmp_path, lora) == _demo_d()
    e, v, p, layers = cfg.n_embd, cfg.vocab_size, cfg.n_positions, cfg.n_layer
    full = v * e + p * e + layers * (12 * e * e + 13 * e) + 2 * e      # tied head: counted once
    assert count_trainable_parameters(tmp_path, None) == full


def _policy_text(epsilon: float = 8.0, batch: int = 16, steps: int = 120) -> str:
    text = DEMO.read_text()
    text = re.sub(r"epsilon: 8\.0", f"epsilon: {epsilon}", text, count=1)
    text = re.sub(r"epsilon: 16\.0", f"epsilon: {max(16.0, epsilon)}", text, count=1)   # lifetime ≥ per release
    text = re.sub(r"expected_batch_size: \d+", f"expected_batch_size: {batch}", text)
    return re.sub(r"    steps: \d+", f"    steps: {steps}", text)


def test_demo_sized_org_is_learnable(tmp_path):
    """The demo organization's size (~240 people) under the demo policy: not hopeless."""
    plan = make_plan(load_policy(DEMO), make_snapshot(240, seed=3), private_dir=tmp_path, created_at=WHEN,
                     compute={"trainable_parameters": _demo_d()}).to_dict()
    fc = plan["utility_forecast"]
    per_step = plan["noise_multiplier"] * math.sqrt(_demo_d()) / plan["expected_batch_size"]
    assert fc["per_step_ratio"] == pytest.approx(per_step)
    assert fc["run_ratio"] == pytest.approx(per_step / math.sqrt(plan["steps"]))
    assert fc["verdict"] in ("ok", "marginal") and ("hints" in fc) == (fc["verdict"] == "marginal")
    assert fc["trainable_parameters"] == _demo_d()


def test_marginal_plan_says_what_would_make_it_ok(tmp_path):
    """A MARGINAL plan gets hints too (issue 26), aimed under the ok line; each, applied alone, gets there."""
    from components.planning.forecast import OK_TARGET

    plan = make_plan(parse_policy(_policy_text(), "m.yaml"), make_snapshot(240, seed=2), private_dir=tmp_path,
                     created_at=WHEN, compute={"trainable_parameters": _demo_d()}).to_dict()
    fc = plan["utility_forecast"]
    assert fc["verdict"] == "marginal", fc
    h = fc["hints"]
    assert h["aim"] == f"run ratio ≤ {OK_TARGET:g}" and h["epsilon"] > 8.0
    assert "MARGINAL" in describe(fc) and "would be OK with (each alone)" in describe(fc)
    budget = plan["accounting"]["epsilon_dp_sgd"]
    delta, q, b, t = plan["target"]["delta"], plan["sampling_rate"], plan["expected_batch_size"], plan["steps"]
    sigma = calibrate("uls", epsilon=budget, delta=delta, sampling_rate=q, steps=t).noise_multiplier
    assert ratios(noise_multiplier=sigma, expected_batch_size=b, steps=t, trainable_parameters=_demo_d())[1] >= OK_BELOW
    # fewer trainable parameters at the same σ: under the ok line
    assert ratios(noise_multiplier=sigma, expected_batch_size=b, steps=t,
                  trainable_parameters=h["trainable_parameters"])[1] < OK_BELOW
    # more people at the target ε: σ re-calibrated at q = B / users
    s2 = calibrate("uls", epsilon=budget, delta=delta, sampling_rate=b / h["training_users"], steps=t).noise_multiplier
    assert ratios(noise_multiplier=s2, expected_batch_size=b, steps=t, trainable_parameters=_demo_d())[1] < OK_BELOW


def test_tiny_org_is_hopeless_and_each_hint_applied_would_learn(tmp_path):
    pol = parse_policy(_policy_text(batch=4), "tiny.yaml")
    plan = make_plan(pol, make_snapshot(30, seed=2), private_dir=tmp_path, created_at=WHEN,
                     compute={"trainable_parameters": _demo_d()}).to_dict()
    fc = plan["utility_forecast"]
    assert fc["verdict"] == "hopeless", fc
    h = fc["hints"]
    assert h["epsilon"] > 8.0 and h["training_users"] > plan["data"]["population"]["estimate"]
    line = describe(fc)
    assert "HOPELESS" in line and "ε ≥" in line and "training users" in line

    # ε: re-plan the same org at the hinted ε — the new plan is no longer hopeless
    again = make_plan(parse_policy(_policy_text(epsilon=h["epsilon"], batch=4), "tiny2.yaml"), make_snapshot(30, seed=2),
                      private_dir=tmp_path, created_at=WHEN, compute={"trainable_parameters": _demo_d()}).to_dict()
    assert again["utility_forecast"]["verdict"] != "hopeless", again["utility_forecast"]

    # people, steps, batch: calibrate σ at the plan's DP-SGD budget with the hinted value alone
    budget = plan["accounting"]["epsilon_dp_sgd"]
    delta, q, b, t = plan["target"]["delta"], plan["sampling_rate"], plan["expected_batch_size"], plan["steps"]

    def run_ratio(q_, b_, t_):
        s = calibrate("uls", epsilon=budget, delta=delta, sampling_rate=q_, steps=t_).noise_multiplier
        return ratios(noise_multiplier=s, expected_batch_size=b_, steps=t_, trainable_parameters=_demo_d())[1]

    assert run_ratio(q, b, t) >= HOPELESS_AT                           # as planned
    assert run_ratio(b / h["training_users"], b, t) < HOPELESS_AT
    if h["steps"] is not None:
        assert run_ratio(q, b, h["steps"]) < HOPELESS_AT
    if h["expected_batch_size"] is not None:
        n_hat = plan["data"]["population"]["estimate"]
        assert run_ratio(h["expected_batch_size"] / n_hat, h["expected_batch_size"], t) < HOPELESS_AT


def test_forecast_without_d_says_so_and_certificate_fills_it_from_the_run(tmp_path):
    plan = make_plan(load_policy(DEMO), make_snapshot(60, seed=1), private_dir=tmp_path, created_at=WHEN).to_dict()
    assert plan["utility_forecast"]["verdict"] == "unknown" and "--base-model" in plan["utility_forecast"]["why"]
    from components.certificate.document import _utility_forecast

    fc = _utility_forecast(plan, {"trainable_params": _demo_d()})
    assert fc == {**plan_forecast(plan, _demo_d(), with_hints=False), "source": "plan numbers, the run's d"}
    planned = {**plan, "utility_forecast": plan_forecast(plan, _demo_d())}
    assert _utility_forecast(planned, {"trainable_params": _demo_d()})["source"] == "plan"


def test_forecast_uses_public_quantities_only(tmp_path):
    """Same public plan numbers → same forecast, whatever the exact private N behind N̂."""
    plan = make_plan(parse_policy(_policy_text(batch=4), "tiny.yaml"), make_snapshot(30, seed=2), private_dir=tmp_path,
                     created_at=WHEN, compute={"trainable_parameters": _demo_d()}).to_dict()
    public = {k: plan[k] for k in ("mechanism", "noise_multiplier", "expected_batch_size", "steps", "clip_norm",
                                   "sampling_rate", "records_per_user", "target")}
    public["accounting"] = {k: plan["accounting"][k] for k in ("mechanism", "epsilon_population")}
    public["data"] = {"population": {k: plan["data"]["population"][k] for k in ("estimate", "unit")}}
    assert plan_forecast(public, _demo_d()) == plan["utility_forecast"]
