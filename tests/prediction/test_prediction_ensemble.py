"""The ensemble engine with real (tiny) models: one forward per token, mixing equals the per-model path."""
from __future__ import annotations

import random

import numpy as np
import torch

from components.prediction.ensemble import Ensemble, dir_sha256


def test_shards_train_deterministically_and_hash(tiny_base, tiny_ensemble_dirs, tmp_path, tiny_people):
    from components.prediction.ensemble import ShardTraining, train_shard

    dirs, facts = tiny_ensemble_dirs
    assert all(f["steps"] > 0 for f in facts)
    assert [dir_sha256(d) for d in dirs] == [f["sha256"] for f in facts]
    users = tiny_people.column("user_id").to_pylist()
    texts = tiny_people.column("text").to_pylist()
    mine = [t for u, t in zip(users, texts) if int(u[4:6]) % 3 == 0]
    cfg = ShardTraining(epochs=3, learning_rate=2e-2, seq_len=32, batch_size=4, lora_r=4, lora_alpha=16)
    again = train_shard(tiny_base, mine, cfg, tmp_path / "again")
    from safetensors.torch import load_file
    w1 = load_file(str(dirs[0] / "adapter_model.safetensors"))
    w2 = load_file(str(tmp_path / "again" / "adapter_model.safetensors"))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert again["records"] == facts[0]["records"]


def test_mixed_batch_forward_equals_each_model_alone(tiny_base, tiny_ensemble_dirs):
    """The batched mixed-adapter forward with KV cache gives each member's own next-token logits."""
    from peft import PeftModel

    from components.modeling import load_base

    dirs, _ = tiny_ensemble_dirs
    ens = Ensemble(tiny_base, dirs, radius=0.5, q=0.5)
    ids = ens.encode("alpha bravo charlie")
    x = torch.tensor([ids] * len(ens.rows))
    logits, cache = ens._forward(x, None, ens.rows)
    logits2, _ = ens._forward(torch.tensor([[5]] * len(ens.rows)), cache, ens.rows)
    base, _ = load_base(tiny_base)
    with torch.inference_mode():
        ref0 = base(input_ids=torch.tensor([ids + [5]])).logits[0, -1].double().numpy()
    assert np.allclose(logits2[0], ref0, atol=1e-4)
    for i, d in enumerate(dirs):
        m, _ = load_base(tiny_base)
        m = PeftModel.from_pretrained(m, str(d)).eval()
        with torch.inference_mode():
            ref = m(input_ids=torch.tensor([ids + [5]])).logits[0, -1].double().numpy()
        assert np.allclose(logits2[1 + i], ref, atol=1e-4)
    assert not np.allclose(logits2[1], logits2[0], atol=1e-3)  # the adapters did learn something


def test_generate_charges_before_every_private_token_then_falls_back(tiny_base, tiny_ensemble_dirs):
    dirs, _ = tiny_ensemble_dirs
    ens = Ensemble(tiny_base, dirs, radius=0.5, q=0.5)
    budget = {"left": 3, "calls": 0}

    def charge():
        budget["calls"] += 1
        if budget["left"] <= 0:
            return False
        budget["left"] -= 1
        return True

    out = ens.generate("alpha bravo", 8, charge=charge, rng=random.Random(0))
    assert out["private_tokens"] == min(3, len(out["ids"]))
    assert out["private_tokens"] + out["public_tokens"] == len(out["ids"])
    # nothing about λ, S or p; `refused`: whether the budget said no (it did iff fewer than 8 were private)
    assert set(out) == {"ids", "text", "private_tokens", "public_tokens", "refused"}
    assert out["refused"] == (budget["calls"] > 3)

    # a synthetic corpus stops at the first refusal instead (no public tail): what was drawn, all charged
    budget.update(left=2, calls=0)
    out = ens.generate("alpha bravo", 8, charge=charge, rng=random.Random(0), stop_when_refused=True)
    assert out["public_tokens"] == 0 and out["private_tokens"] == len(out["ids"]) <= 2
    assert out["refused"] == (len(out["ids"]) == 2 and budget["calls"] == 3)


def test_leave_one_shard_out_on_real_prompts_respects_the_bound(tiny_base, tiny_ensemble_dirs):
    """Real next-token distributions of the trained members on real prompts: replace each member by
    another member or by the public base (what re-training its shard without one person could give) and
    check every order's divergence of the exact served distributions against the certificate's curve."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "privacy"))
    from _pmixed_exact import dinf, renyi, served

    from components.prediction.mechanism import ORDERS, token_epsilon, token_rdp
    from components.prediction.mixing import log_softmax64

    dirs, _ = tiny_ensemble_dirs
    ens = Ensemble(tiny_base, dirs, radius=0.5, q=0.5)
    worst = 0.0
    for prompt in ("alpha bravo", "from user3", "tango uniform victor", "zulu"):
        ids = ens.encode(prompt)
        logits, _ = ens._forward(torch.tensor([ids] * len(ens.rows)), None, ens.rows)
        p0 = np.exp(log_softmax64(logits[0]))
        members = [np.exp(log_softmax64(z)) for z in logits[1:]]
        for r in (0.1, 1.0, 3.0):
            for q in (1.0, 0.3):
                P = served(members, p0, q, r)
                for i in range(len(members)):
                    for alt in [p0] + [m for j, m in enumerate(members) if j != i]:
                        other = list(members)
                        other[i] = alt
                        Pp = served(other, p0, q, r)
                        eps = token_epsilon(q, r)
                        worst = max(worst, max(dinf(P, Pp), dinf(Pp, P)) / eps)
                        for a, c in zip(ORDERS, token_rdp(q, r)):
                            d = max(renyi(P, Pp, a), renyi(Pp, P, a))
                            assert d <= c * (1 + 1e-9) + 1e-15
    assert worst <= 1 + 1e-9
