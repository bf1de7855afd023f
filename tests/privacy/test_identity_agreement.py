"""The catalog, the planner and the ledger agree on who is a person (issue 26), and a change of the
identity rule never gives anyone a fresh budget.

Issue 26 saw one maintainer under two capitalisations be two users to the catalog and the planner and
one to the ledger, which refused the release naming no one. Here a tiny source with such variants
goes through the real ingest, the planner's people functions and the ledger; and a ledger written
under the earlier rule (its pseudonyms: HMAC of NFKC + trim + casefold) keeps charging the same
people once the planner links their accounts (`stages.link_identities`).
"""
from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np
import pytest

from components.core.identity import legacy_person_id, person_id
from components.ledger import Ledger, reserve_release
from components.ledger import keys as ledger_keys
from components.ledger.ledger import default_url

PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 100,
        "lifetime_budget": {"epsilon": 8.0, "delta": 1e-5}}

# the source's user field, as people and systems wrote it → the person it is
SPELLINGS = {
    "Alice Smith <Alice@Example.org>": "alice@example.org",
    "alice@example.org": "alice@example.org",
    " ALICE@EXAMPLE.ORG ": "alice@example.org",
    "bob\u200b@x.org": "bob@x.org",
    "Bob@x.org": "bob@x.org",
    "ｃａｒｏｌ": "carol",
    "carol": "carol",
    "straße@x.de": "strasse@x.de",
    "STRASSE@x.de": "strasse@x.de",
    "dave\u00a0lee": "dave lee",
    "dave  lee": "dave lee",
    "j.smith@x.org": "j.smith@x.org",    # two people: the rule never drops dots
    "jsmith@x.org": "jsmith@x.org",
    "Alice Smith <alice.smith@corp.example>": "alice.smith@corp.example",  # same name, another address
}
PEOPLE = sorted(set(SPELLINGS.values()))


@pytest.fixture
def ingested(settings, tmp_path):
    from catalog.ingest import ingest_source
    from catalog.snapshots import load_snapshot

    src = tmp_path / "org.jsonl"
    with src.open("w") as f:
        for i, u in enumerate(SPELLINGS):
            for j in range(3):
                f.write(json.dumps({"user": u, "text": f"note {i}.{j} about the build"}) + "\n")
        f.write(json.dumps({"user": "\u200b\u200d", "text": "nobody wrote this"}) + "\n")   # invisible only
    rep = ingest_source(src, "jsonl", settings=settings)
    return rep, load_snapshot(settings, rep.snapshot_id)


class _EarlierLedger(Ledger):
    """The ledger as the Veil before the identity rule wrote it: pseudonym = HMAC(NFKC + trim + casefold),
    charged under the ids the earlier ingest stored (the user field, trimmed of spaces)."""

    def person_key(self, pid: str) -> str:
        return hmac.new(self._key, b"veil-person:" + legacy_person_id(pid).encode(), hashlib.sha256).hexdigest()


def _earlier(settings) -> Ledger:
    settings.private_dir.mkdir(parents=True, exist_ok=True)
    return _EarlierLedger(default_url(settings), ledger_keys.load_or_create_key(settings.private_dir))


def test_catalog_planner_ledger_and_partition_count_the_same_people(settings, ingested):
    from components.bounding.people import canonical_records, people_for_plan, plan_accounts
    from components.prediction import partition

    rep, snap = ingested
    users = set(snap.records.column("user_id").to_pylist())
    # catalog: ids stored under the rule, the source's spelling kept privately, invisible-only id quarantined
    assert users == set(PEOPLE) and rep.users == len(PEOPLE) and rep.snapshot_users == len(PEOPLE)
    assert rep.quarantine_reasons == {"missing user": 1} and rep.quarantined == 1
    accounts = {json.loads(m).get("account") for m in snap.records.column("metadata").to_pylist()}
    assert {"Alice Smith <Alice@Example.org>", "ALICE@EXAMPLE.ORG", "STRASSE@x.de", "ｃａｒｏｌ"} <= accounts
    # the operator's likely-duplicates report: who the rule merged (private file), counts on the report
    doc = json.loads((settings.private_dir / "people" / "likely-duplicates.json").read_text())
    merged = {d["person_id"]: d["spellings"] for d in doc["merged_by_identity_rule"]}
    assert set(merged) == {"alice@example.org", "bob@x.org", "carol", "strasse@x.de", "dave lee"}
    assert rep.identity_merged_people == 5 and "j.smith@x.org" not in merged
    assert merged["alice@example.org"] == sorted(["Alice Smith <Alice@Example.org>", "alice@example.org",
                                                  "ALICE@EXAMPLE.ORG"])
    # one display name under two addresses: likely one person, for the operator to decide (aliases)
    assert doc["likely_same_person"] == [{"name": "alice smith",
                                          "user_ids": ["alice.smith@corp.example", "alice@example.org"]}]
    assert rep.likely_duplicate_people == 1
    # planner: the same people, with or without a people section; the same table when nothing changes
    mapping, report = plan_accounts(snap.records, None)
    assert sorted(set(mapping.values())) == PEOPLE and report["people"] == len(PEOPLE)
    assert canonical_records(snap.records) is snap.records
    planned, _, annex = people_for_plan(snap.records, {"exclude": ["nobody*"]})
    assert sorted(set(planned.column("user_id").to_pylist())) == PEOPLE and annex["n_people"] == len(PEOPLE)
    # ledger: one pseudonym per person whatever the spelling; a release over the planner's ids is charged
    led = Ledger.open(settings)
    try:
        assert len({led.person_key(s) for s in SPELLINGS}) == len(PEOPLE)
        rows = {}
        for u in planned.column("user_id").to_pylist():
            rows[u] = rows.get(u, 0) + 1
        res = reserve_release(settings, {**PLAN, "sha256": "a" * 64}, rows, ledger=led)
        assert sorted(res.admitted) == PEOPLE and len(led.person_rows()) == len(PEOPLE)
    finally:
        led.dispose()
    # PMixED's partition: one shard per person whatever the spelling
    key = b"\x01" * 32
    for s, p in SPELLINGS.items():
        assert partition.shard_of(key, s, 97) == partition.shard_of(key, p, 97)


