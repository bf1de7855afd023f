"""The ledger as an attacker and an operator would poke at it: append-only, private, fixed budget/key."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from components.core.errors import VeilError
from components.core.settings import load_settings
from components.ledger import Ledger, reserve_release

PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.5, "steps": 30,
        "sha256": "a" * 64, "lifetime_budget": {"epsilon": 4.0, "delta": 1e-5}}
CLI = "import sys; from flows.cli import main; sys.argv[0] = 'veil'; main()"
NAMES = ["alice@example.com", "bob@example.com", "carol@example.com"]


@pytest.fixture
def settings(tmp_path):
    return load_settings(tmp_path / "home").ensure()


def test_charges_survive_every_status_and_never_decrease(settings):
    led = Ledger.open(settings)
    r1 = reserve_release(settings, PLAN, {n: 2 for n in NAMES}, ledger=led)
    after_one = led.spend(NAMES)
    for status in ("crashed", "refused", "deleted", "audit_failed"):
        led.record(r1.release_id, status, reason="test")
        assert all(np.array_equal(led.spend(NAMES)[n], after_one[n]) for n in NAMES)
    assert led.status(r1.release_id) == "audit_failed"
    assert [e["status"] for e in led.events(r1.release_id)] == ["reserved", "crashed", "refused", "deleted",
                                                              "audit_failed"]
    r2 = reserve_release(settings, {**PLAN, "sha256": "b" * 64}, {n: 2 for n in NAMES}, ledger=led)   # another plan
    assert all(np.all(led.spend(NAMES)[n] >= after_one[n]) for n in NAMES) and r2.release_id > r1.release_id
    with pytest.raises(VeilError, match="status"):
        led.record(r1.release_id, "unreserved")
    src = open(__import__("components.ledger.store", fromlist=["x"]).__file__).read()
    # the history is append-only: the only updates are the running spend (an upsert), the seq row and
    # the one-time migration's schema stamp (issue 27); nothing is ever deleted
    import re
    assert ".delete(" not in src.lower() and "DELETE FROM" not in src.upper()
    assert sorted(set(re.findall(r"(\w+)\.update\(", src))) == ["meta", "state"]
    assert src.count("meta.update(") == 1 and "meta.update().where(meta.c.key == \"schema\")" in src
    assert src.upper().count("DO UPDATE") == 1 and "SPEND_UPSERT = (\"ON CONFLICT (person_key, mechanism) DO UPDATE" in src


def test_ledger_is_private_and_pseudonymous(settings):
    reserve_release(settings, PLAN, {n: 1 for n in NAMES}, ledger=None)
    db, key = settings.private_dir / "ledger.db", settings.private_dir / "ledger.key"
    for p in (db, key):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    raw = b"".join(p.read_bytes() for p in settings.private_dir.glob("ledger.db*"))
    for n in NAMES:
        assert n.encode() not in raw and n.split("@")[0].encode() not in raw
    led = Ledger.open(settings)
    # same person however their id is spelt; another key gives other pseudonyms
    assert led.person_key(" Alice@Example.COM") == led.person_key("alice@example.com")
    with pytest.raises(VeilError, match="one person under the identity rule") as e:
        reserve_release(settings, PLAN, {"alice@example.com": 1, "ALICE@example.com": 1}, ledger=led)
    # the refusal names the ids and the policy fix for the operator's terminal only, never in its message
    # (what Prefect logs): issue 26
    assert "'alice@example.com' and 'ALICE@example.com'" in e.value.operator_detail
    assert "spec.people.aliases" in e.value.operator_detail
    assert "alice" not in str(e.value).lower() and "veil plan" in str(e.value)


def test_budget_is_fixed_and_a_foreign_key_is_refused(settings, tmp_path):
    led = Ledger.open(settings)
    reserve_release(settings, PLAN, {"x": 1}, ledger=led)
    with pytest.raises(VeilError, match="budget cannot change"):
        reserve_release(settings, {**PLAN, "sha256": "b" * 64, "lifetime_budget": {"epsilon": 40.0, "delta": 1e-5}},
                        {"x": 1}, ledger=led)
    # a release without its own budget is still filtered by the ledger's
    r = reserve_release(settings, {**PLAN, "sha256": "c" * 64, "lifetime_budget": None}, {"x": 1}, ledger=led)
    assert r.budget is not None and r.budget.epsilon == 4.0
    with pytest.raises(VeilError, match="another ledger key"):
        Ledger(led.url, os.urandom(32))
    with pytest.raises(VeilError, match="filtered-ULS"):
        reserve_release(settings, {**PLAN, "mechanism": "uls-filtered"}, {"x": 1}, ledger=led)


def test_row_count_prices_each_person_by_their_own_records(settings):
    led = Ledger.open(settings)
    plan = {**PLAN, "mechanism": "record", "privacy_unit": "record", "noise_multiplier": 10.0, "sampling_rate": 0.05}
    reserve_release(settings, plan, {"few": 1, "many": 3}, ledger=led)
    s = led.spend(["few", "many"])
    assert np.all(s["many"][np.isfinite(s["many"])] > s["few"][np.isfinite(s["many"])])


def test_cli_ledger_json_is_aggregate_only(settings, tmp_path):
    reserve_release(settings, PLAN, {n: 1 for n in NAMES}, ledger=None)
    reserve_release(settings, {**PLAN, "sha256": "b" * 64}, {n: 1 for n in NAMES + ["dave@example.com"]}, ledger=None)
    env = {**os.environ, "VEIL_HOME": str(settings.home), "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", CLI, "ledger", "--json", "--admin"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["budget"] == {"epsilon": 4.0, "delta": 1e-5} and doc["releases"] == 2
    adm = doc["administrators_only"]
    assert "administrators only" in adm["readers"]
    assert adm["people"] == 4 and adm["retired"] == 0
    assert 0 < adm["spend"]["min_epsilon"] <= adm["spend"]["median_epsilon"] <= adm["spend"]["max_epsilon"] <= 4.0
    assert adm["pld_estimate"]["max_epsilon"] < adm["spend"]["max_epsilon"]     # RDP+filter is the pessimistic one
    rows = (settings.private_dir / "ledger-people.csv").read_text()
    assert rows.count("\n") == 5 and stat.S_IMODE(os.stat(settings.private_dir / "ledger-people.csv").st_mode) == 0o600
    assert (settings.home / "ledger-burndown.png").read_bytes()[:4] == b"\x89PNG"
    out = p.stdout + p.stderr
    led = Ledger.open(settings)
    for n in NAMES:
        assert n not in out and led.person_key(n) not in out
    bad = subprocess.run([sys.executable, "-c", CLI, "ledger"], capture_output=True, text=True, timeout=120,
                         env={**env, "VEIL_LEDGER_URL": "mysql://u:secretpw@h/db"})
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "secretpw" not in bad.stderr


def _ledger_json(settings, people: list[str], *extra: str) -> dict:
    # two releases of two plans (a plan is released once)
    reserve_release(settings, PLAN, {n: 1 for n in people[:3]}, ledger=None)
    reserve_release(settings, {**PLAN, "sha256": "b" * 64}, {n: 1 for n in people}, ledger=None)
    env = {**os.environ, "VEIL_HOME": str(settings.home), "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", CLI, "ledger", "--json", *extra], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_governance_ledger_view_is_the_same_with_or_without_any_one_person(tmp_path, monkeypatch):
    """Issue 22, case 7: `veil ledger --json` printed the exact number of people (and retirements, and
    the spread of per-person spend) to governance readers, whom the threat model names as
    non-administrators: one person's presence changed it. The governance view is now identical on a
    ledger and on the same ledger without any one person; the counts are in the administrators-only
    part, printed only with --admin and labelled so."""
    from components.core.settings import load_settings
    from components.publication.gate import field_for

    everyone = NAMES + ["dave@example.com"]
    views = []
    for i, gone in enumerate([None, NAMES[0], "dave@example.com"]):   # a person of both releases, of one
        home = tmp_path / f"home{i}"
        monkeypatch.setenv("VEIL_HOME", str(home))
        s = load_settings(home).ensure()
        views.append(_ledger_json(s, [p for p in everyone if p != gone]))
    assert all(v == views[0] for v in views[1:]), "one person moved the governance view"
    assert not {"people", "retired", "spend", "pld_estimate", "administrators_only"} & set(views[0])
    from components.publication.gate import leaves

    assert all(field_for("cli.ledger", path) is not None for path, _ in leaves(views[0]))


def test_the_bulk_keyer_is_the_person_key():
    """Ledger.person_key keys with keys.person_keyer (HMAC from precomputed pad states, for 10⁶ ids a
    release): the same pseudonym as keys.person_key for every key length, short, a block, and longer
    (hashed first), and for ids the identity rule rewrites."""
    import os as _os

    from components.ledger import keys as _k

    ids = ["alice@example.org", " Alice <ALICE@Example.org>", "ΣΊΣΥΦΟΣ@x.gr", "mailto:b@x.org", "x" * 300]
    for n in (1, 32, 63, 64, 65, 200):
        key = _os.urandom(n)
        f = _k.person_keyer(key)
        for i in ids:
            assert f(i) == _k.person_key(key, i), (n, i)
