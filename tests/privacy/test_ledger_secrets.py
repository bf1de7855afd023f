"""Per-secret charges in the ledger (issue 13 item 3): KL per secret composed across releases.

Checked against computations made here: the per-step mixture KL by scipy quadrature, Lemma 3.2's
posterior bound by root-finding on d_KL(γ‖κ), and the certificate's own per-class KL. A secret whose
lifetime KL would pass its class' budget is dropped from the release (docs/privacy/ledger.md), the
ledger DB never holds a secret's value, and two processes racing for one secret's last budget cannot
both be charged.
"""
from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from components.accounting.secrets import SecretTarget, secret_kl
from components.core.errors import VeilError
from components.ledger import Ledger, reserve_release, secret_costs
from components.ledger.report import ledger_report

SIGMA, T = 2.0, 40
RATES = (0.05, 0.08)
KAPPA, GAMMA = 0.01, 0.4
VALUE = "AKIAZZSECRETVALUE42"
SECRET = f"credential:{VALUE}"
OTHER = "credential:ghp_OTHERTOKEN777"
PERSON = "dana.secretholder@corp.example"


def _plan(sha="ab"):
    return {"mechanism": "secret", "privacy_unit": "secret", "sampling_rate": 0.05, "noise_multiplier": SIGMA,
            "steps": T, "sha256": sha * 32,
            "target": {"epsilon": None, "delta": None, "secrets": {"credential": {"kappa": KAPPA, "gamma": GAMMA}}}}


def _targets(secret=SECRET, rates=RATES, kappa=KAPPA, gamma=GAMMA):
    return [SecretTarget.make(secret, rates, kappa, gamma)]


def _persons():
    return {PERSON: list(RATES), "erin@corp.example": [0.05]}


# --- independent references -------------------------------------------------------------------------

def _mixture_kl_quad(rates, sigma, delta=2.0) -> float:
    """max-direction KL of N(0,σ²) vs Σ_j Pr[K=j] N(jΔ,σ²), K ~ Poisson-binomial(rates), by scipy.quad."""
    pmf = np.array([1.0])
    for p in rates:
        pmf = np.convolve(pmf, [1 - p, p])
    mu = np.arange(len(pmf)) * delta

    from scipy.special import logsumexp

    def loss(x):  # log dQ/dP(x), written out directly
        return float(logsumexp(np.log(pmf) + (mu * x - mu ** 2 / 2) / sigma ** 2))

    def p_(x):
        return stats.norm.pdf(x, 0, sigma)

    kw = dict(limit=400, epsabs=1e-13, epsrel=1e-10)
    lo, hi = -14 * sigma, 14 * sigma + mu[-1]
    qp = integrate.quad(lambda x: p_(x) * math.exp(loss(x)) * loss(x), lo, hi, **kw)[0]
    pq = integrate.quad(lambda x: -p_(x) * loss(x), lo, hi, **kw)[0]
    return max(qp, pq)


def _gamma_lemma32(kl: float, kappa: float) -> float:
    """Largest γ ∈ [κ, 1] with γ log(γ/κ) + (1−γ) log((1−γ)/(1−κ)) ≤ kl (brentq)."""
    d = lambda g: g * math.log(g / kappa) + (1 - g) * math.log((1 - g) / (1 - kappa)) - kl  # noqa: E731
    if kl >= -math.log(kappa):
        return 1.0
    return optimize.brentq(d, kappa, 1 - 1e-15, xtol=1e-15, rtol=1e-14)


def _budget(kappa=KAPPA, gamma=GAMMA) -> float:
    return gamma * math.log(gamma / kappa) + (1 - gamma) * math.log((1 - gamma) / (1 - kappa))


@pytest.fixture
def settings(tmp_path):
    from components.core.settings import load_settings

    return load_settings(tmp_path / "home").ensure()


# --- tests ----------------------------------------------------------------------------------------------

def test_secret_kl_adds_across_releases_and_matches_independent_computation(settings):
    one = secret_kl(RATES, SIGMA, T).kl
    assert one == pytest.approx(T * _mixture_kl_quad(RATES, SIGMA), rel=1e-6)   # the accountant itself
    assert 2 * one <= _budget() < 3 * one, "test setup: two releases fit the class budget, three do not"
    led = Ledger.open(settings)
    try:
        r1 = reserve_release(settings, _plan(), _persons(), ledger=led, secrets=_targets())
        r2 = reserve_release(settings, _plan("cd"), _persons(), ledger=led, secrets=_targets())
        assert r1.secrets_charged == r2.secrets_charged == (SECRET,) and not r1.secrets_dropped + r2.secrets_dropped
        life = led.secret_spend([SECRET])[SECRET]
        assert life == pytest.approx(2 * one, rel=1e-12)
        rows = led.secret_rows()
        assert len(rows) == 1 and rows[0]["releases_charged"] == 2 and rows[0]["secret_class"] == "credential"
        assert rows[0]["lifetime_gamma"] == pytest.approx(_gamma_lemma32(2 * one, KAPPA), rel=1e-9)
        s = led.summary()["secrets"]["credential"]
        assert s["secrets_charged"] == 1 and s["secrets_dropped"] == 0
        assert s["max_lifetime_kl"] == pytest.approx(2 * one, rel=1e-12)
        assert s["max_lifetime_gamma"] == pytest.approx(_gamma_lemma32(2 * one, KAPPA), rel=1e-9)
        assert s["max_lifetime_gamma"] <= GAMMA and s["kl_budget"] == pytest.approx(_budget(), rel=1e-12)
        # no person side: a secret release makes no person-level claim (issue 22, case 3)
        assert np.all(led.spend([PERSON])[PERSON] == 0)
    finally:
        led.dispose()


