"""A tiny GPT-2 base directory (built from config + a small BPE tokenizer) and a 3-shard ensemble of it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
import tiny_lm_training as tiny  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pmixed-base")
    tok = tiny.make_tokenizer()
    model = tiny.make_model(seed=0, vocab=len(tok))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def tiny_people():
    return tiny.make_texts(n_users=12, per_user=(2, 5), seed=0)


@pytest.fixture(scope="session")
def tiny_ensemble_dirs(tiny_base, tmp_path_factory, tiny_people):
    from components.prediction.ensemble import ShardTraining, train_shard

    root = tmp_path_factory.mktemp("pmixed-adapters")
    users = tiny_people.column("user_id").to_pylist()
    texts = tiny_people.column("text").to_pylist()
    cfg = ShardTraining(epochs=3, learning_rate=2e-2, seq_len=32, batch_size=4, lora_r=4, lora_alpha=16)
    dirs, facts = [], []
    for i in range(3):
        mine = [t for u, t in zip(users, texts) if int(u[4:6]) % 3 == i]
        facts.append(train_shard(tiny_base, mine, cfg, root / f"s{i}"))
        dirs.append(root / f"s{i}")
    return dirs, facts
