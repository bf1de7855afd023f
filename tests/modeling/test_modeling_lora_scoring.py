"""LoRA target detection per architecture, and sequence log-likelihoods against a manual computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from catalog.demo import public_corpus
from components.core.errors import VeilError
from components.modeling import (attach_lora, lora_config, lora_target_modules, perplexity_scores,
                                 sequence_logprobs, train_tokenizer)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(public_corpus(np.random.default_rng(1), n_lines=200), vocab_size=400)


def _gpt2(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id)).eval()


def _llama_like(cls_name: str, cfg_name: str, tok):
    import transformers

    cfg = getattr(transformers, cfg_name)(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                          max_position_embeddings=64)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(cfg).eval()


def test_lora_targets_gpt2(tok):
    model = _gpt2(tok)
    assert lora_target_modules(model) == ["c_attn", "c_proj"]
    cfg = lora_config(r=4, alpha=8, model=model)
    assert sorted(cfg.target_modules) == ["c_attn", "c_proj"] and cfg.fan_in_fan_out
    ids = torch.tensor([[tok.bos_token_id] + tok("Hi all, the queue is green", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    peft_model = attach_lora(model, lora_config(r=4, alpha=8), seed=0)  # targets resolved at attach time
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".c_attn.lora_A" in n for n in trainable) and any("mlp.c_proj.lora_A" in n for n in trainable)
    with torch.no_grad():  # B starts at zero: the adapted model is the base model
        assert torch.allclose(peft_model(input_ids=ids).logits, before, atol=1e-6)
        with peft_model.disable_adapter():
            assert torch.allclose(peft_model(input_ids=ids).logits, before, atol=1e-6)


def test_lora_targets_llama_and_fallback(tok):
    llama = _llama_like("LlamaForCausalLM", "LlamaConfig", tok)
    assert lora_target_modules(llama) == ["q_proj", "v_proj"]
    pm = attach_lora(llama, lora_config(), seed=0)
    names = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert names and all(("q_proj" in n or "v_proj" in n) for n in names)
    # an architecture not in the table: every Linear except the output head
    olmo = _llama_like("OlmoForCausalLM", "OlmoConfig", tok)
    got = lora_target_modules(olmo)
    assert got == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert "lm_head" not in got


def test_lora_seed_reproducible_and_bad_input(tok):
    a = attach_lora(_gpt2(tok), lora_config(r=2), seed=5)
    b = attach_lora(_gpt2(tok), lora_config(r=2), seed=5)
    sa = {n: p for n, p in a.named_parameters() if "lora_A" in n}
    sb = {n: p for n, p in b.named_parameters() if "lora_A" in n}
    assert sa and all(torch.equal(sa[n], sb[n]) for n in sa)
    with pytest.raises(VeilError, match="not found"):
        attach_lora(_gpt2(tok), lora_config(target_modules=["q_proj"]))
    with pytest.raises(VeilError, match="r must"):
        lora_config(r=0)
    with pytest.raises(VeilError, match="dropout"):
        lora_config(dropout=1.5)


def _manual_logprob(model, tok, text: str, seq_len: int) -> tuple[float, int]:
    ids = ([tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"])[:seq_len]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return float(sum(logp[t - 1, ids[t]] for t in range(1, len(ids)))), len(ids) - 1


def test_sequence_logprobs_matches_manual_computation(tok):
    model = _gpt2(tok)
    texts = ["Hi team, the nightly batch job failed again.",
             "ok",
             "A much longer message about the data pipeline and the staging cluster that keeps going " * 3]
    got, counts = sequence_logprobs(model, tok, texts, seq_len=40, batch_size=3, return_counts=True)
    for i, t in enumerate(texts):
        want, n = _manual_logprob(model, tok, t, 40)
        assert got[i] == pytest.approx(want, rel=1e-5, abs=1e-4)
        assert counts[i] == n
    assert counts[2] == 39  # truncated to seq_len tokens, BOS included
    # padding does not leak into scores: one at a time gives the same numbers
    single = sequence_logprobs(model, tok, texts, seq_len=40, batch_size=1)
    np.testing.assert_allclose(single, got, rtol=1e-5, atol=1e-4)
    ppl = perplexity_scores(model, tok, texts, seq_len=40, batch_size=2)
    np.testing.assert_allclose(ppl, np.exp(-got / counts), rtol=1e-6)
    assert (ppl > 1).all()


def test_scoring_restores_mode_and_rejects_empty(tok):
    model = _gpt2(tok).train()
    sequence_logprobs(model, tok, ["hello there"], seq_len=16)
    assert model.training
    with pytest.raises(VeilError, match="no token"):
        perplexity_scores(model, tok, ["fine text", ""], seq_len=16)
    assert sequence_logprobs(model, tok, [], seq_len=16).shape == (0,)
