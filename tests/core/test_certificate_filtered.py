"""Filtered ULS (Asi & Liu, Alg. 3) certificates: ε/2 for the sparse vector plus the full-batch
Gaussian steps' ε at δ/2, checked against the closed-form μ-GDP curve; the paper's unverified
noise formula is refused."""
import math

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from components.accounting.filtered import calibrate_filtered, min_users
from components.certificate import build_certificate, recompute_epsilon, verify_certificate
from components.core.errors import VeilError

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

EPS, DELTA, T = 8.0, 1e-5, 40


def _gdp_epsilon(mu: float, delta: float) -> float:
    """Exact ε(δ) of μ-GDP (Dong, Roth & Su 2019): δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    f = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta  # noqa: E731
    return brentq(f, 0.0, 200.0)


def _plan(sigma, n_users, variant="veil"):
    return {
        "schema": "veil.plan/v1", "sha256": "ab" * 32, "mechanism": "uls-filtered", "privacy_unit": "user",
        "target": {"epsilon": EPS, "delta": DELTA}, "sampling_rate": 1.0, "noise_multiplier": sigma,
        "steps": T, "expected_batch_size": n_users, "clip_norm": 1.0, "records_per_user": 4, "selection": "random",
        "filter": {"tau": 0.5, "epsilon": EPS, "delta": DELTA, "variant": variant},
        "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32,
                 "population": {"unit": "users", "exact": n_users, "mechanism": "none", "epsilon": 0.0,
                                "delta": 0.0, "why": "replace-one"}},
        "policy": {"name": "demo", "path": "policies/demo.yaml", "sha256": "01" * 32},
    }


def _result(plan, steps_run, halted_at=None):
    b = bound_run.binding(plan)
    return {**b, "steps_run": steps_run, "steps_attempted": steps_run + (halted_at is not None),
            "mechanism": "uls-filtered", "noise_multiplier": plan["noise_multiplier"], "sampling_rate": 1.0,
            "clip_norm": 1.0, "private_seed_source": "os_entropy",
            "extra": {**b["extra"], "filter": dict(plan["filter"]), "halted_at_step": halted_at}}


def test_filtered_certificate_matches_closed_form_and_meets_target():
    cal = calibrate_filtered(epsilon=EPS, delta=DELTA, steps=T)
    sigma = cal.noise_multiplier
    n = min_users(EPS, DELTA, T)
    plan = _plan(sigma, n)
    cert = verify_certificate(build_certificate(plan, _result(plan, T)).to_dict()).doc
    exact_gauss = _gdp_epsilon(math.sqrt(T) / sigma, DELTA / 2)
    assert cert["accountant"]["epsilon_gaussian"] >= exact_gauss - 1e-9          # never below the truth
    assert cert["accountant"]["epsilon_gaussian"] == pytest.approx(exact_gauss, rel=2e-3)
    assert cert["epsilon"] == pytest.approx(EPS / 2 + cert["accountant"]["epsilon_gaussian"])
    assert cert["epsilon"] <= EPS and cert["delta"] <= DELTA and cert["within_target"]
    assert cert["neighbouring"] == "replace_one_user"
    assert cert["filter"]["sensitivity"] == pytest.approx(60 * 0.5 / cert["filter"]["w_min"])
    assert recompute_epsilon(cert) == pytest.approx(cert["epsilon"])


def test_halted_run_charges_only_the_updates_it_made():
    cal = calibrate_filtered(epsilon=EPS, delta=DELTA, steps=T)
    plan = _plan(cal.noise_multiplier, min_users(EPS, DELTA, T))
    cert = build_certificate(plan, _result(plan, 10, halted_at=10)).doc
    assert cert["filter"]["gaussian_steps"] == 10 and cert["filter"]["halted_at_step"] == 10
    exact = _gdp_epsilon(math.sqrt(10) / cal.noise_multiplier, DELTA / 2)
    assert cert["epsilon"] == pytest.approx(EPS / 2 + exact, rel=2e-3)      # the test's ε/2 is spent regardless


def test_paper_noise_variant_and_too_few_users_are_refused():
    sigma = calibrate_filtered(epsilon=EPS, delta=DELTA, steps=T).noise_multiplier
    n = min_users(EPS, DELTA, T)
    plan = _plan(sigma, n, variant="seed")
    with pytest.raises(VeilError, match="not certifiable"):
        build_certificate(plan, _result(plan, T))
    small = _plan(sigma, n - 1)
    with pytest.raises(VeilError, match="too few"):
        build_certificate(small, _result(small, T))
