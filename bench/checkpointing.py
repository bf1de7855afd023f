"""Peak memory and step time of a DP step with and without gradient (activation) checkpointing.

Each configuration runs in its own subprocess: the model is built, one warm-up step runs (it holds
the engine's first-micro-batch self-check), then the peak resident set is reset
(/proc/self/clear_refs) and `--steps` more steps run. "peak_mb" is the step's peak RSS above the RSS
just before it (VmHWM − VmRSS): the activations, gradients and per-record factors the step
allocates, not the weights (on CUDA: torch.cuda.max_memory_allocated above memory_allocated). glibc's malloc is told to hand large blocks straight back to the OS
(MALLOC_MMAP_THRESHOLD_), so RSS follows what torch holds. SGD (no optimizer state), so the figure
is the step's own working memory.

    python bench/checkpointing.py                               # GPT-2 6×384, seq 256, batch 8, CPU
    python bench/checkpointing.py --arch llama --layers 4 --json
    python bench/checkpointing.py --modes lora --per-record hooks,ghost

Rows: LoRA and full fine-tuning × per-record method × checkpointing off/on, plus the non-private
step (plain batched backward) for reference. On a shared 2-core VM, times vary ±10 %; memory does not.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0   # kB → MiB
    raise RuntimeError(f"/proc/self/status has no {key}")


def _build(args, lora: bool, ckpt: bool):
    import torch
    from transformers.utils import logging

    from components.dpsgd.model_prep import set_gradient_checkpointing

    logging.set_verbosity_error()
    torch.manual_seed(0)
    if args.arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        m = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.d_model, n_head=max(1, args.d_model // 64),
                                       vocab_size=args.vocab, n_positions=max(args.seq_len, 64), bos_token_id=0,
                                       eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        targets = ["c_attn", "c_proj", "c_fc"]
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.d_model,
                                         intermediate_size=int(args.d_model * 8 / 3) // 8 * 8,
                                         num_attention_heads=max(1, args.d_model // 64),
                                         num_key_value_heads=max(1, args.d_model // 128), vocab_size=args.vocab,
                                         max_position_embeddings=max(args.seq_len, 64), bos_token_id=0,
                                         eos_token_id=0, pad_token_id=0))
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    if lora:
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                         target_modules=targets))
    else:
        for p in m.parameters():
            p.requires_grad_(True)
    set_gradient_checkpointing(m, ckpt)
    return m.to(args.device).train()


def child(cfg: dict) -> dict:
    """One configuration, in this (fresh) process."""
    import numpy as np
    import torch

    args = argparse.Namespace(**{"device": "cpu", **cfg["args"]})
    if args.threads:
        torch.set_num_threads(args.threads)
    from components.dpsgd.per_sample import Unit
    from components.dpsgd.step import DPStep

    model = _build(args, cfg["mode"] == "lora", cfg["ckpt"])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    private = cfg["per_record"] != "nonprivate"
    step = DPStep(model, opt, private=private, clip_norm=1.0, noise_multiplier=1.0,
                  expected_batch_size=float(args.batch), micro_batch_size=args.batch, private_seed=1,
                  per_record=cfg["per_record"] if private else "auto")
    rng = np.random.default_rng(0)
    ids = rng.integers(1, args.vocab, size=(args.batch, args.seq_len))
    lengths = np.full(args.batch, args.seq_len)
    units = [Unit(np.array([i]), 1.0) for i in range(args.batch)]
    cuda = args.device.startswith("cuda")
    step(0, units, ids, lengths)                        # warm-up (and the self-check)
    if cuda:   # the caching allocator's own count: exact, no RSS needed
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        Path("/proc/self/clear_refs").write_text("5")   # reset the peak RSS (VmHWM) to the current RSS
        before = _status("VmRSS")
    times = []
    for t in range(args.steps):
        t0 = time.perf_counter()
        step(t + 1, units, ids, lengths)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda else _status("VmHWM")) - before
    step.close()
    return {"mode": cfg["mode"], "per_record": cfg["per_record"], "checkpointing": cfg["ckpt"],
            "step_s": sorted(times)[len(times) // 2], "peak_mb": round(peak, 1), "before_mb": round(before, 1),
            "trainable_params": int(sum(p.numel() for p in params))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="measured steps after the warm-up")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (peak = torch.cuda.max_memory_allocated)")
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--per-record", default="mixed", help="comma-separated: mixed, hooks, ghost")
    ap.add_argument("--no-nonprivate", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        warnings.filterwarnings("ignore")
        print(json.dumps(child(json.loads(args.child))))
        return 0

    methods = [m for m in args.per_record.split(",") if m]
    if "vmap" in methods:
        ap.error("--per-record vmap: torch.func cannot run through activation checkpointing (Veil refuses it)")
    methods += [] if args.no_nonprivate else ["nonprivate"]
    conf = {k: v for k, v in vars(args).items() if k not in ("child", "json", "modes", "per_record")}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1"}
    rows = []
    for mode in [m for m in args.modes.split(",") if m]:
        for method in methods:
            for ckpt in (False, True):
                cfg = {"args": conf, "mode": mode, "per_record": method, "ckpt": ckpt}
                p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], env=env,
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    print(p.stderr[-2000:], file=sys.stderr)
                    return 1
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
                if not args.json:
                    print(f"  {mode} {method} checkpointing={ckpt}: done", file=sys.stderr)
    for r in rows:   # ratios against the same mode and method without checkpointing
        base = next(b for b in rows if (b["mode"], b["per_record"], b["checkpointing"]) ==
                    (r["mode"], r["per_record"], False))
        r["peak_vs_off"] = round(r["peak_mb"] / base["peak_mb"], 3) if base["peak_mb"] > 0 else None
        r["time_vs_off"] = round(r["step_s"] / base["step_s"], 3)
    doc = {"config": {**conf, "torch_threads": __import__("torch").get_num_threads() if not args.threads
                      else args.threads, "machine": platform.machine(), "python": platform.python_version()},
           "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{args.arch} {args.layers}×{args.d_model}, vocab {args.vocab}, seq {args.seq_len}, batch {args.batch}, "
          f"SGD, {args.device}; peak = the step's peak memory above the memory before it "
          f"({'CUDA allocator' if args.device.startswith('cuda') else 'RSS'})")
    print(f"{'mode':<5} {'per_record':<11} {'ckpt':<5} {'step s':>8} {'peak MiB':>9} {'peak ×off':>9} {'time ×off':>9}")
    for r in rows:
        print(f"{r['mode']:<5} {r['per_record']:<11} {str(r['checkpointing']).lower():<5} {r['step_s']:>8.3f} "
              f"{r['peak_mb']:>9.1f} {r['peak_vs_off']!s:>9} {r['time_vs_off']:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
