"""Bad sources and crash leftovers: one line or a quarantined record, never a traceback, silent loss or
a visible half-written snapshot."""
from __future__ import annotations

import json
import os
import shutil

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.ingest import ingest_source
from catalog.snapshots import list_snapshots, load_snapshot
from components.core.errors import VeilError


def _reconciles(rep):
    assert rep.read == rep.accepted + rep.quarantined + rep.duplicates


def test_mbox_leading_message_without_separator_is_kept(settings, tmp_path):
    p = tmp_path / "m.mbox"
    p.write_bytes(b"From: first@x.example\nSubject: a\n\nno separator before me\n\n"
                  b"From second@x.example Mon Jan  2 03:04:05 2006\nFrom: second@x.example\n\nsecond\n")
    rep = ingest_source(p, "mbox", settings=settings)
    _reconciles(rep)
    assert (rep.read, rep.accepted) == (2, 2)
    assert {r["user_id"] for r in load_snapshot(settings).records.to_pylist()} == {"first@x.example",
                                                                                 "second@x.example"}


@pytest.mark.parametrize("body", [b"just some prose, no mail here\nat all\n", bytes(range(256)) * 8, b""])
def test_mbox_without_messages_is_one_line_error(settings, tmp_path, body):
    p = tmp_path / "junk.mbox"
    p.write_bytes(body)
    with pytest.raises(VeilError, match="not an mbox file") as e:
        ingest_source(p, "mbox", settings=settings)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert list_snapshots(settings) == []


def test_ingest_accepting_nothing_is_an_error(settings, tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"user": "", "text": "x"}\n{"user": "  ", "text": "y"}\n{"user": "a", "text": 3}\n')
    with pytest.raises(VeilError, match=r"nothing accepted \(3 records read, 3 quarantined: missing user 2, wrong type 1\)"):
        ingest_source(p, "jsonl", settings=settings)
    assert list_snapshots(settings) == [] and not (settings.snapshots_dir / "LATEST").exists()


def test_json_lone_surrogate_is_quarantined_not_fatal(settings, tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"user":"a","text":"fine"}\n{"user":"b","text":"half a pair \\ud800 here"}\n'
                 '{"user":"c","text":"also fine"}\n')
    rep = ingest_source(p, "jsonl", settings=settings)
    _reconciles(rep)
    assert (rep.read, rep.accepted, rep.quarantined) == (3, 2, 1)
    assert rep.quarantine_reasons == {"undecodable text": 1}


def test_corrupt_parquet_page_is_one_line(settings, tmp_path):
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"user": ["a"] * 1000, "text": [f"text {i}" for i in range(1000)]}), p,
                   compression="none")
    b = bytearray(p.read_bytes())
    for i in range(200, 2000):  # inside the first data page, footer intact
        b[i] ^= 0x5A
    p.write_bytes(bytes(b))
    with pytest.raises(VeilError, match="corrupt Parquet data") as e:
        ingest_source(p, "parquet", settings=settings)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_maildir_file_name_not_utf8(settings, tmp_path):
    md = tmp_path / "md" / "inbox"
    md.mkdir(parents=True)
    (md / "ok.").write_bytes(b"From: a@x.example\n\nhello\n")
    with open(os.path.join(os.fsencode(md), b"bad\xff\xfe."), "wb") as f:
        f.write(b"From: b@x.example\n\nbye\n")
    rep = ingest_source(tmp_path / "md", "maildir", settings=settings)
    assert rep.accepted == 2
    folders = sorted(json.loads(r["metadata"])["folder"] for r in load_snapshot(settings).records.to_pylist())
    assert folders == ["inbox", "inbox"]


def test_crash_leftovers_are_cleaned_and_uncommitted_snapshot_is_invisible(settings, tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"user":"a","text":"one"}\n')
    first = ingest_source(p, "jsonl", settings=settings)
    # A killed ingest: a temporary folder holding raw text, and a snapshot renamed into place whose
    # catalog transaction never committed.
    tmp = settings.snapshots_dir / ".tmp-20260101T000000-dead"
    tmp.mkdir()
    (tmp / "records.parquet").write_bytes(b"raw text of someone")
    ghost = settings.snapshots_dir / "snap-00000000deadbeef"
    shutil.copytree(settings.snapshots_dir / first.snapshot_id, ghost)
    m = json.loads((ghost / "manifest.json").read_text())
    m["snapshot_id"], m["created_at"] = ghost.name, "2999-01-01T00:00:00+00:00"
    os.chmod(ghost / "manifest.json", 0o644)
    (ghost / "manifest.json").write_text(json.dumps(m))
    # ... and its staged files: the bookkeeping (quarantined rows' raw bytes) and exact-dedup text
    staging = settings.cache_dir / "ingest-tmp"
    assert staging.is_dir() and not list(staging.iterdir())  # a finished ingest leaves none
    for name in ("20260101T000000-dead.stage.arrow", "20260101T000000-dead.parquet"):
        (staging / name).write_bytes(b"raw bytes of a quarantined line")
    assert [s["snapshot_id"] for s in list_snapshots(settings)] == [first.snapshot_id]
    p2 = tmp_path / "b.jsonl"
    p2.write_text('{"user":"b","text":"two"}\n')
    second = ingest_source(p2, "jsonl", settings=settings)
    assert not tmp.exists() and not ghost.exists() and not list(staging.iterdir())
    assert sorted(s["snapshot_id"] for s in list_snapshots(settings)) == sorted([second.snapshot_id, first.snapshot_id])
