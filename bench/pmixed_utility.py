"""Utility on the demo: next-token perplexity of PMixED vs DP-SGD (ULS) at the same person-level (ε, δ).

    VEIL_HOME=... python bench/pmixed_utility.py --dp-model models:/veil-demo/1 --pmixed models:/acme-pmixed-demo/1 [--json]

Needs a VEIL_HOME where `veil demo` (ULS, ε=8) and `veil pmixed build --policy policies/demo-pmixed.yaml`
(ε=8 over its token budget) have both run. Evaluation text: a *fresh* demo organization (generator seed 1),
so neither model trained on it. PMixED is scored as served: at every position one Poisson selection (OS
CSPRNG) and the mollified mixture at the certificate's radius (teacher forcing; the token's probability is
read from the served distribution). Rows: the public base, ULS DP-SGD, PMixED at the certificate's radius,
and the same ensemble without the mollifier (radius ∞, no privacy) as a ceiling.

Honesty notes: the evaluation scores far more positions than the 512-token budget — it measures per-token
quality at the calibrated radius, not a deployment that could answer that many tokens; and the scoring is
offline (no budget is charged).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def eval_texts(n: int) -> list[str]:
    from catalog.demo import write_demo_org

    d = Path(tempfile.mkdtemp()) / "org"
    write_demo_org(d, seed=1)
    rows = [json.loads(x) for x in (d / "org" / "messages.jsonl").read_text().splitlines() if x.strip()]
    return [r["text"] for r in rows[:n]]


def encode(tok, texts, seq_len):
    bos = [] if tok.bos_token_id is None else [int(tok.bos_token_id)]
    return [s for s in ((bos + list(ids))[:seq_len] for ids in tok(texts, add_special_tokens=False)["input_ids"])
            if len(s) >= 2]


def single_ppl(model, seqs) -> float:
    import torch

    from components.prediction.mixing import log_softmax64

    nll, n = 0.0, 0
    for s in seqs:
        with torch.inference_mode():
            lg = model(input_ids=torch.tensor([s])).logits[0, :-1].double().numpy()
        lp = log_softmax64(lg)
        nll -= float(lp[np.arange(len(s) - 1), s[1:]].sum())
        n += len(s) - 1
    return math.exp(nll / n)


def pmixed_ppl(ens, seqs, radius: float) -> float:
    import torch

    from components.prediction.mixing import log_softmax64, mixture_log, poisson_select

    nll, n = 0.0, 0
    for s in seqs:
        x = torch.tensor([s] * len(ens.rows))
        ens.model.rows = torch.tensor(ens.rows)
        with torch.inference_mode():
            lg = ens.model.model(input_ids=x).logits[:, :-1].double().numpy()  # (N+1, L−1, V)
        for t in range(len(s) - 1):
            lp0 = log_softmax64(lg[0, t], ens.temperature)
            sel = poisson_select(ens.n, ens.q)
            lp, _ = mixture_log([log_softmax64(lg[1 + i, t], ens.temperature) for i in sel], lp0, radius)
            nll -= float(lp[s[t + 1]])
            n += 1
    return math.exp(nll / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp-model", default="models:/veil-demo/1")
    ap.add_argument("--pmixed", default="models:/acme-pmixed-demo/1")
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    from components.core.settings import load_settings
    from components.modeling import load_base
    from components.prediction.release import open_ensemble, resolve
    from components.registry.mlflow_registry import load_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    s = load_settings().ensure()
    dp = load_model(args.dp_model, s)
    r = resolve(s, args.pmixed)
    ens = open_ensemble(s, r)
    cert = r["certificate"]
    base, tok = load_base(r["base_dir"])
    seqs = encode(tok, eval_texts(args.records), args.seq_len)
    doc = {
        "eval": {"records": len(seqs), "tokens": int(sum(len(x) - 1 for x in seqs)), "source": "demo org, seed 1"},
        "public_base_ppl": single_ppl(base, seqs),
        "uls_dp_sgd_ppl": single_ppl(dp.model.eval(), seqs),
        "uls_epsilon": dp.certificate["epsilon"], "uls_delta": dp.certificate["delta"],
        "pmixed_ppl": pmixed_ppl(ens, seqs, cert["ensemble"]["radius"]),
        "pmixed_epsilon": cert["epsilon"], "pmixed_delta": cert["delta"], "pmixed_token_budget": cert["token_budget"],
        "pmixed_radius": cert["ensemble"]["radius"], "shards": cert["ensemble"]["shards"],
        "q": cert["ensemble"]["subsample_rate"],
        "ensemble_no_privacy_ppl": pmixed_ppl(ens, seqs, 1e6),
    }
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    print(f"eval: {doc['eval']['records']} fresh demo records, {doc['eval']['tokens']} tokens")
    print(f"{'model':<44}{'privacy':>26}{'PPL':>9}")
    print(f"{'public base':<44}{'none needed':>26}{doc['public_base_ppl']:>9.2f}")
    print(f"{'DP-SGD (ULS), weights released':<44}{'(%.2f, %g) per person' % (doc['uls_epsilon'], doc['uls_delta']):>26}"
          f"{doc['uls_dp_sgd_ppl']:>9.2f}")
    print(f"{'PMixED, %d private tokens, r=%.3f' % (doc['pmixed_token_budget'], doc['pmixed_radius']):<44}"
          f"{'(%.2f, %g) per person' % (doc['pmixed_epsilon'], doc['pmixed_delta']):>26}{doc['pmixed_ppl']:>9.2f}")
    print(f"{'ensemble, no mollifier':<44}{'none (ε = ∞)':>26}{doc['ensemble_no_privacy_ppl']:>9.2f}")


if __name__ == "__main__":
    main()
