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
import ast
import gzip
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

_ROFF_ESC = re.compile(r"\\f[BIRP1-4]|\\f\(..|\\\(..|\\[-&e|^~ 0]|\\s[-+]?\d+|\\\*\(..|\\\*.")
_SKIP = re.compile(r"changelog|news|changes", re.IGNORECASE)


def stdlib_docstrings(root: Path, limit_files: int) -> list[str]:
    out = []
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    for p in files[:limit_files]:
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d and len(d) >= 40:
                    out.append(d)
    return out


def licences(root: Path) -> list[str]:
    out = []
    for p in sorted(root.glob("*")):
        if p.is_file() and not p.is_symlink():
            text = p.read_text(encoding="utf-8", errors="replace")
            out.extend(x.strip() for x in re.split(r"\n\s*\n", text) if len(x.strip()) >= 40)
    return out


def man_pages(root: Path, sections: tuple[str, ...], limit: int) -> list[str]:
    out = []
    for sec in sections:
        for p in sorted((root / f"man{sec}").glob("*.gz"))[:limit]:
            if p.is_symlink() or _SKIP.search(p.name):
                continue
            try:
                raw = gzip.decompress(p.read_bytes()).decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            lines = []
            for ln in raw.splitlines():
                if ln.startswith((".", "'")):
                    # macro lines: keep the words of headings and tagged paragraphs
                    m = re.match(r"^\.(SH|SS|TP|IP|B|I|BR|IR|RB)\s+(.*)$", ln)
                    if m:
                        lines.append(_ROFF_ESC.sub("", m.group(2)).replace('"', ""))
                    continue
                lines.append(_ROFF_ESC.sub("", ln).replace("\\", ""))
            text = "\n".join(lines)
            out.extend(x.strip() for x in re.split(r"\n\s*\n", text) if len(x.strip()) >= 40)
    return out


def collect(python_root: Path, licence_root: Path, man_root: Path, *, py_files: int, man_limit: int) -> dict:
    parts = {"python-docstrings": stdlib_docstrings(python_root, py_files) if python_root.is_dir() else [],
             "common-licenses": licences(licence_root) if licence_root.is_dir() else [],
             "man-pages": man_pages(man_root, ("1", "5", "8"), man_limit) if man_root.is_dir() else []}
    return parts


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
