"""`veil synthesize MODEL_URI --records N`: a certified synthetic corpus from a registered model (issue 25).

Post-processing of the model's DP release: the model is loaded verified (every check of `veil verify`),
records are sampled from public prompts and settings only, scanned with the catalog's detectors,
written as Parquet and JSONL under VEIL_HOME/synthetic/, certified and sealed, recorded in the ledger
(kind 'synthetic', no charge) and registered in MLflow. docs/synthetic.md."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from flows.cli.common import out, print_json, quiet_third_party, settings_with_device


def summary_line(doc: dict) -> str:
    """One line (also the demo summary's row)."""
    inh = doc["inherits"]
    g = (f"ε={inh['epsilon']:.3g}, δ={inh['delta']:.0e}" if inh.get("epsilon") is not None else "per-class γ")
    hits = sum(doc["scan"].values())
    return (f"{doc['records']} records ({doc['conditioning']}), inherits {inh['privacy_unit']}-level {g}; "
            f"scan: {hits} detector match{'es' if hits != 1 else ''}; load with "
            f"components.registry.load_synthetic({doc['uri'] or doc['corpus_dir']!r})")


def synthesize(model_uri: str = typer.Argument(..., help="models:/NAME/VERSION or models:/NAME@ALIAS"),
               records: int = typer.Option(..., "--records", help="how many records to sample"),
               prompts: Optional[Path] = typer.Option(None, "--prompts",
                                                      help="public prompts YAML (control codes); default: "
                                                           "unconditional"),
               seed: int = typer.Option(0, "--seed", help="sampling seed (same seed, same model: same bytes)"),
               max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="tokens sampled per record at most"),
               temperature: float = typer.Option(1.0, "--temperature", help="sampling temperature"),
               top_p: float = typer.Option(1.0, "--top-p", help="nucleus sampling mass (1: the model's distribution)"),
               policy: Optional[Path] = typer.Option(None, "--policy",
                                                     help="scan with this policy's tagging rules (default: every "
                                                          "built-in detector)"),
               json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """Sample a synthetic corpus from a registered, verified model: certified (it inherits the model's
    guarantee), sealed, scanned for secrets, recorded in the ledger (no extra charge) and registered."""
    from flows.synthetic import synthesize as run  # startup

    s = settings_with_device()
    quiet_third_party(prefect=False)   # no flow here: importing Prefect would bind its console to this stderr
    res = run(s, model_uri, records=records, prompts_path=prompts, seed=seed, max_new_tokens=max_new_tokens,
              temperature=temperature, top_p=top_p, policy=policy, progress=not json_out)
    doc = res["public"]
    if json_out:
        print_json(doc)
        return
    t = Table(title=f"Synthetic corpus from {model_uri}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    t.add_row("records", f"{doc['records']} ({doc['conditioning']})")
    t.add_row("guarantee", doc["statement"])
    t.add_row("files", f"{doc['corpus_dir']}/records.parquet, records.jsonl (sha256 {doc['corpus_sha256'][:12]}…)")
    t.add_row("certificate", f"{doc['certificate_sha256'][:16]}… (sealed)")
    t.add_row("registry", doc["uri"] or "not registered")
    t.add_row("ledger", f"release {doc['ledger_release_id']} (synthetic: post-processing, no charge)")
    t.add_row("secret scan", ", ".join(f"{c} {n}" for c, n in sorted(doc["scan"].items())) +
              f" record(s) matched; the matches: {res['private']['scan_matches']} (private)")
    t.add_row("load it", f"components.registry.load_synthetic({doc['uri'] or doc['corpus_dir']!r})")
    out.print(t)


def register(app: typer.Typer) -> None:
    app.command("synthesize")(synthesize)
