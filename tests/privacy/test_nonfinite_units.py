"""One person's non-finite gradient must not make the release distinguishable (issue 11, item 8).

One unit's data is made to produce NaN/inf (a forward hook poisons the embedding output of any
record holding a token only that unit uses). The noisy update must equal — same private seed, same
noise — the update of a run in which that unit contributes an exact zero (its records replaced by
one-token records, whose loss and gradient are 0), and be finite. On the old engine the whole
update was NaN.
"""
from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from components.core.errors import VeilError
from components.training import TrainSpec, train

warnings.filterwarnings("ignore")
_spec = importlib.util.spec_from_file_location(
    "tiny_lm_training", Path(__file__).resolve().parents[1] / "training" / "tiny_lm_training.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

LORA = {"r": 4, "alpha": 8, "dropout": 0.0}
POISON_WORDS = "zulu yankee"


@pytest.fixture(scope="module")
def tok():
    return tiny.make_tokenizer()


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _data(n_users=6, per_user=(1, 3), seed=0, poison_records=2):
    """user00 (first in sorted order, so also in the engine's self-check) holds the poison words."""
    rng = np.random.default_rng(seed)
    words = [w for w in tiny.WORDS if w not in POISON_WORDS.split()]
    users, texts = [], []
    for u in range(n_users):
        n = poison_records if u == 0 else int(rng.integers(per_user[0], per_user[1] + 1))
        for _ in range(n):
            body = " ".join(rng.choice(words, size=int(rng.integers(3, 9))))
            users.append(f"user{u:02d}@acme.example")
            texts.append(f"{POISON_WORDS} {body}" if u == 0 else body)
    return pa.table({"user_id": users, "text": texts})


def _poison_token(tok, data) -> int:
    users, texts = data.column("user_id").to_pylist(), data.column("text").to_pylist()
    mine = set().union(*(tok(t)["input_ids"][:24] for u, t in zip(users, texts) if u == users[0]))
    others = set().union(*(tok(t)["input_ids"] for u, t in zip(users, texts) if u != users[0]))
    only = sorted(mine - others)
    assert only, "the poison words must tokenize to a token no other user has"
    return only[0]


def _silenced(data):
    """The same table with user00's records replaced by one-token records (loss 0, gradient 0)."""
    users = data.column("user_id").to_pylist()
    texts = ["a" if u == users[0] else t for u, t in zip(users, data.column("text").to_pylist())]
    return data.set_column(data.column_names.index("text"), "text", pa.array(texts))


def _poison(model, token: int, value: float):
    emb = model.get_input_embeddings()

    def hook(module, inputs, output):
        hit = (inputs[0] == token).any(-1)
        return torch.where(hit.view(-1, *([1] * (output.dim() - 1))), torch.full_like(output, value), output)

    return emb.register_forward_hook(hook)


def _run(tok, tmp, data, *, mechanism, method, poison, value=float("nan"), lora=LORA, mbs=4, k=3, q=1.0, steps=1):
    model = tiny.make_model()
    token = _poison_token(tok, _data())
    handle = _poison(model, token, value) if poison else None
    spec = TrainSpec(mechanism=mechanism, sampling_rate=q, noise_multiplier=0.7, clip_norm=0.05, steps=steps,
                     records_per_user=k if mechanism in ("uls", "els", "group") else None, lora=lora,
                     learning_rate=1.0, optimizer="sgd", seq_len=24, micro_batch_size=mbs, private_seed=99,
                     per_record=method)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = train(spec, data, model, tok, tmp, progress=False)
    if handle is not None:
        handle.remove()
    after = {n: p.detach().clone() for n, p in model.named_parameters() if n in before or "lora" in n}
    return res, {n: a - before.get(n, torch.zeros_like(a)) for n, a in after.items()}


CASES = [  # (mechanism, per-record method, micro-batch size, lora)
    ("uls", "mixed", 4, LORA), ("uls", "hooks", 4, LORA), ("uls", "ghost", 4, LORA), ("uls", "vmap", 4, LORA),
    ("uls", "mixed", 2, LORA),            # micro-batch 2 < G 3: the poisoned user spans micro-batches
    ("uls", "ghost", 6, None),            # full fine-tuning: ghost norms of the tied embedding / LM head
    ("record", "mixed", 4, LORA), ("record", "vmap", 4, LORA), ("record", "ghost", 3, None),
    ("els", "mixed", 4, LORA), ("group", "hooks", 4, LORA), ("secret", "mixed", 4, LORA),
]


@pytest.mark.parametrize("mechanism,method,mbs,lora", CASES)
def test_nonfinite_unit_contributes_exactly_zero(tok, tmp_path, mechanism, method, mbs, lora):
    data = _data()
    if mechanism == "secret":
        data = data.append_column("rate", pa.array(np.full(data.num_rows, 0.999)))
    res_a, upd_a = _run(tok, tmp_path / "a", data, mechanism=mechanism, method=method, poison=True, mbs=mbs,
                        lora=lora, q=0.999 if mechanism == "secret" else 1.0)
    res_b, upd_b = _run(tok, tmp_path / "b", _silenced(data), mechanism=mechanism, method=method, poison=False,
                        mbs=mbs, lora=lora, q=0.999 if mechanism == "secret" else 1.0)
    assert res_a.steps_run == 1 and res_a.batch_max == res_b.batch_max
    for n in upd_b:
        assert torch.isfinite(upd_a[n]).all(), f"{n}: update is not finite"
        torch.testing.assert_close(upd_a[n], upd_b[n], rtol=1e-4, atol=1e-6, msg=n)
    # the count of dropped units is kept, privately: never in what the stage returns or prints
    expected_bad = 1 if mechanism == "uls" else 2  # user00's two records are two units below ULS
    assert res_a.nonfinite_units == expected_bad and res_b.nonfinite_units == 0
    assert "nonfinite_units" not in res_a.public_dict() and "losses" not in res_a.public_dict()
    assert json.loads((tmp_path / "a" / "train_result.json").read_text())["nonfinite_units"] == expected_bad


def test_infinite_gradient_is_dropped_too(tok, tmp_path):
    data = _data()
    _, upd_a = _run(tok, tmp_path / "a", data, mechanism="uls", method="mixed", poison=True, value=float("inf"))
    _, upd_b = _run(tok, tmp_path / "b", _silenced(data), mechanism="uls", method="mixed", poison=False)
    for n in upd_b:
        torch.testing.assert_close(upd_a[n], upd_b[n], rtol=1e-4, atol=1e-6, msg=n)


def test_model_with_nonfinite_weights_stops_with_one_line(tok, tmp_path):
    """Every unit is then non-finite and dropped; the noisy update is finite but the weights are not.
    The check reads only released values (post-processing) and stops with a one-line error."""
    model = tiny.make_model()
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight[0, 0] = float("nan")
    spec = TrainSpec(mechanism="record", sampling_rate=1.0, noise_multiplier=0.7, clip_norm=0.05, steps=2,
                     lora=None, learning_rate=1.0, optimizer="sgd", seq_len=24, private_seed=1)
    with pytest.raises(VeilError) as e:
        train(spec, _data(), model, tok, tmp_path / "run", progress=False)
    assert "not finite" in str(e.value) and "\n" not in str(e.value)
