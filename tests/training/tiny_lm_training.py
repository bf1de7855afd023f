"""Tiny GPT-2 + byte-level BPE tokenizer for the training tests (and a CLI worker for the
subprocess tests: SIGKILL/resume and torchrun). Imported by path from conftest, run as a script."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def make_texts(n_users: int = 12, per_user=(1, 6), seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    users, texts = [], []
    for u in range(n_users):
        for _ in range(int(rng.integers(per_user[0], per_user[1] + 1))):
            n = int(rng.integers(3, 14))
            users.append(f"user{u:02d}@acme.example")
            texts.append(" ".join(rng.choice(WORDS, size=n)) + f" from user{u}")
    return pa.table({"user_id": users, "text": texts})


def make_tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    corpus = [" ".join(WORDS)] * 4 + [f"from user{u}" for u in range(40)]
    bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    return tok


def make_model(seed: int = 0, vocab: int = 300):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def trainable_state(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def worker(argv: list[str]) -> None:
    """argv: out_dir spec_json [sleep_per_step [data.parquet]]. Trains (on make_texts(), or the
    parquet's table with its schema metadata) and writes final trainable params."""
    import time
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from components.training import TrainSpec, train

    out_dir, spec_json = Path(argv[0]), json.loads(argv[1])
    pause = float(argv[2]) if len(argv) > 2 else 0.0
    spec = TrainSpec(**spec_json)
    model = make_model()
    if len(argv) > 3:
        import pyarrow.parquet as pq

        data = pq.read_table(argv[3])
    else:
        data = make_texts()
    res = train(spec, data, model, make_tokenizer(), out_dir, progress=False,
                on_step=(lambda s: time.sleep(pause)) if pause else None)
    import os

    from components.training.sharding import full_state

    # sharded (fsdp): every rank gathers the whole weights (a collective), rank 0 writes them
    params = full_state([(n, p) for n, p in model.named_parameters() if p.requires_grad])
    if int(os.environ.get("RANK", "0")) == 0:
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
        torch.save({"params": params, "result": res.to_dict(), "local_numel": local}, out_dir / "final.pt")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    worker(sys.argv[1:])
