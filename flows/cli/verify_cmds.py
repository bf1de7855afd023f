"""Release verification commands: verify (a registered model's seal and every check), signing-key."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from components.core.errors import VeilError
from components.publication import publish
from flows.cli.common import err, out, print_json, settings as _settings
from components.certificate.seal import (TRUSTED_DIR, fingerprint, load_signing_key, public_key_pem, raw_public_bytes,
                                         read_public_keys, signing_key_path, trusted_keys)
from components.certificate.summary import promises


def verify(model_uri: str = typer.Argument(..., help="models:/NAME/VERSION or models:/NAME@ALIAS"),
           json_out: bool = typer.Option(False, "--json", help="print the checks as one JSON document")) -> None:
    """Verify a registered model: signature, hashes, ε recomputed, weights/base/tokenizer/plan, tags.

    Exit 0 when every check passes, 2 when one fails (the first failure is the `reason`).
    """
    from components.registry import verify_model  # startup

    v = verify_model(model_uri, _settings())
    doc = v.to_dict()
    # what the certificate promises, in words: only for a release that verifies (an invalid one promises nothing)
    doc["promises"] = promises(v.certificate, epsilon=doc["epsilon"], gamma=doc["gamma"]) \
        if doc["valid"] and v.certificate else []
    if json_out:
        print_json(publish("cli.verify", doc, subject=model_uri))
    else:
        from rich.table import Table  # not on the --json path (bench/startup.py)

        t = Table(title=f"verify {model_uri}")
        t.add_column("check")
        t.add_column("result")
        for name, ok in doc["checks"].items():
            t.add_row(name, "ok" if ok else f"FAILED: {v.reasons.get(name, '')}")
        out.print(t)
        if doc["epsilon"] is not None:
            out.print(f"ε recomputed: {doc['epsilon']:.6g}")
        for cls, g in (doc["gamma"] or {}).items():
            out.print(f"γ recomputed ({cls}): {g:.6g}")
        if doc["key_fingerprint"]:
            out.print(f"signed by {doc['key_fingerprint']}")
        for note in doc["notes"]:
            out.print(f"note: {note}")
        out.print("VALID" if doc["valid"] else f"INVALID: {doc['reason']}")
        if doc["promises"]:
            out.print("\n[bold]What this certificate promises[/bold]")
            for line in doc["promises"]:
                out.print(f"  • {line}", highlight=False)
    if not doc["valid"]:
        if not json_out:
            err.print(f"error: {model_uri} refused: {doc['reason']}")
        raise typer.Exit(2)


def keys(trust: Optional[Path] = typer.Option(None, "--trust", help="add this PEM public key to the trust store"),
         json_out: bool = typer.Option(False, "--json")) -> None:
    """The signing key's public half and fingerprint (create it if needed), and the trusted keys."""
    s = _settings()
    if trust is not None:
        if not trust.is_file():
            raise VeilError(f"{trust}: no such key file")
        key = read_public_keys(trust)[0]
        dest_dir = Path(s.home) / TRUSTED_DIR
        dest_dir.mkdir(parents=True, exist_ok=True)
        fp = fingerprint(raw_public_bytes(key))
        # Only the public half is stored, whatever the file held.
        (dest_dir / f"{fp.split(':', 1)[1][:16]}.pem").write_text(public_key_pem(key))
        err.print(f"trusted {fp}")
    key = load_signing_key(s)
    pub = key.public_key()
    doc = {"signing_key": str(signing_key_path(s)), "fingerprint": fingerprint(raw_public_bytes(pub)),
           "public_key_pem": public_key_pem(pub), "trusted": sorted(trusted_keys(s))}
    if json_out:
        print_json(doc)
        return
    out.print(f"signing key: {doc['signing_key']}\nfingerprint: {doc['fingerprint']}")
    out.print(doc["public_key_pem"].rstrip())
    out.print("trusted keys:\n" + "\n".join(f"  {fp}" for fp in doc["trusted"]))


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
    app.command("signing-key")(keys)
