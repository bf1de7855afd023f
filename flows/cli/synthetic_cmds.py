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

from components.core.errors import VeilError
from flows.cli.common import check_device_now, out, print_json, quiet_third_party, settings_with_device


def summary_line(doc: dict) -> str:
    """One line (also the demo summary's row)."""
    inh = doc["inherits"]
    g = (f"ε={inh['epsilon']:.3g}, δ={inh['delta']:.0e}" if inh.get("epsilon") is not None else "per-class γ")
    hits = sum(doc["scan"].values())
    if doc.get("source") == "pmixed":
        stop = (f", stopped: the token budget ran out after {doc['records_kept']} of {doc['records']}"
                if doc["stopped_by_budget"] else "")
        return (f"{doc['records_kept']} records ({doc['conditioning']}) drawn through PMixED, {doc['tokens_charged']} "
                f"private tokens charged{stop}; covered by its {inh['privacy_unit']}-level {g}; scan: {hits} detector "
                f"match{'es' if hits != 1 else ''}; load with components.registry.load_synthetic("
                f"{doc['uri'] or doc['corpus_dir']!r})")
    return (f"{doc['records']} records ({doc['conditioning']}), inherits {inh['privacy_unit']}-level {g}; "
            f"scan: {hits} detector match{'es' if hits != 1 else ''}; load with "
            f"components.registry.load_synthetic({doc['uri'] or doc['corpus_dir']!r})")


