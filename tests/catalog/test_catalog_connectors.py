"""CSV, Parquet, mbox, maildir and git connectors, each on a small fixture built here."""
from __future__ import annotations

import gzip
import json
import os
import subprocess

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.connectors.mail import strip_quoted
from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot
from components.core.errors import VeilError

RULES = [
    {"secret_class": "codename", "kind": "literal", "patterns": ["BLUEHERON"], "case_sensitive": True},
    {"secret_class": "codename", "kind": "path_glob", "patterns": ["teams/blueheron/**"], "case_sensitive": True},
    {"secret_class": "credential", "kind": "detector", "patterns": ["credentials"], "case_sensitive": True},
]


def _quarantine(settings):
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    try:
        return con.sql("SELECT position, reason FROM quarantine ORDER BY line, position").fetchall()
    finally:
        con.close()


def _reconciles(rep):
    assert rep.read == rep.accepted + rep.quarantined + rep.duplicates


# -- CSV -------------------------------------------------------------------------------------------
def test_csv_mapping_quoted_newlines_and_bad_rows(settings, tmp_path):
    src = tmp_path / "t.csv.gz"
    body = ('author,body,when,team\n'
            'ann@x.example,"hello, BLUEHERON\nsecond line",2026-01-02T03:04:05Z,blueheron\n'
            'bob@x.example,too,many,fields,here\n'
            ',no author,2026-01-02,x\n'
            'bob@x.example,plain text,,\n')
    src.write_bytes(gzip.compress(body.encode() + b'cy@x.example,bad \xff byte,,\n'))
    rep = ingest_source(src, "csv", settings=settings, user_field="author", text_field="body", time_field="when",
                        metadata_fields=("team",), rules=RULES)
    _reconciles(rep)
    assert (rep.read, rep.accepted, rep.quarantined) == (5, 2, 3)
    q = dict(_quarantine(settings))
    assert q["row 2 (line 4)"].startswith("malformed CSV row: 5 fields")
    assert q["row 3 (line 5)"].startswith("missing user")
    assert q["row 5 (line 7)"].startswith("undecodable bytes")
    snap = load_snapshot(settings)
    ann = [r for r in snap.records.to_pylist() if r["user_id"] == "ann@x.example"][0]
    assert ann["text"] == "hello, BLUEHERON\nsecond line"
    assert json.loads(ann["metadata"]) == {"team": "blueheron"}
    assert snap.secret_spans.column("secret_id").to_pylist() == ["codename:BLUEHERON"]


