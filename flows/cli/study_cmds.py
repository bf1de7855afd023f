"""`veil study`: a grid of privacy settings trained and evaluated; table, plot, MLflow runs."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from components.core.errors import VeilError
from flows.cli.common import err, out, print_json, quiet_third_party, settings_with_device
from flows.study_report import rich_table


def study(policy: Path = typer.Option(..., "--policy", "-p", help="The policy every grid point starts from."),
          grid: Path = typer.Option(..., "--grid", "-g", help="Grid YAML (docs/results/grid-*.yaml)."),
          base_model: Optional[Path] = typer.Option(None, "--base-model",
                                                    help="Public base model directory (bench/public_base.py)."),
          private_selection: bool = typer.Option(False, "--private-selection",
                                                 help="Choose a point privately (Papernot & Steinke 2022): a random "
                                                      "number of trials, charged to the per-person ledger."),
          task_runner: str = typer.Option("thread", "--task-runner", help="thread | dask (prefect-dask)."),
          workers: int = typer.Option(1, "--workers", help="Grid points trained at once."),
          as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")) -> None:
    """Train and evaluate every point of GRID (mechanism, ε, selection, k, LoRA/full) as tuning runs:
    nothing is charged, certified or registered. Tuning on private data is not covered by any certificate."""
    quiet_third_party()
    if not policy.is_file():
        raise VeilError(f"--policy: {policy}: no such file")
    s = settings_with_device()   # the points train: a missing GPU is said before any planning
    if private_selection:
        from flows.private_selection import run_private_selection  # startup

        doc = run_private_selection(s, policy, grid, base_dir=base_model)
        if as_json:
            print_json(doc)
            return
        sel = doc["selection"]
        out.print(f"selected: [bold]{(doc['selected'] or {}).get('key', 'nothing (K = 0)')}[/bold]")
        out.print(f"private selection: ({sel['epsilon']:.3f}, {sel['delta']:g})-DP per person "
                  f"(E[K] = {sel['expected_trials']:.2f}, {sel['theorem']}), ledger release {sel['ledger_release_id']}")
        err.print(f"[yellow]{doc['caveat']}[/yellow]")
        return
    from flows.study import run_study  # startup

    doc = run_study(s, policy, grid, base_dir=base_model, task_runner=task_runner, workers=workers)
    if as_json:
        print_json(doc)
        return
    out.print(rich_table(doc))
    out.print(f"table: {doc['dir']}/results.csv · plot: {doc['plot']}")
    err.print(f"[yellow]{doc['caveat']}[/yellow]")


def register(app: typer.Typer) -> None:
    app.command("study")(study)
