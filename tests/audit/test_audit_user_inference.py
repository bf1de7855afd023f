"""The seed-003 statistic on a tiny GPT-2: a user whose style was fine-tuned in scores above the others."""
import numpy as np
import pyarrow as pa
import pytest
import torch

from _audit_tinylm import build_model, build_tokenizer, filler, finetune, with_lora
from components.audit.scoring import continuation_logprobs, sequence_logprobs
from components.audit.user_inference import score_users, user_inference_report
from components.core.errors import VeilError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(1)
    users = [f"user{i}@x.example" for i in range(6)]
    # every user writes filler words plus their own recurring sign-off (their "style")
    style = {u: f"regards from {filler(rng, 4)} team {i}" for i, u in enumerate(users)}
    tok = build_tokenizer(style.values())
    model = with_lora(build_model(tok))
    train_texts = [f"{filler(rng, 6)} . {style[users[0]]}" for _ in range(8)]
    finetune(model, tok, train_texts, steps=40)
    rows = []
    for i, u in enumerate(users):
        for _ in range(3):  # fresh attacker samples: new filler, same style, never trained on
            rows.append({"user_id": u, "text": f"{filler(rng, 6)} . {style[u]}", "member": i == 0})
    return model, tok, pa.Table.from_pylist(rows)


def test_logprob_matches_manual_token_loop(tiny):
    model, tok, _ = tiny
    text = "alpha bravo charlie delta"
    got = sequence_logprobs(model, tok, [text, "echo"], seq_len=32, batch_size=2)[0]
    ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    want = sum(lp[t - 1, ids[t]].item() for t in range(1, len(ids)))
    assert got == pytest.approx(want, rel=1e-5)
    # conditional: log p(ctx + cont) = log p(ctx) + log p(cont | ctx) when the split is a token boundary
    whole = sequence_logprobs(model, tok, ["alpha bravo charlie"], seq_len=32)[0]
    head = sequence_logprobs(model, tok, ["alpha bravo"], seq_len=32)[0]
    cond = continuation_logprobs(model, tok, ["alpha bravo"], [" charlie"], seq_len=32)[0]
    assert head + cond == pytest.approx(whole, rel=1e-5)


def test_member_scores_above_non_members(tiny):
    model, tok, samples = tiny
    scores = score_users(model, tok, samples, seq_len=64, batch_size=4)
    assert scores.column_names == ["user_id", "member", "m", "score"]
    assert scores.num_rows == 6 and scores["m"].to_pylist() == [3] * 6
    s = dict(zip(scores["user_id"].to_pylist(), scores["score"].to_pylist()))
    member = s.pop("user0@x.example")
    assert member > max(s.values()) + 1.0, (member, s)


def test_reference_equal_to_model_gives_zero(tiny):
    model, tok, samples = tiny
    scores = score_users(model, tok, samples, reference=model, seq_len=64)
    assert np.allclose(scores["score"].to_numpy(), 0.0)


def test_plain_model_needs_reference(tiny):
    _, tok, samples = tiny
    with pytest.raises(VeilError, match="reference"):
        score_users(build_model(tok), tok, samples, seq_len=64)


def test_mixed_labels_rejected(tiny):
    model, tok, _ = tiny
    bad = pa.table({"user_id": ["a", "a"], "text": ["x", "y"], "member": [True, False]})
    with pytest.raises(VeilError, match="both member and non-member"):
        score_users(model, tok, bad, seq_len=16)


def _scores(n_in, n_out, shift, seed=0):
    rng = np.random.default_rng(seed)
    s = np.r_[rng.normal(shift, 1, n_in), rng.normal(0, 1, n_out)]
    return pa.table({"user_id": [f"u{i}" for i in range(n_in + n_out)],
                     "member": [True] * n_in + [False] * n_out, "m": [1] * (n_in + n_out), "score": s})


def test_report_gating_and_ceiling_rule():
    strong = _scores(200, 200, 3.0)   # AUROC ~ 0.98
    weak = _scores(200, 200, 0.0)     # AUROC ~ 0.5
    r = user_inference_report(strong, 0.5, 1e-6, seed=0)
    assert r["auroc"] > 0.95 and r["auroc_ceiling"] == pytest.approx(0.6225, abs=1e-3)
    assert r["above_ceiling"] and r["verdict"] == "failed" and not r["passed"] and r["epsilon_lower_bound"] > 0.5
    assert len(r["failures"]) == 2
    r = user_inference_report(weak, 0.5, 1e-6, seed=0)
    assert not r["above_ceiling"] and r["verdict"] == "passed" and r["passed"]
    assert r["auroc_interval"][1] < r["auroc_ceiling"]
    assert user_inference_report(weak, 0.5, 1e-6, max_auroc=0.3)["verdict"] == "failed"
    # no user-level guarantee: no ceiling, only the policy decides; nothing to compare with: no verdict
    r = user_inference_report(strong, None, None)
    assert r["auroc_ceiling"] == 1.0 and not r["above_ceiling"] and r["verdict"] is None
    assert user_inference_report(strong, None, None, max_auroc=0.9)["verdict"] == "failed"
    # an interval that straddles the ceiling is not "clearly above": inconclusive, with the people it needs
    mid = _scores(30, 30, 0.9, seed=3)
    r = user_inference_report(mid, 1.0, 1e-6)
    lo, hi = r["auroc_interval"]
    assert lo <= r["auroc_ceiling"] < hi and not r["above_ceiling"] and r["verdict"] == "inconclusive"
    assert r["people_needed"]["in"] > 30 and r["people_needed"]["out"] > 30


