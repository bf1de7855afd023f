"""The online dedup in bounded memory (catalog/dedup.py): runs past the spill size live in memory-mapped
files, merged chunk by chunk; the answers are those of a plain set, and an ingest that spills writes the
golden snapshot."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from catalog import dedup
from catalog.dedup import OnlineDedup, SortedRuns, verify_dropped
from test_ingest_golden import GOLDEN_FIRST, GOLDEN_SECOND, _digest, _ingest, lines, write


def test_spilled_runs_answer_like_a_set(tmp_path):
    rng = np.random.default_rng(1)
    runs = SortedRuns(tmp_path / "x", spill_rows=40)
    ref: set[int] = set()
    for _ in range(60):
        batch = np.unique(rng.integers(0, 5000, size=rng.integers(1, 90)).astype(np.uint64))
        new = batch[~runs.contains(batch)]
        assert set(new.tolist()) == set(batch.tolist()) - ref
        runs.add(new)
        ref |= set(new.tolist())
        q = np.unique(rng.integers(0, 5000, size=200).astype(np.uint64))
        assert runs.contains(q).tolist() == [v in ref for v in q.tolist()]
    assert any(isinstance(r, np.memmap) for r in runs.runs)              # it did spill
    assert all(np.all(np.diff(np.asarray(r).astype(np.int64)) > 0) for r in runs.runs)  # sorted, no repeats
    assert len(list(tmp_path.iterdir())) == sum(isinstance(r, np.memmap) for r in runs.runs)
    runs.close()
    assert not list(tmp_path.iterdir())                                 # spill files removed


def _ids(n, seed):
    import hashlib

    return [hashlib.sha256(f"{seed}-{i}".encode()).hexdigest() for i in range(n)]


def test_online_dedup_counts_and_verification(tmp_path):
    ids = _ids(300, 0)
    rows = ids + ids[:50] + ids[100:120]                                 # 70 later copies
    d = OnlineDedup(None, spill=tmp_path / "d", spill_rows=16)
    kept, prefixes = [], []
    for k in range(0, len(rows), 37):
        m, p = d.keep(pa.array(rows[k:k + 37]))
        kept += m.tolist()
        prefixes += p.tolist()
    assert sum(kept) == 300 and d.distinct == 300
    assert [r for r, k in zip(rows, kept) if k] == ids                   # first copies, in order
    stage = pa.table({"reason": pa.nulls(len(rows), pa.string()), "kept": kept,
                      "prefix": pa.array(np.array(prefixes, dtype=np.uint64).view(np.int64)),
                      "record_id": rows})
    assert verify_dropped(stage, None, chunk=25)
    # a dropped row whose id differs from its prefix's owner: a collision, caught
    bad = stage.set_column(3, "record_id", pa.array(rows[:-1] + [_ids(1, 9)[0]]))
    assert not verify_dropped(bad, None, chunk=25)
    d.close()
    assert not list(tmp_path.iterdir())


def test_ingest_that_spills_writes_the_golden_snapshot(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(dedup, "SPILL_ROWS", 64)
    monkeypatch.setattr(dedup, "_CHUNK", 50)
    first = _digest(settings, _ingest(settings, write(tmp_path / "a.jsonl", lines(1, 1500))))
    second = _digest(settings, _ingest(settings, write(tmp_path / "b.jsonl", lines(1, 300) + lines(2, 900))))
    assert first == GOLDEN_FIRST
    assert second == GOLDEN_SECOND
    assert not list((settings.cache_dir / "ingest-tmp").iterdir())      # spill files removed