def test_ledger_charge_equals_the_certificates_per_secret_kl(settings):
    from components.certificate import build_certificate

    spec = importlib.util.spec_from_file_location("bound_run", Path(__file__).resolve().parents[1] / "bound_run.py")
    bound_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bound_run)

    plan = {**_plan(), "schema": "veil.plan/v1", "expected_batch_size": 8, "clip_norm": 1.0,
            "records_per_user": None, "selection": "all", "secret_lp": {"untagged_records": "keep"},
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32},
            "policy": {"name": "code", "sha256": "01" * 32}}
    res = {**bound_run.binding(plan), "steps_run": T, "steps_attempted": T, "mechanism": "secret",
           "noise_multiplier": SIGMA, "sampling_rate": 0.05, "clip_norm": 1.0, "private_seed_source": "os_entropy"}
    cert = build_certificate(plan, res, secret_targets=_targets(), untagged_rate=None).to_dict()
    led = Ledger.open(settings)
    try:
        reserve_release(settings, plan, _persons(), ledger=led, secrets=_targets())
        # the ledger charges the accountant's KL; the certificate publishes it (and γ) rounded up to 6
        # significant digits (components.core.canonical): never below, at most a digit above
        kl = led.secret_spend([SECRET])[SECRET]
        assert kl <= cert["secrets"]["credential"]["max_kl"] <= kl * (1 + 1e-5)
        got = led.summary()["secrets"]["credential"]["max_lifetime_gamma"]
        assert got <= cert["secrets"]["credential"]["max_gamma"] <= got * (1 + 3e-5)
    finally:
        led.dispose()


def test_secret_over_its_class_target_is_dropped_and_others_go_on(settings):
    one = secret_kl(RATES, SIGMA, T).kl
    led = Ledger.open(settings)
    try:
        for sha in ("a1", "a2"):
            reserve_release(settings, _plan(sha), _persons(), ledger=led, secrets=_targets())
        before = led.secret_spend([SECRET])[SECRET]
        # third release: SECRET would pass its budget; OTHER (same class, fresh) is charged in the same release
        r3 = reserve_release(settings, _plan("a3"), _persons(), ledger=led,
                             secrets=_targets() + _targets(OTHER))
        assert r3.secrets_dropped == (SECRET,) and r3.secrets_charged == (OTHER,)
        assert led.secret_spend([SECRET])[SECRET] == before           # a dropped secret is not charged
        assert led.secret_spend([OTHER])[OTHER] == pytest.approx(one, rel=1e-12)
        assert not r3.admitted and not r3.retired   # the release goes on; no person is charged or retired
        ev = led.events(r3.release_id)[0]
        assert ev["status"] == "reserved" and ev["secrets_dropped"] == 1 and ev["secrets_charged"] == 1
        s = led.summary()["secrets"]["credential"]
        assert s["secrets_dropped"] == 1 and s["secrets_charged"] == 2
        assert s["max_lifetime_gamma"] <= GAMMA                       # nobody passes the class target
        # a smaller release that still fits the remaining budget is charged again
        small = secret_costs(_plan(), _targets(rates=(1e-4,)))[0].kl
        assert before + small <= _budget()
        r4 = reserve_release(settings, _plan("a4"), _persons(), ledger=led, secrets=_targets(rates=(1e-4,)))
        assert r4.secrets_charged == (SECRET,)
        # a class' (κ, γ) cannot move once charged: a looser γ would reopen exhausted secrets
        with pytest.raises(VeilError, match="cannot change"):
            reserve_release(settings, _plan("a5"), _persons(), ledger=led, secrets=_targets(gamma=0.6))
        with pytest.raises(VeilError, match="cannot change"):
            reserve_release(settings, _plan("a6"), _persons(), ledger=led, secrets=_targets(kappa=0.02))
    finally:
        led.dispose()


