"""`veil audit MODEL_URI`: user inference, canaries and secret exposure of a registered model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from components.core.errors import VeilError
from components.core.settings import load_settings

err = Console(stderr=True)


def _fmt(x, spec=".3f") -> str:
    return "—" if x is None else format(x, spec)


_STYLE = {"passed": "[green]PASSED[/green]", "failed": "[red]FAILED[/red]",
          "inconclusive": "[yellow]INCONCLUSIVE[/yellow]", None: "not gated"}


def _rng(b) -> str:
    return "—" if not b else f"[{b[0]:g}, {b[1]:g})" if b[1] is not None else f"[{b[0]:g}, …)"


def _count(b) -> str:
    return f"{b[0]}–{b[1] - 1}"


def verdict_word(doc: dict) -> str:
    """PASSED / FAILED / INCONCLUSIVE for an audit section (or "FAILED"/"PASSED" from a v1 one)."""
    v = doc.get("verdict")
    if v is None:
        v = "passed" if doc.get("passed") else "failed"
    return v.upper()


def _table(doc: dict) -> Table:
    """The public section only: verdicts and quantized aggregates (exact values are in the private report)."""
    t = Table(title=f"Audit {doc['audit_id']}: {_STYLE.get(doc['verdict'], doc['verdict'])}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    ui = doc["user_inference"]
    ceil = f"DP ceiling {doc['auroc_ceiling']:.3f} from (ε, δ)" + (
        f", {doc['auroc_ceiling_pld']:.3f} from the mechanism's PLD" if doc.get("auroc_ceiling_pld") is not None else "")
    # a value no grid can hold to the public rule is not published (null): say so rather than print a range
    auc = (f"AUROC in {_rng(doc['auroc'])} (grid {doc['auroc_grid']:g})" if doc.get("auroc") is not None
           else "AUROC not published (too few people)")
    if doc.get("auroc_interval") is not None:
        auc += f", {ui['confidence']:.0%} interval within {_rng(doc['auroc_interval'])} (grid {doc['interval_grid']:g})"
    t.add_row("user inference", f"{_STYLE.get(ui['verdict'], ui['verdict'])} · {auc} · {ceil}"
              + (f" · policy max {ui['threshold']:g}" if ui.get("threshold") is not None else ""))
    t.add_row("  by samples/user", "  ".join(f"m={r['m']}: {r['verdict'] or '—'}" for r in ui["by_m"]))
    t.add_row("  users", f"{_count(doc['users_in'])} trained / {_count(doc['users_out'])} held out")
    if ui.get("people_needed"):
        need = ui["people_needed"]
        t.add_row("  [yellow]people needed[/yellow]", f"about {need['in']} in / {need['out']} out"
                  if isinstance(need, dict) else str(need))
    ex = doc["secret_exposure"]
    if ex.get("by_class"):
        t.add_row("secret exposure", f"{_STYLE.get(ex['verdict'], ex['verdict'])} · {ex['n_candidates']} candidates "
                                     f"per secret · policy max {_fmt(ex['limit_bits'], 'g')} bits"
                                     + (" (excess over the base model)" if ex.get("excess_over_reference") else ""))
        for c, v in ex["by_class"].items():
            t.add_row(f"  {c}", f"{_STYLE.get(v['verdict'], v['verdict'])} · {_count(v['n_secrets'])} secrets · "
                                f"mean {v['statistic']} " + (f"in {_rng(v['mean_bits'])} bits" if v["mean_bits"]
                                                              else "not published (too few secrets in the class)"))
    one = doc.get("one_run") or {}
    if one.get("computed"):
        t.add_row("one-run ε bound", f"ε ≥ {one['epsilon_at_least']:g} at {one['confidence']:.0%} confidence "
                                     f"(Steinke et al. 2023) · certified ε {_fmt(one.get('certified_epsilon'), 'g')}")
    gate = doc.get("gate")
    if gate:
        t.add_row("gate", f"policy requires '{gate['require']}': "
                          + ("[green]met[/green]" if gate["meets"] else f"[red]not met[/red] · {gate['reason']}"))
    can = doc.get("canaries")
    if can:
        t.add_row("canaries", f"{_STYLE.get(can.get('verdict'), can.get('verdict'))} · {_count(can['users_in'])} "
                              f"injected / {_count(can['users_out'])} held out · "
                              + (f"AUROC in {_rng(can['auroc'])}" if can.get("auroc") is not None else "AUROC not published"))
    for r in doc["reasons"]:
        t.add_row("[yellow]why[/yellow]" if "INCONCLUSIVE" in r else "[red]why[/red]", r)
    t.add_row("coverage", doc["coverage_note"])
    if doc.get("plot_png"):
        t.add_row("plot (public)", doc["plot_png"])
    t.add_row("private report", f"{doc['private_report']} (owner only: per-person rows and exact values)")
    return t


def audit_cmd(
    model_uri: str = typer.Argument(..., help="registered model: models:/NAME/VERSION or models:/NAME@ALIAS"),
    policy: Optional[Path] = typer.Option(None, "--policy", help="policy whose audit thresholds decide pass/fail "
                                                                  "(default: the thresholds recorded in the plan)"),
    truth: Optional[Path] = typer.Option(None, "--truth", help="demo truth.json: probe every planted secret "
                                                                "(default: the snapshot's tagged secrets)"),
    candidates: Optional[int] = typer.Option(None, "--candidates", min=1, help="random candidates per secret "
                                             "(exposure); default: the plan's audit sizing (policy "
                                             "audit.candidates_per_secret), as the pipelines use"),
    per_class: Optional[int] = typer.Option(None, "--secrets-per-class", min=0, help="secrets probed per class (0: "
                                            "all); default: the plan's audit sizing (policy audit.secrets_per_class)"),
    bootstrap: int = typer.Option(100, "--bootstrap", min=2, help="bootstrap resamples of users"),
    record: bool = typer.Option(True, "--record/--no-record", help="write the aggregates into the certificate "
                                                                    "and the MLflow run"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Audit a registered model: user inference vs the DP ceiling, canaries, secret exposure.

    Verdict: PASSED, FAILED or INCONCLUSIVE (too few people to decide; says how many it needs). Exit
    code 0 only when PASSED; 1 when FAILED, 3 when INCONCLUSIVE. Per-user scores and exact values go to
    VEIL_HOME/private/audit/ only; the certificate, the MLflow run and this output carry the public
    section: verdicts and coarsely quantized aggregates, not covered by the certificate.
    """
    from catalog.snapshots import load_snapshot  # startup
    from components.audit.run import run_audit  # startup
    from components.registry import load_model  # startup
    from flows.stages import plan_snapshot_id  # startup

    settings = load_settings().ensure()
    settings.apply_environment()
    thresholds = None
    if policy is not None:
        from components.policy import load_policy  # startup

        thresholds = load_policy(policy).spec.audit
    truth_doc = None
    if truth is not None:
        try:
            truth_doc = json.loads(truth.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise VeilError(f"{truth}: cannot read truth file ({e})") from None
    loaded = load_model(model_uri, settings)
    plan = loaded.plan
    snap = load_snapshot(settings, plan_snapshot_id(settings, plan))
    result = run_audit(loaded, snap.records, policy_thresholds=thresholds, settings=settings, truth=truth_doc,
                       secret_spans=None if truth_doc is not None else snap.secret_spans,
                       n_candidates=candidates, max_secrets_per_class=per_class, bootstrap=bootstrap,
                       progress=True)
    if record:
        from components.registry import record_audit  # startup

        record_audit(settings, model_uri, result.summary(), plot_path=result.plot_path)
    doc = result.to_json()
    if json_out:
        print(json.dumps(doc, indent=2, allow_nan=False, ensure_ascii=False))
    else:
        Console().print(_table(doc))
    if result.verdict != "passed":
        raise typer.Exit(3 if result.verdict == "inconclusive" else 1)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit_cmd)
