"""The optional NER pass (catalog/ner.py): off unless a local model is configured, and the plug-in
path end to end with a TEST DOUBLE — a zero-layer BERT token classifier built here from a config,
whose weights are set by hand so that it tags exactly the words it was told to (no download, no
trained weights: it checks the plumbing — loading, offsets, label mapping, spans — not NER quality)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from catalog.ingest import ingest_source
from catalog.ner import ENV, OFF, load_ner
from catalog.snapshots import load_snapshot
from catalog.tagging import Tagger
from components.core.errors import VeilError

LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
WORDS = {"alice": (0, 1), "bob": (0, 1), "smith": (1, 2), "paris": (2, 3)}   # word -> (hidden dim, label id)


def _fake_model(path):
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.normalizers import Lowercase
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import BertConfig, BertForTokenClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    for w in ["met", "in", "today", "nothing", "here", "and", *WORDS]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = Lowercase()
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=0, num_attention_heads=1,
                     intermediate_size=8, max_position_embeddings=128, type_vocab_size=1, id2label=LABELS,
                     label2id={v: k for k, v in LABELS.items()}, hidden_dropout_prob=0.0)
    model = BertForTokenClassification(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        emb = model.bert.embeddings
        emb.LayerNorm.weight.fill_(1.0)
        model.classifier.bias[0] = 1.0                      # "O" unless a word's dimension says otherwise
        for w, (dim, label) in WORDS.items():
            emb.word_embeddings.weight[vocab[w], dim] = 1.0
            model.classifier.weight[label, dim] = 5.0
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _fake_model(tmp_path_factory.mktemp("ner-double"))


def test_off_unless_configured(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert load_ner() == (None, OFF)
    assert OFF.startswith("off:") and "not detected" in OFF


def test_a_path_that_is_not_a_model_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(VeilError, match="config.json"):
        load_ner()
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VeilError, match="not a token-classification model"):
        load_ner(tmp_path)


def test_plugin_spans_names_and_places(model_dir):
    plugin, status = load_ner(model_dir)
    assert status.startswith("on: hf:") and plugin.version.startswith("ner-")
    texts = ["Met Alice Smith in Paris today", "nothing here", None, "Bob and alice"]
    spans = Tagger(None, ner=plugin).tag(pa.array(texts, pa.string()))
    got = sorted((s.row, s.secret_id, texts[s.row][s.start:s.end], s.detector) for s in spans
                 if s.detector.startswith("ner."))
    assert got == [(0, "location:paris", "Paris", "ner.location"),
                   (0, "person_name:alice smith", "Alice Smith", "ner.person_name"),
                   (3, "person_name:alice", "alice", "ner.person_name"),
                   (3, "person_name:bob", "Bob", "ner.person_name")]
    # the model's version is part of the tagging identity (a new model re-tags on re-ingest)
    assert Tagger(None, ner=plugin).rules_sha256 != Tagger(None).rules_sha256


def test_ingest_reports_and_stores_ner_spans(model_dir, settings, tmp_path, monkeypatch):
    src = tmp_path / "m.jsonl"
    src.write_text("\n".join(json.dumps({"user": u, "text": t}) for u, t in
                             [("a@x", "lunch with Bob in Paris"), ("b@x", "nothing here at all")]) + "\n")
    monkeypatch.delenv(ENV, raising=False)
    rep = ingest_source(src, "jsonl", settings=settings, rules=None)
    assert rep.ner == OFF
    monkeypatch.setenv(ENV, str(model_dir))
    rep = ingest_source(src, "jsonl", settings=settings, rules=None)   # same data, new tagging identity
    assert rep.ner.startswith("on:") and rep.new_spans == 2
    spans = load_snapshot(settings).secret_spans
    assert sorted(spans.column("secret_id").to_pylist()) == ["location:paris", "person_name:bob"]
