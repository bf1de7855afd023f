"""Attacks on attribution: a record credited to someone who did not write it breaks every per-user bound.

Each case is an input an adversary (or an accident) can produce: a git author name carrying a field
separator and the victim's address, a truncated mbox message followed by the victim's message, a
subdirectory ingest that would read the rest of the repository, a maildir symlink out of the tree.
"""
from __future__ import annotations

import json
import os
import subprocess

import pyarrow as pa
import pytest

from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot


def _git(repo, *args, env=None):
    e = {**os.environ, "GIT_COMMITTER_NAME": "c", "GIT_COMMITTER_EMAIL": "c@x.example",
         "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=e)


def _commit(repo, name, email, msg):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", msg, env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email})


def test_git_author_name_with_unit_separator_is_not_credited_to_the_victim(settings, tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("mallory wrote this\n")
    _commit(repo, "Mallory\x1fvictim.user@corp.example\x1f", "mallory@evil.example", "init")
    rep = ingest_source(repo, "git", settings=settings)
    assert rep.accepted == 1
    rec = load_snapshot(settings).records.to_pylist()[0]
    assert rec["user_id"] == "mallory@evil.example"
    assert json.loads(rec["metadata"])["author_name"].startswith("Mallory\x1fvictim.user@corp.example")


def test_git_subdirectory_reads_only_that_path(settings, tmp_path):
    repo = tmp_path / "r"
    (repo / "team").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "team" / "mine.txt").write_text("inside the path\n")
    (repo / "other.txt").write_text("OUTSIDE the path\n")
    _commit(repo, "Ann", "ann@x.example", "both")
    (repo / "other.txt").write_text("OUTSIDE again\n")
    _commit(repo, "Bob", "bob@x.example", "outside only")
    rep = ingest_source(repo / "team", "git", settings=settings)
    recs = load_snapshot(settings).records.to_pylist()
    assert rep.read == 1 and [r["text"] for r in recs] == ["inside the path"]
    assert {r["user_id"] for r in recs} == {"ann@x.example"}


def test_truncated_mbox_message_is_not_folded_into_the_previous_sender(settings, tmp_path):
    # Message 1 is cut off mid-body (no blank line before the next separator): message 2 must stay
    # the victim's own record, not text credited to the previous sender.
    mbox = (b"From alice@x.example Mon Jan  2 03:04:05 2006\n"
            b"From: alice@x.example\nSubject: one\n\nalice's words, cut off mid-sen\n"
            b"From victim@x.example Tue Jan  3 03:04:05 2006\n"
            b"From: victim@x.example\nSubject: two\n\nthe victim's private words\n")
    p = tmp_path / "m.mbox"
    p.write_bytes(mbox)
    rep = ingest_source(p, "mbox", settings=settings)
    assert (rep.read, rep.accepted) == (2, 2)
    by_user = {r["user_id"]: r["text"] for r in load_snapshot(settings).records.to_pylist()}
    assert by_user == {"alice@x.example": "alice's words, cut off mid-sen",
                       "victim@x.example": "the victim's private words"}


def test_maildir_symlink_out_of_the_tree_is_not_read(settings, tmp_path):
    outside = tmp_path / "secret.eml"
    outside.write_bytes(b"From: boss@x.example\nSubject: s\n\nthe boss's private mail\n")
    md = tmp_path / "maildir" / "ann" / "inbox"
    md.mkdir(parents=True)
    (md / "1.").write_bytes(b"From: ann@x.example\nSubject: hi\n\nann's mail\n")
    os.symlink(outside, md / "2.")
    os.symlink(tmp_path, md / "escape")  # a folder link: never descended into
    rep = ingest_source(tmp_path / "maildir", "maildir", settings=settings)
    texts = [r["text"] for r in load_snapshot(settings).records.to_pylist()]
    assert texts == ["ann's mail"]
    assert rep.read == rep.accepted + rep.quarantined + rep.duplicates
    assert rep.quarantine_reasons.get("outside the source") == 2


# -- issue 28: a display name that is another address ------------------------------------------------

_SPOOFS = [  # From headers that show the victim's address but are sent by Eve
    b"victim.user@corp.example <eve@evil.example>",                   # Outlook-style, unquoted
    b'"victim.user@corp.example" <eve@evil.example>',                 # quoted
    b"'victim.user@corp.example' <eve@evil.example>",                 # Outlook's single quotes
    b"=?utf-8?q?victim.user=40corp.example?= <eve@evil.example>",    # RFC 2047-encoded
    "victim.user＠corp.example <eve@evil.example>".encode(),          # full-width '@' (NFKC: '@')
    b"eve@evil.example (victim.user@corp.example)",                   # in a comment
    b"victim.user@corp.example eve@evil.example",                     # two addresses, no brackets
    b"victim.user@corp.example, eve@evil.example",                    # two authors
]
_FINE = [b"eve@evil.example", b"Eve <eve@evil.example>", b"EVE@evil.example <eve@evil.example>",
         b"'eve@evil.example' <eve@evil.example>"]


def _msg(frm: bytes, body: bytes, to: bytes = b"bob@x.example") -> bytes:
    return b"From: " + frm + b"\nTo: " + to + b"\nSubject: s\n\n" + body + b"\n"


@pytest.mark.parametrize("fmt", ["mbox", "maildir"])
def test_a_display_name_that_is_another_address_is_quarantined_not_credited(settings, tmp_path, fmt):
    msgs = [_msg(f, b"spoof %d" % i) for i, f in enumerate(_SPOOFS)] + \
           [_msg(f, b"eve's own %d" % i) for i, f in enumerate(_FINE)] + \
           [_msg(b"Victim User <victim.user@corp.example>", b"the victim's own words")]
    if fmt == "mbox":
        src = tmp_path / "m.mbox"
        src.write_bytes(b"".join(b"From x@y Mon Jan  2 03:04:05 2006\n" + m + b"\n" for m in msgs))
    else:
        src = tmp_path / "md"
        (src / "inbox").mkdir(parents=True)
        for i, m in enumerate(msgs):
            (src / "inbox" / f"{i:02d}.").write_bytes(m)
    rep = ingest_source(src, fmt, settings=settings)
    assert rep.read == rep.accepted + rep.quarantined + rep.duplicates == len(msgs)
    recs = load_snapshot(settings).records.to_pylist()
    by_user = {}
    for r in recs:
        by_user.setdefault(r["user_id"], []).append(r["text"])
    # nothing of Eve's is the victim's; nothing is silently dropped: every spoof is quarantined
    assert by_user == {"eve@evil.example": [f"eve's own {i}" for i in range(len(_FINE))],
                       "victim.user@corp.example": ["the victim's own words"]}
    assert rep.quarantined == len(_SPOOFS) and rep.quarantine_reasons == {"ambiguous sender": len(_SPOOFS)}
    import duckdb

    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    reasons = [r for (r,) in con.sql("SELECT reason FROM quarantine ORDER BY position").fetchall()]
    con.close()
    assert sorted(reasons) == sorted(["ambiguous sender: display name is another address"] * 6
                                     + ["ambiguous sender: two addresses in one mailbox without angle brackets",
                                        "ambiguous sender: From names 2 addresses"])


def test_a_recipient_whose_display_name_is_another_address_is_quarantined(settings, tmp_path):
    # To/Cc own the record under all-participants: a spoofed recipient would charge the wrong person
    src = tmp_path / "m.mbox"
    src.write_bytes(b"From x@y Mon Jan  2 03:04:05 2006\n"
                    + _msg(b"ann@x.example", b"to the real bob", b"Bob <bob@x.example>") + b"\n"
                    + b"From x@y Mon Jan  2 03:04:05 2006\n"
                    + _msg(b"ann@x.example", b"to whom?", b"bob@x.example, victim@corp.example <eve@evil.example>"))
    rep = ingest_source(src, "mbox", settings=settings)
    assert (rep.read, rep.accepted) == (2, 1) and rep.quarantine_reasons == {"ambiguous recipient": 1}
    [rec] = load_snapshot(settings).records.to_pylist()
    assert rec["text"] == "to the real bob" and json.loads(rec["metadata"])["to"] == ["bob@x.example"]


def test_a_user_field_whose_display_name_is_another_address_is_quarantined(settings, tmp_path):
    # The identity rule reads 'Name <addr>' as addr in every format: the same ambiguity, the same answer
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in [
        {"user": "victim.user@corp.example <eve@evil.example>", "text": "spoof"},
        {"user": "Eve <eve@evil.example>", "text": "eve's own"}]))
    rep = ingest_source(src, "jsonl", settings=settings)
    assert (rep.read, rep.accepted) == (2, 1) and rep.quarantine_reasons == {"ambiguous user": 1}
    assert [(r["user_id"], r["text"]) for r in load_snapshot(settings).records.to_pylist()] == \
        [("eve@evil.example", "eve's own")]


