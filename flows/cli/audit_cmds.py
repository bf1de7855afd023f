"""`veil audit MODEL_URI`: user inference, canaries and secret exposure of a registered model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from components.core.errors import VeilError

err = Console(stderr=True)


def _fmt(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


def _table(doc: dict) -> Table:
    t = Table(title=f"Audit {doc['audit_id']}: {'PASSED' if doc['passed'] else 'FAILED'}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("user inference AUROC", f"{doc['auroc']:.3f} ± {doc['auroc_std']:.3f} "
                                      f"(point {doc['auroc_point']:.3f}; DP ceiling {doc['auroc_ceiling']:.3f} from "
                                      "(ε, δ)" + (f", {doc['auroc_ceiling_pld']:.3f} from the mechanism's PLD)"
                                                  if doc.get("auroc_ceiling_pld") is not None else ")"))
    t.add_row("TPR at FPR", "  ".join(
        f"{k}: {v:.3f}{'' if doc['tpr_at_fpr_resolved'][k] else ' (0 FP)'}" for k, v in doc["tpr_at_fpr"].items()))
    if doc.get("auroc_by_m"):
        t.add_row("AUROC by samples/user", "  ".join(f"m={r['m']}: {r['auroc']:.3f}" for r in doc["auroc_by_m"]))
    t.add_row("users", f"{doc['users_in']} trained / {doc['users_out']} held out "
                       f"(FPR resolution {doc['fpr_resolution']:.3g})")
    t.add_row("empirical ε lower bound", f"{doc['epsilon_lower_bound']:.3f} (95%)"
              + (f" vs certified {doc['epsilon']:.3g}" if doc["epsilon"] is not None else ""))
    ex = doc["secret_exposure"]
    if ex.get("n_secrets"):
        t.add_row("secret exposure", f"{ex['n_secrets']} secrets × {ex['n_candidates']} candidates; max "
                                     f"{ex['max_exposure']:.2f} bits, max excess over base "
                                     f"{_fmt(ex.get('max_excess_exposure'), '.2f')} bits")
        for c, v in ex["by_class"].items():
            t.add_row(f"  {c}", f"n={v['n']} max {v['max_exposure']:.2f} mean {v['mean_exposure']:.2f} bits")
    can = doc.get("canaries")
    if can:
        t.add_row("canaries", f"{can['users_in']} injected / {can['users_out']} held out; AUROC "
                              f"{_fmt(can.get('auroc'))}; max exposure {_fmt(can.get('max_exposure'), '.2f')} bits")
    for f in doc["failures"]:
        t.add_row("[red]failure[/red]", f)
    if doc.get("roc_png"):
        t.add_row("ROC plot", doc["roc_png"])
    return t


def audit_cmd(
    model_uri: str = typer.Argument(..., help="registered model: models:/NAME/VERSION or models:/NAME@ALIAS"),
    policy: Optional[Path] = typer.Option(None, "--policy", help="policy whose audit thresholds decide pass/fail "
                                                                  "(default: the thresholds recorded in the plan)"),
    truth: Optional[Path] = typer.Option(None, "--truth", help="demo truth.json: probe every planted secret "
                                                                "(default: the snapshot's tagged secrets)"),
    candidates: int = typer.Option(100, "--candidates", min=1, help="random candidates per secret (exposure)"),
    per_class: int = typer.Option(20, "--secrets-per-class", min=0, help="secrets probed per class (0: all)"),
    bootstrap: int = typer.Option(100, "--bootstrap", min=2, help="bootstrap resamples of users"),
    record: bool = typer.Option(True, "--record/--no-record", help="write the aggregates into the certificate "
                                                                    "and the MLflow run"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Audit a registered model: user inference vs the DP ceiling, canaries, secret exposure.

    Per-user scores go to VEIL_HOME/catalog-private/audits/ only; the certificate, the MLflow run and
    this output carry aggregates.
    """
    from catalog.snapshots import load_snapshot
    from components.audit import run_audit
    from components.core.settings import load_settings
    from components.registry import load_model

    settings = load_settings().ensure()
    settings.apply_environment()
    thresholds = None
    if policy is not None:
        from components.policy import load_policy

        thresholds = load_policy(policy).spec.audit
    truth_doc = None
    if truth is not None:
        try:
            truth_doc = json.loads(truth.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise VeilError(f"{truth}: cannot read truth file ({e})") from None
    loaded = load_model(model_uri, settings)
    plan = loaded.plan
    snap = load_snapshot(settings, plan["data"]["snapshot_id"])
    result = run_audit(loaded, snap.records, policy_thresholds=thresholds, settings=settings, truth=truth_doc,
                       secret_spans=None if truth_doc is not None else snap.secret_spans,
                       n_candidates=candidates, max_secrets_per_class=per_class, bootstrap=bootstrap,
                       progress=True)
    if record:
        from components.registry import record_audit

        record_audit(settings, model_uri, result.summary(), plot_path=result.plot_path)
    doc = result.to_json()
    if json_out:
        print(json.dumps(doc, indent=2, allow_nan=False, ensure_ascii=False))
    else:
        Console().print(_table(doc))
    if not result.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit_cmd)
