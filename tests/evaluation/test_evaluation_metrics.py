"""evaluate_texts against a hand computation: one unbatched forward per text, token by token."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from catalog.demo import public_corpus
from components.core.errors import VeilError
from components.evaluation import EvalResult, evaluate_texts
from components.modeling import attach_lora, lora_config, train_tokenizer

from _hand import by_hand as _by_hand  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(public_corpus(np.random.default_rng(1), n_lines=200), vocab_size=400)


@pytest.fixture(scope="module")
def model(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id)).eval()


TEXTS = ["Hi all, the build queue is green again.",
         "x",
         "Quarterly review moved to Thursday; bring the numbers and the plots " * 4,  # longer than max_length
         "ok then",
         "Deploy at noon."]


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_matches_hand_computation(model, tok, batch_size):
    mean_nll, acc, n = _by_hand(model, tok, TEXTS, max_length=24)
    r = evaluate_texts(model, tok, TEXTS, max_length=24, batch_size=batch_size)
    assert isinstance(r, EvalResult)
    assert r.tokens == n and r.records == len(TEXTS)
    assert r.mean_nll == pytest.approx(mean_nll, rel=1e-5)
    assert r.perplexity == pytest.approx(math.exp(mean_nll), rel=1e-5)
    assert r.next_token_accuracy == pytest.approx(acc, abs=1e-12)
    # token-weighted, not a mean of per-text perplexities: the long text dominates
    assert r.tokens > 24


def test_truncation_and_determinism(model, tok):
    long = evaluate_texts(model, tok, TEXTS[2:3], max_length=16)
    assert long.tokens == 15  # 16 tokens in all with BOS, 15 predicted
    a = evaluate_texts(model, tok, TEXTS, max_length=24, batch_size=2)
    b = evaluate_texts(model, tok, list(reversed(TEXTS)), max_length=24, batch_size=5)
    assert a.tokens == b.tokens and a.next_token_accuracy == b.next_token_accuracy
    assert a.mean_nll == pytest.approx(b.mean_nll, rel=1e-9)


def test_training_mode_restored_and_adapter(model, tok):
    model.train()
    try:
        evaluate_texts(model, tok, TEXTS, max_length=24)
        assert model.training
    finally:
        model.eval()
    import copy

    pm = attach_lora(copy.deepcopy(model), lora_config(r=4, alpha=8), seed=0).eval()  # LoRA dropout off
    with torch.no_grad():  # move the adapter away from zero: the peft model is a different model
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    base = evaluate_texts(model, tok, TEXTS, max_length=24)
    adapted = evaluate_texts(pm, tok, TEXTS, max_length=24)
    assert adapted.mean_nll != pytest.approx(base.mean_nll, rel=1e-4)
    assert adapted.mean_nll == pytest.approx(_by_hand(pm, tok, TEXTS, 24)[0], rel=1e-5)
    with pm.disable_adapter():
        assert evaluate_texts(pm, tok, TEXTS, max_length=24).mean_nll == pytest.approx(base.mean_nll, rel=1e-6)


def test_bad_inputs(model, tok):
    with pytest.raises(VeilError, match="no texts"):
        evaluate_texts(model, tok, [], max_length=24)
    with pytest.raises(VeilError, match="has a token to predict"):
        evaluate_texts(model, tok, ["", ""], max_length=24)
    with pytest.raises(VeilError, match="not a string"):
        evaluate_texts(model, tok, ["a", None], max_length=24)
    with pytest.raises(VeilError, match="seq_len"):
        evaluate_texts(model, tok, ["abc"], max_length=1)


def test_broken_weights_are_one_line(model, tok):
    import copy

    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.raises(VeilError, match="weights are broken"):
        evaluate_texts(broken, tok, TEXTS, max_length=24)


def test_token_capped_batches_match_hand_computation(model, tok):
    """Batches capped in padded tokens (issue 26: bigger batches, bounded memory) score every text
    exactly as the hand computation does; each batch respects both caps."""
    from components.modeling.scoring import _batches, token_statistics

    lengths = [3, 24, 5, 24, 2, 9]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    got = _batches(order, lengths, batch_size=4, max_tokens=30)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 4 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 30) for b in got)
    assert got[-1] == [1] or got[-1] == [3]      # a 24-token text alone: two of them exceed 30 tokens
    mean_nll, acc, n = _by_hand(model, tok, TEXTS, max_length=24)
    sums, counts, correct = token_statistics(model, tok, TEXTS, 24, 64, max_batch_tokens=30)
    assert int(counts.sum()) == n
    assert -sums.sum() / n == pytest.approx(mean_nll, rel=1e-5)
    assert correct.sum() / n == pytest.approx(acc, abs=1e-12)
