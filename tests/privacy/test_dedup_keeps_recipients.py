"""Within-writer dedup must not drop owners. Two copies of one mail (same sender, same words) sent to
different people are one record; under `ownership: all-participants` every recipient of any copy owns
it — the text is trained on through the kept copy, so a recipient whose copy was dropped must still be
charged for it. Holds within one ingest and across ingests into an existing catalog, and the dedup
counts stay what they were (read = accepted + quarantined + duplicates)."""
from __future__ import annotations

import json

from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot
from components.bounding.people import owners_column

ALL = {"ownership": "all-participants"}


def _mail(to: str, body: str, day: int, cc: str | None = None) -> bytes:
    return (f"From alice@x.example Mon Jan  {day} 03:04:05 2006\n"
            f"From: alice@x.example\nTo: {to}\n" + (f"Cc: {cc}\n" if cc else "") +
            f"Subject: plan\nMessage-ID: <m{day}@x.example>\nDate: Mon, {day} Jan 2006 03:04:05 +0000\n\n"
            f"{body}\n\n").encode()


def _owners(settings) -> dict[str, list[str]]:
    recs = load_snapshot(settings).records
    owners, _ = owners_column(recs, recs.column("user_id"), ALL)
    return dict(zip(recs.column("text").to_pylist(), owners.to_pylist()))


def test_a_dropped_copy_s_recipients_own_the_kept_record(settings, tmp_path):
    p = tmp_path / "m.mbox"
    p.write_bytes(_mail("bob@x.example", "the merger closes friday", 2)
                  + _mail("carol@x.example", "the merger closes friday", 3, cc="dan@x.example")
                  + _mail("bob@x.example", "lunch?", 4))
    rep = ingest_source(p, "mbox", settings=settings)
    assert (rep.read, rep.accepted, rep.quarantined, rep.duplicates) == (3, 2, 0, 1)
    assert rep.recipients_merged == 1
    owners = _owners(settings)
    assert owners["the merger closes friday"] == ["alice@x.example", "bob@x.example", "carol@x.example",
                                                  "dan@x.example"]
    assert owners["lunch?"] == ["alice@x.example", "bob@x.example"]
    meta = {r["text"]: json.loads(r["metadata"]) for r in load_snapshot(settings).records.to_pylist()}
    # kept copy's own addresses first, then each later copy's new ones in source order
    assert meta["the merger closes friday"]["to"] == ["bob@x.example", "carol@x.example"]
    assert meta["the merger closes friday"]["cc"] == ["dan@x.example"]
    assert meta["the merger closes friday"]["message_id"] == "<m2@x.example>"  # the kept copy's own


def test_recipients_of_a_copy_ingested_later_join_the_catalog_s_record(settings, tmp_path):
    a, b = tmp_path / "a.mbox", tmp_path / "b.mbox"
    a.write_bytes(_mail("bob@x.example", "the merger closes friday", 2))
    b.write_bytes(_mail("carol@x.example", "the merger closes friday", 5) + _mail("erin@x.example", "new one", 6))
    first = ingest_source(a, "mbox", settings=settings)
    rep = ingest_source(b, "mbox", settings=settings)
    assert (rep.read, rep.accepted, rep.new, rep.duplicates, rep.records) == (2, 2, 1, 0, 2)
    assert rep.recipients_merged == 1 and rep.snapshot_id != first.snapshot_id
    owners = _owners(settings)
    assert owners["the merger closes friday"] == ["alice@x.example", "bob@x.example", "carol@x.example"]
    assert owners["new one"] == ["alice@x.example", "erin@x.example"]
    # The same mails again (another path: not short-cut as already ingested): nothing grows, no new snapshot.
    c = tmp_path / "c.mbox"
    c.write_bytes(b.read_bytes())
    again = ingest_source(c, "mbox", settings=settings)
    assert again.snapshot_id == rep.snapshot_id and again.new == 0 and again.recipients_merged == 0


def test_only_new_recipients_leave_a_new_snapshot(settings, tmp_path):
    # A copy to the same people (the same mail in two folders) changes nothing: no rewrite, no new id.
    a, b = tmp_path / "a.mbox", tmp_path / "b.mbox"
    a.write_bytes(_mail("bob@x.example", "the merger closes friday", 2))
    b.write_bytes(_mail("bob@x.example", "the merger closes friday", 7))
    first = ingest_source(a, "mbox", settings=settings)
    rep = ingest_source(b, "mbox", settings=settings)
    assert rep.recipients_merged == 0 and rep.snapshot_id == first.snapshot_id and rep.new == 0
    one = tmp_path / "one.mbox"
    one.write_bytes(a.read_bytes() + b.read_bytes())
    rep2 = ingest_source(one, "mbox", settings=settings)
    assert (rep2.read, rep2.accepted, rep2.duplicates, rep2.recipients_merged) == (2, 1, 1, 0)
    assert rep2.snapshot_id == first.snapshot_id


def test_exact_dedup_path_merges_the_same_recipients(settings, tmp_path, monkeypatch):
    # The fallback taken on a 64-bit id prefix collision (forced: every prefix equal) must merge the
    # same recipients and cut the same snapshot as the online path.
    import numpy as np

    import catalog.dedup as cd
    from components.core.settings import load_settings

    p = tmp_path / "m.mbox"
    p.write_bytes(_mail("bob@x.example", "the merger closes friday", 2) + _mail("bob@x.example", "lunch?", 3)
                  + _mail("carol@x.example", "the merger closes friday", 4))
    ref = ingest_source(p, "mbox", settings=settings)
    other = load_settings(tmp_path / "other-home").ensure()
    monkeypatch.setattr(cd, "prefix64", lambda ids: np.zeros(len(ids), dtype=np.uint64))
    got = ingest_source(p, "mbox", settings=other)
    assert (got.accepted, got.duplicates, got.recipients_merged) == (ref.accepted, ref.duplicates, 1) == (2, 1, 1)
    assert got.snapshot_id == ref.snapshot_id
    assert _owners(other)["the merger closes friday"] == ["alice@x.example", "bob@x.example", "carol@x.example"]