def test_report_carries_no_per_user_score():
    t = _scores(50, 50, 1.0)
    r = user_inference_report(t, 2.0, 1e-5)
    flat = repr(r)
    for v in t["score"].to_pylist():
        assert repr(v) not in flat
    for u in t["user_id"].to_pylist():
        assert f"'{u}'" not in flat
    for key in ("verdict", "auroc", "auroc_interval", "auroc_ceiling", "tpr_at_fpr", "users_in", "users_out",
                "passed"):
        assert key in r


def test_auroc_by_m_grows_with_samples_and_matches_the_full_statistic():
    import numpy as np
    import pyarrow as pa

    from components.audit.metrics import auroc
    from components.audit.user_inference import aggregate_user_scores, auroc_by_m

    rng = np.random.default_rng(0)
    users, member, ratios = [], [], []
    for u in range(200):
        is_member = u % 2 == 0
        for _ in range(16):
            users.append(f"u{u:03d}")
            member.append(is_member)
            ratios.append(rng.normal(0.3 if is_member else 0.0, 1.0))
    samples = pa.table({"user_id": users, "member": member})
    sweep = auroc_by_m(samples, np.array(ratios), [1, 4, 16])
    assert [r["m"] for r in sweep] == [1, 4, 16]
    assert all(r["users_in"] == 100 and r["users_out"] == 100 for r in sweep)
    assert sweep[0]["auroc"] < sweep[1]["auroc"] < sweep[2]["auroc"]   # averaging more samples: a stronger attack
    full = aggregate_user_scores(samples, np.array(ratios))
    want = auroc(full["score"].to_numpy(), full["member"].to_numpy(zero_copy_only=False))
    assert sweep[2]["auroc"] == pytest.approx(want, abs=1e-12)           # all 16 samples: the audit's own statistic


def test_scored_positions_only_path_equals_the_full_logits_and_falls_back(tiny):
    # issue 26: exposure scoring computes the head only where a continuation is scored; with the adapter on
    # and off (the reference) it must give the full-logits numbers, and a model whose logits are not
    # head(hidden) must take the plain path
    from components.audit import scoring
    from components.audit.scoring import reference_of, token_logprob_sums

    model, tok, _ = tiny
    rng = np.random.default_rng(3)
    seqs = [list(rng.integers(0, len(tok), size=int(rng.integers(5, 40)))) for _ in range(40)]
    starts = [max(1, len(s) - int(rng.integers(1, 6))) for s in seqs]
    assert scoring._trunk_and_head(model) is not None
    fast = token_logprob_sums(model, seqs, starts, batch_size=7)
    with reference_of(model) as ref:
        fast_ref = token_logprob_sums(ref, seqs, starts, batch_size=7)
    plain_split = scoring._trunk_and_head
    try:
        scoring._trunk_and_head = lambda m: None
        plain = token_logprob_sums(model, seqs, starts, batch_size=7)
        with reference_of(model) as ref:
            plain_ref = token_logprob_sums(ref, seqs, starts, batch_size=7)
    finally:
        scoring._trunk_and_head = plain_split
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(fast_ref, plain_ref, rtol=1e-5, atol=1e-4)
    assert np.abs(fast - fast_ref).max() > 1e-3          # the adapter does change the scores

    class Scaled(torch.nn.Module):        # logits = 2·head(hidden): the split would be wrong, so it is not used
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_base_model(self):
            return self.inner.get_base_model()

        def forward(self, **kw):
            out = self.inner(**kw)
            out.logits = out.logits * 2
            return out

    scaled = Scaled(model)
    with torch.inference_mode():
        ids = torch.tensor([seqs[0]])
        want = torch.log_softmax(scaled(input_ids=ids).logits[0, :-1].float(), -1)
    want_sum = sum(want[t - 1, seqs[0][t]].item() for t in range(starts[0], len(seqs[0])))
    assert token_logprob_sums(scaled, seqs[:1], starts[:1])[0] == pytest.approx(want_sum, rel=1e-5)
