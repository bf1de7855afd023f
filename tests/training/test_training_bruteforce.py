"""With noise off and a fixed seed, each mode's update equals a plain loop: per-unit gradients by
ordinary autograd on one unpadded record at a time, clip, sum, ÷ expected batch (SGD, lr = 1)."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from components.training import TrainSpec, train
from components.dpsgd.sampling import PoissonSampler

warnings.filterwarnings("ignore")
LORA = {"r": 4, "alpha": 8, "dropout": 0.0}


def _record_loss(model, ids: list[int]) -> torch.Tensor:
    """Mean next-token NLL of one record, computed independently of the engine."""
    if len(ids) < 2:
        return sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits, x[0, 1:])


def _grad(model, records: list[list[int]]) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = sum(_record_loss(model, r) for r in records) / len(records)
    loss.backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters() if p.requires_grad]


def _clip(g: list[torch.Tensor], C: float | None) -> list[torch.Tensor]:
    if C is None:
        return g
    norm = float(torch.sqrt(sum((x.double() ** 2).sum() for x in g)))
    f = min(1.0, C / norm) if norm > 0 else 1.0
    return [x * f for x in g]


def _prepare(tiny_lm, lora):
    model = tiny_lm.make_model()
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(7)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM"))
        with torch.no_grad():  # make lora_B non-zero so every adapter weight gets a gradient
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
    return model


def _run_and_brute(tiny_lm, tok, tmp_path, mechanism, data, *, q=0.5, k=None, lora=LORA, mbs=3, method="auto",
                   selection=None, seq_len=24):
    """Brute force first (which also picks C = the median unit-gradient norm, so some units are
    clipped and some are not), then one engine step; returns (result, n_clipped, n_units)."""
    model = _prepare(tiny_lm, lora)
    ref = copy.deepcopy(model)
    ref.train()
    enc = [tok(t, truncation=True, max_length=seq_len)["input_ids"] for t in data.column("text").to_pylist()]
    users = data.column("user_id").to_pylist()
    user_list = sorted(set(users))
    by_user = {u: [i for i, x in enumerate(users) if x == u] for u in user_list}
    if selection == "random-chunk":
        # each user's texts, tokenized whole, EOS after each, concatenated in table order
        streams = {u: sum((tok(data.column("text")[i].as_py())["input_ids"] + [tok.eos_token_id]
                           for i in by_user[u]), []) for u in user_list}
        chosen, rng = PoissonSampler.uniform(len(user_list), q, 2024).sample(0)
        units, enc = [], []
        for ui in chosen:
            s = streams[user_list[ui]]
            starts = rng.integers(0, len(s) - seq_len + 1, size=k) if len(s) > seq_len else [0]
            units.append(list(range(len(enc), len(enc) + len(starts))))
            enc.extend(s[a:a + seq_len] for a in starts)
        expected = q * len(user_list)
    elif mechanism == "uls":
        chosen, rng = PoissonSampler.uniform(len(user_list), q, 2024).sample(0)
        units = []
        for ui in chosen:
            recs = np.array(by_user[user_list[ui]])
            if len(recs) > k:  # the engine's per-visit draw: G of the user's records, same stream
                recs = np.sort(rng.choice(recs, size=k, replace=False))
            units.append(list(recs))
        expected = q * len(user_list)
    else:
        rates = (np.asarray(data.column("rate").to_pylist()) if mechanism == "secret"
                 else np.full(data.num_rows, q))
        chosen, _ = PoissonSampler(rates, 2024).sample(0)
        units = [[int(r)] for r in chosen]
        expected = float(rates.sum())
    assert len(units) >= 2
    grads = [_grad(ref, [enc[i] for i in recs]) for recs in units]
    norms = [float(torch.sqrt(sum((x.double() ** 2).sum() for x in g))) for g in grads]
    C = float(np.median(norms)) * 0.999
    clipped = [_clip(g, None if mechanism == "nonprivate" else C) for g in grads]
    n_clipped = sum(int(n > C) for n in norms) if mechanism != "nonprivate" else 0
    want = [-sum(parts) / expected for parts in zip(*clipped)]

    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    spec = TrainSpec(mechanism=mechanism, sampling_rate=q, noise_multiplier=0.0, clip_norm=C, steps=1,
                     records_per_user=k, lora=lora, learning_rate=1.0, optimizer="sgd", seq_len=seq_len,
                     micro_batch_size=mbs, private_seed=2024, per_record=method, selection=selection)
    res = train(spec, data, model, tok, tmp_path / "run", progress=False)
    assert res.batch_max == len(units) and res.steps_run == 1
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    for b, a, w in zip(before, after, want):
        torch.testing.assert_close(a - b, w, rtol=2e-4, atol=2e-6)
    return res, n_clipped, len(units)


@pytest.mark.parametrize("method,mbs", [("mixed", 3), ("hooks", 3), ("ghost", 3), ("vmap", 3),
                                        ("mixed", 2)])  # mbs 2 < G 3: a user spans micro-batches
def test_uls_update_equals_bruteforce(tiny_lm, tiny_tokenizer, tmp_path, method, mbs):
    data = tiny_lm.make_texts(n_users=10, per_user=(1, 6), seed=3)
    res, n_clipped, n_units = _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, "uls", data, k=3, method=method,
                                             mbs=mbs)
    assert 0 < n_clipped < n_units, "C should clip some users and not others"
    assert res.expected_batch_size == pytest.approx(0.5 * 10)


def test_uls_random_chunk_update_equals_bruteforce(tiny_lm, tiny_tokenizer, tmp_path):
    data = tiny_lm.make_texts(n_users=8, per_user=(1, 6), seed=8)
    res, n_clipped, n_units = _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, "uls", data, k=2,
                                             selection="random-chunk", seq_len=12)
    assert 0 < n_clipped < n_units


@pytest.mark.parametrize("mechanism", ["record", "els", "group"])
def test_record_level_update_equals_bruteforce(tiny_lm, tiny_tokenizer, tmp_path, mechanism):
    data = tiny_lm.make_texts(n_users=6, per_user=(1, 3), seed=4)
    res, n_clipped, n_units = _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, mechanism, data,
                                             q=0.4, k=3)
    assert 0 < n_clipped < n_units


def test_secret_update_uses_per_record_rates(tiny_lm, tiny_tokenizer, tmp_path):
    data = tiny_lm.make_texts(n_users=6, per_user=(1, 3), seed=5)
    rates = np.linspace(0.0, 1.0, data.num_rows)
    data = data.append_column("rate", pa.array(rates))
    res, _, _ = _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, "secret", data, q=float(rates.mean()))
    assert res.expected_batch_size == pytest.approx(rates.sum())


def test_nonprivate_update_is_unclipped_sum(tiny_lm, tiny_tokenizer, tmp_path):
    data = tiny_lm.make_texts(n_users=5, per_user=(1, 3), seed=6)
    _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, "nonprivate", data, q=0.6)


@pytest.mark.parametrize("method", ["mixed", "hooks", "ghost", "vmap"])
def test_full_finetuning_record_update_equals_bruteforce(tiny_lm, tiny_tokenizer, tmp_path, method):
    # tied input/output embeddings, Conv1D, LayerNorm, Embedding: every layer sampler is exercised
    data = tiny_lm.make_texts(n_users=4, per_user=(1, 2), seed=7)
    res, n_clipped, n_units = _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, "record", data,
                                             q=0.5, lora=None, mbs=2, method=method)
    assert res.model_dir is not None and n_clipped > 0


@pytest.mark.parametrize("method", ["ghost", "hooks"])
def test_full_finetuning_uls_update_equals_bruteforce(tiny_lm, tiny_tokenizer, tmp_path, method):
    # users of several records: ghost norms of the tied embedding/LM head are taken over a user's
    # concatenated tokens (one-hot Gram across records, cross terms between the two uses)
    data = tiny_lm.make_texts(n_users=5, per_user=(2, 4), seed=9)
    res, n_clipped, n_units = _run_and_brute(tiny_lm, tiny_tokenizer, tmp_path, "uls", data, k=3,
                                             lora=None, mbs=6, method=method)
    assert res.model_dir is not None and 0 < n_clipped < n_units
