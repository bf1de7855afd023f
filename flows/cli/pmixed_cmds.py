"""`veil pmixed build`: a PMixED ensemble (private prediction, seed 002 repaired) registered with its certificate."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import err, print_json, quiet_third_party, settings_with_device

pmixed_app = typer.Typer(help="Private prediction: an ensemble served token by token under a token budget.",
                         no_args_is_help=True)


def show_plan(doc: dict) -> None:
    """The sizing on stderr: what the budget buys per request and per key, and the ε/radius trade."""
    from rich.table import Table

    z = doc["sizing"]
    err.print(f"[bold]{doc['policy']['name']}[/bold]: ({doc['epsilon']:g}, {doc['delta']:g})-DP per person over "
              f"{z['token_budget']} private tokens for the endpoint's whole life, whoever asks "
              f"(radius {doc['radius']:.4f} nats, {doc['shards']} shards, q={doc['subsample_rate']:g})")
    err.print(f"  per request: up to {z['private_tokens_per_request']} private tokens "
              f"(max_tokens_per_request {z['max_tokens_per_request']}) → {z['full_private_requests']} full-length "
              f"private answers in total (fewer tokens each: up to {z['min_private_requests']} answers)")
    if z["key_quota_tokens"] is not None:
        err.print(f"  per key: {z['key_quota_tokens']} private tokens ({z['requests_per_key']} full-length answers); "
                  f"{z['keys_at_full_quota']} keys can use their whole quota")
    if z["keys"]:
        err.print(f"  with {z['keys']} keys: about {z['private_tokens_per_key']} private tokens "
                  f"({z['requests_per_key']} full-length answers) per key")
    err.print(f"  afterwards: {'public-only text, flagged per token' if doc['when_exhausted'] == 'public_only' else 'HTTP 429'}")
    t = Table("token_budget", "private answers", "radius (nats)", title="budget vs. how far answers may move "
              "from the public model", title_justify="left", box=None)
    for row in doc["tradeoff"]:
        t.add_row(str(row["token_budget"]), str(row["token_budget"] // z["max_tokens_per_request"]),
                  f"{row['radius']:.4f}")
    err.print(t)
    for h in z["hints"]:
        err.print(f"  [yellow]hint[/yellow]: {h}")


@pmixed_app.command("plan")
def plan_cmd(policy: Path = typer.Option(..., "--policy", help="A PredictionPolicy YAML (policies/demo-pmixed.yaml)."),
             keys: Optional[int] = typer.Option(None, "--keys", help="How many API keys you expect (sizes the share "
                                                "of each)."),
             as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    """What the policy's token budget buys, before any build: private tokens per request, requests per key."""
    from flows.pmixed import plan  # startup

    doc = plan(policy, keys=keys)
    if as_json:
        print_json(doc)
    else:
        show_plan(doc)


@pmixed_app.command("build")
def build_cmd(policy: Path = typer.Option(..., "--policy", help="A PredictionPolicy YAML (policies/demo-pmixed.yaml)."),
              base_model: Optional[Path] = typer.Option(None, "--base-model", help="Public base model directory."),
              snapshot: Optional[str] = typer.Option(None, "--snapshot", help="Snapshot id (default: the latest)."),
              name: Optional[str] = typer.Option(None, "--name", help="Registered model name (default: the policy's)."),
              as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    from flows.pmixed import build, plan  # startup

    quiet_third_party()
    s = settings_with_device()  # the shards train: a missing GPU is said before any ledger charge
    if not as_json:
        show_plan(plan(policy))   # before minutes of training: what this budget will buy
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
