"""DP step at real model size: non-private vs Veil vs Opacus, step time and peak memory, one run.

A Llama-style model is built from a config with random weights (no download): `llama-1b` is
TinyLlama-1.1B's shape (22 layers, d 2048, MLP 5632, 32 heads / 4 KV heads, vocab 32000). Two
tunings — LoRA (r 16 on every projection) and full fine-tuning — and for each: the non-private step
(ordinary batched backward, Adam), Veil's user-level DP step (ULS: each sampled user is a unit of
G records, its mean gradient clipped to C, one Gaussian draw per step), Opacus 1.6 per-sample
gradients (hooks) and Opacus ghost clipping (record-level; Opacus has no user-level mode, so its
units are records — it clips B·G rows where Veil clips B). Precision: `bf16` loads the base in
bfloat16; for the non-private and Veil steps, LoRA weights, full fine-tuning's float32 master
weights, norms, clipping, the clipped sum and the noise stay float32 (components.dpsgd.precision).
Opacus trains the same model; it has no master weights, so in full fine-tuning it updates the 16-bit
weights in place (less memory than a master copy: its figure is a lower bound for a careful setup).

Each engine runs alone: its model is built, warmed up, timed over `--rounds` steps (median), and its
peak device memory read (CUDA: torch.cuda.max_memory_allocated from a reset before the model is
built; CPU: the child process's peak RSS, so on CPU every engine runs in its own process). An
engine that cannot run a configuration (out of memory, an unsupported layer) is reported with the
reason, not dropped.

    python bench/gpu.py                        # CUDA if present: llama-1b, bf16, LoRA and full
    python bench/gpu.py --smoke                # tiny config on CPU, every engine, seconds (CI runs this)
    python bench/gpu.py --device cpu --tunings lora --engines nonprivate,veil --precision bf16,fp32
    python bench/gpu.py --json                 # one JSON document

Targets (issue 24, on GPU): Veil LoRA ULS ≤ 1.10× non-private step time and ≤ 1.25× its peak memory.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODELS = {
    # TinyLlama-1.1B's shape
    "llama-1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000),
    # a Llama-3.2-1B-like shape (tied embeddings, larger vocabulary)
    "llama-1b-tied": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                          num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ENGINES = ("nonprivate", "veil", "opacus", "opacus-ghost")


def build_model(args, tuning: str, precision: str, device):
    """The model one engine trains: base weights in `precision`, trainable weights in float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    spec = dict(MODELS[args.model])
    cfg = LlamaConfig(max_position_embeddings=max(args.seq_len, 64), bos_token_id=0, eos_token_id=0,
                      pad_token_id=0, attention_dropout=0.0, **spec)
    cfg._attn_implementation = "sdpa" if device.type == "cuda" else "eager"
    with torch.device(device):
        base = LlamaForCausalLM(cfg)
    from components.dpsgd.precision import cast_base, trainable_to_float32

    cast_base(base, precision)
    if tuning == "full":
        return base
    from peft import LoraConfig, get_peft_model

    base.requires_grad_(False)
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=LORA_TARGETS)
    model = get_peft_model(base, lora)
    trainable_to_float32(model)     # float32 adapters on the 16-bit base, as Veil trains them
    return model


