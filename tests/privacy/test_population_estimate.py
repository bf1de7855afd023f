"""N is private: the plan uses and publishes only N̂ = N + Laplace(Δ/ε_N), and the certificate pays for it.

Checked against independent computations: ε = ε_N + ε_DP-SGD with ε_DP-SGD from dp_accounting's own
PLD accountant (not Veil's wrapper); the keyed noise is Laplace(Δ/ε_N) (Kolmogorov–Smirnov against
scipy); re-planning the same inputs draws the same N̂ (nothing new released); the sensitivity per
mechanism is the largest change one unit makes to the count, measured on neighbours.
"""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pyarrow.compute as pc
import pytest
from scipy import stats

from components.certificate import build_certificate, recompute_epsilon
from components.planning import make_plan
from components.draws.annex import load_annex
from components.draws.annex import laplace_noise
from components.policy import load_policy

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"


def _policy(tmp_path, mechanism="uls", unit="user", steps=30):
    text = (ROOT / "policies" / "demo.yaml").read_text()
    text = re.sub(r"    steps: \d+", f"    steps: {steps}", text)
    text = text.replace("privacy_unit: user", f"privacy_unit: {unit}").replace("mechanism: uls", f"mechanism: {mechanism}")
    text = text.replace("expected_batch_size: 24", "expected_batch_size: 12")
    p = tmp_path / f"{mechanism}.yaml"
    p.write_text(text)
    return load_policy(p)


def _reference_pld_epsilon(q, sigma, steps, delta):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return acc.get_epsilon(delta)


@pytest.fixture(scope="module")
def snap():
    return make_snapshot(90, seed=3)


def test_certificate_epsilon_is_population_plus_dp_sgd(tmp_path, snap):
    pol = _policy(tmp_path)
    plan = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    pop = plan["data"]["population"]
    eps_n = pop["epsilon"]
    assert eps_n == pytest.approx(0.02 * pol.spec.target.epsilon) and pop["mechanism"] == "laplace"
    for steps_run in (0, 17, plan["steps"]):
        cert = build_certificate(plan, {**bound_run.binding(plan), "steps_run": steps_run, "steps_attempted": steps_run, "mechanism": "uls",
                                        "noise_multiplier": plan["noise_multiplier"],
                                        "sampling_rate": plan["sampling_rate"], "clip_norm": plan["clip_norm"],
                                        "private_seed_source": "os_entropy"}).to_dict()
        ref_sgd = 0.0 if steps_run == 0 else _reference_pld_epsilon(plan["sampling_rate"], plan["noise_multiplier"],
                                                                    steps_run, cert["delta"])
        # Veil's accountant is pessimistic: at least the reference, within discretization
        assert cert["epsilon"] >= eps_n + ref_sgd - 1e-9
        assert cert["epsilon"] == pytest.approx(eps_n + ref_sgd, rel=0.02, abs=1e-9)
        assert cert["epsilon_parts"]["population_estimate"] == eps_n
        assert cert["epsilon"] == pytest.approx(cert["epsilon_parts"]["population_estimate"]
                                                + cert["epsilon_parts"]["dp_sgd"])
        raw = recompute_epsilon(cert)     # the certificate's is rounded up (core.canonical)
        assert raw <= cert["epsilon"] <= raw * (1 + 1e-5)
        assert cert["dataset"]["population"]["estimate"] == pop["estimate"]
        assert "n_train_users" not in cert["dataset"] and "n_train_records" not in cert["dataset"]
        assert any("population" in c and "Laplace" in c for c in cert["caveats"])
    assert cert["within_target"] and cert["epsilon"] <= pol.spec.target.epsilon + 1e-9


