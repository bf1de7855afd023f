"""Secret exposure ranks a memorised secret first; canary users are well formed."""
import json
import math

import numpy as np
import pytest
import torch

from _audit_tinylm import build_model, build_tokenizer, filler, finetune, with_lora
from components.audit.canaries import canary_probes, is_canary, make_canary_users
from components.audit.exposure import SecretProbe, exposure_summary, probes_from_spans, secret_exposure, shape_of
from components.core.errors import VeilError

torch.set_num_threads(1)
KEY = "AKIA7Q2ZK4M9XW3B8N5C"
CTX = "aws access key for the billing job: "


@pytest.fixture(scope="module")
def memorised():
    rng = np.random.default_rng(2)
    tok = build_tokenizer()
    model = with_lora(build_model(tok, seed=1))
    texts = [CTX + KEY] * 4 + [filler(rng, 10) for _ in range(4)]
    finetune(model, tok, texts, steps=60, lr=1e-2)
    return model, tok


def test_shapes_keep_fixed_parts_and_classes():
    rng = np.random.default_rng(0)
    for value, pattern in [(KEY, r"AKIA[0-9A-Z]{16}"), ("acme_live_" + "a1" * 12, r"acme_live_[0-9a-f]{24}"),
                           ("+1-555-013-4567", r"\+1-555-\d{3}-\d{4}"),
                           ("maria.okafor@acme-corp.example", r"[a-z]{5}\.[a-z]{6}@acme-corp\.example"),
                           ("KESTREL", r"[A-Z]{7}"), ("v2-build-77", r"[a-z]\d-[a-z]{5}-\d\d")]:
        import re
        for _ in range(20):
            assert re.fullmatch(pattern, shape_of(value).sample(rng)), value


def test_memorised_secret_ranks_first(memorised):
    model, tok = memorised
    probes = [SecretProbe("credential:" + KEY, "credential", KEY, CTX),
              SecretProbe("phone:+1-555-013-4567", "phone", "+1-555-013-4567", "call me on ")]
    rows = secret_exposure(model, tok, probes, n_candidates=63, seed=0, seq_len=64, batch_size=32)
    top = rows[0]
    assert top["secret_class"] == "credential" and top["rank"] == 1
    assert top["exposure"] == pytest.approx(math.log2(64))
    assert top["excess_exposure"] > 2 and top["exposure_extrapolated"] > 6
    flat = json.dumps(rows)
    assert KEY not in flat and "555-013" not in flat  # values never in the rows
    s = exposure_summary(rows)
    assert s["n_secrets"] == 2 and s["max_exposure"] == pytest.approx(6.0)
    assert set(s["by_class"]) == {"credential", "phone"} and KEY not in json.dumps(s)
    # refs are keyed: stable with the same key, different with another
    again = secret_exposure(model, tok, probes[:1], n_candidates=7, seq_len=64, ref_key=b"k")
    assert again[0]["secret_ref"] == secret_exposure(model, tok, probes[:1], n_candidates=7, seq_len=64,
                                                     ref_key=b"k")[0]["secret_ref"]
    assert again[0]["secret_ref"] != secret_exposure(model, tok, probes[:1], n_candidates=7, seq_len=64,
                                                     ref_key=b"j")[0]["secret_ref"]


def test_probes_from_spans():
    import pyarrow as pa
    recs = pa.table({"record_id": ["r1", "r2"], "text": ["line one\nkey: " + KEY + " ok", "no secret"]})
    spans = pa.table({"record_id": ["r1", "r1"], "secret_id": ["credential:" + KEY, "codename:X"],
                      "secret_class": ["credential", "codename"], "start": [14, 0], "end": [34, 10]})
    probes = probes_from_spans(recs, spans)
    assert [(p.value, p.context) for p in probes] == [(KEY, "key: ")]
    assert probes_from_spans(recs, spans, record_ids=["r2"]) == []


def test_canary_users_are_well_formed_and_deterministic():
    a = make_canary_users(4, 5, seed=1, substring_words=6)
    b = make_canary_users(4, 5, seed=1, substring_words=6)
    assert a.equals(b) and a.num_rows == 20
    assert not a.equals(make_canary_users(4, 5, seed=2, substring_words=6))
    users = a["user_id"].to_pylist()
    assert len(set(users)) == 4 and all(is_canary(u) for u in users)
    assert len(set(a["record_id"].to_pylist())) == 20
    subs = {}
    for u, t, md in zip(users, a["text"].to_pylist(), a["metadata"].to_pylist()):
        s = json.loads(md)["substring"]
        assert len(s.split(" ")) == 6 and s in t  # every record of a canary carries its substring
        subs.setdefault(u, set()).add(s)
    assert all(len(v) == 1 for v in subs.values()) and len({next(iter(v)) for v in subs.values()}) == 4
    pool = [f"base text number {i} about the weather" for i in range(10)]
    c = make_canary_users(2, 3, seed=0, texts=pool)
    assert all(any(t.replace(json.loads(m)["substring"], "").split() == p.split() for p in pool)
               for t, m in zip(c["text"].to_pylist(), c["metadata"].to_pylist()))
    with pytest.raises(VeilError):
        make_canary_users(2, 30, seed=0, texts=pool)
    probes = canary_probes(a)
    assert len(probes) == 4
    for u, p in probes:
        text = next(t for uu, t in zip(users, a["text"].to_pylist()) if uu == u)
        assert p.context + p.value in text and len(p.value.split()) == 4