def test_jsonl_recipients_own_the_record_and_spoofed_or_mistyped_ones_are_quarantined(settings, tmp_path):
    # `--meta to --meta cc` from JSONL used to be kept as the string '["b@x"]', which the owners
    # column cannot read: under all-participants those recipients owned nothing and were charged nothing
    from catalog.people import apply_people

    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in [
        {"user": "ann@x.example", "text": "to bob and cy", "to": ["bob@x.example", "Cy <CY@x.example>"],
         "cc": ["dee@x.example"]},
        {"user": "bob@x.example", "text": "one string", "to": "Ann A <ann@x.example>, eve@x.example"},
        {"user": "bob@x.example", "text": "chat", "to": ["alice", "carol"]},
        {"user": "bob@x.example", "text": "not a string", "to": [5]},
        {"user": "bob@x.example", "text": "spoofed", "to": ["victim@corp.example <eve@evil.example>"]}]))
    rep = ingest_source(src, "jsonl", settings=settings, metadata_fields=["to", "cc"])
    assert (rep.read, rep.accepted) == (5, 3)
    assert rep.quarantine_reasons == {"ambiguous recipient": 1, "wrong type": 1}
    recs = load_snapshot(settings).records
    out, _ = apply_people(recs, {"ownership": "all-participants"})
    owners = {r["text"]: r["owners"] for r in out.to_pylist()}
    assert owners == {"to bob and cy": ["ann@x.example", "bob@x.example", "cy@x.example", "dee@x.example"],
                      "one string": ["bob@x.example", "ann@x.example", "eve@x.example"],
                      "chat": ["bob@x.example", "alice", "carol"]}


