"""`veil keys create|list|revoke` and `veil serve MODEL_URI`: the PMixED HTTP endpoint (FastAPI + uvicorn)."""
from __future__ import annotations

from typing import Optional

import typer

from components.publication import publish
from flows.cli.common import err, print_json, settings

keys_app = typer.Typer(help="API keys for `veil serve` (stored hashed).", no_args_is_help=True)


@keys_app.command("create")
def keys_create(as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    from components.prediction.budget import TokenBudget  # startup

    tb = TokenBudget.open(settings())
    try:
        key = tb.create_key()
    finally:
        tb.dispose()
    from components.prediction.budget import KEY_ID_CHARS, key_digest  # startup

    kid = key_digest(key)[:KEY_ID_CHARS]
    if as_json:
        print_json({"key": key, "id": kid})
    else:
        err.print(f"API key {kid} (shown once; only its hash is stored; revoke it with `veil keys revoke {kid}`):")
        print(key)


@keys_app.command("list")
def keys_list(as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    """Every API key's id, hash and creation (and revocation) time; never a key (only hashes are stored)."""
    from components.prediction.budget import TokenBudget  # startup

    tb = TokenBudget.open(settings())
    try:
        keys = tb.list_keys()
    finally:
        tb.dispose()
    doc = publish("cli.keys", {"keys": keys})
    if as_json:
        print_json(doc)
        return
    if not keys:
        err.print("no API keys (create one with `veil keys create`)")
    for k in keys:
        print(f"{k['id']}  created {k['created_at']}  " + (f"REVOKED {k['revoked_at']}" if k["revoked_at"] else "active"))


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="the key's id from `veil keys list` (≥ 8 hex digits)"),
                as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout.")):
    """Revoke an API key, durably: a running `veil serve` answers 401 to it from its next request on."""
    from components.prediction.budget import TokenBudget  # startup

    tb = TokenBudget.open(settings())
    try:
        k = tb.revoke_key(key_id)
    finally:
        tb.dispose()
    doc = publish("cli.keys", {"revoked": k})
    if as_json:
        print_json(doc)
    else:
        err.print(f"revoked {k['id']} at {k['revoked_at']}: servers refuse it from their next request")


def serve_cmd(model_uri: str = typer.Argument(..., help="models:/NAME/VERSION or models:/NAME@ALIAS"),
              host: str = typer.Option("127.0.0.1", "--host"),
              port: int = typer.Option(8000, "--port"),
              device: str = typer.Option("cpu", "--device"),
              max_body_bytes: Optional[int] = typer.Option(
                  None, "--max-body-bytes", min=1024,
                  help="Refuse request bodies larger than this (413) before reading them; default: the most a "
                       "prompt that fits the model's context could need")):
    """Serve a PMixED ensemble: POST /v1/completions {"prompt", "max_tokens"} with Authorization: Bearer KEY."""
    import uvicorn

    from components.prediction.budget import TokenBudget  # startup
    from components.prediction.release import open_ensemble, resolve  # startup
    from components.prediction.server import create_app, default_max_body_bytes  # startup

    s = settings()
    r = resolve(s, model_uri)
    ens = open_ensemble(s, r, device=device)
    tb = TokenBudget.open(s)
    cert = r["certificate"]
    cap = int(r["manifest"].get("max_tokens_per_request", 0)) or 1024
    quota = r["manifest"].get("key_quota_tokens")  # absent in ensembles built before quotas: none
    quota = None if quota is None else int(quota)
    app = create_app(ensemble=ens, budget=tb, ensemble_id=cert["ensemble_id"], when_exhausted=cert["when_exhausted"],
                     max_tokens_cap=cap, certificate=cert, key_quota=quota,
                     max_body_bytes=max_body_bytes or default_max_body_bytes(ens))
    left = tb.remaining(cert["ensemble_id"])
    err.print(f"serving {model_uri} on http://{host}:{port}/v1/completions "
              f"({left} private tokens left ≈ {left // cap} private answers of {cap} tokens; "
              + (f"each key at most {quota} private tokens" if quota else "no per-key quota")
              + f"; bodies ≤ {max_body_bytes or default_max_body_bytes(ens)} bytes, prompts ≤ "
              f"{ens.max_prompt_chars} characters)")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    app.command("serve")(serve_cmd)
