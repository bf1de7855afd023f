"""The pipeline's stages as plain functions: catalog → plan → train → certify → register → audit.

Each stage reads a hashed artifact and writes one. Prefect wraps these in `flows/pipeline.py`;
tests call them directly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from components.core.errors import VeilError
from components.core.hashing import sha256_file
from components.core.settings import Settings

DEMO_POLICY = Path(__file__).resolve().parents[1] / "policies" / "demo.yaml"
# How the demo organization's JSONL maps onto catalog records (user and text use the defaults).
DEMO_MAPPING = {"id_field": "id", "time_field": "ts", "metadata_fields": ["team", "path"]}


def demo_data(settings: Settings, out_dir: Path | None = None, seed: int = 0) -> dict:
    from catalog.demo import write_demo_org

    out = Path(out_dir) if out_dir else settings.home / "demo-org"
    org = write_demo_org(out, seed=seed)
    return {"dir": str(out), "messages": str(out / "org" / "messages.jsonl"),
            "public": str(out / "public" / "corpus.jsonl"), "truth": str(out / "truth.json"),
            **{k: v for k, v in vars(org).items() if isinstance(v, (int, float, str))}}


def ingest(settings: Settings, source: str | Path, fmt: str, *, policy: str | Path | None = None,
           progress: bool = False, **mapping: Any) -> dict:
    from catalog.ingest import ingest_source

    rules = None
    if policy is not None:
        from components.policy import load_policy

        rules = load_policy(policy).tagging_rules()
    report = ingest_source(Path(source), fmt, settings=settings, rules=rules, progress=progress, **mapping)
    return report.to_dict()


def base_model(settings: Settings, *, public_corpus: str | Path | None = None,
               base_model_dir: str | Path | None = None, progress: bool = True) -> str:
    """Any local HF causal-LM directory, or the demo's base trained locally on the public corpus.

    The built base is cached by the corpus' sha256, so re-runs reuse it.
    """
    from components.modeling import build_base_model, load_base

    if base_model_dir is not None:
        load_base(base_model_dir)  # fail early and clearly on a bad directory
        return str(Path(base_model_dir).resolve())
    if public_corpus is None:
        raise VeilError("no base model: pass --base-model PATH or a public corpus to pretrain one")
    digest = sha256_file(public_corpus)
    out = settings.models_dir / f"base-{digest[:12]}"
    if (out / "veil_base.json").is_file():
        return str(out)
    texts = [json.loads(line)["text"] for line in Path(public_corpus).read_text().splitlines() if line.strip()]
    return str(build_base_model(texts, out, progress=progress))


def planning_aids(pol, base_dir: str | Path | None):
    """What the planner may take from the *public* base model: perplexity scores for ppl-high/ppl-low
    selection, and a gradient-diversity estimate for mechanism `auto`. Returns (scorer, compute)."""
    scorer = compute = None
    if pol.spec.contribution.selection in ("ppl-high", "ppl-low"):
        if base_dir is None:
            raise VeilError(f"selection '{pol.spec.contribution.selection}' scores records with the public base "
                            "model: pass --base-model DIR")
        from components.modeling import load_base, perplexity_scores

        model, tok = load_base(base_dir)
        seq_len = pol.spec.training.seq_len
        scorer = lambda texts: perplexity_scores(model, tok, texts, seq_len=seq_len)  # noqa: E731
    if pol.spec.mechanism == "auto" and pol.spec.privacy_unit == "user" and base_dir is not None:
        from components.modeling import load_base

        compute = {"base_model": load_base(base_dir)}
    return scorer, compute


def plan(settings: Settings, policy: str | Path, *, snapshot_id: str | None = None,
         base_dir: str | Path | None = None, progress=None) -> dict:
    from catalog.snapshots import load_snapshot
    from components.planning import make_plan, save_plan
    from components.policy import load_policy

    pol = load_policy(policy)
    snap = load_snapshot(settings, snapshot_id)
    scorer, compute = planning_aids(pol, base_dir)
    # the public part goes to plans/, the annex (membership, exact counts) to the private area
    p = make_plan(pol, snap, private_dir=settings.private_dir, scorer=scorer, compute=compute,
                  cache_dir=settings.cache_dir, progress=progress)
    path = save_plan(p, settings.plans_dir)
    return {"plan_path": str(path), "plan": p.to_dict()}


def training_data(settings: Settings, plan_doc: dict) -> pa.Table:
    """The plan's training records (user_id, text[, rate]) from the plan's own snapshot and its
    private annex (checked against the plan's commitment)."""
    from catalog.snapshots import load_snapshot
    from components.planning.annex import load_annex
    from components.planning.data import training_records

    data = plan_doc["data"]
    snap = load_snapshot(settings, data["snapshot_id"])
    if snap.sha256 != data["snapshot_sha256"]:
        raise VeilError(f"snapshot {data['snapshot_id']} changed since planning (sha256 differs)")
    return training_records(plan_doc, load_annex(settings.private_dir, plan_doc), snap.records)


def train(settings: Settings, plan_path: str | Path, base_dir: str | Path, *, progress: bool = True) -> dict:
    from components.modeling import load_base
    from components.planning import load_plan
    from components.training import TrainSpec, train as run_training

    plan_doc = load_plan(plan_path).to_dict()
    data = training_data(settings, plan_doc)
    model, tokenizer = load_base(base_dir)
    spec = TrainSpec.from_plan(plan_doc)
    out_dir = settings.runs_dir / plan_doc["sha256"][:16]
    result = run_training(spec, data, model, tokenizer, out_dir, resume=True, progress=progress)
    res = result.to_dict()
    (out_dir / "train_result.json").write_text(json.dumps(res, indent=2, sort_keys=True, default=str))
    # Per-step losses are statistics of the sampled private batches: they stay in the run folder.
    return {k: v for k, v in res.items() if k != "losses"}


def certify(settings: Settings, plan_path: str | Path, train_result: dict) -> dict:
    from components.certificate import build_certificate
    from components.planning import load_plan

    plan_doc = load_plan(plan_path).to_dict()
    targets = secret_targets(settings, plan_doc) if plan_doc["mechanism"] == "secret" else None
    return build_certificate(plan_doc, train_result, secret_targets=targets).to_dict()


def secret_targets(settings: Settings, plan_doc: dict) -> list:
    """Every secret the plan's training rows hold, with its class' (κ, γ) and the rows' Poisson rates."""
    from catalog.snapshots import load_snapshot
    from components.accounting.secrets import secret_targets as targets_for
    from components.planning.annex import load_annex
    from components.planning.data import train_rows

    snap = load_snapshot(settings, plan_doc["data"]["snapshot_id"])
    return targets_for(train_rows(load_annex(settings.private_dir, plan_doc)), snap.secret_spans,
                       plan_doc["target"]["secrets"])


def register(settings: Settings, *, name: str, certificate: dict, plan_path: str | Path, base_dir: str | Path,
             adapter_dir: str | Path | None) -> dict:
    from components.planning import load_plan
    from components.registry import register_model

    plan_doc = load_plan(plan_path).to_dict()
    target_eps = plan_doc["target"].get("epsilon")
    reg = register_model(settings, name=name, certificate=certificate, plan=plan_doc, base_model_dir=base_dir,
                         adapter_dir=adapter_dir,
                         policy_max_epsilon=float(target_eps) if target_eps is not None else None)
    return reg.to_dict()


@dataclass
class PipelineResult:
    ingest: dict
    plan_path: str
    plan: dict
    train: dict
    certificate: dict
    registration: dict
    audit: dict | None


def audit(settings: Settings, model_uri: str, *, policy: str | Path | None = None,
          truth: str | Path | None = None) -> dict:
    """Audit a registered model; aggregates go into its certificate, per-user scores stay private."""
    from catalog.snapshots import load_snapshot
    from components.audit import run_audit
    from components.policy import load_policy
    from components.registry import load_model, record_audit

    loaded = load_model(model_uri, settings)
    snap = load_snapshot(settings, loaded.plan["data"]["snapshot_id"])
    thresholds = load_policy(policy).spec.audit if policy else None
    truth_doc = json.loads(Path(truth).read_text()) if truth else None
    result = run_audit(loaded, snap.records, policy_thresholds=thresholds, settings=settings, truth=truth_doc,
                       secret_spans=snap.secret_spans)
    summary = result.summary() if hasattr(result, "summary") else dict(result)
    new_cert = record_audit(settings, model_uri, summary, plot_path=getattr(result, "plot_path", None))
    return {"summary": summary, "certificate": new_cert}
