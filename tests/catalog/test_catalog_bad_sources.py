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


# -- issue 28: unreadable messages, a full disk, a garbled snapshot: one line or a quarantined record ---

def _cli(args):
    """The `veil` command in process (typer's runner): (exit code, output lines)."""
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, args)
    out = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "Traceback" not in res.output, res.output
    return res.exit_code, out


def _unreadable(monkeypatch, path):
    """Make `path` unreadable: chmod 000, and — root reads through modes — every read of it refused."""
    import errno
    from pathlib import Path

    os.chmod(path, 0)
    if os.geteuid() != 0:
        return
    real_read, real_scandir = Path.read_bytes, os.scandir

    def read_bytes(self):
        if os.path.samefile(self, path):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_read(self)

    def scandir(p="."):
        if os.path.exists(p) and os.path.samefile(p, path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(p))
        return real_scandir(p)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(os, "scandir", scandir)


def test_maildir_unreadable_message_and_folder_are_quarantined(settings, tmp_path, monkeypatch):
    md = tmp_path / "md"
    (md / "inbox").mkdir(parents=True)
    (md / "locked").mkdir()
    for i in range(3):
        (md / "inbox" / f"{i}.").write_bytes(b"From: a%d@x.example\n\nhello %d\n" % (i, i))
    (md / "locked" / "1.").write_bytes(b"From: z@x.example\n\nunseen\n")
    _unreadable(monkeypatch, md / "inbox" / "1.")
    _unreadable(monkeypatch, md / "locked")
    try:
        rep = ingest_source(md, "maildir", settings=settings)
    finally:
        os.chmod(md / "inbox" / "1.", 0o600)
        os.chmod(md / "locked", 0o700)
    _reconciles(rep)
    assert (rep.read, rep.accepted) == (4, 2)
    assert rep.quarantine_reasons == {"unreadable file": 1, "unreadable folder": 1}
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    q = dict(con.sql("SELECT position, reason FROM quarantine").fetchall())
    con.close()
    assert q == {"inbox/1.": "unreadable file: Permission denied", "locked": "unreadable folder: Permission denied"}


def test_an_unreadable_mbox_is_one_line(settings, tmp_path, monkeypatch):
    p = tmp_path / "m.mbox"
    p.write_bytes(b"From: a@x.example\n\nhello\n")
    _unreadable(monkeypatch, p)
    if os.geteuid() == 0:  # (HashedStream opens the file itself)
        import builtins
        import errno

        real_open = builtins.open
        monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (_ for _ in ()).throw(
            PermissionError(errno.EACCES, "Permission denied", str(f))) if str(f) == str(p) else real_open(f, *a, **k))
    code, out = _cli(["ingest", str(p), "--format", "mbox", "--json"])
    assert code == 2 and out == [f"error: {p}: Permission denied (while ingesting {p})"]


@pytest.mark.parametrize("where", ["stage", "snapshot"])
def test_a_full_disk_during_ingest_is_one_line_and_recovers(settings, tmp_path, monkeypatch, where):
    import errno

    import catalog.ingest as ci
    import catalog.snapshots as cs

    first = tmp_path / "a.jsonl"
    first.write_text('{"user":"a","text":"one"}\n')
    before = ingest_source(first, "jsonl", settings=settings)
    src = tmp_path / "b.jsonl"
    src.write_text("".join(json.dumps({"user": f"u{i}", "text": f"text {i}"}) + "\n" for i in range(50)))
    if where == "stage":   # an OSError naming the file (Python's own writes)
        full = tmp_path / "stage.arrow"

        def boom(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device", str(full))
        monkeypatch.setattr(ci._StageFile, "write", boom)
    else:                  # Arrow's: no file named, errno in the text; what fills up is VEIL_HOME
        full = settings.home

        def boom(*a, **k):
            raise OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
        monkeypatch.setattr(cs.RowGroupWriter, "write", boom)
    code, out = _cli(["ingest", str(src), "--format", "jsonl", "--json"])
    assert code == 2 and len(out) == 1 and out[0].startswith(f"error: {full}: no space left on device while "
                                                             f"ingesting {src}")
    # clean: nothing staged or half-written left, the catalog still at the earlier snapshot
    assert not list((settings.cache_dir / "ingest-tmp").iterdir())
    assert not [p for p in settings.snapshots_dir.iterdir() if p.name.startswith(".tmp-")]
    assert load_snapshot(settings).snapshot_id == before.snapshot_id
    monkeypatch.undo()
    again = ingest_source(src, "jsonl", settings=settings)
    assert again.accepted == 50 and load_snapshot(settings).snapshot_id == again.snapshot_id


def _garble(path, how):
    os.chmod(path, 0o600)
    b = bytearray(path.read_bytes())
    if how == "flip":
        b[len(b) // 2:len(b) // 2 + 8] = b"\xff" * 8
    elif how == "truncate":
        b = b[:len(b) // 2]
    else:
        b = bytearray()
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("name,how", [("records.parquet", "flip"), ("secret_spans.parquet", "flip"),
                                      ("records.parquet", "truncate"), ("manifest.json", "flip"),
                                      ("manifest.json", "empty"), ("LATEST", "flip")])
def test_a_garbled_snapshot_file_is_one_line_naming_it(settings, tmp_path, name, how):
    p = tmp_path / "a.jsonl"
    p.write_text('{"user":"a","text":"key AKIAABCDEFGHIJKLMNOP"}\n{"user":"b","text":"two"}\n')
    rep = ingest_source(p, "jsonl", settings=settings)
    f = settings.snapshots_dir / (name if name == "LATEST" else f"{rep.snapshot_id}/{name}")
    _garble(f, how)
    for cmd in (["catalog", "stats"], ["secrets"]):
        code, out = _cli(cmd)
        assert code == 2 and len(out) == 1 and str(f) in out[0], out