def test_a_snapshot_from_before_the_rule_is_planned_as_the_same_people():
    """Ids stored before ingest applied the rule ('Alice' and 'alice' as two user ids) map to one person."""
    import pyarrow as pa

    from components.bounding.people import canonical_records, plan_accounts

    raw = list(SPELLINGS)
    recs = pa.table({"user_id": [s.strip(" ") for s in raw], "text": ["t"] * len(raw),
                     "metadata": ["{}"] * len(raw)})
    out = canonical_records(recs)
    assert [person_id(s) for s in raw] == out.column("user_id").to_pylist()
    assert sorted(set(plan_accounts(recs, None)[0].values())) == PEOPLE


def test_a_ledger_from_the_earlier_rule_keeps_charging_the_same_people(settings, ingested):
    """Privacy: a rule change must not give anyone a fresh budget. People the earlier Veil charged under
    their old spellings — 'Alice Smith <…>' and 'alice@…' as two pseudonyms, 'dave  lee' with its
    double space — are charged the sum once the planner links their accounts; without the link they
    would start again from nothing (checked, so this test can fail)."""
    from flows import stages

    _, snap = ingested
    old_ids = {"Alice Smith <Alice@Example.org>": 3, "alice@example.org": 3, "dave  lee": 3, "carol": 3}
    old = _earlier(settings)
    try:
        n = 0
        while True:      # charge them until the earlier ledger retires them: their budget is spent
            res = reserve_release(settings, {**PLAN, "sha256": f"{n:064x}"}, old_ids, ledger=old)
            n += 1
            if res.retired or n > 40:
                break
        assert set(res.retired) == set(old_ids), "the earlier ledger never exhausted them: the test proves nothing"
        before = old.spend(list(old_ids))
    finally:
        old.dispose()
    led = Ledger.open(settings)
    try:
        # under the new rule 'dave lee' and 'alice@example.org' have new or merged pseudonyms: unlinked, Dave
        # is a stranger to the ledger
        assert not np.any(led.spend(["dave lee"])["dave lee"])
        assert led.person_key("carol") == _earlier(settings).person_key("carol")   # plain ids keep theirs
    finally:
        led.dispose()
    added = stages.link_identities(settings, snap.records, None)
    # two pseudonyms to link: Alice's display-name spelling (her plain address is her key already), Dave's
    assert added == 2
    assert stages.link_identities(settings, snap.records, None) == 0        # idempotent
    led = Ledger.open(settings)
    try:
        now = led.spend(["alice@example.org", "dave lee", "carol"])
        np.testing.assert_allclose(now["alice@example.org"],
                                   before["Alice Smith <Alice@Example.org>"] + before["alice@example.org"])
        np.testing.assert_allclose(now["dave lee"], before["dave  lee"])
        np.testing.assert_allclose(now["carol"], before["carol"])
        # the next release retires them all, as the earlier ledger would have
        res = reserve_release(settings, {**PLAN, "sha256": "f" * 64},
                              {"alice@example.org": 3, "dave lee": 3, "carol": 3, "bob@x.org": 3}, ledger=led)
        assert sorted(res.retired) == ["alice@example.org", "carol", "dave lee"] and res.admitted == ("bob@x.org",)
        # the views fold the linked pseudonyms in: Alice is one person, not three rows
        keys = {r["person_key"] for r in led.person_rows()}
        assert led.person_key("alice@example.org") in keys and len(keys) == 4
    finally:
        led.dispose()