def make_runner(engine: str, model, args, precision: str, device):
    """A zero-argument callable doing one optimizer step of `engine` on a fixed batch."""
    import torch

    from components.dpsgd.distributed import DistContext
    from components.dpsgd.per_sample import Unit, sequence_losses
    from components.dpsgd.step import DPStep

    rng = np.random.default_rng(0)
    vocab = MODELS[args.model]["vocab_size"]
    n_rec = args.users * args.records_per_user
    ids = rng.integers(1, vocab, size=(n_rec, args.seq_len)).astype(np.int64)
    lengths = np.full(n_rec, args.seq_len, dtype=np.int64)
    G = args.records_per_user
    params = [p for p in model.parameters() if p.requires_grad]
    C, sigma = 1.0, 1.0

    if engine in ("nonprivate", "veil"):
        private = engine == "veil"
        # ULS: a unit is a user's G records, each weighted 1/G (its mean gradient is clipped)
        units = ([Unit(np.arange(u * G, (u + 1) * G), 1.0 / G) for u in range(args.users)] if private
                 else [Unit(np.arange(u * G, (u + 1) * G), 1.0) for u in range(args.users)])
        from components.dpsgd.precision import MasterWeights

        # a 16-bit trainable weight (full fine-tuning in bf16) is updated through a float32 master
        masters = MasterWeights([(n, p) for n, p in model.named_parameters() if p.requires_grad])
        opt = torch.optim.Adam(masters.params, lr=1e-5)
        step = DPStep(model, opt, private=private, clip_norm=C, noise_multiplier=sigma,
                      expected_batch_size=args.users, micro_batch_size=args.micro_batch or n_rec,
                      private_seed=1, dctx=DistContext(), per_record=args.per_record)
        counter = iter(range(10 ** 9))
        return lambda: step(next(counter), units, ids, lengths)

    import opacus
    from opacus.optimizers import DPOptimizer

    x = torch.as_tensor(ids, device=device)
    lens = torch.as_tensor(lengths, device=device)
    pos = torch.arange(x.shape[1], device=device).expand_as(x)
    if engine == "opacus":
        from opacus import GradSampleModule

        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum")
        popt = DPOptimizer(torch.optim.Adam([p for p in gsm.parameters() if p.requires_grad], lr=1e-5),
                           noise_multiplier=sigma, max_grad_norm=C, expected_batch_size=n_rec,
                           loss_reduction="sum")

        def opacus_step():
            popt.zero_grad(set_to_none=True)
            out = gsm(input_ids=x, position_ids=pos, use_cache=False)
            sequence_losses(out.logits.float(), x, lens).sum().backward()
            popt.step()

        return opacus_step

    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="mean",
                                               max_grad_norm=C, use_ghost_clipping=True)
    opt = DPOptimizerFastGradientClipping(
        torch.optim.Adam([p for p in gsm.parameters() if p.requires_grad], lr=1e-5),
        noise_multiplier=sigma, max_grad_norm=C, expected_batch_size=n_rec, loss_reduction="mean")
    crit = torch.nn.CrossEntropyLoss(reduction="mean", ignore_index=-100)
    dploss = DPLossFastGradientClipping(gsm, opt, crit, loss_reduction="mean")
    valid = torch.arange(x.shape[1], device=device) < (lens[:, None] - 1)
    targets = torch.where(valid, torch.roll(x, -1, dims=1), torch.full_like(x, -100))

    def opacus_ghost_step():
        opt.zero_grad(set_to_none=True)
        logits = gsm(input_ids=x, position_ids=pos, use_cache=False).logits
        loss = dploss(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), shape=logits.shape)
        loss.backward()
        opt.step()

    return opacus_ghost_step


def correctness(args, precision: str) -> list[dict]:
    """Veil's clipped sum on this device, every per-record path, against a brute-force float32 one.

    Brute force: each unit's gradient by its own ordinary backward on a float32 copy of the model
    (the weighted sum over its records), clipped to C, summed. Veil's paths run on the model in
    `precision`; a 16-bit base is expected to agree to bf16/fp16 rounding (~1e-2), float32 to ~1e-5.
    Clip C is set below the typical unit norm so that clipping is active.
    """
    import torch

    from components.dpsgd.per_sample import PerUnitGradients, Unit, sequence_losses
    from components.dpsgd.precision import emulate_out_dtype, native_products

    device = torch.device(args.device)
    small = argparse.Namespace(**{**vars(args), "model": "llama-tiny", "lora_r": 4})
    users, G, T = 6, 2, 24
    rng = np.random.default_rng(3)
    ids = rng.integers(1, MODELS["llama-tiny"]["vocab_size"], size=(users * G, T)).astype(np.int64)
    lengths = rng.integers(6, T + 1, size=users * G).astype(np.int64)
    units = [Unit(np.arange(u * G, (u + 1) * G), 1.0 / G) for u in range(users)]
    rows = []
    for tuning in ("lora", "full"):
        ref_model = build_model(small, tuning, "fp32", device).train()
        names = [n for n, p in ref_model.named_parameters() if p.requires_grad]
        params = dict(ref_model.named_parameters())
        per_unit = []
        for u in units:
            ref_model.zero_grad(set_to_none=True)
            x = torch.as_tensor(ids[u.records], device=device)
            L = torch.as_tensor(lengths[u.records], device=device)
            (sequence_losses(ref_model(input_ids=x, use_cache=False).logits, x, L).sum() * u.weight).backward()
            per_unit.append(torch.cat([params[n].grad.reshape(-1).double() for n in names]))
        norms = torch.stack([g.norm() for g in per_unit])
        C = float(norms.median())
        ref = sum(g * min(1.0, C / float(g.norm())) for g in per_unit)
        del ref_model
        # a 16-bit run on a device without fused float32-output GEMMs (a CPU) also runs the CUDA path's
        # logic, with those products emulated (precision.emulate_out_dtype)
        emulate = precision != "fp32" and not native_products(device)
        paths = [(m, False) for m in ("mixed", "hooks", "ghost", "vmap")] + (
            [("mixed", True), ("ghost", True)] if emulate else [])
        for method, emulated in paths:
            label = method + (" (CUDA products emulated)" if emulated else "")
            row = {"tuning": tuning, "precision": precision, "per_record": label, "clip": C}
            try:
                model = build_model(small, tuning, precision, device).train()
                pu = PerUnitGradients(model, names, users * G, method)
                with (emulate_out_dtype() if emulated else contextlib.nullcontext()):
                    sums, _, _ = pu.clipped_sum(units, ids, lengths, C, device)
                got = torch.cat([sums[n].reshape(-1).double() for n in names])
                row["rel_error"] = float((got - ref).norm() / ref.norm())
                pu.close()
                del model, pu
            except Exception as e:  # noqa: BLE001 — reported in the table
                row["error"] = _short(e)
            rows.append(row)
    return rows


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:160]}"


