"""Policy and plan commands: `veil policy check|schema|show`, `veil plan`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from components.core.errors import VeilError
from components.publication import publish
from flows.cli.common import err, out, print_json as _print_json, quiet_third_party, settings as _settings
from components.draws.annex import load_annex


policy_app = typer.Typer(help="Check and inspect privacy policies (YAML, see policies/README.md).",
                         no_args_is_help=True)


@policy_app.command("check")
def check(files: List[Path] = typer.Argument(..., help="policy YAML file(s)"),
          json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """Validate policies: "ok", or one line per problem naming file, line and field (exit 2)."""
    from components.policy import check_policy  # startup

    report = {}
    for f in files:
        try:
            report[str(f)] = [str(p) for p in check_policy(f)]
        except VeilError as e:          # unreadable / missing file
            report[str(f)] = [str(e)]
    bad = any(report.values())
    if json_out:
        _print_json({"ok": not bad, "problems": report})
    else:
        for f, problems in report.items():
            for line in problems:
                print(line, file=sys.stderr)
            if not problems:
                print("ok" if len(files) == 1 else f"{f}: ok")
    if bad:
        raise typer.Exit(2)


@policy_app.command("schema")
def schema(write: Optional[Path] = typer.Option(None, "--write", help="write the schema to this file")) -> None:
    """Print the policy JSON Schema (editors use it to complete and check policies)."""
    from components.policy.schema import schema_text, write_schema  # startup

    if write is not None:
        print(write_schema(write))
    else:
        sys.stdout.write(schema_text())


@policy_app.command("show")
def show(file: Path = typer.Argument(..., help="policy YAML file"),
         json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """The policy as Veil reads it, with defaults filled in and its sha256."""
    from components.policy import load_policy  # startup

    pol = load_policy(file)
    doc = {"sha256": pol.sha256, "path": pol.path, "policy": pol.model_dump(mode="json"),
           "tagging_rules": pol.tagging_rules(),
           "secret_protection": {c: {"kappa": p.kappa, "gamma": p.gamma, "rho": p.rho}
                                 for c, p in pol.secret_protection().items()}}
    if json_out:
        _print_json(doc)
        return
    s = pol.spec
    t = Table(title=f"policy {pol.name}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("file", f"{pol.path}")
    t.add_row("sha256", pol.sha256)
    t.add_row("owner", pol.metadata.owner)
    t.add_row("unit · mechanism", f"{s.privacy_unit} · {s.mechanism}")
    if s.target:
        t.add_row("target", f"ε={s.target.epsilon:g}, δ={s.target.delta:g}")
    if s.lifetime_budget:
        t.add_row("lifetime", f"ε={s.lifetime_budget.epsilon:g}, δ={s.lifetime_budget.delta:g}")
    t.add_row("contribution", f"k={s.contribution.max_records_per_user}, {s.contribution.selection}")
    for c, p in pol.secret_protection().items():
        t.add_row(f"secret {c}", f"κ={p.kappa:g} → γ≤{p.gamma:g} (ρ={p.rho:.4g})")
    tr = s.training
    t.add_row("training", f"T={tr.steps}, B={tr.expected_batch_size}, C={tr.clip_norm:g}, lr={tr.learning_rate:g}, "
                          f"seq_len={tr.seq_len}, lora={'r=' + str(tr.lora.r) if tr.lora else 'full'}")
    out.print(t)


def _sweep_values(spec: Optional[str], c0: float) -> list[float]:
    if spec:
        try:
            vals = [float(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            raise VeilError(f"--c-values: {spec!r} is not a comma-separated list of numbers") from None
        if not vals or any(v <= 0 for v in vals):
            raise VeilError("--c-values: give positive numbers, e.g. 1,3,10,30")
        return sorted(vals)
    return sorted({round(c0 * f, 6) for f in (0.1, 0.3, 1, 3, 10, 30)})


def plan(policy: Path = typer.Option(..., "--policy", "-p", help="policy YAML"),
         snapshot: Optional[str] = typer.Option(None, "--snapshot", help="snapshot id (default: the latest)"),
         json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
         sweep_c: bool = typer.Option(False, "--sweep-c", help="secret unit: retained data vs noise for a range "
                                                               "of C (writes no plan)"),
         c_values: Optional[str] = typer.Option(None, "--c-values", help="C values for --sweep-c, e.g. 1,3,10"),
         base_model: Optional[Path] = typer.Option(None, "--base-model",
                                                   help="public base model dir: ppl-high/ppl-low selection; "
                                                        "gradient diversity for mechanism auto"),
         admin: bool = typer.Option(False, "--admin", help="with --json: also the administrators-only forecast "
                                                           "over this plan's people (releases left, people the "
                                                           "next release would retire)")) -> None:
    """Turn a policy and a snapshot into a plan: sampling rate, calibrated σ, bounded data, audit split;
    and what the per-person ledger says about releasing it: how many releases of it a person can still
    take, and how many people its release would retire."""
    from catalog.snapshots import load_snapshot  # startup
    from components.policy import load_policy  # startup

    quiet_third_party()   # the utility forecast loads the base model (transformers' FutureWarning, issue 26)
    pol = load_policy(policy)
    s = _settings()
    snap = load_snapshot(s, snapshot)
    if sweep_c:
        _sweep(pol, snap, c_values, json_out)
        return
    from components.planning import Plan  # startup
    from flows import stages  # startup

    progress = None if json_out else (lambda msg: err.print(f"[dim]plan:[/dim] {msg}"))
    # the pipeline's planning stage: the policy's people rules applied, and N̂ charged in the ledger to
    # everyone it counts before the plan is written (publishing N̂ is a release)
    with err.status("planning…", spinner="dots") if not json_out else _null():
        res = stages.plan(s, policy, snapshot_id=snap.snapshot_id, base_dir=base_model, progress=progress)
    p, path = Plan(res["plan"]), Path(res["plan_path"])
    lfc = _forecast(s, p.to_dict())
    if json_out:
        doc = {"plan_path": str(path), "plan": p.to_dict()}
        if lfc:
            from components.ledger.report import ADMIN_ONLY, FORECAST_DEFINITION  # startup

            doc["forecast"] = publish("cli.plan", {"forecast": {**lfc["public"],
                                                                "definition": FORECAST_DEFINITION}})["forecast"]
            if admin:   # the operator's own terminal, never a published channel
                doc["administrators_only"] = {"readers": ADMIN_ONLY, "forecast": lfc["people"]}
        if admin:
            from components.ledger.report import ADMIN_ONLY  # startup

            doc.setdefault("administrators_only", {"readers": ADMIN_ONLY})["audit"] = _audited(s, pol, p)
        _print_json(doc)
        return
    t = Table(title=f"plan {p.sha256[:12]}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")

    # the operator's own terminal: the real snapshot id, from the plan's private annex
    for k, v in p.summary_rows(load_annex(s.private_dir, p.to_dict())):
        t.add_row(k, v)
    out.print(t)
    fc = p.to_dict().get("utility_forecast") or {}
    if fc.get("verdict") in ("hopeless", "marginal"):
        from components.planning.forecast import describe  # startup

        style = "bold red" if fc["verdict"] == "hopeless" else "yellow"
        out.print(f"[{style}]utility forecast: {describe(fc)}[/{style}]", highlight=False)
    if lfc:
        n = lfc["public"]["releases_for_a_new_person"]
        out.print(f"ledger: a person who has spent nothing can take {'any number of' if n is None else n} "
                  "releases of this plan", highlight=False)
        pp = lfc.get("people")
        if pp and pp.get("people"):
            lo, med = pp["releases_left_min"], pp["releases_left_median"]
            # the operator's own terminal (it already shows the real snapshot id from the annex)
            out.print(f"ledger (administrators only): over this plan's {pp['people']} people, releases of it left "
                      f"min {'∞' if lo is None else lo} · median {'∞' if med is None else f'{med:g}'}; its release "
                      f"would retire {pp['next_release_retires']}", highlight=False)
    au = _audited(s, pol, p)
    if au is not None:
        # exact counts of audited people: the operator's own terminal (as the ledger line above)
        ok = au["settles"] and au["require"] == "passed"
        style = "dim" if ok or au["require"] == "not_failed" else "yellow"
        verdict = ("" if au["settles"] else " — the audit cannot pass; with audit.require 'passed' the release "
                   "will not be promoted" if au["require"] == "passed" else
                   " — the audit cannot pass; audit.require 'not_failed' promotes it unless it fails")
        out.print(f"[{style}]audit (administrators only): {au['why']}{verdict}[/{style}]", highlight=False)
    out.print(f"written to {path}")


def _audited(s, pol, p) -> dict | None:
    """User inference with the people this plan's split audits (audit.sizing.audited_sizing):
    exact counts from the private annex, for the operator only."""
    from components.audit.sizing import audited_sizing  # startup

    if pol.spec.privacy_unit != "user":
        return None
    return audited_sizing(pol.spec.audit, load_annex(s.private_dir, p.to_dict()).get("counts") or {})


def _forecast(s, plan_doc: dict) -> dict | None:
    """The ledger's forecast for this plan (components.ledger.report.plan_forecast), None without a budget."""
    from components.ledger import Ledger  # startup
    from components.ledger.report import plan_forecast  # startup

    led = Ledger.open(s)
    try:
        return plan_forecast(s, led, plan_doc)
    finally:
        led.dispose()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _sweep(pol, snap, c_values: Optional[str], json_out: bool) -> None:
    from components.draws.audit_split import split_for_audit  # startup
    from components.bounding.secret_plan import sweep_c  # startup

    if pol.spec.privacy_unit != "secret":
        raise VeilError("--sweep-c: C weighs secrets in the secret-protection LP; this policy's privacy_unit is "
                        f"'{pol.spec.privacy_unit}'")
    tr = pol.spec.training
    split = split_for_audit(snap.records.select(["record_id", "user_id", "text"]), holdout=pol.spec.audit.holdout_users,
                            m=pol.spec.audit.attacker_samples_per_user, seed=tr.seed)
    cs = _sweep_values(c_values, pol.spec.secrets.lp.c)
    rows = sweep_c(pol, split.train, snap.secret_spans, cs, expected_batch_size=tr.expected_batch_size,
                   steps=tr.steps)
    if json_out:
        _print_json({"policy": pol.name, "snapshot_id": snap.snapshot_id, "steps": tr.steps,
                     "expected_batch_size": tr.expected_batch_size, "sweep": rows})
        return
    t = Table(title=f"C sweep · {pol.name} · T={tr.steps}, B={tr.expected_batch_size}")
    for col in ("C", "records kept", "binding secrets", "σ", "noise / signal", "note"):
        t.add_column(col, justify="right" if col != "note" else "left")
    for r in rows:
        t.add_row(f"{r['c']:g}", f"{r['retained_fraction']:.1%}", str(r["n_binding"]),
                  "—" if r.get("noise_multiplier") is None else f"{r['noise_multiplier']:.4g}",
                  "—" if r.get("noise_per_signal") is None else f"{r['noise_per_signal']:.4g}",
                  r.get("note", ""))
    out.print(t)
    out.print("larger C keeps more data but needs more noise; pick C by validation loss (seed 004 §4)")


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")
    app.command("plan")(plan)
