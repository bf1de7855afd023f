"""An audit too small to decide says INCONCLUSIVE (never PASSED); the interval decides, at every m.

Issue 11 item 6: on a 44-author repository the audit ran on 8 people in and 3 out — AUROC 0.635 with a
95 % interval of [0.33, 0.90], 0.887 at m = 1 against a ceiling of 0.761 — and printed PASSED.
"""
import math

import numpy as np
import pytest

import _audit_stub as stub
from components.audit.run import run_audit
from components.audit.ceiling import auroc_ceiling

CEILING_0761_EPS = math.log(1 / (1 - 0.761) - 1)   # ε whose (ε, 1e-5) AUROC ceiling is 0.761


def test_the_reported_small_audit_is_inconclusive_at_every_m():
    from components.audit.verdict import auroc_verdict

    assert auroc_ceiling(CEILING_0761_EPS, 1e-5) == pytest.approx(0.761, abs=1e-4)
    curves = [{"m": 1, "auroc": 0.887, "users_in": 8, "users_out": 3},
              {"m": 4, "auroc": 0.635, "users_in": 8, "users_out": 3}]
    d = auroc_verdict(curves, threshold=0.65, ceiling=0.761)
    assert d["verdict"] == "inconclusive" and not d["above_ceiling"]
    assert [c["verdict"] for c in d["curves"]] == ["inconclusive", "inconclusive"]
    lo, hi = d["curves"][1]["interval"]
    assert lo < 0.4 and hi > 0.85                       # about the [0.33, 0.90] the report quoted
    assert d["people_needed"]["in"] > 100 and d["people_needed"]["out"] > 30


def test_one_m_above_the_ceiling_fails_even_when_the_full_statistic_passes():
    from components.audit.verdict import auroc_verdict

    curves = [{"m": 1, "auroc": 0.9, "users_in": 400, "users_out": 400},
              {"m": 16, "auroc": 0.55, "users_in": 400, "users_out": 400}]
    d = auroc_verdict(curves, threshold=0.65, ceiling=0.761)
    assert [c["verdict"] for c in d["curves"]] == ["failed", "passed"]
    assert d["verdict"] == "failed" and d["above_ceiling"] and d["curves"][0]["above_ceiling"]


def test_small_audit_through_run_audit_is_inconclusive_not_passed(monkeypatch, settings):
    stub.install(monkeypatch)
    samples = stub.samples(8, 3, m=4, shift=0.3, seed=11)
    res = run_audit(stub.loaded(CEILING_0761_EPS), stub.EMPTY_RECORDS, settings=settings, samples=samples,
                    reference=stub.REFERENCE, bootstrap=50, plot=False)
    s = res.summary()
    assert s["verdict"] == "inconclusive" and s["passed"] is False and not res.passed
    assert s["user_inference"]["verdict"] == "inconclusive" and not s["above_ceiling"]
    assert [r["m"] for r in s["user_inference"]["by_m"]] == [1, 2, 4]
    assert all(r["verdict"] == "inconclusive" for r in s["user_inference"]["by_m"])
    need = s["user_inference"]["people_needed"]
    assert isinstance(need, dict) and need["in"] > 8 and need["out"] > 3
    assert any("INCONCLUSIVE" in r and "needs" in r for r in s["reasons"])


def test_big_clean_audit_passes(monkeypatch, settings):
    stub.install(monkeypatch)
    res = run_audit(stub.loaded(2.0), stub.EMPTY_RECORDS, settings=settings, reference=stub.REFERENCE,
                    samples=stub.samples(600, 600, m=2, shift=0.0, seed=1), bootstrap=20, plot=False)
    s = res.summary()
    assert s["verdict"] == "passed" and res.passed and s["user_inference"]["people_needed"] is None
    assert all(r["verdict"] == "passed" for r in s["user_inference"]["by_m"])
    assert s["auroc_grid"] == 0.05 and s["auroc"] in ([0.45, 0.5], [0.5, 0.55])


def test_interval_above_the_ceiling_fails_loudly(monkeypatch, settings):
    stub.install(monkeypatch)
    res = run_audit(stub.loaded(0.5), stub.EMPTY_RECORDS, settings=settings, reference=stub.REFERENCE,
                    samples=stub.samples(200, 200, m=2, shift=1.5, seed=2), bootstrap=20, plot=False)
    s = res.summary()
    assert s["verdict"] == "failed" and s["above_ceiling"] and not res.passed
    assert any("THE CERTIFICATE OR THE CODE IS WRONG" in r for r in s["reasons"])


def test_interval_covers_the_truth_on_tiny_audits():
    """The score interval's coverage, by simulation (binormal scores, true AUROC known in closed form)."""
    from scipy.stats import norm

    from components.audit.metrics import auroc_from_groups
    from components.audit.verdict import auroc_interval, z_value

    rng = np.random.default_rng(0)
    z = z_value(0.95)
    for n_in, n_out, a in [(8, 3, 0.75), (8, 3, 0.5), (30, 10, 0.9), (5, 5, 0.95)]:
        d = math.sqrt(2) * norm.ppf(a)
        hits = sum(lo <= a <= hi for lo, hi in (
            auroc_interval(auroc_from_groups(rng.normal(d, 1, n_in), rng.normal(0, 1, n_out)), n_in, n_out, z)
            for _ in range(600)))
        assert hits / 600 >= 0.93, (n_in, n_out, a, hits / 600)


def test_exposure_gate_decides_per_class():
    from components.audit.verdict import exposure_verdict

    one = {"secret_ref": "a", "secret_class": "phone", "rank": 1, "n_candidates": 100}
    # one secret ranked first of 100 by itself: an exact test at 1/101 < 2.5 %: memorised
    assert exposure_verdict([one], limit=6.0)["verdict"] == "failed"
    # 60 candidates cannot show 6 bits at all (log2 61 < 6): ask for more
    d = exposure_verdict([{**one, "n_candidates": 60, "rank": 30}], limit=6.0)
    assert d["verdict"] == "inconclusive" and d["candidates_needed"] == 500
    # one unremarkable secret cannot show that a class is clean: ask for more secrets
    d = exposure_verdict([{**one, "rank": 60}], limit=6.0)
    assert d["verdict"] == "inconclusive" and d["secrets_needed"] >= 20 and d["candidates_needed"] is None
    # with a reference, the calibrated rank decides, not the model's own rank
    assert exposure_verdict([{**one, "reference_rank": 1, "calibrated_rank": 60}], limit=6.0)["secrets"][0][
        "exposure"] < 1