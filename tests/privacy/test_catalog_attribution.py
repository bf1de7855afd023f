"""Attacks on attribution: a record credited to someone who did not write it breaks every per-user bound.

Each case is an input an adversary (or an accident) can produce: a git author name carrying a field
separator and the victim's address, a truncated mbox message followed by the victim's message, a
subdirectory ingest that would read the rest of the repository, a maildir symlink out of the tree.
"""
from __future__ import annotations

import json
import os
import subprocess

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
