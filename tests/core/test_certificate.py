"""Certificates: ε recomputed from the steps actually run, checked against independent accountants."""
import json
import math

import dp_accounting
import pytest

from components.certificate import attach_audit, build_certificate, recompute_epsilon, verify_certificate
from components.core.errors import VeilError

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

Q, SIGMA, DELTA = 0.08, 1.1, 1e-5


def _plan(steps=120, mechanism="uls", k=None):
    return {
        "schema": "veil.plan/v1", "sha256": "ab" * 32, "mechanism": mechanism, "privacy_unit": "user",
        "target": {"epsilon": 8.0, "delta": DELTA}, "sampling_rate": Q, "noise_multiplier": SIGMA,
        "steps": steps, "expected_batch_size": 16, "clip_norm": 1.0, "records_per_user": k or 4,
        "selection": "random", "data": {"snapshot_commitment": "cd" * 32,
                                        "train_records_commitment": "ef" * 32, "n_train_users": 200,
                                        "n_train_records": 4000},
        "policy": {"name": "demo", "path": "policies/demo.yaml", "sha256": "01" * 32},
    }


def _result(steps_run, **kw):
    return {**bound_run.binding(_plan()), "steps_run": steps_run, "steps_attempted": steps_run, "mechanism": kw.pop("mechanism", "uls"),
            "noise_multiplier": SIGMA, "sampling_rate": Q, "clip_norm": 1.0,
            "private_seed_source": "os_entropy", **kw}


def _reference_pld(steps, discretization=1e-4, pessimistic=True):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=discretization)
    event = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(DELTA)


def _opacus_rdp(steps):
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 256))
    rdp = compute_rdp(q=Q, noise_multiplier=SIGMA, steps=steps, orders=orders)
    return get_privacy_spent(orders=orders, rdp=rdp, delta=DELTA)[0]


def test_epsilon_is_recomputed_for_steps_actually_run():
    full = build_certificate(_plan(), _result(120))
    short = build_certificate(_plan(), _result(60))
    assert short.doc["steps"] == 60 and short.doc["steps_planned"] == 120
    assert short.epsilon < full.epsilon


def test_epsilon_brackets_independent_accountants():
    cert = build_certificate(_plan(), _result(120))
    # never below dp-accounting's own pessimistic PLD at fine discretization…
    assert cert.epsilon >= _reference_pld(120) * (1 - 1e-9)
    # …and no looser than the RDP bound computed by another library (Opacus).
    assert cert.epsilon <= _opacus_rdp(120)
    assert cert.epsilon <= _reference_pld(120) * 1.01


def test_crashed_steps_count():
    cert = build_certificate(_plan(), _result(50, steps_attempted=53))
    assert cert.doc["steps"] == 53


def test_certificate_fields_and_hash():
    cert = build_certificate(_plan(), _result(120)).to_dict()
    for field in ("privacy_unit", "neighbouring", "epsilon", "delta", "accountant", "dp_event", "noise_multiplier",
                  "sampling_rate", "steps", "clip_norm", "contribution_bound", "dataset", "policy",
                  "code_version", "created_at", "sha256"):
        assert field in cert
    assert cert["privacy_unit"] == "user" and cert["neighbouring"] == "add_remove_user"
    from importlib.metadata import version

    assert version("dp-accounting") in cert["accountant"]["library_version"]
    assert cert["dataset"]["snapshot_commitment"] == "cd" * 32 and cert["policy"]["sha256"] == "01" * 32
    verify_certificate(cert)
    tampered = dict(cert, epsilon=cert["epsilon"] / 2)
    with pytest.raises(VeilError, match="sha256 mismatch"):
        verify_certificate(tampered)
    with pytest.raises(VeilError, match="registered"):
        verify_certificate(cert, expected_sha256="0" * 64)
    # the certificate states the recomputed ε rounded up to 6 significant digits (core.canonical)
    raw = recompute_epsilon(cert)
    assert raw <= cert["epsilon"] <= raw * (1 + 1e-5)


def test_refuses_a_run_that_used_other_numbers_than_the_plan():
    with pytest.raises(VeilError, match="noise_multiplier"):
        build_certificate(_plan(), dict(_result(120), noise_multiplier=SIGMA / 2))
    with pytest.raises(VeilError, match="no secret targets"):
        build_certificate(_plan(mechanism="secret"), _result(120, mechanism="secret"))


def test_reproducible_seed_is_flagged():
    cert = build_certificate(_plan(), _result(10, private_seed_source="spec"))
    assert any("seed" in c for c in cert.doc["caveats"])