def test_an_alias_added_later_carries_the_aliased_ids_spend(settings):
    """`people.aliases` merging two ids that were charged apart: the person keeps both histories."""
    import pyarrow as pa

    from flows import stages

    led = Ledger.open(settings)
    try:
        reserve_release(settings, {**PLAN, "sha256": "1" * 64}, {"j.smith@x.org": 2, "jsmith@x.org": 5}, ledger=led)
        before = led.spend(["j.smith@x.org", "jsmith@x.org"])
    finally:
        led.dispose()
    recs = pa.table({"user_id": ["j.smith@x.org", "jsmith@x.org"], "text": ["a", "b"], "metadata": ["{}", "{}"]})
    people = {"aliases": [["J.Smith@x.org", "jsmith@X.org "]]}     # variants of both: accepted by the rule
    assert stages.link_identities(settings, recs, people) == 1
    led = Ledger.open(settings)
    try:
        np.testing.assert_allclose(led.spend(["j.smith@x.org"])["j.smith@x.org"],
                                   before["j.smith@x.org"] + before["jsmith@x.org"])
        assert len(led.person_rows()) == 1
    finally:
        led.dispose()


def test_the_operator_detail_reaches_the_terminal_only():
    """The refusal's ids are for the operator's terminal: the CLI prints them under the one-line message;
    str(e) (what Prefect logs) and a pickled copy (a Prefect state) never hold them."""
    import pickle

    import typer
    from typer.testing import CliRunner

    from components.core.errors import VeilError
    from flows.cli import _VeilGroup

    app = typer.Typer(cls=_VeilGroup)

    @app.command()
    def boom():
        raise VeilError("ledger: refused", operator_detail="the same person: 'Ann' and 'ann'")

    @app.command()
    def other():
        pass

    res = CliRunner().invoke(app, ["boom"])
    assert res.exit_code == 2 and "error: ledger: refused" in res.output and "'Ann' and 'ann'" in res.output
    e = VeilError("ledger: refused", operator_detail="'Ann' and 'ann'")
    copy = pickle.loads(pickle.dumps(e))
    assert "Ann" not in str(e) and copy.operator_detail is None and str(copy) == "ledger: refused"


FIVE = ["Alice@Example.org", "  alice@example.org  ", "ALICE@EXAMPLE.ORG", "ａｌｉｃｅ＠ｅｘａｍｐｌｅ.ｏｒｇ",
        "Alice Smith <alice@example.org>"]


@pytest.mark.parametrize("fmt", ["jsonl", "mbox"])
def test_five_spellings_of_one_address_are_one_person_at_ingest(settings, tmp_path, fmt):
    """Issue 28: case, surrounding spaces, full-width characters and a display name around the address
    ingested as four people; the ledger (one person) then refused the release. The catalog counts one."""
    from catalog.ingest import ingest_source
    from catalog.snapshots import load_snapshot

    if fmt == "jsonl":
        src = tmp_path / "a.jsonl"
        src.write_text("".join(json.dumps({"user": u, "text": f"note {i}"}) + "\n" for i, u in enumerate(FIVE)))
    else:
        src = tmp_path / "a.mbox"
        src.write_bytes(b"".join(b"From x@y Mon Jan  2 03:04:05 2006\nFrom: " + u.encode() + b"\nSubject: s\n\n"
                                 + f"note {i}".encode() + b"\n\n" for i, u in enumerate(FIVE)))
    rep = ingest_source(src, fmt, settings=settings)
    assert (rep.read, rep.accepted, rep.users, rep.snapshot_users) == (5, 5, 1, 1)
    assert {r["user_id"] for r in load_snapshot(settings).records.to_pylist()} == {"alice@example.org"}
    if fmt == "jsonl":  # the spellings the rule merged: reported to the operator, privately
        doc = json.loads((settings.private_dir / "people" / "likely-duplicates.json").read_text())
        merged = {d["person_id"]: d["spellings"] for d in doc["merged_by_identity_rule"]}
        assert merged == {"alice@example.org": sorted({u.strip() for u in FIVE})}
        assert rep.identity_merged_people == 1
    led = Ledger.open(settings)
    try:
        res = reserve_release(settings, {**PLAN, "sha256": "b" * 64}, {"alice@example.org": 5}, ledger=led)
        assert list(res.admitted) == ["alice@example.org"] and len({led.person_key(u) for u in FIVE}) == 1
    finally:
        led.dispose()