def test_csv_missing_column_is_a_clear_error(settings, tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("who,what\na,b\n")
    with pytest.raises(VeilError, match="header has no user column 'user'.*who, what"):
        ingest_source(src, "csv", settings=settings)


# -- Parquet ---------------------------------------------------------------------------------------
def test_parquet_mapping_types_and_binary_text(settings, tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({
        "uid": pa.array([7, 8, 9, 7], pa.int64()),
        "body": pa.array([b"key AKIAABCDEFGHIJKLMNOP", b"fine", b"bad \xff", b"key AKIAABCDEFGHIJKLMNOP"]),
        "at": pa.array([1767225600, None, None, 1767225600], pa.int64()),
        "path": pa.array(["teams/blueheron/a.py", "teams/osprey/b.py", None, "teams/blueheron/a.py"]),
    }), src)
    rep = ingest_source(src, "parquet", settings=settings, user_field="uid", text_field="body", time_field="at",
                        metadata_fields=("path",), rules=RULES)
    _reconciles(rep)
    assert (rep.read, rep.accepted, rep.quarantined, rep.duplicates) == (4, 2, 1, 1)
    assert dict(_quarantine(settings))["row 3"].startswith("undecodable bytes")
    snap = load_snapshot(settings)
    r7 = [r for r in snap.records.to_pylist() if r["user_id"] == "7"][0]
    assert r7["created_at"].isoformat() == "2026-01-01T00:00:00+00:00"
    ids = sorted(set(snap.secret_spans.column("secret_id").to_pylist()))
    assert ids == ["codename:teams/blueheron/**", "credential:AKIAABCDEFGHIJKLMNOP"]


# -- mail ------------------------------------------------------------------------------------------
def _msg(frm, body, *, subject="s", date="Mon, 05 Jan 2026 10:00:00 +0000", extra=""):
    return (f"From: {frm}\nTo: Team <team@x.example>\nCc: boss@x.example\nBcc: hidden@x.example\n"
            f"Subject: {subject}\nDate: {date}\nMessage-ID: <{abs(hash(body))}@x>\n{extra}\n{body}\n")


def test_quoted_reply_and_forward_are_cut():
    own, info = strip_quoted("Agreed, ship it.\n\nAnn\n\nOn Mon, Jan 5, 2026 at 9:00 AM Bob <bob@x.example> wrote:\n"
                             "> BLUEHERON key is AKIAABCDEFGHIJKLMNOP\n")
    assert own == "Agreed, ship it.\n\nAnn" and info["cut"] == "reply_attribution"
    own, info = strip_quoted("FYI\n---------------------- Forwarded by Ann Lee/HOU/ECT on 10/16/2000 01:42 PM "
                             "---------------------------\nBob's words")
    assert own == "FYI" and info["cut"] == "forwarded"
    own, info = strip_quoted("my point\n> your point\nmy reply\n")
    assert own == "my point\nmy reply" and info["quoted_lines"] == 1
    own, info = strip_quoted("ok\n\n-----Original Message-----\nFrom: Bob\nSent: Monday\nTo: Ann\n\nsecret stuff")
    assert own == "ok" and info["cut"] == "original_message"
    own, info = strip_quoted("Sure.\n\nJane Doe@ENRON\n05/01/2001 10:34 AM\nTo: Phillip K Allen/HOU/ECT@ECT\n"
                             "cc:\nSubject: Re: x\n\nBLUEHERON?")
    assert own == "Sure." and info["cut"] == "notes_header"


def test_mbox_sender_is_user_and_quotes_are_not_credited(settings, tmp_path):
    src = tmp_path / "box.mbox"
    m1 = _msg("Ann Lee <Ann.Lee@X.example>", "Agreed.\n\nOn Mon, Jan 5, 2026 Bob <bob@x.example> wrote:\n> BLUEHERON launch\n")
    m2 = _msg("bob@x.example", "BLUEHERON launch\n>From here on")
    m3 = _msg("nobody", "no address")
    m4 = _msg("cy@x.example", "> only quoted\n> text")
    src.write_text("From ann Mon Jan  5 10:00:00 2026\n" + m1 + "\nFrom bob Mon Jan  5 10:00:00 2026\n" + m2
                   + "\nFrom x Mon Jan  5 10:00:00 2026\n" + m3 + "\nFrom y Mon Jan  5 10:00:00 2026\n" + m4)
    rep = ingest_source(src, "mbox", settings=settings, rules=RULES)
    _reconciles(rep)
    assert (rep.read, rep.accepted, rep.quarantined) == (4, 2, 2)
    recs = {r["user_id"]: r for r in load_snapshot(settings).records.to_pylist()}
    assert set(recs) == {"ann.lee@x.example", "bob@x.example"}
    assert recs["ann.lee@x.example"]["text"] == "Agreed."            # Bob's quoted words are not Ann's
    assert recs["bob@x.example"]["text"] == "BLUEHERON launch\nFrom here on"  # mboxrd unquoting
    meta = json.loads(recs["ann.lee@x.example"]["metadata"])
    assert meta["to"] == ["team@x.example"] and meta["cc"] == ["boss@x.example"] and "bcc" not in meta
    assert recs["ann.lee@x.example"]["source"] == "mail"
    spans = load_snapshot(settings).secret_spans.to_pylist()
    owners = {s["record_id"] for s in spans}
    assert owners == {recs["bob@x.example"]["record_id"]}  # the codename is tagged where Bob wrote it only
    starts = [i + 1 for i, ln in enumerate(src.read_text().split("\n")) if ln.startswith("From ")]
    reasons = dict(_quarantine(settings))
    assert reasons[f"message 3 (line {starts[2]})"].startswith("missing user")
    assert reasons[f"message 4 (line {starts[3]})"].startswith("missing text")


def test_maildir_enron_layout_dedups_copies_and_keeps_attachments_out(settings, tmp_path):
    root = tmp_path / "maildir"
    (root / "allen-p" / "sent").mkdir(parents=True)
    (root / "allen-p" / "all_documents").mkdir(parents=True)
    (root / "allen-p" / "inbox").mkdir(parents=True)
    sent = _msg("phillip.allen@enron.com", "Send me the BLUEHERON numbers.")
    (root / "allen-p" / "sent" / "1.").write_text(sent)
    (root / "allen-p" / "all_documents" / "7.").write_text(sent)  # same mail in two folders: a duplicate
    multipart = ("From: jane.doe@enron.com\nTo: phillip.allen@enron.com\nSubject: deck\n"
                 "Date: Tue, 06 Jan 2026 11:00:00 -0500\nMIME-Version: 1.0\n"
                 'Content-Type: multipart/mixed; boundary="b"\n\n--b\nContent-Type: text/plain\n\nDeck attached.\n'
                 '--b\nContent-Type: application/pdf\nContent-Disposition: attachment; filename="deck.pdf"\n'
                 "Content-Transfer-Encoding: base64\n\nJVBERi0xLjQK\n--b--\n")
    (root / "allen-p" / "inbox" / "3.").write_text(multipart)
    (root / "allen-p" / "inbox" / ".hidden").write_text("ignored")
    rep = ingest_source(root, "maildir", settings=settings, rules=RULES)
    _reconciles(rep)
    assert (rep.read, rep.accepted, rep.duplicates, rep.quarantined) == (3, 2, 1, 0)
    recs = {r["user_id"]: r for r in load_snapshot(settings).records.to_pylist()}
    jane = recs["jane.doe@enron.com"]
    assert jane["text"] == "Deck attached."
    meta = json.loads(jane["metadata"])
    assert meta["attachments"] == [{"bytes": 9, "content_type": "application/pdf", "filename": "deck.pdf"}]
    assert meta["folder"] == "allen-p/inbox"
    assert jane["created_at"].isoformat() == "2026-01-06T16:00:00+00:00"


# -- git -------------------------------------------------------------------------------------------
def _git(repo, *args, env=None):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null", **(env or {})})


def _commit(repo, name, mail, msg, when):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", msg, env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": mail,
                                                 "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": mail,
                                                 "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when})


def test_git_added_lines_per_commit_and_file_with_mailmap(settings, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "teams" / "blueheron").mkdir(parents=True)
    (repo / "teams" / "blueheron" / "billing.py").write_text("def bill():\n    return 1\n")
    (repo / "README.md").write_text("# Project\n")
    _commit(repo, "Ann Lee", "ann@old.example", "first", "2026-01-05T10:00:00+00:00")
    (repo / "teams" / "blueheron" / "billing.py").write_text("def bill():\n    return 2\nKEY = 'AKIAABCDEFGHIJKLMNOP'\n")
    (repo / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    _commit(repo, "Bob Stone", "bob@x.example", "second", "2026-01-06T10:00:00+00:00")
    _git(repo, "mv", "README.md", "README.txt")
    _commit(repo, "Bob Stone", "bob@x.example", "rename only", "2026-01-07T10:00:00+00:00")
    (repo / ".mailmap").write_text("Ann Lee <ann@x.example> <ann@old.example>\n")
    _commit(repo, "Ann Lee", "ann@old.example", "mailmap", "2026-01-08T10:00:00+00:00")
    rep = ingest_source(repo, "git", settings=settings, rules=RULES)
    _reconciles(rep)
    recs = load_snapshot(settings).records.to_pylist()
    by = {(json.loads(r["metadata"])["path"], r["user_id"]): r for r in recs}
    # commit 1: two files by Ann (mailmapped); commit 2: Bob's changed lines only; the png is quarantined;
    # the rename adds nothing; commit 4 adds .mailmap
    assert set(by) == {("teams/blueheron/billing.py", "ann@x.example"), ("README.md", "ann@x.example"),
                       ("teams/blueheron/billing.py", "bob@x.example"), (".mailmap", "ann@x.example")}
    assert by[("teams/blueheron/billing.py", "bob@x.example")]["text"] == "    return 2\nKEY = 'AKIAABCDEFGHIJKLMNOP'"
    assert rep.quarantined == 1 and dict(_quarantine(settings)).popitem()[1].startswith("binary file")
    spans = load_snapshot(settings).secret_spans.to_pylist()
    bob_rec = by[("teams/blueheron/billing.py", "bob@x.example")]
    assert {(s["record_id"], s["secret_id"]) for s in spans} == {
        (bob_rec["record_id"], "codename:teams/blueheron/**"),
        (bob_rec["record_id"], "credential:AKIAABCDEFGHIJKLMNOP"),
        (by[("teams/blueheron/billing.py", "ann@x.example")]["record_id"], "codename:teams/blueheron/**")}
    assert by[("README.md", "ann@x.example")]["source"] == "code"
    # re-ingest: idempotent
    again = ingest_source(repo, "git", settings=settings, rules=RULES)
    assert again.snapshot_id == rep.snapshot_id and again.new == 0


def test_git_not_a_repository(settings, tmp_path):
    with pytest.raises(VeilError, match="not a git repository"):
        ingest_source(tmp_path, "git", settings=settings)
