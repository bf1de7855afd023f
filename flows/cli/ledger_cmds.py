"""`veil ledger`: the ledger's budget and releases for governance readers; with `--admin`, for
administrators only, the exact counts of people and the spread of per-person spend."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from components.core.errors import VeilError
from components.publication import publish
from flows.cli import common


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def ledger_cmd(json_out: bool = typer.Option(False, "--json", help="one JSON document on stdout"),
               admin: bool = typer.Option(False, "--admin",
                                          help="also the administrators-only part: exact counts of people, "
                                               "retirements and secrets, the spread of per-person spend"),
               plan: Path = typer.Option(None, "--plan", help="forecast further releases of this plan (default: "
                                                              "the latest release's plan)")) -> None:
    """Budget, releases and the Rényi orders (for governance readers); with --admin, for administrators
    only, the number of people and retirements, the spread of per-person spend and per secret class the
    secrets charged and their max lifetime KL and γ. Per-person and per-secret rows go only to the private
    area, a burn-down plot to VEIL_HOME."""
    from components.ledger.report import admin_view, governance_view, ledger_report  # startup

    if plan is not None and not plan.is_file():
        raise VeilError(f"--plan {plan}: no such plan file")
    full = ledger_report(common.settings(), plan=plan)
    gov = publish("cli.ledger", governance_view(full))
    adm = admin_view(full) if admin else None
    if json_out:
        # the administrators' part is theirs (their terminal), never on the governance channel
        common.print_json({**gov, "administrators_only": adm} if admin else gov)
        return
    b = gov["budget"]
    t = Table(title="Privacy ledger (per person, Rényi filter)", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("budget", "none set (charging only)" if b is None else f"ε={b['epsilon']:g} at δ={b['delta']:g} per person")
    t.add_row("releases", str(gov["releases"]))
    for r in gov.get("post_processing_releases") or []:
        t.add_row(f"release {r['release_id']}: {r['kind']}",
                  f"{r.get('records')} records from {r.get('model')} v{r.get('model_version')} (post-processing of "
                  f"release {r.get('of_release') if r.get('of_release') is not None else '—'}: no charge), "
                  f"corpus {str(r.get('corpus_sha256'))[:12]}…")
    nc = gov.get("persons_not_covered") or {}
    if nc.get("releases"):
        t.add_row("persons not covered", nc["statement"])
    fc = gov.get("forecast")
    if fc:
        n = fc["releases_for_a_new_person"]
        t.add_row("forecast", f"plan {fc['plan_sha256'][:12]}: a person who has spent nothing can take "
                              f"{'any number of' if n is None else n} releases of it")
    if adm is None:
        t.add_row("people, spend", gov["note"])
        common.out.print(t)
        return
    common.out.print(t)
    a = Table(title="Administrators only — exact counts of people; never for governance readers", show_header=False)
    a.add_column("what", style="bold")
    a.add_column("value")
    a.add_row("people", str(adm["people"]))
    a.add_row("retired", f"{adm['retired']} (left out of at least one release)")
    s = adm["spend"]
    a.add_row("spend ε", f"max {_fmt(s['max_epsilon'])} · median {_fmt(s['median_epsilon'])} · "
                         f"min {_fmt(s['min_epsilon'])}")
    if adm.get("pld_estimate") and adm["pld_estimate"].get("max_epsilon") is not None:
        a.add_row("PLD (estimate)", f"{adm['pld_estimate']['max_epsilon']:.3f} for the most-charged person — "
                                    "non-adaptive estimate, not the guarantee")
    afc = adm.get("forecast")
    if afc and afc.get("people"):
        lo, med = afc.get("releases_left_min"), afc.get("releases_left_median")
        a.add_row("releases left", f"of plan {afc['plan_sha256'][:12]}, over its {afc['people']} people: min "
                                   f"{'∞' if lo is None else lo} · median {'∞' if med is None else f'{med:g}'}")
        a.add_row("next release", f"would retire {afc['next_release_retires']} of them")
    if adm.get("burn_down_png"):
        a.add_row("burn-down plot", adm["burn_down_png"])
    for cls, c in (adm.get("secrets") or {}).items():
        a.add_row(f"secrets: {cls}", f"{c['secrets_charged']} charged · {c['secrets_dropped']} dropped · max lifetime "
                                     f"KL {c['max_lifetime_kl']:.4g} of {c['kl_budget']:.4g} · max γ "
                                     f"{c['max_lifetime_gamma']:.4g} (κ={c['kappa']:g}, target {c['gamma_target']:g})")
    a.add_row("per-person rows", f"{adm['private_rows']} (private)")
    if adm.get("private_secret_rows"):
        a.add_row("per-secret rows", f"{adm['private_secret_rows']} (private)")
    common.out.print(a)


def register(app: typer.Typer) -> None:
    app.command("ledger")(ledger_cmd)
