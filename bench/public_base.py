"""A public base model for the real-data studies, pretrained on this machine's public text only.

    python bench/public_base.py --out DIR [--steps 600] [--json]

Text: the Python standard library's docstrings (modules, classes, functions; `ast`, never imported),
the licence texts in /usr/share/common-licenses, and man pages (section 1, 5 and 8, roff markup
stripped). None of it is a Debian changelog — the corpus the studies fine-tune on — and every file
whose name says changelog/NEWS is skipped, so the base never saw the people it is evaluated on.
The tokenizer is trained here too (components.modeling.build_base_model). Deterministic for a seed
and a machine: the file list is sorted, the text sha256 goes to DIR/veil_base.json with the sources.

The output is a local Hugging Face directory: `veil plan|run|study --base-model DIR`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from components.modeling.public_text import collect  # noqa: E402  (moved there: `veil base-model system`)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--python-root", type=Path, default=Path(f"/usr/lib/python3.{sys.version_info.minor}"))
    ap.add_argument("--licences", type=Path, default=Path("/usr/share/common-licenses"))
    ap.add_argument("--man-root", type=Path, default=Path("/usr/share/man"))
    ap.add_argument("--py-files", type=int, default=1500, help="at most this many stdlib files (sorted)")
    ap.add_argument("--man-pages", type=int, default=400, help="at most this many pages per man section")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    from components.modeling import build_base_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.perf_counter()
    parts = collect(args.python_root, args.licences, args.man_root, py_files=args.py_files, man_limit=args.man_pages)
    texts = [t for v in parts.values() for t in v]
    out = build_base_model(texts, args.out, vocab_size=args.vocab, n_layer=args.layers, n_embd=args.width,
                           n_head=4, n_positions=max(256, args.seq_len), steps=args.steps, seq_len=args.seq_len,
                           seed=args.seed, progress=not args.json)
    facts_path = Path(out) / "veil_base.json"
    facts = json.loads(facts_path.read_text())
    facts["public_sources"] = {k: {"texts": len(v), "chars": sum(map(len, v))} for k, v in parts.items()}
    facts["public_roots"] = {"python": str(args.python_root), "licences": str(args.licences),
                             "man": str(args.man_root)}
    facts_path.write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    doc = {"out": str(out), "sources": facts["public_sources"], "n_params": facts["n_params"],
           "train_tokens": facts["n_train_tokens"], "eval_loss_before": facts["eval_loss_before"],
           "eval_loss_after": facts["eval_loss_after"], "seconds": round(time.perf_counter() - t0, 1)}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for k, v in doc.items():
            print(f"{k:>18}: {v}")


if __name__ == "__main__":
    main()
