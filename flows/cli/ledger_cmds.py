"""`veil ledger`: the per-person privacy ledger's spend distribution (aggregates only)."""
from __future__ import annotations

import typer
from rich.table import Table

from flows.cli import common


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def ledger_cmd(json_out: bool = typer.Option(False, "--json", help="one JSON document on stdout")) -> None:
    """Budget, people, retired, releases and the spread of per-person spend; per secret class the secrets
    charged and their max lifetime KL and γ; per-person and per-secret rows go only to the private area,
    a burn-down plot to VEIL_HOME."""
    from components.ledger.report import ledger_report

    doc = ledger_report(common.settings())
    if json_out:
        common.print_json(doc)
        return
    b = doc["budget"]
    t = Table(title="Privacy ledger (per person, Rényi filter)", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("budget", "none set (charging only)" if b is None else f"ε={b['epsilon']:g} at δ={b['delta']:g} per person")
    t.add_row("people", str(doc["people"]))
    t.add_row("retired", f"{doc['retired']} (left out of at least one release)")
    t.add_row("releases", str(doc["releases"]))
    nc = doc.get("persons_not_covered") or {}
    if nc.get("releases"):
        t.add_row("persons not covered", nc["statement"])
    s = doc["spend"]
    t.add_row("spend ε", f"max {_fmt(s['max_epsilon'])} · median {_fmt(s['median_epsilon'])} · "
                         f"min {_fmt(s['min_epsilon'])}")
    if doc.get("pld_estimate") and doc["pld_estimate"].get("max_epsilon") is not None:
        t.add_row("PLD (estimate)", f"{doc['pld_estimate']['max_epsilon']:.3f} for the most-charged person — "
                                    "non-adaptive estimate, not the guarantee")
    if doc.get("burn_down_png"):
        t.add_row("burn-down plot", doc["burn_down_png"])
    for cls, c in (doc.get("secrets") or {}).items():
        t.add_row(f"secrets: {cls}", f"{c['secrets_charged']} charged · {c['secrets_dropped']} dropped · max lifetime "
                                     f"KL {c['max_lifetime_kl']:.4g} of {c['kl_budget']:.4g} · max γ "
                                     f"{c['max_lifetime_gamma']:.4g} (κ={c['kappa']:g}, target {c['gamma_target']:g})")
    t.add_row("per-person rows", f"{doc['private_rows']} (private)")
    if doc.get("private_secret_rows"):
        t.add_row("per-secret rows", f"{doc['private_secret_rows']} (private)")
    common.out.print(t)


def register(app: typer.Typer) -> None:
    app.command("ledger")(ledger_cmd)
