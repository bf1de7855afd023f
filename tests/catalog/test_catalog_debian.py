"""The Debian changelog connector on small handmade changelogs, and once on the machine's /usr/share/doc."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import duckdb
import pytest

from catalog.connectors.debian import DebianChangelogSource, parse_changelog
from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot
from components.core.errors import VeilError

HELLO = """hello (2.10-3) unstable; urgency=medium

  * Fix the build with GCC 14. Thanks to Carol Helper <carol@example.org>.
  * Closes: #1000.

 -- Ann Maintainer <Ann@Example.ORG>  Mon, 02 Jan 2023 13:06:21 +0100

hello (2.10-2) unstable; urgency=low

  * Bump standards.

 -- Bob Uploader <bob@example.net>  Sat, 31 Dec 2022 16:40:30 +0000

# Older entries have been removed from this changelog.
# To read the complete changelog use `apt changelog hello`.
"""

BROKEN = """broken (1.0-2) unstable; urgency=medium

  * No trailer here.

broken (1.0-1) unstable; urgency=medium

  * Trailer with a date that is no date.

 -- Dan Dev <dan@example.com>  sometime last week

Changes for broken-0.9:
  * an old free-form entry

 -- Dan Dev <dan@example.com>  Tue, 01 Jan 2019 10:00:00 +0000

broken (0.8-1) unstable; urgency=low

  * Good one.

 -- Eve Dev <eve@example.com>  Tue, 01 Jan 2019 10:00:00 +0000

broken (0.7-1) unstable; urgency=low

  * Trailer without an address.

 -- Eve Dev <https://example.com/eve>  Tue, 01 Jan 2019 10:00:00 +0000
"""


def _gz(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode() if isinstance(text, str) else text))


def _quarantine(settings):
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    try:
        return con.sql("SELECT position, reason FROM quarantine ORDER BY position").fetchall()
    finally:
        con.close()


def test_entries_users_dates_and_trailer_not_in_text():
    got = list(parse_changelog(HELLO.encode()))
    assert [e["version"] for e in got] == ["2.10-3", "2.10-2"]
    a = got[0]
    assert a["email"] == "ann@example.org" and a["name"] == "Ann Maintainer"
    assert a["ts"].startswith("2023-01-02T13:06:21+01:00")
    assert "Ann" not in a["body"] and " -- " not in a["body"] and "carol@example.org" in a["body"]


def test_bad_entries_are_quarantined_with_reason_and_line():
    got = list(parse_changelog(BROKEN.encode()))
    errs = {e["line"]: e["error"] for e in got if "error" in e}
    good = [e for e in got if "error" not in e]
    assert [e["version"] for e in good] == ["0.8-1"]
    assert errs[1].startswith("entry without trailer")
    assert errs[9].startswith("bad timestamp")
    assert errs[11].startswith("bad entry header")
    assert errs[26].startswith("bad trailer")
    assert len(errs) == 4


def test_undecodable_entry_quarantined():
    data = HELLO.encode().replace(b"Bump standards", b"Bump \xff standards")
    got = list(parse_changelog(data))
    assert [e.get("version") for e in got if "error" not in e] == ["2.10-3"]
    bad = [e for e in got if "error" in e]
    assert len(bad) == 1 and bad[0]["error"].startswith("undecodable bytes") and bad[0]["line"] == 8


def test_ingest_links_gzip_errors_and_secrets(settings, tmp_path):
    root = tmp_path / "doc"
    _gz(root / "hello" / "changelog.Debian.gz", HELLO)
    _gz(root / "broken" / "changelog.Debian.gz", BROKEN)
    # a second binary package of the same source: a link inside the tree is read once
    (root / "hello-doc").mkdir()
    os.symlink("../hello/changelog.Debian.gz", root / "hello-doc" / "changelog.Debian.gz")
    # a link out of the tree is quarantined, never read
    outside = tmp_path / "secret-outside"
    _gz(outside / "changelog.Debian.gz", HELLO.replace("Ann Maintainer <Ann@Example.ORG>", "Zed <zed@x.org>"))
    (root / "evil").mkdir()
    os.symlink(outside / "changelog.Debian.gz", root / "evil" / "changelog.Debian.gz")
    os.symlink(outside, root / "evil-dir")  # a directory link is not walked
    # not gzip after all, and a truncated one
    (root / "corrupt").mkdir()
    (root / "corrupt" / "changelog.Debian.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    (root / "trunc").mkdir()
    (root / "trunc" / "changelog.Debian.gz").write_bytes(gzip.compress(HELLO.encode())[:40])
    (root / "hello" / "README").write_text("not a changelog")

    rep = ingest_source(root, "debian-changelog", settings=settings)
    assert rep.read == rep.accepted + rep.quarantined + rep.duplicates
    assert rep.accepted == 3 and rep.users == 3  # ann, bob, eve (dan's only entries were bad)
    q = dict(_quarantine(settings))
    assert q["evil/changelog.Debian.gz"].startswith("outside the source")
    assert "corrupt gzip" in q["corrupt/changelog.Debian.gz"] and "\n" not in q["corrupt/changelog.Debian.gz"]
    assert "truncated" in q["trunc/changelog.Debian.gz"]
    assert q["broken/changelog.Debian.gz:9"].startswith("bad timestamp")
    assert rep.quarantined == 7
    assert set(rep.quarantine_reasons) == {"outside the source", "corrupt gzip stream", "truncated gzip stream",
                                          "entry without trailer", "bad timestamp", "bad entry header", "bad trailer"}
    snap = load_snapshot(settings)
    users = set(snap.records.column("user_id").to_pylist())
    assert users == {"ann@example.org", "bob@example.net", "eve@example.com"}
    assert "zed@x.org" not in users
    metas = [json.loads(m) for m in snap.records.column("metadata").to_pylist()]
    assert {m["package"] for m in metas} == {"hello", "broken"}
    assert {m["author_name"] for m in metas} >= {"Ann Maintainer"}
    assert "email:carol@example.org" in set(snap.secret_spans.column("secret_id").to_pylist())


def test_not_a_directory(settings, tmp_path):
    f = tmp_path / "changelog.Debian.gz"
    _gz(f, HELLO)
    with pytest.raises(VeilError, match="must be a directory"):
        ingest_source(f, "debian-changelog", settings=settings)
    with pytest.raises(VeilError, match="must be a directory"):
        DebianChangelogSource(f)


@pytest.mark.skipif(not Path("/usr/share/doc").is_dir() or not any(Path("/usr/share/doc").glob("*/changelog.Debian.gz")),
                    reason="no Debian changelogs on this machine")
def test_real_usr_share_doc_parses_mostly():
    src = DebianChangelogSource(Path("/usr/share/doc"))
    ok = bad = 0
    people = set()
    for _, e in src.entries():
        if "error" in e:
            bad += 1
        else:
            ok += 1
            people.add(e["email"])
            assert "@" in e["email"] and e["ts"]
    assert ok > 0 and bad <= 0.05 * (ok + bad)
    assert len(people) >= 2


def test_decompression_is_bounded(monkeypatch):
    from catalog.connectors import debian

    monkeypatch.setattr(debian, "MAX_DECOMPRESSED", 100)
    with pytest.raises(VeilError, match="too large"):
        debian._decompress(gzip.compress(HELLO.encode()))
    assert debian._decompress(b"plain text") == b"plain text"