def run_one(args, tuning: str, engine: str, precision: str) -> dict:
    """Build, warm up and time one engine; its peak memory; or why it could not run."""
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    row = {"tuning": tuning, "engine": engine, "precision": precision}
    model = runner = None
    try:
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        model = build_model(args, tuning, precision, device).train()
        row["trainable_params"] = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
        row["params"] = int(sum(p.numel() for p in model.parameters()))
        runner = make_runner(engine, model, args, precision, device)
        row["build_s"] = time.perf_counter() - t0
        times = []
        for r in range(args.warmup + args.rounds):
            sync()
            t = time.perf_counter()
            runner()
            sync()
            if r >= args.warmup:
                times.append(time.perf_counter() - t)
        row.update(median_s=float(np.median(times)), min_s=float(min(times)), max_s=float(max(times)))
        if args.profile and engine in ("veil", "nonprivate"):
            # where a step's device time goes (operators by total device time), printed to stderr
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                for _ in range(2):
                    runner()
                sync()
            key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            print(f"--- profile {tuning} {precision} {engine} (2 steps) ---", file=sys.stderr)
            print(prof.key_averages().table(sort_by=key, row_limit=args.profile), file=sys.stderr)
        if cuda:
            row["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        if engine == "veil" and precision != "fp32":
            # whether 16-bit products ran as fused float32-output GEMMs (precision.mm32/bmm32), and any
            # layout the fused kernel refused (then computed from contiguous copies or upcasts)
            from components.dpsgd import precision as prec

            row["fused_products"] = prec.native_products(device)
            if prec._WARNED:
                row["fused_refused"] = sorted(prec._WARNED)
    except Exception as e:  # noqa: BLE001 — an engine's failure is a result of the bench, reported in the table
        row["error"] = "out of memory" if "out of memory" in str(e).lower() else _short(e)
    finally:
        del runner, model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return row


def _child(args, tuning, engine, precision) -> dict:
    """CPU: one engine in its own process, so its peak RSS is its own."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", f"{tuning}:{engine}:{precision}",
           "--model", args.model, "--device", args.device, "--users", str(args.users),
           "--records-per-user", str(args.records_per_user), "--seq-len", str(args.seq_len),
           "--lora-r", str(args.lora_r), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
           "--per-record", args.per_record, "--micro-batch", str(args.micro_batch), "--threads", str(args.threads),
           "--profile", str(args.profile)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"tuning": tuning, "engine": engine, "precision": precision,
                "error": f"exit {p.returncode}: {tail[:160]}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1b", choices=sorted(MODELS))
    ap.add_argument("--tunings", default="lora,full")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--precision", default="bf16", help="comma-separated: fp32,bf16,fp16")
    ap.add_argument("--users", type=int, default=8, help="users in the batch (Veil's clipped units)")
    ap.add_argument("--records-per-user", type=int, default=2, help="G: records per user")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=0, help="records per forward (0: the whole batch)")
    ap.add_argument("--per-record", default="auto")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny config on CPU: checks the script end to end")
    ap.add_argument("--check", action="store_true",
                    help="also compare Veil's clipped sum (every per-record path) with brute force on this device")
    ap.add_argument("--profile", type=int, default=0, help="print the top N operators of 2 profiled steps")
    ap.add_argument("--out", default=None, help="also write the JSON document to this file")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        args.model, args.device, args.seq_len, args.users, args.records_per_user = "llama-tiny", "cpu", 32, 4, 2
        args.rounds, args.warmup, args.lora_r = 1, 0, 4
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        tuning, engine, precision = args.child.split(":")
        row = run_one(args, tuning, engine, precision)
        row["peak_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        print(json.dumps(row))
        return 0

    tunings = [t for t in args.tunings.split(",") if t]
    engines = [e for e in args.engines.split(",") if e]
    precisions = [p for p in args.precision.split(",") if p]
    bad = [x for x in engines if x not in ENGINES] + [t for t in tunings if t not in ("lora", "full")] + \
          [p for p in precisions if p not in ("fp32", "bf16", "fp16")]
    if bad:
        print(f"bench/gpu.py: unknown engine, tuning or precision {bad[0]!r}", file=sys.stderr)
        return 2
    try:
        import opacus
        opacus_version = opacus.__version__
    except ImportError:
        opacus_version = None
        engines = [e for e in engines if not e.startswith("opacus")]

    rows = []
    from rich.console import Console

    con = Console(stderr=True)
    for precision in precisions:
        for tuning in tunings:
            for engine in engines:
                con.print(f"[dim]{tuning} {precision} {engine} …[/dim]")
                # CUDA: in this process (peak from a reset); CPU: a child process each, so its peak RSS is
                # its own — except --smoke, which checks the script, not memory (no peak reported)
                row = (run_one(args, tuning, engine, precision) if (args.device.startswith("cuda") or args.smoke)
                       else _child(args, tuning, engine, precision))
                rows.append(row)
    # ratios against the non-private step of the same tuning and precision
    for r in rows:
        base = next((b for b in rows if b["engine"] == "nonprivate" and b["tuning"] == r["tuning"]
                     and b["precision"] == r["precision"] and "error" not in b), None)
        if base and "error" not in r:
            r["time_over_nonprivate"] = r["median_s"] / base["median_s"]
            if r.get("peak_bytes") and base.get("peak_bytes"):
                r["memory_over_nonprivate"] = r["peak_bytes"] / base["peak_bytes"]
    dev = torch.device(args.device)
    card = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    out = {"rows": rows, "config": {
        "model": args.model, **MODELS[args.model], "users": args.users, "records_per_user": args.records_per_user,
        "seq_len": args.seq_len, "lora_r": args.lora_r, "lora_targets": LORA_TARGETS, "rounds": args.rounds,
        "device": str(dev), "card": card, "torch": torch.__version__, "opacus": opacus_version,
        "python": platform.python_version(), "threads": torch.get_num_threads()}}
    if args.check:
        out["correctness"] = [r for p in precisions for r in correctness(args, p)]
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out))
        return 0
    from rich.table import Table

    tab = Table(title=f"DP step, {args.model}, {args.users} users × {args.records_per_user} records × "
                      f"{args.seq_len} tokens, {card}")
    for col in ("tuning", "precision", "engine", "s/step", "× np", "peak GiB", "mem × np"):
        tab.add_column(col, justify="left" if col in ("tuning", "precision", "engine") else "right")
    for r in rows:
        if "error" in r:
            tab.add_row(r["tuning"], r["precision"], r["engine"], "cannot run (below)", "—", "—", "—")
            continue
        mem = f"{r['peak_bytes'] / 2 ** 30:.2f}" if r.get("peak_bytes") else "—"
        tab.add_row(r["tuning"], r["precision"], r["engine"], f"{r['median_s']:.4f}",
                    f"{r.get('time_over_nonprivate', float('nan')):.3f}", mem,
                    f"{r['memory_over_nonprivate']:.3f}" if "memory_over_nonprivate" in r else "—")
    con = Console(width=max(Console().width, 100))
    con.print(tab)
    con.print("× np: over the non-private step of the same tuning and precision")
    for r in rows:
        if "error" in r:
            con.print(f"{r['tuning']} {r['precision']} {r['engine']}: {r['error']}", soft_wrap=True)
    if args.check:
        chk = Table(title=f"Veil's clipped sum vs brute force (float32), llama-tiny, {card}")
        for col in ("tuning", "precision", "per-record path", "relative error"):
            chk.add_column(col)
        for r in out["correctness"]:
            chk.add_row(r["tuning"], r["precision"], r["per_record"],
                        f"{r['rel_error']:.2e}" if "rel_error" in r else r["error"])
        con.print(chk)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
