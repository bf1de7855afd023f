"""Tokens/s: PMixED serving (N adapters + public, one mixed-adapter forward per token) vs plain generation
with one adapter, same model, same machine, one run.

    python bench/pmixed.py                          # CPU defaults: demo-sized GPT-2, N=8, q=0.3 (E|S|=2.4)
    python bench/pmixed.py --layers 12 --d-model 768 --vocab 16000 --device cuda
    python bench/pmixed.py --json

Both paths use the same sampler (float64 log-softmax, CSPRNG inverse-CDF draw) and a KV cache. PMixED runs
every member at every token (constant work, no timing signal about the selection; docs/privacy/pmixed.md),
so its cost grows with N, not with E|S_t|. Rows: single adapter; PMixED without the durable charge (the
mechanism alone); with a durable SQLite commit per token; with commits in blocks of 8 (what the endpoint
does: every token committed before it is drawn, ≤ 7 wasted per request).
Target (issue 15): PMixED per-token latency ≤ 3 × single at E|S_t| ≈ 2–3.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(args, root: Path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    from components.modeling import attach_lora, lora_config, train_tokenizer

    logging.set_verbosity_error()
    rng = random.Random(0)
    syl = ["ka", "lo", "mi", "ren", "sta", "vo", "qui", "dar", "ne", "tor", "bel", "ix", "um", "pha", "gro"]
    words = ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(6000)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(2000)]
    tok = train_tokenizer(texts, vocab_size=args.vocab, min_frequency=1)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=args.d_model, n_layer=args.layers,
                     n_head=max(1, args.d_model // 64), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    base = GPT2LMHeadModel(cfg)
    base_dir = root / "base"
    base.save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    dirs = []
    for i in range(args.shards):
        m = attach_lora(GPT2LMHeadModel.from_pretrained(base_dir), lora_config(r=8, alpha=16, model=base), seed=0)
        with torch.no_grad():
            g = torch.Generator().manual_seed(100 + i)
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)  # a non-trivial adapter per shard
        d = root / f"shard-{i}"
        m.save_pretrained(d)
        dirs.append(d)
    return base_dir, dirs


def single_adapter(base_dir, adapter_dir, prompt, n, device):
    import torch
    from peft import PeftModel

    from components.modeling import load_base
    from components.prediction import mixing

    model, tok = load_base(base_dir, device=device)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    ids = [tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]

    def run():
        out, cache = [], None
        x = torch.tensor([ids], device=device)
        for _ in range(n):
            with torch.inference_mode():
                o = model(input_ids=x, past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            t = mixing.sample_token(mixing.log_softmax64(o.logits[0, -1].double().cpu().numpy()))
            out.append(t)
            x = torch.tensor([[t]], device=device)
        return out
    run()  # warm-up
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) / n


def pmixed(base_dir, dirs, prompt, n, device, q, charge):
    from components.prediction.ensemble import Ensemble

    ens = Ensemble(base_dir, dirs, radius=0.3, q=q, device=device)
    # no EOS stop for timing: count exactly n tokens
    ens.tokenizer.eos_token_id = None
    ens.generate(prompt, 4, charge=lambda: True)  # warm-up
    t0 = time.perf_counter()
    out = ens.generate(prompt, n, charge=charge)
    dt = time.perf_counter() - t0
    return dt / len(out["ids"]), len(out["ids"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--q", type=float, default=0.3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    prompt = "kalo miren stavo quidar"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base_dir, dirs = build(args, root)
        single = single_adapter(base_dir, dirs[0], prompt, args.tokens, args.device)
        mech, n1 = pmixed(base_dir, dirs, prompt, args.tokens, args.device, args.q, lambda: True)
        from components.prediction.budget import TokenBudget

        tb = TokenBudget(f"sqlite:///{root / 'ledger.db'}")
        tb.create("bench", 10 ** 9, "refuse")
        durable, n2 = pmixed(base_dir, dirs, prompt, args.tokens, args.device, args.q, lambda: tb.charge("bench", 1))
        block, n3 = pmixed(base_dir, dirs, prompt, args.tokens, args.device, args.q, tb.prepaid("bench", 8))
        tb.dispose()
    rows = [("single adapter", single), ("PMixED (mechanism)", mech), ("PMixED + durable charge/token", durable),
            ("PMixED + durable, blocks of 8", block)]
    doc = {"shards": args.shards, "q": args.q, "expected_selected": args.shards * args.q, "tokens": args.tokens,
           "layers": args.layers, "d_model": args.d_model, "vocab": args.vocab, "device": args.device,
           "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "single_s_per_token": single, "pmixed_s_per_token": mech, "pmixed_durable_s_per_token": durable,
           "pmixed_durable_block8_s_per_token": block, "ratio_durable_block8": block / single,
           "single_tokens_per_s": 1 / single, "pmixed_tokens_per_s": 1 / mech, "pmixed_durable_tokens_per_s": 1 / durable,
           "ratio": mech / single, "ratio_durable": durable / single, "target_ratio": 3.0}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    print(f"N={args.shards} q={args.q} (E|S|={args.shards * args.q:.1f}) GPT-2 {args.layers}×{args.d_model}, "
          f"vocab {args.vocab}, {args.device}, {doc['threads']} thread(s), {args.tokens} tokens")
    print(f"{'path':<32}{'ms/token':>10}{'tokens/s':>10}{'× single':>10}")
    for name, s in rows:
        print(f"{name:<32}{s * 1e3:>10.2f}{1 / s:>10.1f}{s / single:>10.2f}")
    print(f"target: PMixED ≤ 3.00 × single → {'met' if mech / single <= 3 else 'NOT met'} (mechanism), "
          f"{'met' if durable / single <= 3 else 'NOT met'} (durable per token), "
          f"{'met' if block / single <= 3 else 'NOT met'} (durable, blocks of 8: what `veil serve` does)")


if __name__ == "__main__":
    main()
