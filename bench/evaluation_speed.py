"""Evaluation speed on the demo organization (issue 26: evaluation took longer than training).

Scores the first N demo messages with the evaluation code (components.evaluation.evaluate_texts) on a
demo-size base model (2 layers, 128 wide, demo tokenizer; a few pretraining steps: speed does not
depend on the weights) with a LoRA adapter attached, as the pipeline evaluates the DP model, at
several batch sizes. Batches are also capped at components.modeling.scoring.MAX_BATCH_TOKENS tokens.

    python bench/evaluation_speed.py [--texts 1000] [--batch-sizes 8,64] [--json]

Prints seconds per batch size and the perplexity (identical up to float rounding across batch sizes).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--batch-sizes", default="8,64")
    ap.add_argument("--seq-len", type=int, default=64, help="the demo policy's training.seq_len")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    import torch

    from catalog.demo import write_demo_org
    from components.core.quiet import quiet_third_party
    from components.evaluation import evaluate_texts
    from components.modeling import attach_lora, build_base_model, load_base, lora_config

    quiet_third_party(prefect=False)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write_demo_org(d / "org")
        public = [json.loads(x)["text"] for x in (d / "org" / "public" / "corpus.jsonl").read_text().splitlines() if x]
        msgs = [json.loads(x)["text"] for x in (d / "org" / "org" / "messages.jsonl").read_text().splitlines() if x]
        build_base_model(public, d / "base", steps=5, progress=False)
        model, tok = load_base(d / "base")
        model = attach_lora(model, lora_config(8, 16, 0.0), seed=0)
        texts = msgs[:a.texts]
        rows = []
        for bs in [int(x) for x in a.batch_sizes.split(",")]:
            t0 = time.perf_counter()
            r = evaluate_texts(model, tok, texts, max_length=a.seq_len, batch_size=bs)
            rows.append({"batch_size": bs, "seconds": round(time.perf_counter() - t0, 2),
                         "perplexity": r.perplexity, "tokens": r.tokens})
    doc = {"texts": len(texts), "seq_len": a.seq_len, "torch_threads": torch.get_num_threads(), "rows": rows}
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{len(texts)} demo texts, seq_len {a.seq_len}, {doc['torch_threads']} torch threads")
    print(f"{'batch size':>10} {'seconds':>8} {'perplexity':>14} {'tokens':>7}")
    for r in rows:
        print(f"{r['batch_size']:>10} {r['seconds']:>8.2f} {r['perplexity']:>14.6f} {r['tokens']:>7}")


if __name__ == "__main__":
    main()