# -- issue 28: a key written twice, a user id that is not text ---------------------------------------

def test_a_duplicated_key_is_quarantined_not_last_wins(settings, tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_bytes(b"".join(ln + b"\n" for ln in [
        b'{"user": "victim@corp.example", "text": "eve wrote this", "user": "eve@evil.example"}',   # 1
        b'{"user": "victim@corp.example", "us\\u0065r": "eve@evil.example", "text": "escaped twin"}',  # 2
        b'{"user": "ann@x.example", "text": "one", "text": "two"}',                                  # 3
        b'{"user": "ann@x.example", "text": "meta twin", "team": {"id": 1, "id": 2}}',               # 4
        b'{"user": "ann@x.example", "text": "an unread twin", "z": 1, "z": 2}',                      # 5 ok
        b'{"user": "bob@x.example", "text": "plain"}',                                               # 6 ok
    ]))
    rep = ingest_source(src, "jsonl", settings=settings, metadata_fields=("team",))
    assert (rep.read, rep.accepted, rep.quarantined) == (6, 2, 4)
    assert rep.quarantine_reasons == {"duplicate key": 4}
    import duckdb

    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    q = dict(con.sql("SELECT line, reason FROM quarantine").fetchall())
    con.close()
    assert sorted(q) == [1, 2, 3, 4]
    assert q[1].startswith("duplicate key: 'user' appears twice") and q[2].startswith("duplicate key: 'user'")
    assert q[3].startswith("duplicate key: 'text'") and q[4].startswith("duplicate key: 'team.id'")
    users = {r["user_id"] for r in load_snapshot(settings).records.to_pylist()}
    assert users == {"ann@x.example", "bob@x.example"}


def test_a_user_id_that_is_not_text_is_quarantined_naming_field_and_type(settings, tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in [
        {"user": 123, "text": "a"}, {"user": 123.0, "text": "b"}, {"user": True, "text": "c"},
        {"user": {"id": "victim"}, "text": "d"}, {"user": ["victim"], "text": "e"},
        {"user": "123", "text": "a string of digits is an id"}]))
    rep = ingest_source(src, "jsonl", settings=settings)
    assert (rep.read, rep.accepted, rep.quarantine_reasons) == (6, 1, {"wrong type": 5})
    import duckdb

    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    q = [r for (r,) in con.sql("SELECT reason FROM quarantine ORDER BY line").fetchall()]
    con.close()
    assert q == [f"wrong type: field 'user' (user) is a JSON {t}, not a string"
                 for t in ("number", "number", "boolean", "object", "array")]
    assert [r["user_id"] for r in load_snapshot(settings).records.to_pylist()] == ["123"]


@pytest.mark.parametrize("user,text,why", [
    (pa.array([{"id": "v"}, {"id": "w"}]), ["a", "b"], "column 'user' (user) is struct<id: string>"),
    (pa.array([["v"], ["w"]]), ["a", "b"], "column 'user' (user) is list<element: string>"),
    (pa.array([1.0, 2.0]), ["a", "b"], "column 'user' (user) is double"),
    (pa.array([True, False]), ["a", "b"], "column 'user' (user) is bool"),
    (pa.array(["v", "w"]), pa.array([1, 2]), "column 'text' (text) is int64"),
    (pa.array(["v", "w"]), pa.array([{"q": "x"}, {"q": "y"}]), "column 'text' (text) is struct<q: string>"),
])
def test_parquet_user_or_text_of_another_type_is_quarantined_never_spelled_out(settings, tmp_path, user, text, why):
    import pyarrow.parquet as pq

    from components.core.errors import VeilError

    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"user": user, "text": text}), p)
    with pytest.raises(VeilError, match="nothing accepted") as e:
        ingest_source(p, "parquet", settings=settings)
    allowed = "a string or an integer" if "(user)" in why else "a string"
    assert f"wrong type: {why}, not {allowed}" in str(e.value)
    # with good rows beside them (another file, a string column): only the bad ones go
    good = tmp_path / "g.parquet"
    pq.write_table(pa.table({"user": pa.array(["v", "w"]).dictionary_encode(), "text": ["a", "b"]}), good)
    rep = ingest_source(good, "parquet", settings=settings)
    assert sorted(r["user_id"] for r in load_snapshot(settings).records.to_pylist()) == ["v", "w"]
    assert rep.accepted == 2
