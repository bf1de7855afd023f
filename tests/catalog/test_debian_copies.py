"""bench/user_inference_real.py puts back the within-person duplicates the catalog's ingest drops (the
same changelog shipped by several binary packages): its copy counts must be keyed exactly like the
catalog's record ids, or the `nodedup` setting would silently train on the deduplicated data."""
from __future__ import annotations

import gzip
import sys
from pathlib import Path

from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import user_inference_real as bench  # noqa: E402

ENTRY = """{pkg} ({ver}) unstable; urgency=medium

  * {what}

 -- {name} <{mail}>  Mon, 02 Jan 2023 13:06:21 +0100

"""


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()))


def test_copy_counts_match_catalog_record_ids(settings, tmp_path):
    shared = (ENTRY.format(pkg="hello", ver="2.1-1", what="New upstream release.", name="Ann", mail="ann@example.org")
              + ENTRY.format(pkg="hello", ver="2.0-1", what="Initial release.", name="Bob", mail="Bob@Example.NET"))
    other = ENTRY.format(pkg="tool", ver="1.0-1", what="Initial release.", name="Ann", mail="ann@example.org")
    root = tmp_path / "doc"
    # three binary packages ship real copies (not links) of one source's changelog
    for pkg in ("hello", "hello-doc", "hello-data"):
        _gz(root / pkg / "changelog.Debian.gz", shared)
    _gz(root / "tool" / "changelog.Debian.gz", other)

    ingest_source(root, "debian-changelog", settings=settings)
    recs = load_snapshot(settings).records
    ids = recs["record_id"].to_pylist()
    assert len(ids) == 3                      # the catalog kept one copy of each (person, entry)

    counts = bench.multiplicities(root)
    assert sorted(counts[i] for i in ids) == [1, 3, 3]
    assert set(counts) == set(ids)
    # the bench's key for a training row (user_id, text) is the record id too
    for u, t, r in zip(recs["user_id"].to_pylist(), recs["text"].to_pylist(), ids):
        assert bench.rid(u, t) == r