def synthesize(model_uri: str = typer.Argument(..., help="models:/NAME/VERSION or models:/NAME@ALIAS"),
               records: int = typer.Option(..., "--records", help="how many records to sample"),
               prompts: Optional[Path] = typer.Option(None, "--prompts",
                                                      help="public prompts YAML (control codes); default: "
                                                           "unconditional"),
               seed: Optional[int] = typer.Option(None, "--seed", help="sampling seed (default 0; same seed, same "
                                                                     "model: same bytes)"),
               max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="tokens sampled per record at most"),
               temperature: Optional[float] = typer.Option(None, "--temperature", help="sampling temperature "
                                                                                   "(default 1)"),
               top_p: Optional[float] = typer.Option(None, "--top-p", help="nucleus sampling mass (default 1: the "
                                                                           "model's distribution)"),
               pmixed: bool = typer.Option(False, "--pmixed",
                                           help="MODEL_URI is a PMixED ensemble: draw every token through it, "
                                                "charged to its token budget before it is drawn (no seed, "
                                                "temperature or top-p: its certified sampler)"),
               policy: Optional[Path] = typer.Option(None, "--policy",
                                                     help="scan with this policy's tagging rules (default: every "
                                                          "built-in detector)"),
               json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """Sample a synthetic corpus from a registered, verified model: certified (it inherits the model's
    guarantee), sealed, scanned for secrets, recorded in the ledger (no extra charge) and registered."""
    from flows.synthetic import synthesize as run, synthesize_pmixed  # startup

    s = settings_with_device()
    quiet_third_party(prefect=False)   # no flow here: importing Prefect would bind its console to this stderr
    if pmixed:
        given = [n for n, v in (("--seed", seed), ("--temperature", temperature), ("--top-p", top_p)) if v is not None]
        if given:
            # a caller-known seed makes the draw a function of the adapters alone; another temperature or
            # top-p samples a distribution the ensemble's certificate does not cover
            raise VeilError(f"{', '.join(given)}: not with --pmixed (the ensemble draws from the OS CSPRNG at its "
                            "certified temperature)")
        res = synthesize_pmixed(s, model_uri, records=records, prompts_path=prompts, max_new_tokens=max_new_tokens,
                                policy=policy, progress=not json_out, device=check_device_now(s))
    else:
        res = run(s, model_uri, records=records, prompts_path=prompts, seed=0 if seed is None else seed,
                  max_new_tokens=max_new_tokens, temperature=1.0 if temperature is None else temperature,
                  top_p=1.0 if top_p is None else top_p, policy=policy, progress=not json_out)
    doc = res["public"]
    if json_out:
        print_json(doc)
        return
    t = Table(title=f"Synthetic corpus from {model_uri}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    if doc.get("source") == "pmixed":
        t.add_row("records", f"{doc['records_kept']} of {doc['records']} ({doc['conditioning']}), drawn through "
                             f"PMixED ensemble {doc['ensemble_id'][:12]}…")
        t.add_row("token budget", f"{doc['tokens_charged']} private tokens charged, each before its draw"
                  + ("; STOPPED: the budget ran out (concurrent serving) — the records drawn are kept"
                     if doc["stopped_by_budget"] else ""))
    else:
        t.add_row("records", f"{doc['records']} ({doc['conditioning']})")
    t.add_row("guarantee", doc["statement"])
    t.add_row("files", f"{doc['corpus_dir']}/records.parquet, records.jsonl (sha256 {doc['corpus_sha256'][:12]}…)")
    t.add_row("certificate", f"{doc['certificate_sha256'][:16]}… (sealed)")
    t.add_row("registry", doc["uri"] or "not registered")
    t.add_row("ledger", f"release {doc['ledger_release_id']} (synthetic: post-processing, no charge"
              + (": the ensemble's build charged its whole token budget)" if doc.get("source") == "pmixed" else ")"))
    t.add_row("secret scan", ", ".join(f"{c} {n}" for c, n in sorted(doc["scan"].items())) +
              f" record(s) matched; the matches: {res['private']['scan_matches']} (private)")
    t.add_row("load it", f"components.registry.load_synthetic({doc['uri'] or doc['corpus_dir']!r})")
    out.print(t)


_STYLE = {"passed": "[green]PASSED[/green]", "failed": "[red]FAILED[/red]",
          "inconclusive": "[yellow]INCONCLUSIVE[/yellow]"}


def _rng(b) -> str:
    return "—" if not b else f"[{b[0]:g}, {b[1]:g})" if b[1] is not None else f"[{b[0]:g}, …)"


def audit_synthetic(corpus: str = typer.Argument(..., help="corpus id (its folder under VEIL_HOME/synthetic/, or a "
                                                           "unique prefix) or a corpus folder"),
                    policy: Optional[Path] = typer.Option(None, "--policy", help="policy whose audit thresholds "
                                                          "apply (default: the plan's)"),
                    bootstrap: int = typer.Option(100, "--bootstrap", min=2, help="bootstrap resamples of canaries"),
                    record: bool = typer.Option(True, "--record/--no-record", help="tag the corpus' MLflow run "
                                                "with the verdict"),
                    json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """The canary echo audit of a synthetic corpus: how much of each trained canary's random suffix the
    corpus echoes, against held-out canaries and the certificate's ceiling. Reads the corpus, never the model.

    Exit 0 when PASSED, 1 when FAILED, 3 when INCONCLUSIVE (too few canaries; says how many it needs).
    Per-canary values go to VEIL_HOME/private/synthetic/<id>/echo-audit.json only. docs/privacy/synthetic-echo.md."""
    from flows.synthetic import audit_synthetic as run  # startup

    s = settings_with_device()
    quiet_third_party(prefect=False)
    res = run(s, corpus, policy=policy, bootstrap=bootstrap, record=record)
    doc = res["public"]
    if json_out:
        print_json(doc)
    else:
        t = Table(title=f"Echo audit of corpus {doc['corpus']['certificate_sha256'][:16]}: "
                        f"{_STYLE.get(doc['verdict'], doc['verdict'])}", show_header=False)
        t.add_column("what", style="bold")
        t.add_column("value", overflow="fold")
        t.add_row("canaries", f"{doc['canaries_in'][0]}–{doc['canaries_in'][1] - 1} trained / "
                              f"{doc['canaries_out'][0]}–{doc['canaries_out'][1] - 1} held out ({doc['canary_kind']})")
        if doc.get("auroc") is not None:
            ceil = doc.get("binding_ceiling")
            within = ("" if doc.get("auroc_interval") is None else
                      f", {doc['confidence']:.0%} interval within {_rng(doc['auroc_interval'])}")
            t.add_row("bigram AUROC", f"in {_rng(doc['auroc'])}{within} · DP ceiling "
                                      + ("none (no user-level ε)" if ceil is None else f"{ceil:.3f}"))
            if doc.get("echo_auroc"):
                t.add_row("echo AUROC", f"in {_rng(doc['echo_auroc']['auroc'])}")
            me = doc["mean_echo"]
            t.add_row("mean echo", f"trained {_rng(me['members'])}, held out {_rng(me['held_out'])} (fraction of the "
                                   "suffix found contiguous in one record)")
        for r in doc["reasons"]:
            t.add_row("[yellow]why[/yellow]", r)
        t.add_row("coverage", doc["coverage_note"])
        t.add_row("private report", f"{res['private']} (owner only: per-canary values)")
        out.print(t)
    if doc["verdict"] != "passed":
        raise typer.Exit(3 if doc["verdict"] == "inconclusive" else 1)


def register(app: typer.Typer) -> None:
    app.command("synthesize")(synthesize)
    app.command("audit-synthetic")(audit_synthetic)
