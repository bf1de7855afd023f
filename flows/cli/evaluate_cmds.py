"""`veil evaluate MODEL_URI`: perplexity and next-token accuracy on the plan's evaluation people.

The exact figures are printed for the operator only (this terminal, this JSON): they are a near-exact
function of every evaluation person's text. The model's MLflow run gets only the DP release
(components.evaluation.release), charged in the ledger to the evaluation people; `--no-log` publishes
and charges nothing."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import typer
from rich.table import Table

from flows.cli.common import err, out, print_json, quiet_third_party, settings as _settings

JSON_KEYS = ("perplexity", "base_perplexity", "next_token_accuracy", "eval_people", "eval_records")


def _pct(x) -> str:
    return "—" if x is None else f"{x:.1%}"


def _ppl(x) -> str:
    return "—" if x is None else f"{x:.4g}"


def summary_line(doc: dict) -> str:
    """base → DP perplexity in one line (also the demo summary's row)."""
    line = (f"perplexity base {_ppl(doc['base_perplexity'])} → DP {_ppl(doc['perplexity'])}"
            f" · next-token accuracy {_pct(doc['base_next_token_accuracy'])} → {_pct(doc['next_token_accuracy'])}")
    if doc.get("reference_perplexity") is not None:
        line += f" · non-private reference {_ppl(doc['reference_perplexity'])}"
        if doc.get("gap_closed") is not None:
            line += f" (DP closes {doc['gap_closed']:.0%} of the gap)"
    return line + f" · on {doc['eval_records']} held-out records of {doc['eval_people']} evaluation people"


def limit_line(doc: dict) -> str | None:
    """Base or privacy: what holds the model back (components.evaluation.bottleneck), or None."""
    from components.evaluation.bottleneck import line  # startup

    return line(doc["utility_limit"]) if doc.get("utility_limit") else None


def evaluate(model_uri: str = typer.Argument(..., help="models:/NAME/VERSION or models:/NAME@ALIAS"),
             json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
             reference: Optional[str] = typer.Option(None, "--reference",
                                                     help="a non-private reference: models:/ URI, peft adapter "
                                                          "directory (on the model's base) or HF model directory"),
             log: bool = typer.Option(True, "--log/--no-log",
                                      help="log a DP release of the metrics on the model's MLflow run (charged in "
                                           "the ledger to the evaluation people); --no-log: exact figures here only"),
             policy: Optional[str] = typer.Option(None, "--policy",
                                                  help="policy whose evaluation.epsilon/delta/nll_clip price the DP "
                                                       "release (default: the plan's policy file, else the defaults)"),
             batch_size: int = typer.Option(64, "--batch-size", min=1, help="texts per forward pass (also capped at 4096 tokens)")) -> None:
    """Perplexity and next-token accuracy of a registered model and its base on the evaluation people
    (reserved at plan time, never trained on): exact here, for you; a DP release on the model's run."""
    from flows import stages  # startup

    quiet_third_party()
    s = _settings()
    with err.status("evaluating…", spinner="dots") if not json_out else nullcontext():
        doc = stages.evaluate(s, model_uri, reference=reference, log=log, batch_size=batch_size, policy=policy)
    if json_out:
        print_json({**{k: doc[k] for k in JSON_KEYS}, **{k: v for k, v in doc.items() if k not in JSON_KEYS}})
        return
    t = Table(title=f"evaluation of {model_uri} — exact, for the operator only (never logged)", show_header=True,
              header_style="bold")
    for col in ("model", "perplexity", "next-token accuracy"):
        t.add_column(col, justify="left" if col == "model" else "right")
    t.add_row("base (public)", _ppl(doc["base_perplexity"]), _pct(doc["base_next_token_accuracy"]))
    t.add_row("DP fine-tuned", _ppl(doc["perplexity"]), _pct(doc["next_token_accuracy"]))
    if doc.get("reference_perplexity") is not None:
        t.add_row("non-private reference", _ppl(doc["reference_perplexity"]), _pct(doc["reference_next_token_accuracy"]))
    out.print(t)
    if doc.get("gap_closed") is not None:
        out.print(f"the DP model closes {doc['gap_closed']:.0%} of the base → non-private perplexity gap")
    if limit_line(doc):
        out.print(limit_line(doc))
    out.print(f"on {doc['eval_records']} records ({doc['eval_tokens']:,} tokens, ≤{doc['max_length']} per record) of "
              f"{doc['eval_people']} evaluation people — exact counts: yours only, not logged")
    pub = doc.get("published")
    if pub:
        m = pub["metrics"]
        out.print(f"logged on run {doc['run_id'][:8]} (DP release, ε={pub['epsilon']:g}, δ={pub['delta']:g}, ledger "
                  f"release {pub['ledger_release_id']}{', the earlier release again: nothing new charged' if pub['reused'] else ''}): "
                  f"perplexity {_ppl(m.get('eval_perplexity'))} · accuracy {_pct(m.get('eval_next_token_accuracy'))} "
                  f"(base {_ppl(m.get('eval_base_perplexity'))} · {_pct(m.get('eval_base_next_token_accuracy'))})",
                  highlight=False)
        if not pub["reused"]:
            out.print(f"charged to the {pub['counted_people']} evaluation people it counts (exact count: yours only)",
                      highlight=False)
    else:
        out.print("[yellow]--no-log: nothing logged, nothing charged[/yellow]")


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate)
