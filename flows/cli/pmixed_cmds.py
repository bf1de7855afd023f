"""`veil pmixed build`: a PMixED ensemble (private prediction, seed 002 repaired) registered with its certificate."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import err, print_json, quiet_third_party, settings_with_device

pmixed_app = typer.Typer(help="Private prediction: an ensemble served token by token under a token budget.",
                         no_args_is_help=True)


@pmixed_app.command("build")
def build_cmd(policy: Path = typer.Option(..., "--policy", help="A PredictionPolicy YAML (policies/demo-pmixed.yaml)."),
              base_model: Optional[Path] = typer.Option(None, "--base-model", help="Public base model directory."),
              snapshot: Optional[str] = typer.Option(None, "--snapshot", help="Snapshot id (default: the latest)."),
              name: Optional[str] = typer.Option(None, "--name", help="Registered model name (default: the policy's)."),
              as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    from flows.pmixed import build

    quiet_third_party()
    s = settings_with_device()  # the shards train: a missing GPU is said before any ledger charge
    out = build(s, policy, base_dir=base_model, snapshot_id=snapshot, name=name)
    if as_json:
        print_json(out)
        return
    c = out["certificate"]
    err.print(f"[green]registered[/green] {out['model_uri']}: {out['shards']} shards, "
              f"({c['epsilon']:.3f}, {c['delta']:g})-DP per person over {c['token_budget']} private tokens "
              f"(radius {c['ensemble']['radius']:.4f} nats, q={c['ensemble']['subsample_rate']:g})")
    print(out["model_uri"])


def register(app: typer.Typer) -> None:
    app.add_typer(pmixed_app, name="pmixed")
