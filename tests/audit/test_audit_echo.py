"""The canary echo audit of a synthetic corpus (components/audit/echo.py).

- the two statistics against a brute-force recomputation;
- the null: a corpus that never saw the canaries fails a near-zero-ε ceiling no more often than the
  interval's error allows, and its AUROC centres on 1/2;
- a tiny non-private GPT-2 (word-level, built from config) trained on the member canaries echoes them
  whole in its samples: FAILED against a small ε's ceiling; its held-out canaries echo no more than
  canaries that were never drawn (exchangeable with them, so no verdict can separate them).
"""
import math

import numpy as np
import pytest

from components.audit.canaries import VOCAB, make_canary_users
from components.audit.echo import EchoCanary, echo_audit, echo_canaries, echo_scores, public_section, words
from components.audit.verdict import FAILED
from components.core.errors import VeilError
from components.draws.audit_split import split_canaries

KEY = b"echo-test-key-0123456789abcdef!!"
PREFIXES = ["  * Fix build with", "  * New upstream release", "  * Update the", "  * Drop patch for",
            "  * Bump standards version to"]
CERT = {"privacy_unit": "user", "epsilon": 0.5, "delta": 1e-6}


def _brute(texts, suffix, alpha=1.0):
    """Longest contiguous run of `suffix` in one text; mean add-alpha bigram log-probability, the vocabulary
    being the corpus' words, the public word list and this canary's own (never the other canaries')."""
    toks = [words(t) for t in texts]
    n = len(suffix)
    run = 0
    for i in range(n):
        for j in range(i + 1, n + 1):
            g = list(suffix[i:j])
            if any(w[k:k + len(g)] == g for w in toks for k in range(len(w) - len(g) + 1)):
                run = max(run, j - i)
    vocab = {x for w in toks for x in w} | set(VOCAB) | set(suffix)
    lps = []
    for a, b in zip(suffix, suffix[1:]):
        c_ab = sum(1 for w in toks for k in range(len(w) - 1) if w[k] == a and w[k + 1] == b)
        c_a = sum(1 for w in toks for k in range(len(w) - 1) if w[k] == a)
        lps.append(math.log((c_ab + alpha) / (c_a + alpha * len(vocab))))
    return run, sum(lps) / len(lps)


def test_statistics_match_a_brute_force_count():
    rng = np.random.default_rng(0)
    small = VOCAB[:12]
    texts = [" ".join(small[i] for i in rng.integers(12, size=int(rng.integers(3, 15)))) for _ in range(40)]
    texts.append("Some PREFIX: " + " ".join(small[:5]) + ", and more")   # a planted 5-word echo
    canaries = [EchoCanary(f"c{i}", tuple(small[j] for j in rng.integers(12, size=6)), bool(i % 2))
                for i in range(10)] + [EchoCanary("planted", tuple(small[:5]) + ("zzz",), True),
                                       EchoCanary("outside", ("qqq", "zzz", "www", "zzz"), False)]
    rows = {r["user_id"]: r for r in echo_scores(texts, canaries)}
    for c in canaries:
        run, lp = _brute(texts, c.suffix)
        assert rows[c.user_id]["echoed_words"] == run
        assert rows[c.user_id]["echo"] == pytest.approx(run / len(c.suffix))
        assert rows[c.user_id]["bigram"] == pytest.approx(lp, rel=1e-12)
    assert rows["planted"]["echoed_words"] == 5
    with pytest.raises(VeilError, match="no records"):
        echo_scores([], canaries)


def test_null_corpus_fails_rarely_and_centres_on_half():
    """No canary reached the corpus: membership is a fair coin for the statistics, so at a ceiling of
    1/2 + 0.0003 (ε = 0.001) 'failed' is the interval's own one-sided error (≤ 2.5 %, Bonferroni over
    the two statistics)."""
    rng = np.random.default_rng(1)
    fails, aurocs = 0, []
    reps = 100
    for _ in range(reps):
        texts = [" ".join(VOCAB[i] for i in rng.integers(len(VOCAB), size=12)) for _ in range(60)]
        canaries = [EchoCanary(f"c{i}", tuple(VOCAB[j] for j in rng.integers(len(VOCAB), size=8)), i < 20)
                    for i in range(40)]
        rep = echo_audit(texts, canaries, {"privacy_unit": "user", "epsilon": 0.001, "delta": 0.0}, bootstrap=2)
        fails += rep["verdict"] == FAILED
        aurocs.append(rep["auroc"]["bigram"])
    assert fails <= 0.05 * reps
    assert abs(np.mean(aurocs) - 0.5) < 0.03