def test_els_uses_the_mixture_bound_with_k():
    els = build_certificate(_plan(mechanism="els", k=4, steps=40), _result(40, mechanism="els"))
    uls = build_certificate(_plan(mechanism="uls", steps=40), _result(40))
    assert els.doc["accountant"]["mechanism"] == "els" and els.epsilon > uls.epsilon


def test_audit_section_is_aggregates_only_and_rehashes():
    cert = build_certificate(_plan(), _result(20)).to_dict()
    audited = attach_audit(cert, {"auroc": 0.51, "auroc_ceiling": 0.9, "passed": True}).to_dict()
    assert audited["supersedes"] == cert["sha256"] and audited["sha256"] != cert["sha256"]
    verify_certificate(audited)
    with pytest.raises(VeilError, match="aggregates"):
        attach_audit(cert, {"auroc": 0.5, "scores": [0.1, 0.2]})


def _independent_gamma(rate, sigma, steps, kappa, sensitivity=2.0):
    """KL of (1-p)N(0,σ²)+pN(Δ,σ²) vs N(0,σ²), both directions by quadrature, × T; then invert
    d_KL(γ‖κ) = ρ with a root finder — none of Veil's accounting code involved."""
    from scipy import integrate, optimize, stats

    p_dens = lambda x: (1 - rate) * stats.norm.pdf(x, 0, sigma) + rate * stats.norm.pdf(x, sensitivity, sigma)
    q_dens = lambda x: stats.norm.pdf(x, 0, sigma)
    kl_pq = integrate.quad(lambda x: p_dens(x) * math.log(p_dens(x) / q_dens(x)), -40, 40, limit=400)[0]
    kl_qp = integrate.quad(lambda x: q_dens(x) * math.log(q_dens(x) / p_dens(x)), -40, 40, limit=400)[0]
    rho = steps * max(kl_pq, kl_qp)
    dkl = lambda g: g * math.log(g / kappa) + (1 - g) * math.log((1 - g) / (1 - kappa)) - rho
    return optimize.brentq(dkl, kappa, 1 - 1e-15)


def test_secret_certificate_matches_an_independent_posterior_bound():
    from components.accounting.secrets import SecretTarget

    plan = dict(_plan(mechanism="secret", steps=50), sampling_rate=0.02, noise_multiplier=3.0, records_per_user=None,
                target={"epsilon": None, "delta": None, "secrets": {"credential": {"kappa": 1e-3, "gamma": 0.05}}})
    res = dict(_result(50, mechanism="secret"), sampling_rate=0.02, noise_multiplier=3.0, records_per_user=None)
    targets = [SecretTarget.make("credential:AKIA1", [0.02], 1e-3, 0.05),
               SecretTarget.make("credential:AKIA2", [0.04], 1e-3, 0.05)]
    cert = build_certificate(plan, res, secret_targets=targets).to_dict()
    assert cert["privacy_unit"] == "secret" and cert["epsilon"] is None
    cls = cert["secrets"]["credential"]
    assert cls["n_secrets"] == 2
    # the worst secret is the one sampled at 0.04; ids (which hold the values) never appear
    expected = _independent_gamma(0.04, 3.0, 50, 1e-3)
    # rounded up to 6 significant digits (core.canonical): never below, at most one unit of the last digit above
    assert expected * (1 - 1e-6) <= cls["max_gamma"] <= expected * (1 + 2e-5)
    assert "AKIA" not in json.dumps(cert)
    assert cert["within_target"] == (cls["max_gamma"] <= 0.05)
    verify_certificate(cert)
    with pytest.raises(VeilError, match="posterior"):
        recompute_epsilon(cert)


def test_verifier_accepts_rounding_up_and_refuses_any_understatement():
    """The certificate's ε is the recomputed one rounded UP (components.core.canonical). The verifier
    tolerates that rounding in the pessimistic direction only: a stated ε 1e-7 below the recomputed one
    (inside the old symmetric tolerance of 0.25 %) is an understatement and refused."""
    from components.certificate.verify import recheck_guarantee

    cert = build_certificate(_plan(), _result(120)).to_dict()
    raw = recompute_epsilon(cert)
    assert recheck_guarantee(cert)[0] == cert["epsilon"] >= raw
    assert recheck_guarantee(dict(cert, epsilon=raw * (1 + 5e-6)))[0] == raw * (1 + 5e-6)
    with pytest.raises(VeilError, match="below what its parameters .* an understatement"):
        recheck_guarantee(dict(cert, epsilon=raw * (1 - 1e-7)))
    with pytest.raises(VeilError):
        recheck_guarantee(dict(cert, epsilon=raw * 1.01))
