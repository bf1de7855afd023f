"""`veil study`: train and evaluate a grid of privacy settings; a results table and a privacy–utility plot.

Each grid point is plan → train → evaluate with the pipeline's own stage functions (flows/stages.py):
the point's policy (flows/study_grid.point_policy) is planned on the latest snapshot, trained as a
*tuning run* (`stages.train(release=False)`: nothing charged to the ledger, trained in the study's
folder, never certified or registered), then scored on the plan's evaluation people
(components.evaluation) with the public base scored on the same texts. A `non-private` point plans as
ULS (same people trained and evaluated) and trains with mechanism `nonprivate` (Poisson records at the
same expected records per step, no clipping, no noise); nothing it trains can get a certificate
(the certificate refuses a run whose mechanism differs from its plan's).

The points are a Prefect map (`veil-study` flow): a thread pool by default, prefect-dask's
DaskTaskRunner with `--task-runner dask` (a LocalCluster, or VEIL_DASK_ADDRESS's scheduler). One
MLflow parent run (experiment `veil-studies`) holds a child run per point, the table and the plot.
Everything lands in VEIL_HOME/studies/<id>/ (results.json, results.csv, privacy_utility.png).

Tuning on private data is not covered by any certificate: the scores are measured on private
held-out people and the choice they drive leaks. The study says so in every output. The accounted
alternative is `--private-selection` (flows/private_selection.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from catalog import snapshots  # its module, not the function: tests stand a snapshot in
from components.core.errors import VeilError
from components.core.quiet import quiet_third_party
from components.core.settings import Settings
from components.evaluation import evaluate_texts
from components.modeling import load_base
from components.modeling.base import load_finetuned
from components.policy import load_policy
from flows import stages
from flows.pmixed import _runner as pmixed_runner
from flows.prefect_boundary import prefect_safe
from flows.stages import plan_snapshot_id
from flows.study_grid import Grid, Point, parse_grid, point_policy
from flows.study_report import gap_closing, log_study, plot_study, write_tables
from components.draws.annex import load_annex
from components.draws.data import evaluation_records
from components.planning import load_plan

CAVEAT = ("Tuning on private data is not covered by any certificate: these scores are measured on private "
          "evaluation people and any choice made from them leaks information about them and about the "
          "trained people. No study point is a release: none is charged to the ledger, certified or "
          "registered. Use --private-selection for an accounted choice (Papernot & Steinke 2022).")
EXPERIMENT = "veil-studies"


def studies_dir(settings: Settings) -> Path:
    d = settings.home / "studies"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def nonprivate_adjust(spec, data):
    """The non-private reference: Poisson records at the rate that gives the ULS plan's expected records
    per step (q users × min(G, n_u) records each), no clipping, no noise."""
    import numpy as np
    import pyarrow as pa

    counts = pa.table({"u": data["user_id"]}).group_by("u").aggregate([("u", "count")])["u_count"].to_numpy()
    G = int(spec.records_per_user or 1)
    per_step = float(spec.sampling_rate) * float(np.minimum(counts, G).sum())
    rate = min(1.0, per_step / max(1, data.num_rows))
    return replace(spec, mechanism="nonprivate", noise_multiplier=0.0, sampling_rate=rate,
                   selection=None if spec.selection != "random-chunk" else "random-chunk")


def eval_texts(settings: Settings, plan_doc: dict, max_records: int) -> tuple[list[str], list[str]]:
    """(user ids, texts) of the plan's evaluation people, at most `max_records` of them: a stable
    subset (by a hash of each record), so every point of a study scores the same texts."""

    annex = load_annex(settings.private_dir, plan_doc)
    snap = snapshots.load_snapshot(settings, plan_snapshot_id(settings, plan_doc, annex))
    t = evaluation_records(plan_doc, annex, snap.records)
    rows = list(zip(t.column("user_id").to_pylist(), t.column("text").to_pylist()))
    rows.sort(key=lambda r: hashlib.sha256((r[0] + "\x1f" + r[1]).encode()).hexdigest())
    rows = sorted(rows[:max_records])
    return [r[0] for r in rows], [r[1] for r in rows]


def texts_sha(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()


def run_point(settings: Settings, point: dict, plan_path: str, base_dir: str, run_dir: str,
              eval_max: int, drop_users: tuple = ()) -> dict:
    """train (a tuning run) → evaluate, for one planned grid point. Returns its results row."""
    t0 = time.perf_counter()
    pt = Point(**{k: point[k] for k in ("mechanism", "epsilon", "selection", "k", "lora")})
    plan_doc = load_plan(plan_path).to_dict()
    adjust = nonprivate_adjust if not pt.private else None
    tr = stages.train(settings, plan_path, base_dir, progress=False, release=False, out_dir=run_dir,
                      adjust=adjust, drop_users=drop_users)
    t_train = time.perf_counter() - t0
    users, texts = eval_texts(settings, plan_doc, eval_max)
    seq_len = int(plan_doc["training"]["seq_len"])
    model, tok = load_finetuned(base_dir, adapter_dir=tr.get("adapter_dir"), model_dir=tr.get("model_dir"))
    ev = evaluate_texts(model, tok, texts, max_length=seq_len, batch_size=32)
    base, btok = load_base(base_dir)
    ev0 = evaluate_texts(base, btok, texts, max_length=seq_len, batch_size=32)
    # one plain line per finished point (points run in threads or dask workers: no live bars); the key
    # and the times only — the scores come in the final table
    import sys

    print(f"study: point {pt.key} done (trained in {t_train:.0f} s, evaluated in "
          f"{time.perf_counter() - t0 - t_train:.0f} s)", file=sys.stderr, flush=True)
    return {
        **pt.to_dict(),
        "privacy_unit": plan_doc.get("privacy_unit"),
        "plan_sha256": plan_doc["sha256"],
        "plan_epsilon": None if not pt.private else (plan_doc.get("accounting") or {}).get("epsilon"),
        "delta": None if not pt.private else (plan_doc.get("target") or {}).get("delta"),
        "noise_multiplier": 0.0 if not pt.private else plan_doc.get("noise_multiplier"),
        "sampling_rate": tr.get("sampling_rate"),
        "clip_norm": None if not pt.private else plan_doc.get("clip_norm"),
        "steps": tr.get("steps_run"),
        "expected_batch_size": plan_doc.get("expected_batch_size"),
        "trainable_params": tr.get("trainable_params"),
        "perplexity": ev.perplexity, "next_token_accuracy": ev.next_token_accuracy, "mean_nll": ev.mean_nll,
        "base_perplexity": ev0.perplexity, "base_next_token_accuracy": ev0.next_token_accuracy,
        "base_mean_nll": ev0.mean_nll,
        "eval_texts_sha256": texts_sha(texts), "eval_records": ev.records, "eval_tokens": ev.tokens,
        "eval_people": len(set(users)),
        "train_seconds": round(t_train, 1), "seconds": round(time.perf_counter() - t0, 1),
        "certified": False,
    }


def _runner(kind: str, workers: int, processes: bool = True):
    if kind == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=max(1, int(workers)))
    if kind != "dask":
        raise VeilError(f"--task-runner: {kind!r} is not one of thread, dask")

    return pmixed_runner("dask", {"n_workers": max(1, int(workers)), "threads_per_worker": 1,
                                  "processes": processes})


def map_points(settings: Settings, jobs: list[dict], *, task_runner: str = "thread", workers: int = 1,
               use_prefect: bool = True, processes: bool = True) -> list[dict]:
    """Run `run_point` over jobs (dicts of its keyword arguments), as a Prefect map when use_prefect."""
    if not use_prefect:
        return [run_point(settings, **j) for j in jobs]
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(name="study-point", cache_policy=NO_CACHE, retries=0, persist_result=False)
    @prefect_safe("study-point")
    def point_task(settings: Settings, job: dict) -> dict:
        # only the point, file paths and the settings travel as task parameters: no private data
        return run_point(settings, **job)

    @flow(name="veil-study", task_runner=_runner(task_runner, workers, processes), log_prints=False,
          persist_result=False)
    @prefect_safe("veil-study")
    def study_flow() -> list[dict]:
        futures = point_task.map([settings] * len(jobs), jobs)
        return [f.result() for f in futures]

    return study_flow()


def new_study_dir(settings: Settings, grid: Grid) -> tuple[str, Path]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    sid = f"{grid.name}-{stamp}-{os.urandom(3).hex()}"
    out = studies_dir(settings) / sid
    out.mkdir(mode=0o700, parents=True)
    return sid, out


def run_study(settings: Settings, policy: str | Path, grid_path: str | Path, *, base_dir: str | Path | None,
              task_runner: str = "thread", workers: int = 1, use_prefect: bool = True,
              log_mlflow: bool = True, dask_processes: bool = True) -> dict:
    quiet_third_party(prefect=use_prefect)  # its points' threads or dask workers log into Prefect's run log
    grid = parse_grid(grid_path)
    pol = load_policy(policy)
    if base_dir is None:
        raise VeilError("veil study: pass --base-model DIR (a public base; the study compares against it)")
    base_dir = stages.base_model(settings, base_model_dir=base_dir)
    sid, out = new_study_dir(settings, grid)
    jobs = []
    for pt in grid.points:
        # planned here, one after another (cheap): a point the planner refuses stops the study before any
        # training, and the tasks only train and evaluate
        pp = point_policy(policy, pt, grid.training, out / "policies" / f"{pt.key}.yaml")
        try:
            planned = stages.plan(settings, pp, base_dir=base_dir)
        except VeilError as e:
            raise VeilError(f"grid point {pt.key}: {e}") from None
        jobs.append({"point": pt.to_dict(), "plan_path": planned["plan_path"], "base_dir": str(base_dir),
                     "run_dir": str(out / "runs" / pt.key), "eval_max": grid.eval_max_records})
    t0 = time.perf_counter()
    import sys

    print(f"study: {len(jobs)} point(s) planned; training and evaluating {max(1, int(workers))} at a time",
          file=sys.stderr, flush=True)
    rows = map_points(settings, jobs, task_runner=task_runner, workers=workers, use_prefect=use_prefect,
                      processes=dask_processes)
    shas = {r["eval_texts_sha256"] for r in rows}
    doc = {
        "study_id": sid, "grid": {"name": grid.name, "sha256": grid.sha256, "path": str(grid_path),
                                  "points": [p.to_dict() for p in grid.points]},
        "policy": {"name": pol.name, "sha256": pol.sha256, "path": str(policy)},
        "base_model": str(base_dir),
        "covered_by_certificate": False, "caveat": CAVEAT,
        "same_eval_texts": len(shas) == 1,
        "rows": rows,
        "gap_closing": gap_closing(rows),
        "seconds": round(time.perf_counter() - t0, 1),
        "dir": str(out),
    }
    write_tables(doc, out)
    plot = plot_study(doc, out / "privacy_utility.png")
    doc["plot"] = str(plot)
    if log_mlflow:
        doc["mlflow"] = log_study(settings, doc, out)
    (out / "results.json").write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    return doc
