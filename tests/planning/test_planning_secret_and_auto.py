"""Secret-protection plans (LP rates + σ meeting every γ) and the `auto` mechanism choice."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from components.accounting.secrets import SecretTarget, report_secrets, secret_rates
from components.planning import make_plan
from components.draws.annex import load_annex
from components.draws.data import train_rows
from components.mechanisms.auto import choose_mechanism, estimate_and_double
from components.policy import load_policy

sys.path.insert(0, str(Path(__file__).parent))
from _planning_fixtures import make_snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secret_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secret")
    text = (ROOT / "policies" / "code-team-secrets.yaml").read_text()
    text = text.replace("steps: 1000", "steps: 60").replace("expected_batch_size: 256", "expected_batch_size: 24")
    pol_path = tmp / "code.yaml"
    pol_path.write_text(text)
    snap = make_snapshot(70, seed=4, secrets_per_record=2)
    pol = load_policy(pol_path)
    d = make_plan(pol, snap, private_dir=tmp, created_at="2026-01-01T00:00:00+00:00").to_dict()
    return pol, snap, d, train_rows(load_annex(tmp, d))


def test_secret_plan_rates_respect_the_lp_and_the_batch(secret_setup):
    pol, snap, d, train = secret_setup
    assert (d["mechanism"], d["privacy_unit"], d["neighbouring"]) == ("secret", "secret", "secret_substitution")
    rates = train["rate"].to_numpy()
    B = d["expected_batch_size"]
    assert np.all((rates > 0) & (rates <= 1)) and rates.sum() == pytest.approx(B, rel=1e-9)
    # back to LP weights: w_i = p_i · Σw / B; every secret's load stays within C·ρ_s
    w = dict(zip(train["record_id"].to_pylist(), rates * d["secret_lp"]["objective"] / B))
    c = pol.spec.secrets.lp.c
    prot = pol.secret_protection()
    load: dict[str, float] = {}
    cls_of = {}
    for r, s, cls in zip(*(snap.secret_spans[k].to_pylist() for k in ("record_id", "secret_id", "secret_class"))):
        load[s] = load.get(s, 0.0) + w.get(r, 0.0)
        cls_of[s] = cls
    assert load and all(v <= c * prot[cls_of[s]].rho * (1 + 1e-9) + 1e-12 for s, v in load.items())


def test_secret_plan_sigma_meets_every_gamma_and_is_minimal(secret_setup):
    pol, snap, d, train = secret_setup
    prot = pol.secret_protection()
    per = secret_rates(train, snap.secret_spans, sampling_rate=0.0)
    targets = [SecretTarget.make(s, r, prot[c].kappa, prot[c].gamma) for s, (c, r) in per.items()]
    reports = report_secrets(targets, d["noise_multiplier"], d["steps"])
    assert all(r.meets_target for r in reports)
    assert not all(r.meets_target for r in report_secrets(targets, 0.97 * d["noise_multiplier"], d["steps"]))


def test_secret_values_never_appear_in_the_public_plan(secret_setup):
    _, snap, d, _ = secret_setup
    text = json.dumps(d)
    ids = set(snap.secret_spans["secret_id"].to_pylist())
    assert ids and not any(s in text for s in ids)


def test_estimate_and_double_follows_the_cheaper_doubling():
    # σ flat in M: doubling M halves noise/signal; f falls only by 1/√2 per doubling of G → grow M only
    assert estimate_and_double(64, 1000, 16, lambda g: g ** -0.5, lambda m: 2.0) == 1
    # σ growing like √M: doubling M gains only 1/√2; f ∝ 1/G gains 1/2 → grow G up to its cap
    assert estimate_and_double(64, 1000, 16, lambda g: 1.0 / g, lambda m: m ** 0.5) == 16
    # population cap: M cannot exceed the users, G takes the rest of the budget
    assert estimate_and_double(64, 4, 64, lambda g: g ** -0.5, lambda m: 2.0) == 16


def test_auto_compares_uls_els_group_and_explains(tmp_path):
    text = (ROOT / "policies" / "email-assistant.yaml").read_text()
    text = (text.replace("steps: 2000", "steps: 40").replace("expected_batch_size: 512", "expected_batch_size: 32")
            .replace("holdout_users: 0.02", "holdout_users: 0.2").replace("max_records_per_user: 16",
                                                                        "max_records_per_user: 2"))
    p = tmp_path / "email.yaml"
    p.write_text(text)
    pol = load_policy(p)
    train = make_snapshot(120, seed=5).records.select(["record_id", "user_id", "text"])
    aligned = choose_mechanism(pol, train, steps=40, expected_batch_size=32, user_grad_ratio=lambda g: 1.0, cache_dir=tmp_path)
    by = {c["mechanism"]: c for c in aligned.candidates}
    assert set(by) == {"uls", "els", "group"}
    assert by["els"]["noise_per_signal"] == pytest.approx(by["els"]["noise_multiplier"] / 32)
    best = min(by.values(), key=lambda c: c["noise_per_signal"])
    assert aligned.mechanism == best["mechanism"] and aligned.reason
    diverse = choose_mechanism(pol, train, steps=40, expected_batch_size=32, user_grad_ratio=lambda g: g ** -0.5, cache_dir=tmp_path)
    by_d = {c["mechanism"]: c for c in diverse.candidates}
    assert by_d["uls"]["noise_per_signal"] <= by["uls"]["noise_per_signal"] + 1e-12
    unknown = choose_mechanism(pol, train, steps=40, expected_batch_size=32, cache_dir=tmp_path)
    u = {c["mechanism"]: c for c in unknown.candidates}["uls"]
    assert u["noise_per_signal_if_diverse"] == pytest.approx(u["noise_per_signal"] / np.sqrt(u["records_per_user"]))
    assert "gradient" in unknown.assumption
