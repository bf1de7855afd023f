"""Tokenizer, base-model pretraining and loading (tiny settings: the whole file runs in seconds)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from catalog.demo import public_corpus
from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.modeling import build_base_model, load_base, read_base_facts, train_tokenizer

TINY = dict(vocab_size=2000, n_layer=1, n_embd=32, n_head=2, n_positions=64, steps=60, seq_len=32, batch_size=16,
            lr=5e-3, seed=3, progress=False)


@pytest.fixture(scope="module")
def texts():
    return public_corpus(np.random.default_rng(7), n_lines=300)


@pytest.fixture(scope="module")
def base_dir(texts, tmp_path_factory):
    return build_base_model(texts, tmp_path_factory.mktemp("base") / "m", **TINY)


def test_tokenizer_round_trip_and_special_tokens(texts):
    tok = train_tokenizer(texts, vocab_size=500)
    assert 258 < len(tok) <= 500
    assert tok.bos_token_id == tok.eos_token_id != tok.pad_token_id
    for s in texts[:20] + ["Hi all,\nkey AKIA0123456789ABCDEF for BLUEHERON — é, 👍,  two  spaces\ttab"]:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == s
        assert tok.bos_token_id not in ids and tok.pad_token_id not in ids
    # deterministic: same texts, same merges
    assert train_tokenizer(texts, vocab_size=500).get_vocab() == tok.get_vocab()


def test_tokenizer_rejects_bad_input():
    with pytest.raises(VeilError, match="vocab_size"):
        train_tokenizer(["a b c"], vocab_size=100)
    with pytest.raises(VeilError, match="no training text"):
        train_tokenizer([])


def test_build_base_model_learns_and_records_facts(texts, base_dir):
    facts = read_base_facts(base_dir)
    assert facts["data_sha256"] == sha256_json(texts)
    assert facts["config"]["steps"] == 60 and len(facts["losses"]) == 60
    assert facts["initial_loss"] == pytest.approx(facts["losses"][0], abs=1e-4)
    # learning happened: the end of training is well below the start and below uniform
    assert facts["final_loss"] < facts["initial_loss"] - 1.5
    assert facts["final_loss"] < facts["uniform_loss"] - 1.5
    assert facts["eval_loss_after"] < facts["eval_loss_before"] - 1.5
    for f in ("config.json", "model.safetensors", "tokenizer.json", "veil_base.json"):
        assert (base_dir / f).is_file()


def test_build_is_deterministic_for_a_seed(texts, base_dir, tmp_path):
    again = build_base_model(texts, tmp_path / "again", **TINY)
    assert read_base_facts(again)["losses"] == read_base_facts(base_dir)["losses"]
    assert (again / "tokenizer.json").read_bytes() == (base_dir / "tokenizer.json").read_bytes()
    m1, _ = load_base(base_dir)
    m2, _ = load_base(again)
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n


def test_load_base_round_trips_the_saved_model(base_dir):
    model, tok = load_base(base_dir)
    assert not model.training and model.config.model_type == "gpt2"
    assert tok.pad_token_id is not None and model.config.pad_token_id == tok.pad_token_id
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.tensor([[tok.bos_token_id] + tok("Hi team,", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model(input_ids=ids).logits
    assert out.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(out).all()


def test_load_base_bad_paths_are_clear_errors(tmp_path):
    with pytest.raises(VeilError, match="does not exist"):
        load_base(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VeilError, match="no config.json"):
        load_base(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(VeilError, match="config.json"):
        load_base(bad)
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(VeilError):
        load_base(weird)


def test_load_base_any_local_causal_lm_and_pad_fallback(texts, tmp_path):
    """A LLaMA-family directory whose tokenizer has no pad token loads, with pad := eos."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = train_tokenizer(texts, vocab_size=400)
    tok.pad_token = None
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    tok.save_pretrained(tmp_path / "llama")
    model, tok2 = load_base(tmp_path / "llama")
    assert model.config.model_type == "llama"
    assert tok2.pad_token == tok2.eos_token and model.config.pad_token_id == tok2.eos_token_id


def test_read_corpus_takes_jsonl_text_files_and_directories(tmp_path):
    import json as _json

    from components.core.errors import VeilError
    from components.modeling.public_text import read_corpus

    para = "a public paragraph long enough to be worth learning from, number "
    (tmp_path / "d" / ".hidden").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text(f"{para}1\n\n{para}2\n\nshort\n")
    (tmp_path / "d" / "b.jsonl").write_text(_json.dumps({"text": para + "3"}) + "\n\n")
    (tmp_path / "d" / ".hidden" / "c.txt").write_text(f"{para}4\n\n{para}5")
    assert read_corpus(tmp_path / "d") == [para + "1", para + "2", para + "3"]
    assert read_corpus(tmp_path / "d" / "a.txt") == [para + "1", para + "2"]
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(VeilError, match=r"bad.jsonl:1: expected a JSON object with a `text` field"):
        read_corpus(tmp_path / "bad.jsonl")
    with pytest.raises(VeilError, match="no such file or directory"):
        read_corpus(tmp_path / "missing")


def test_cli_base_model_options_progress_and_cache(tmp_path, monkeypatch):
    """`veil base-model DIR --layers --width --steps …`: the options reach the model, a non-terminal stderr gets
    plain progress lines (rich draws nothing there), and the same corpus and options reuse the build."""
    import json as _json

    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "home"))
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(" ".join(words[(i + j) % 12] for j in range(20)) for i in range(60)))
    args = ["base-model", str(corpus), "--layers", "1", "--width", "24", "--heads", "2", "--steps", "10",
            "--vocab", "300", "--seq-len", "16", "--batch-size", "2"]
    r = CliRunner().invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    doc = _json.loads(r.stdout)
    cfg = _json.loads((Path(doc["base_model"]) / "veil_base.json").read_text())["config"]
    assert (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["steps"], cfg["seq_len"]) == (1, 24, 2, 10, 16)
    assert doc["steps"] == 10 and doc["n_params"] > 0
    r2 = CliRunner().invoke(app, args + ["--steps", "11"])   # new options: a new build, with progress lines
    assert r2.exit_code == 0, r2.output
    assert "pretraining base model: 11/11" in r2.output and "base model: tokenizer on" in r2.output
    r3 = CliRunner().invoke(app, args + ["--json"])
    assert r3.exit_code == 0 and _json.loads(r3.stdout)["base_model"] == doc["base_model"]
    bad = CliRunner().invoke(app, args + ["--width", "25"])
    assert bad.exit_code == 2 and "divisible" in bad.output and "Traceback" not in bad.output