def test_same_inputs_same_estimate_and_the_noise_is_laplace(tmp_path, snap):
    pol = _policy(tmp_path)
    a = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    b = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    assert a["data"]["population"]["estimate"] == b["data"]["population"]["estimate"]   # no fresh draw to average
    annex = load_annex(tmp_path, a)
    assert a["data"]["population"]["estimate"] == annex["population"]["exact"] + annex["population"]["noise"]
    # the keyed draws are Laplace(scale): KS test against scipy over many inputs
    key = b"\x11" * 32
    draws = np.array([laplace_noise(key, 6.25, "population", i) for i in range(4000)])
    assert stats.kstest(draws, stats.laplace(scale=6.25).cdf).pvalue > 1e-3
    # and a different key (another Veil home) gives other draws: the key, not the inputs, hides N
    assert laplace_noise(b"\x12" * 32, 6.25, "population", 0) != draws[0]


@pytest.mark.parametrize("mechanism,unit", [("uls", "user"), ("els", "user"), ("group", "user"), ("record", "record")])
def test_sensitivity_bounds_one_units_effect_on_the_count(tmp_path, snap, mechanism, unit):
    """Δ in the plan ≥ the largest change one unit makes to the exact N (measured on neighbours)."""
    pol = _policy(tmp_path, mechanism, unit, steps=5)
    (tmp_path / "keys").mkdir(mode=0o700)                  # a fixed key: the same draws on every run
    (tmp_path / "keys" / "plan.key").write_bytes(b"\x05" * 32)
    base = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    n0 = load_annex(tmp_path, base)["population"]["exact"]
    delta = base["data"]["population"]["sensitivity"]
    recs = snap.records
    worst = 0
    for i in range(0, 60, 6):
        if unit == "user":
            drop = pc.not_equal(recs["user_id"], recs["user_id"][i])
        else:
            drop = pc.not_equal(recs["record_id"], recs["record_id"][i])
        nb = type(snap)(snap.snapshot_id + f"-{i}", snap.sha256[:-4] + f"{i:04d}", recs.filter(drop), snap.secret_spans)
        d = make_plan(pol, nb, private_dir=tmp_path, created_at=WHEN).to_dict()
        worst = max(worst, abs(load_annex(tmp_path, d)["population"]["exact"] - n0))
    assert 0 < worst <= delta
    assert delta == {"uls": 1, "record": 1}.get(mechanism, pol.spec.contribution.max_records_per_user)
    assert base["data"]["population"]["scale"] == pytest.approx(delta / base["data"]["population"]["epsilon"])
    assert math.isfinite(base["data"]["population"]["estimate"])


def test_lifetime_spend_includes_the_population_estimate(tmp_path, snap):
    """The per-person ledger charges each release's ε_N (pure DP → (α, min(ε_N, αε_N²/2))-RDP) on top of
    the DP-SGD curve; checked against dp-accounting's RDP accountant for the DP-SGD part."""
    import dp_accounting
    import numpy as np

    from components.ledger.release import release_costs
    from components.renyi.rdp import ORDERS

    pol = _policy(tmp_path)
    plan = make_plan(pol, snap, private_dir=tmp_path, created_at=WHEN).to_dict()
    eps_n = plan["data"]["population"]["epsilon"]
    costs = release_costs(plan, {"u1": 3, "u2": 1}, ORDERS)
    acc = dp_accounting.rdp.RdpAccountant(list(ORDERS))
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        plan["sampling_rate"], dp_accounting.GaussianDpEvent(plan["noise_multiplier"])), int(plan["steps"]))
    sgd = np.asarray(acc._rdp)
    a = np.asarray(ORDERS, dtype=float)
    want = sgd + np.minimum(eps_n, a * eps_n ** 2 / 2)
    for c in costs.values():   # user level: one person moves N by one, whatever their row count
        assert np.allclose(c.rdp, want, rtol=1e-9, atol=1e-12)
    fin = np.isfinite(sgd)
    assert fin.any() and np.all(np.asarray(costs["u1"].rdp)[fin] > sgd[fin])   # ε_N is charged, not dropped