def test_echo_canaries_are_keyed_and_in_distribution():
    a = make_canary_users(6, 4, 0, prefixes=PREFIXES, key=KEY, substring_words=8)
    b = make_canary_users(6, 4, 0, prefixes=PREFIXES, key=KEY, substring_words=8)
    c = make_canary_users(6, 4, 0, prefixes=PREFIXES, key=b"another key", substring_words=8)
    assert a.equals(b) and not a.equals(c)                     # the suffixes depend on the plan's key
    for t in a["text"].to_pylist():
        assert any(t.startswith(p.rstrip() + " ") for p in PREFIXES)
    can = echo_canaries(a, held_out=["canary-000@canary.veil.invalid"])
    assert len(can) == 6 and [x.member for x in can] == [False] + [True] * 5
    assert all(len(x.suffix) == 8 and x.suffix[-1] == words(t)[-1] for x in can
               for t, u in zip(a["text"].to_pylist(), a["user_id"].to_pylist()) if u == x.user_id)
    assert "suffix" not in repr(can[0]) and can[0].suffix[0] not in repr(can[0])
    with pytest.raises(VeilError, match="key"):
        make_canary_users(2, 4, 0, prefixes=PREFIXES)
    with pytest.raises(VeilError, match="distinct prefixes"):
        make_canary_users(2, 8, 0, prefixes=PREFIXES, key=KEY)


def _word_model(recs):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab_words = sorted(set(VOCAB) | {w for p in PREFIXES for w in p.split()})
    tk = Tokenizer(models.WordLevel({"<|endoftext|>": 0, **{w: i + 1 for i, w in enumerate(vocab_words)}},
                                    unk_token="<|endoftext|>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg), tok


def _fit(model, tok, texts, steps):
    """Non-private full-batch Adam on the member canaries' records, each between document boundaries."""
    import torch

    seqs = [[0] + tok(t, add_special_tokens=False)["input_ids"] + [0] for t in texts]
    w = max(map(len, seqs))
    ids = torch.zeros((len(seqs), w), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def echoed():
    import torch

    from components.synthetic import Sampling, generate_records

    torch.set_num_threads(1)
    recs = make_canary_users(24, 4, 0, prefixes=PREFIXES, key=KEY, substring_words=8)
    split = split_canaries(recs.select(["record_id", "user_id", "text"]), m=1, seed=0, key=KEY)
    model, tok = _word_model(recs)
    _fit(model, tok, split.train["text"].to_pylist(), steps=80)
    corpus = [r["text"] for r in generate_records(model, tok, Sampling(records=64, seed=0, max_new_tokens=16))]
    return recs, split, corpus


def test_a_nonprivate_model_echoes_its_canaries_and_fails(echoed):
    recs, split, corpus = echoed
    canaries = echo_canaries(recs, split.held_out_users)
    rep = echo_audit(corpus, canaries, CERT, bootstrap=10)
    assert rep["users_in"] == rep["users_out"] == 12
    assert rep["verdict"] == FAILED and rep["report"]["above_ceiling"]
    assert rep["auroc"]["bigram"] > 0.95 and rep["auroc"]["echo"] > 0.95
    assert rep["means"]["members"]["echo"] > 0.8            # most members' suffixes come back whole
    assert rep["means"]["held_out"]["echo"] <= 0.25         # a held-out suffix: a common word or two by chance
    sec = public_section(rep, corpus={"certificate_sha256": "x" * 64}, model={"name": "m", "version": "1"})
    assert sec["verdict"] == FAILED and sec["canaries_in"] == [10, 20]
    assert "THE CERTIFICATE OR THE CODE IS WRONG" in " ".join(sec["reasons"])
    flat = repr(sec)
    assert not any(" ".join(c.suffix) in flat or c.user_id in flat for c in canaries)


def test_held_out_canaries_echo_like_never_drawn_ones(echoed):
    """A held-out canary was never trained on: it is exchangeable with a canary drawn afresh, so held-out
    vs fresh must not separate (the null the member/held-out test rests on)."""
    recs, split, corpus = echoed
    fresh = make_canary_users(24, 4, 1, prefixes=PREFIXES, key=b"never-drawn", substring_words=8)
    held = [c for c in echo_canaries(recs, split.held_out_users) if not c.member]
    pseudo = [EchoCanary(c.user_id, c.suffix, True) for c in held] + \
             [EchoCanary("fresh-" + c.user_id, c.suffix, False) for c in echo_canaries(fresh, [])]
    rep = echo_audit(corpus, pseudo, {"privacy_unit": "user", "epsilon": 0.001, "delta": 0.0}, bootstrap=10)
    assert rep["verdict"] != FAILED
    lo, hi = rep["report"]["auroc_interval"]
    assert lo < 0.5 < hi


def test_policy_prefixes_are_checked():
    from pydantic import ValidationError

    from components.policy.model import Canaries

    assert Canaries(users=4, records_per_user=4, prefixes=PREFIXES).prefixes == PREFIXES
    for bad, msg in ((PREFIXES[:3], "each need a distinct one"), (PREFIXES[:3] + [PREFIXES[0]], "appears twice"),
                     (PREFIXES[:3] + ["  "], "empty"), (PREFIXES[:3] + ["x" * 2001], "at most 2000")):
        with pytest.raises(ValidationError, match=msg):
            Canaries(users=4, records_per_user=4, prefixes=bad)
