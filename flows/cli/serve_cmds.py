"""`veil keys create` and `veil serve MODEL_URI`: the PMixED HTTP endpoint (FastAPI + uvicorn)."""
from __future__ import annotations

import typer

from flows.cli.common import err, print_json, settings

keys_app = typer.Typer(help="API keys for `veil serve` (stored hashed).", no_args_is_help=True)


@keys_app.command("create")
def keys_create(as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    from components.prediction.budget import TokenBudget

    tb = TokenBudget.open(settings())
    try:
        key = tb.create_key()
    finally:
        tb.dispose()
    if as_json:
        print_json({"key": key})
    else:
        err.print("API key (shown once; only its hash is stored):")
        print(key)


def serve_cmd(model_uri: str = typer.Argument(..., help="models:/NAME/VERSION or models:/NAME@ALIAS"),
              host: str = typer.Option("127.0.0.1", "--host"),
              port: int = typer.Option(8000, "--port"),
              device: str = typer.Option("cpu", "--device")):
    """Serve a PMixED ensemble: POST /v1/completions {"prompt", "max_tokens"} with Authorization: Bearer KEY."""
    import uvicorn

    from components.prediction.budget import TokenBudget
    from components.prediction.release import open_ensemble, resolve
    from components.prediction.server import create_app

    s = settings()
    r = resolve(s, model_uri)
    ens = open_ensemble(s, r, device=device)
    tb = TokenBudget.open(s)
    cert = r["certificate"]
    cap = int(r["manifest"].get("max_tokens_per_request", 0)) or 1024
    quota = r["manifest"].get("key_quota_tokens")  # absent in ensembles built before quotas: none
    quota = None if quota is None else int(quota)
    app = create_app(ensemble=ens, budget=tb, ensemble_id=cert["ensemble_id"], when_exhausted=cert["when_exhausted"],
                     max_tokens_cap=cap, certificate=cert, key_quota=quota)
    left = tb.remaining(cert["ensemble_id"])
    err.print(f"serving {model_uri} on http://{host}:{port}/v1/completions "
              f"({left} private tokens left ≈ {left // cap} private answers of {cap} tokens; "
              + (f"each key at most {quota} private tokens" if quota else "no per-key quota") + ")")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    app.command("serve")(serve_cmd)