def test_dropped_secret_records_leave_the_training_rows():
    """stages.reserve keeps record ids (not secret ids) and training_records leaves those rows out."""
    import pyarrow as pa

    from components.draws import data as D

    rows = pa.table({"record_id": ["r1", "r2", "r3", "r2"], "user_id": ["u1", "u1", "u2", "u1"],
                     "rate": [0.1, 0.1, 0.1, 0.1]}).replace_schema_metadata({b"veil.sha256": b"x" * 64})
    texts = pa.table({"record_id": ["r1", "r2", "r3"], "text": ["a", f"key {VALUE}", "c"]})
    orig = (D.train_rows, D.plan_texts)
    D.train_rows, D.plan_texts = (lambda annex: rows), (lambda annex, recs: texts)
    try:
        kept = D.training_records({"data": {"snapshot_id": "s"}}, {}, None, drop_records=["r2"])
        full = D.training_records({"data": {"snapshot_id": "s"}}, {}, None)
    finally:
        D.train_rows, D.plan_texts = orig
    assert full.num_rows == 4 and kept.num_rows == 2
    assert not any(VALUE in t for t in kept.column("text").to_pylist())


def test_ledger_database_holds_no_secret_value_or_person_id(settings):
    led = Ledger.open(settings)
    try:
        for sha in ("b1", "b2", "b3"):
            reserve_release(settings, _plan(sha), _persons(), ledger=led, secrets=_targets() + _targets(OTHER))
        assert led.secret_rows()
    finally:
        led.dispose()
    doc = ledger_report(settings, estimate=False)
    db = Path(settings.private_dir) / "ledger.db"
    blobs = b"".join(p.read_bytes() for p in db.parent.glob("ledger.db*"))   # the DB, its WAL and shm
    for needle in (VALUE, "ghp_OTHERTOKEN777", PERSON, "OTHERTOKEN", "AKIAZZ"):
        for enc in (needle.encode(), needle.encode("utf-16-le"), needle.lower().encode()):
            assert enc not in blobs, needle
    printed = json.dumps(doc)
    assert VALUE not in printed and "OTHERTOKEN" not in printed and PERSON not in printed
    assert set(doc["secrets"]) == {"credential"}
    private = Path(doc["private_secret_rows"]).read_text()
    assert VALUE not in private and "OTHERTOKEN" not in private and len(private.splitlines()) == 3
    assert oct(os.stat(doc["private_secret_rows"]).st_mode & 0o777) == "0o600"


def _racer(url: str, key: bytes, start, out) -> None:
    led = Ledger(url, key)
    plan = _plan()
    from components.ledger.release import release_costs, secret_costs as sc

    costs, sec = release_costs(plan, _persons(), led.orders), sc(plan, _targets())
    start.wait()
    r = led.reserve(kind="secret", mechanism="secret", plan_sha256=None, params={}, costs=costs, budget=None,
                    secrets=sec)
    led.dispose()
    out.put(len(r.secrets_charged))


def test_two_processes_cannot_both_spend_a_secrets_last_budget_sqlite(tmp_path):
    _race(f"sqlite:///{tmp_path / 'ledger.db'}")


@pytest.mark.timeout(300)
def test_two_processes_cannot_both_spend_a_secrets_last_budget_postgresql():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _ledger_pg import postgres_server

    with postgres_server() as url:
        _race(url)


def _race(url: str) -> None:
    key = os.urandom(32)
    led = Ledger(url, key)
    plan = _plan()
    from components.ledger.release import release_costs

    big = secret_kl(RATES, SIGMA, T).kl
    led.reserve(kind="secret", mechanism="secret", plan_sha256=None, params={},   # one release's KL spent
                costs=release_costs(plan, _persons(), led.orders), budget=None, secrets=secret_costs(plan, _targets()))
    spent = led.secret_spend([SECRET])[SECRET]
    led.dispose()
    assert spent + big <= _budget() < spent + 2 * big, "test setup: room for exactly one more release"
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(url, key, start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(out.get(timeout=5) for _ in procs) == [0, 1]
    led = Ledger(url, key)
    try:
        life = led.secret_spend([SECRET])[SECRET]
        assert life == pytest.approx(spent + big, rel=1e-12) and life <= _budget()
    finally:
        led.dispose()


def test_charging_the_planned_rows_bounds_a_release_with_fewer_records():
    """The charge uses the plan's rows before retirements and drops: it must not be below the KL of any
    subset of the secret's records or of lower rates (the assumption docs/privacy/ledger.md states)."""
    full = (0.02, 0.05, 0.05, 0.1)
    k_full = secret_kl(full, SIGMA, T).kl
    for sub in [(0.02,), (0.05, 0.1), (0.02, 0.05, 0.05), (0.01, 0.05, 0.05, 0.1), (0.02, 0.05, 0.04, 0.1)]:
        assert secret_kl(sub, SIGMA, T).kl <= k_full
