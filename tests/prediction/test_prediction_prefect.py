"""Shards train as a Prefect map — with the thread runner and with a Dask LocalCluster — and give the same
adapters as the plain loop (each shard depends on its own texts and the fixed seed only)."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


def test_prefect_map_thread_and_dask_match_plain(prefect_harness, tiny_base, tiny_people, tmp_path):
    from components.prediction.ensemble import ShardTraining
    from flows.pmixed import train_shards

    users = tiny_people.column("user_id").to_pylist()
    texts = tiny_people.column("text").to_pylist()
    shard_texts = [[t for u, t in zip(users, texts) if int(u[4:6]) % 2 == i] for i in range(2)]
    cfg = ShardTraining(epochs=1, learning_rate=1e-2, seq_len=32, batch_size=4, lora_r=2, lora_alpha=8)
    plain = train_shards(str(tiny_base), shard_texts, cfg, [tmp_path / f"p{i}" for i in range(2)], use_prefect=False)
    thread = train_shards(str(tiny_base), shard_texts, cfg, [tmp_path / f"t{i}" for i in range(2)], runner="thread")
    assert [f["sha256"] for f in thread] == [f["sha256"] for f in plain]
    pytest.importorskip("prefect_dask")
    dask = train_shards(str(tiny_base), shard_texts, cfg, [tmp_path / f"d{i}" for i in range(2)], runner="dask",
                        cluster_kwargs={"n_workers": 2, "threads_per_worker": 1, "processes": False})
    assert [f["sha256"] for f in dask] == [f["sha256"] for f in plain]
