"""Peak memory per rank of sharded (FSDP2) vs unsharded full fine-tuning, 2 ranks under torchrun (gloo, CPU).

Each configuration is one `torchrun --nproc_per_node=2` job running Veil's `train` on the same GPT-2-style
model (random weights, no download), the same synthetic users and the same seed, with Adam. Per rank it
reports the peak resident set size (the whole process, Python and torch included) over the DP steps and
over the whole run (which ends by gathering the whole weights and Adam state for the checkpoint), and the bytes
of model state the rank holds after training (its weights + Adam moments: what sharding divides). The
last column checks the two runs ended on the same weights.

    python bench/sharding_memory.py                         # 6 layers × 512 (≈ 19 M parameters)
    python bench/sharding_memory.py --layers 12 --d-model 768 --json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
warnings.filterwarnings("ignore")

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def _data_and_tokenizer(n_users: int):
    import numpy as np
    import pyarrow as pa
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    rng = np.random.default_rng(0)
    users, texts = [], []
    for u in range(n_users):
        for _ in range(int(rng.integers(1, 5))):
            users.append(f"user{u:03d}@acme.example")
            texts.append(" ".join(rng.choice(WORDS, size=int(rng.integers(8, 40)))))
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 4, vocab_size=400, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    return pa.table({"user_id": users, "text": texts}), tok


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(args) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    from components.training import TrainSpec, train
    from components.training.sharding import full_state

    logging.set_verbosity_error()
    torch.set_num_threads(1)
    data, tok = _data_and_tokenizer(args.users)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.d_model, n_head=8, vocab_size=len(tok),
                                       n_positions=args.seq_len, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    spec = TrainSpec(mechanism="uls", sampling_rate=0.25, noise_multiplier=1.0, clip_norm=1.0, steps=args.steps,
                     records_per_user=2, lora=None, learning_rate=1e-4, seq_len=args.seq_len, micro_batch_size=4,
                     checkpoint_every=10_000, private_seed=5, sharding=args.sharding)
    steps_peak = {}

    def on_step(done: int) -> None:
        # the high-water mark over the DP steps, read before the run's end gathers the whole weights and
        # Adam state for the checkpoint and model/ (as FSDP's full state dict does, to rank 0's CPU)
        if done == args.steps - 1:
            steps_peak["bytes"] = _vm_hwm()

    train(spec, data, model, tok, Path(args.out) / "run", progress=False, on_step=on_step)
    # this rank's weights (its shard under fsdp) and Adam's two float32 moments of them
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    state_bytes = local * 4 * 3
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    params = full_state([(n, p) for n, p in model.named_parameters()])
    rank = int(os.environ.get("RANK", "0"))
    out = {"rank": rank, "peak_rss_bytes": peak, "steps_peak_rss_bytes": steps_peak.get("bytes"), "local_params": local, "state_bytes": state_bytes}
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(out))
    if rank == 0:
        torch.save(params, Path(args.out) / "params.pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sharding", default="none", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import torch

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    rows, finals = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for sharding in ("none", "fsdp"):
            out = Path(tmp) / sharding
            out.mkdir()
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0",
                   "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", __file__, "--worker", "--sharding", sharding,
                   "--out", str(out), "--layers", str(args.layers), "--d-model", str(args.d_model),
                   "--seq-len", str(args.seq_len), "--users", str(args.users), "--steps", str(args.steps)]
            r = subprocess.run(cmd, env=env, capture_output=True)
            if r.returncode != 0:
                sys.exit(f"torchrun ({sharding}) failed:\n{r.stderr.decode()[-3000:]}")
            rows[sharding] = [json.loads((out / f"rank{k}.json").read_text()) for k in (0, 1)]
            finals[sharding] = torch.load(out / "params.pt")
    diff = max(float((finals["fsdp"][n] - finals["none"][n]).abs().max()) for n in finals["none"])
    n_params = sum(t.numel() for t in finals["none"].values())
    doc = {"layers": args.layers, "d_model": args.d_model, "seq_len": args.seq_len, "params": n_params,
           "world_size": 2, "device": "cpu (gloo)", "max_abs_weight_diff": diff,
           "runs": {k: v for k, v in rows.items()}}
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    mib = 1 / 2**20
    print(f"GPT-2 {args.layers}×{args.d_model}, {n_params / 1e6:.1f} M parameters, Adam, 2 ranks (gloo, CPU)")
    print(f"{'sharding':<9} {'rank':>4} {'peak RSS, steps MiB':>20} {'peak RSS, run MiB':>18} {'weights+Adam MiB':>17}")
    for k, rs in rows.items():
        for r in rs:
            print(f"{k:<9} {r['rank']:>4} {r['steps_peak_rss_bytes'] * mib:>20.0f} {r['peak_rss_bytes'] * mib:>18.0f} "
                  f"{r['state_bytes'] * mib:>17.0f}")
    print(f"max |fsdp − none| over the final weights: {diff:.2e}")


if __name__ == "__main__":
    main()
