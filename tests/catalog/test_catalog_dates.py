"""Dates as sources write them: RFC 2822 (mail, Debian changelogs) and other common forms parse; an
ambiguous numeric day/month order stays a bad timestamp rather than a guess."""
from __future__ import annotations

import glob
import gzip
import json
import re
from datetime import datetime, timezone

import pytest

from catalog.dates import parse_timestamp
from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot


@pytest.mark.parametrize("raw,want", [
    ("Mon, 02 Jan 2023 13:06:21 +0100", "2023-01-02T12:06:21+00:00"),
    ("Sat, 31 Dec 2022 16:40:30 -0000", "2022-12-31T16:40:30+00:00"),
    ("2 Jan 2023 13:06:21 +0100", "2023-01-02T12:06:21+00:00"),
    ("2006-01-02 15:04:05 -0700", "2006-01-02T22:04:05+00:00"),
    ("20060102T150405Z", "2006-01-02T15:04:05+00:00"),
    ("1136214245000", "2006-01-02T15:04:05+00:00"),
    ("Jan 2, 2006", "2006-01-02T00:00:00+00:00"),
    ("Mon Jan  2 15:04:05 2006 -0700", "2006-01-02T22:04:05+00:00"),
])
def test_common_formats(raw, want):
    got = parse_timestamp(raw)
    assert got is not None
    assert datetime.fromisoformat(got).astimezone(timezone.utc).isoformat() == want


@pytest.mark.parametrize("raw", ["02/01/2006", "yesterday", "2006-13-45", ""])
def test_ambiguous_or_wrong_stays_unparsed(raw):
    assert parse_timestamp(raw) is None


def _changelog_entries(limit_files=6, per_file=20):
    """(maintainer email, entry text, RFC 2822 date) from this machine's real Debian changelogs."""
    trailer = re.compile(r"^ -- (.+?) <([^>]+)>  (.+)$")
    out = []
    for f in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))[:limit_files]:
        body: list[str] = []
        for line in gzip.open(f, "rt", encoding="utf-8", errors="replace"):
            m = trailer.match(line.rstrip("\n"))
            if m:
                out.append((m.group(2), "\n".join(body).strip() or "(empty entry)", m.group(3)))
                body = []
                if len(out) % per_file == 0:
                    break
            elif line.strip():
                body.append(line.rstrip("\n"))
    return out


def test_real_debian_changelogs_ingest_with_their_dates(settings, tmp_path):
    entries = _changelog_entries()
    if len(entries) < 10:
        pytest.skip("no Debian changelogs on this machine")
    p = tmp_path / "changelogs.jsonl"
    p.write_text("".join(json.dumps({"user": u, "text": t, "date": d}) + "\n" for u, t, d in entries))
    rep = ingest_source(p, "jsonl", settings=settings, time_field="date")
    assert rep.quarantine_reasons.get("bad timestamp", 0) == 0, rep.quarantine_reasons
    recs = load_snapshot(settings).records.to_pylist()
    assert recs and all(r["created_at"] is not None for r in recs)
    want = {datetime.fromisoformat(parse_timestamp(d)) for _, _, d in entries}
    assert {r["created_at"] for r in recs} <= want
