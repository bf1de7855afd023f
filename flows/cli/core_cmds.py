"""Pipeline commands: demo, demo-data, base-model, train, register, models, run, serve."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from components.core.errors import VeilError
from components.publication import publish
from flows.cli.audit_cmds import verdict_word
from flows.cli.common import out, print_json as _print_json, quiet_third_party, settings as _settings, settings_with_device
from flows.cli.common import err
from flows.cli.evaluate_cmds import limit_line, summary_line
from flows.cli.synthetic_cmds import summary_line as synthetic_line
from components.certificate import describe


def _ceiling(aud: dict) -> str:
    """The tightest AUROC ceiling the audit has: from the mechanism's whole PLD, else from (ε, δ)."""
    if aud.get("auroc_ceiling_pld") is not None:
        return f"{aud['auroc_ceiling_pld']:.3f} (PLD; {aud['auroc_ceiling']:.4f} from ε, δ)"
    if aud.get("auroc_ceiling") is not None and aud.get("epsilon") is not None:
        return f"{aud['auroc_ceiling']:.4f} (from ε, δ)"
    return "none (no user-level guarantee)"


def _audit_line(aud: dict, short: bool = False) -> str:
    """One line for an audit section: its verdict first (INCONCLUSIVE says what it needs), then the
    quantized AUROC against the ceiling. Old (v1) sections had an exact AUROC and a pass flag."""
    word = verdict_word(aud)
    if aud.get("schema") != "veil.audit/v2":
        return f"{word} · AUROC {aud['auroc']:.3f} ≤ {_ceiling(aud)} (v1 section)"
    a = aud["auroc"]
    # null when the groups are too small for any grid the public rule allows
    line = (f"{word} · AUROC in [{a[0]:g}, {a[1]:g}) · ceiling {_ceiling(aud)}" if a is not None
            else f"{word} · AUROC not published (too few people) · ceiling {_ceiling(aud)}")
    if short:
        return line
    gate = aud.get("gate")
    if gate:
        # every non-pass says why, from the public section: the same reason the tags and the Prefect log carry
        line += f" · gate '{gate['require']}' " + ("met" if gate["meets"] else "not met")
        if aud.get("verdict") != "passed":
            line += f" · {gate['reason']}"
    else:
        need = (aud.get("user_inference") or {}).get("people_needed")
        if word == "INCONCLUSIVE" and need:
            line += (f" · needs about {need['in']} people in / {need['out']} out" if isinstance(need, dict)
                     else f" · needs {need}")
    one = aud.get("one_run") or {}
    if one.get("computed"):
        line += f" · one-run ε ≥ {one['epsilon_at_least']:g} ({one['confidence']:.0%})"
    return line + " · not covered by the certificate"


def _summary_table(result: dict, seconds: float) -> Table:
    cert, reg, ing, tr = result["certificate"], result["registration"], result["ingest"], result["train"]
    t = Table(title="Veil run", show_header=True, header_style="bold")
    t.add_column("stage")
    t.add_column("result")
    t.add_row("ingest", f"snapshot {ing['snapshot_id']}: {ing['accepted']} records, {ing['users']} users "
                        f"({ing['quarantined']} quarantined, {ing['duplicates']} duplicates dropped)")
    p = result["plan"]
    target = (f"target ε={p['target']['epsilon']} δ={p['target']['delta']:g}" if p["target"].get("epsilon") is not None
              else "target: every secret's posterior bound γ")
    t.add_row("plan", f"{p['mechanism']} · q={p['sampling_rate']:.4g} · σ={p['noise_multiplier']:.4g} · "
                      f"T={p['steps']} · C={p['clip_norm']} · {target}")
    # not the realised mean batch: it is q·N, and N is private (the plan publishes only N̂)
    t.add_row("train", f"{tr['steps_run']} DP steps · expected batch {p['expected_batch_size']} "
                       f"· {tr['trainable_params']:,} trainable parameters · {tr['seconds']:.0f} s")
    t.add_row("certificate", f"{describe(cert)} · sha256 {cert['sha256'][:12]}…")
    life = reg.get("lifetime")
    t.add_row("registry", f"{reg['model_uri']} (run {reg['run_id'][:8]})" + (
        # counts of people charged/retired are exact private counts: `veil ledger` (administrators) has them
        f" · charged to the per-person ledger (release {life['ledger_release_id']}"
        + (f"; lifetime budget ε={life['budget_epsilon']:g}, δ={life['delta']:g}" if life.get("budget_epsilon") is not None
           else "") + ")"
        if life else ""))
    aud = result.get("audit")
    if aud:
        t.add_row("audit", _audit_line(aud))
    if result.get("evaluation"):
        t.add_row("evaluation", summary_line(result["evaluation"]))
        if limit_line(result["evaluation"]):
            t.add_row("utility limit", limit_line(result["evaluation"]))
    if result.get("synthetic"):
        t.add_row("synthetic", synthetic_line(result["synthetic"]) + f" · {result['synthetic']['seconds']:.0f} s")
    fc = (result["plan"].get("utility_forecast") or {})
    if fc.get("verdict") not in (None, "unknown"):
        from components.planning.forecast import describe as describe_forecast  # startup

        t.add_row("forecast", describe_forecast(fc))
    t.add_row("time", f"{seconds:.0f} s")
    return t


def demo(json_out: bool = typer.Option(False, "--json", help="print the run's result as JSON"),
         prefect: bool = typer.Option(True, "--prefect/--no-prefect", help="run through Prefect (default)"),
         audit: bool = typer.Option(True, "--audit/--no-audit", help="audit the registered model")) -> None:
    """The whole run on the demo organization: data → ingest → plan → DP fine-tune → certify → register → audit."""
    quiet_third_party()
    s = settings_with_device()
    t0 = time.time()
    if prefect:
        from flows.pipeline import demo_flow  # startup

        result = demo_flow(home=str(s.home), audit=audit)
    else:
        from flows import stages  # startup

        org = stages.demo_data(s)
        result = run_stages(s, str(stages.DEMO_POLICY), org["messages"], "jsonl", public_corpus=org["public"],
                            model_name="veil-demo", mapping=stages.DEMO_MAPPING, audit=audit, truth=org["truth"])
    result["synthetic"] = _demo_synthetic(s, result["registration"]["model_uri"], json_out)
    if json_out:
        _print_json(result)
    else:
        out.print(_summary_table(result, time.time() - t0))


DEMO_SYNTHETIC_RECORDS = 200


def _demo_synthetic(s, model_uri: str, quiet: bool) -> dict:
    """A few hundred synthetic records from the demo's model (issue 25: `veil synthesize`): measured 6 s
    for 200 records of a demo-sized model in a process that has already loaded the libraries."""
    from flows.synthetic import synthesize  # startup

    t0 = time.time()
    doc = synthesize(s, model_uri, records=DEMO_SYNTHETIC_RECORDS, seed=0, progress=not quiet)["public"]
    return {**doc, "seconds": round(time.time() - t0, 1)}


def run_stages(s, policy, source, fmt, *, public_corpus=None, base_model_dir=None, model_name="veil",
               mapping=None, audit=True, truth=None, precision=None) -> dict:
    """The pipeline without Prefect (same stages, same artifacts)."""
    from flows import stages  # startup

    ing = stages.ingest(s, source, fmt, policy=policy, progress=True, **(mapping or {}))
    base = stages.base_model(s, public_corpus=public_corpus, base_model_dir=base_model_dir)
    planned = stages.plan(s, policy, snapshot_id=ing["snapshot_id"], base_dir=base)
    trained = stages.train(s, planned["plan_path"], base, precision=precision)
    cert = stages.certify(s, planned["plan_path"], trained)
    reg = stages.register(s, name=model_name, certificate=cert, plan_path=planned["plan_path"], base_dir=base,
                          adapter_dir=trained.get("adapter_dir") or trained.get("model_dir"))
    aud = stages.audit(s, reg["model_uri"], policy=policy, truth=truth) if audit else None
    if aud is not None:
        stages.settle_latest(s, reg["model_uri"], aud["summary"])
    return {"ingest": ing, "plan_path": planned["plan_path"], "plan": planned["plan"], "train": trained,
            "certificate": aud["certificate"] if aud else cert, "registration": reg,
            "audit": aud["summary"] if aud else None, "evaluation": stages.evaluate(s, reg["model_uri"], missing_ok=True,
                                                                     policy=policy)}


def demo_data(out_dir: Optional[Path] = typer.Option(None, "--out", help="folder (default: $VEIL_HOME/demo-org)"),
              seed: int = typer.Option(0, help="generator seed"),
              json_out: bool = typer.Option(False, "--json")) -> None:
    """Write the deterministic synthetic organization (messages, public corpus, planted-secret truth)."""
    from flows import stages  # startup

    org = stages.demo_data(_settings(), out_dir, seed=seed)
    if json_out:
        _print_json(org)
    else:
        out.print(f"demo organization written to {org['dir']}")
        out.print(f"  messages: {org['messages']}\n  public corpus: {org['public']}\n  truth: {org['truth']}")


def base_model(corpus: str = typer.Argument(..., help="public, secret-free text: a JSONL file with a `text` field, a "
                                                     "text file (.txt/.md: paragraphs), a directory of them, or "
                                                     "`system` (this machine's docstrings, licences and man pages)"),
               layers: Optional[int] = typer.Option(None, "--layers", min=1, help="transformer layers (default 2)"),
               width: Optional[int] = typer.Option(None, "--width", min=8, help="embedding width (default 128)"),
               heads: Optional[int] = typer.Option(None, "--heads", min=1, help="attention heads (default 4; must "
                                                                               "divide --width)"),
               steps: Optional[int] = typer.Option(None, "--steps", min=1, help="optimizer steps (default 200)"),
               seq_len: Optional[int] = typer.Option(None, "--seq-len", min=4, help="tokens per training window "
                                                                                   "(default 128)"),
               vocab: Optional[int] = typer.Option(None, "--vocab", min=258, help="tokenizer vocabulary (default 4096)"),
               batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="windows per step "
                                                                                         "(default 16)"),
               seed: Optional[int] = typer.Option(None, "--seed"),
               out_dir: Optional[Path] = typer.Option(None, "--out", help="write here (default: VEIL_HOME/models/"
                                                                         "base-<corpus and options hash>, reused)"),
               json_out: bool = typer.Option(False, "--json")) -> None:
    """Train a tokenizer and a small causal LM from config on public text, with progress (cached by corpus and
    options). A tiny base limits every model built on it: `--layers 4 --width 256 --steps 2000` on `system`
    text is a stronger start than the 2×128, 200-step default (see `veil plan`'s hints and the run summary)."""
    from flows import stages  # startup

    quiet_third_party()
    cfg = {"n_layer": layers, "n_embd": width, "n_head": heads, "steps": steps, "seq_len": seq_len,
           "vocab_size": vocab, "batch_size": batch_size, "seed": seed}
    if seq_len is not None and seq_len > 256:
        cfg["n_positions"] = seq_len   # room for the longer windows (the default context is 256)
    path = stages.base_model(settings_with_device(), public_corpus=corpus, config=cfg, out_dir=out_dir, progress=not json_out)
    if json_out:
        from components.modeling.base import read_base_facts  # startup

        f = read_base_facts(path) or {}
        _print_json({"base_model": path, "n_params": f.get("n_params"), "steps": (f.get("config") or {}).get("steps"),
                     "eval_loss_after": f.get("eval_loss_after"), "train_seconds": f.get("train_seconds")})
    else:
        out.print(f"base model: {path}")


_PRECISION = typer.Option(None, "--precision", help="fp32 | bf16 | fp16: the base model's dtype in training "
                          "(default: the plan's training.precision, else fp32). Norms, clipping, noise and "
                          "LoRA/master weights stay float32; ε is the same. A run folder's checkpoint of "
                          "another precision is not resumed.")


def check_precision(precision: Optional[str]) -> None:
    from components.training.spec import PRECISIONS  # startup

    if precision is not None and precision not in PRECISIONS:
        raise VeilError(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")


def train(plan: Path = typer.Option(..., "--plan", help="plan JSON written by `veil plan`"),
          base_model: Path = typer.Option(..., "--base-model", help="any local HF causal-LM directory"),
          precision: Optional[str] = _PRECISION,
          checkpointing: Optional[bool] = typer.Option(
              None, "--gradient-checkpointing/--no-gradient-checkpointing",
              help="recompute activations in the backward (less memory, same update and ε); default: the plan's "
                   "training.gradient_checkpointing"),
          json_out: bool = typer.Option(False, "--json")) -> None:
    """Run a plan: DP fine-tuning exactly as planned (resumes from its last checkpoint)."""
    import dataclasses

    from flows import stages  # startup

    if not plan.is_file():
        raise VeilError(f"{plan}: no such plan file")
    check_precision(precision)
    quiet_third_party()
    s = settings_with_device()
    # memory only: the update is the same either way, so the plan's other numbers stand and a run may
    # resume with it switched (it is not part of the spec's resume identity)
    adjust = (None if checkpointing is None else
              lambda spec, data: dataclasses.replace(spec, gradient_checkpointing=bool(checkpointing)))
    res = stages.train(s, plan, stages.base_model(s, base_model_dir=base_model), adjust=adjust,
                       precision=precision)
    cert = stages.certify(s, plan, res)
    cert_path = Path(s.runs_dir) / plan_sha(plan)[:16] / "certificate.json"
    cert_path.write_text(json.dumps(cert, indent=2, sort_keys=True))
    doc = {"train": res, "certificate_path": str(cert_path), "certificate": cert}
    if json_out:
        _print_json(doc)
    else:
        out.print(f"trained {res['steps_run']} steps · {describe(cert)} · certificate {cert_path}")


def plan_sha(plan: Path) -> str:
    from components.planning import load_plan  # startup

    return load_plan(plan).to_dict()["sha256"]


def register_cmd(plan: Path = typer.Option(..., "--plan"),
             base_model: Path = typer.Option(..., "--base-model"),
             name: str = typer.Option("veil", "--name", help="registered model name"),
             json_out: bool = typer.Option(False, "--json")) -> None:
    """Register a trained run of PLAN in MLflow with its certificate (refused if ε exceeds the policy's)."""
    from flows import stages  # startup

    s = _settings()
    run_dir = Path(s.runs_dir) / plan_sha(plan)[:16]
    cert_file, res_file = run_dir / "certificate.json", run_dir / "train_result.json"
    if not cert_file.is_file() or not res_file.is_file():
        raise VeilError(f"{plan}: no finished training run in {run_dir}; run `veil train --plan {plan}` first")
    res = json.loads(res_file.read_text())
    reg = stages.register(s, name=name, certificate=json.loads(cert_file.read_text()), plan_path=plan,
                          base_dir=base_model, adapter_dir=res.get("adapter_dir") or res.get("model_dir"))
    _print_json(reg) if json_out else out.print(f"registered {reg['model_uri']}")


def models(json_out: bool = typer.Option(False, "--json")) -> None:
    """Registered model versions with their certificates; `verified` only when every check passes."""
    from components.registry import list_models  # startup

    rows = list_models(_settings())
    if json_out:
        _print_json(publish("cli.models", rows))
        return
    out.print(models_table(rows))
    for r in rows:
        if r["certificate_status"] != "verified":
            out.print(f"{r['name']}/{r['version']}: {r['certificate_status']}", soft_wrap=True)


def models_table(rows: list[dict]) -> Table:
    """Names and URIs fold onto more lines at any terminal width, never cut to "…" (issue 26)."""
    t = Table(title="Registered models")
    for col in ("model", "aliases", "mechanism", "guarantee", "steps", "audit AUROC (ceiling)", "certificate"):
        t.add_column(col, overflow="fold", no_wrap=col == "steps")
    for r in rows:
        c = r["certificate"] or {}
        a = c.get("audit") or {}
        aud = _audit_line(a, short=True) if a else "—"
        status = r["certificate_status"]
        short = status if status == "verified" else "INVALID (" + status[len("INVALID: "):].split(":", 1)[0] + ")"
        t.add_row(f"{r['name']}/{r['version']}", ", ".join(r["aliases"]), c.get("mechanism", "?"),
                  describe(c) if c else "?", str(c.get("steps", "?")), aud, short)
    return t


# How the source's fields map onto catalog records: the same flags as `veil ingest` (ingest's own
# error messages name them).
_USER_FIELD = typer.Option("user", "--user-field", help="field holding the user (jsonl/csv/parquet)")
_TEXT_FIELD = typer.Option("text", "--text-field", help="field holding the text (jsonl/csv/parquet)")
_ID_FIELD = typer.Option(None, "--id-field", help="the source's own record id (kept in metadata)")
_TIME_FIELD = typer.Option(None, "--time-field", help="timestamp field (ISO-8601 or epoch s)")
_META = typer.Option([], "--meta", help="a field to keep in metadata (repeatable)")


def _mapping(user_field: str, text_field: str, id_field: Optional[str], time_field: Optional[str],
             meta: List[str]) -> dict:
    return {"user_field": user_field, "text_field": text_field, "id_field": id_field, "time_field": time_field,
            "metadata_fields": list(meta)}


def _check_inputs(policy: Path, source: Path, base_model: Optional[Path], public_corpus: Optional[Path]) -> None:
    """Before any flow starts (and before ingest runs): missing inputs are one line, exit 2."""
    if not policy.is_file():
        raise VeilError(f"{policy}: no such policy file")
    if not source.exists():
        raise VeilError(f"{source}: no such source")
    if base_model is None and public_corpus is None:
        raise VeilError("no base model: pass --base-model DIR (a local Hugging Face causal LM) or "
                        "--public-corpus FILE to pretrain one")
    if base_model is not None and not base_model.is_dir():
        raise VeilError(f"{base_model}: base model directory does not exist")
    if public_corpus is not None and base_model is None and not public_corpus.is_file():
        raise VeilError(f"{public_corpus}: no such public corpus")


def run(policy: Path = typer.Option(..., "--policy"), source: Path = typer.Option(..., "--source"),
        fmt: str = typer.Option("jsonl", "--format"),
        user_field: str = _USER_FIELD, text_field: str = _TEXT_FIELD, id_field: Optional[str] = _ID_FIELD,
        time_field: Optional[str] = _TIME_FIELD, meta: List[str] = _META,
        base_model: Optional[Path] = typer.Option(None, "--base-model", help="local HF causal-LM directory"),
        public_corpus: Optional[Path] = typer.Option(None, "--public-corpus", help="pretrain a base on this"),
        name: str = typer.Option("veil", "--name"), json_out: bool = typer.Option(False, "--json"),
        precision: Optional[str] = _PRECISION,
        prefect: bool = typer.Option(True, "--prefect/--no-prefect", help="run through Prefect (default), or the "
                                     "same stages in this process without a Prefect server")) -> None:
    """The whole pipeline on your own data, through Prefect (or, with --no-prefect, in this process)."""
    _check_inputs(policy, source, base_model, public_corpus)
    check_precision(precision)
    quiet_third_party(prefect=prefect)   # --no-prefect never imports Prefect (seconds of start-up)
    s = settings_with_device()
    t0 = time.time()
    mapping = _mapping(user_field, text_field, id_field, time_field, meta)
    if prefect:
        from flows.pipeline import pipeline_flow  # startup

        result = pipeline_flow(str(policy), str(source), fmt, home=str(s.home),
                               public_corpus=str(public_corpus) if public_corpus else None,
                               base_model_dir=str(base_model) if base_model else None, model_name=name,
                               mapping=mapping, precision=precision)
    else:
        result = run_stages(s, str(policy), str(source), fmt, public_corpus=public_corpus, base_model_dir=base_model,
                            model_name=name, mapping=mapping, precision=precision)
    _print_json(result) if json_out else out.print(_summary_table(result, time.time() - t0))


def retrain(policy: Path = typer.Option(..., "--policy"), source: Path = typer.Option(..., "--source"),
            fmt: str = typer.Option("jsonl", "--format"),
            user_field: str = _USER_FIELD, text_field: str = _TEXT_FIELD, id_field: Optional[str] = _ID_FIELD,
            time_field: Optional[str] = _TIME_FIELD, meta: List[str] = _META,
            base_model: Optional[Path] = typer.Option(None, "--base-model", help="local HF causal-LM directory"),
            public_corpus: Optional[Path] = typer.Option(None, "--public-corpus", help="pretrain a base on this"),
            name: str = typer.Option("veil", "--name", help="registered model name"),
            json_out: bool = typer.Option(False, "--json"),
            serve: bool = typer.Option(False, "--serve", help="serve the retraining on --cron until Ctrl-C "
                                       "(needs PREFECT_API_URL; prefect.yaml is the work-pool deployment)"),
            cron: str = typer.Option("0 3 * * 0", "--cron", help="with --serve: the schedule"),
            timezone: str = typer.Option("UTC", "--timezone", help="with --serve: the schedule's timezone")) -> None:
    """One retraining, through the flow the schedule runs: skipped (no spend) when the data eligible for
    training did not change; else train, certify, register, audit, and promote to `production` only on a
    passed audit (and, when the policy names release.promoters, once one of them approved the paused run).

    With --serve, the same flow is served on a cron schedule until SIGINT/SIGTERM (exit 130/143).

    people_trained / people_retired are exact counts from the per-person ledger. They are printed
    because whoever runs this holds VEIL_HOME (its private area, the ledger: `veil ledger` shows the
    same counts): they are an administrator. The flow never logs them to the Prefect server."""
    _check_inputs(policy, source, base_model, public_corpus)
    if serve:  # a bad schedule is said before the quieting and device check load mlflow and torch (~10 s of CPU)
        _check_schedule(cron, timezone)
    quiet_third_party()
    settings_with_device()
    if serve:
        _serve_retraining(policy, source, fmt, cron, timezone, base_model, public_corpus, name,
                          _mapping(user_field, text_field, id_field, time_field, meta))
        return
    from flows.retrain import retrain_flow  # startup

    s = _settings()
    result = retrain_flow(str(policy.resolve()), str(source.resolve()), fmt, home=str(s.home),
                          public_corpus=str(public_corpus.resolve()) if public_corpus else None,
                          base_model_dir=str(base_model.resolve()) if base_model else None, model_name=name,
                          mapping=_mapping(user_field, text_field, id_field, time_field, meta))
    if json_out:
        _print_json(result)
    elif result["action"] == "skipped":
        out.print(f"skipped: {result['reason']}")
    else:   # "trained", or "resumed": a killed run's release finished (its audit, its promotion)
        out.print(f"{result['action']} {result['model_uri']} · {result['people_trained']} people trained, "
                  f"{result['people_retired']} retired (no budget left) · "
                  + ("promoted" if result["promoted"] else "not promoted") + f": {result['reason']}")
        if result.get("evaluation"):       # exact figures: the operator's terminal only, as `veil run` shows them

            out.print(f"evaluation: {summary_line(result['evaluation'])}")
            if limit_line(result["evaluation"]):
                out.print(f"utility limit: {limit_line(result['evaluation'])}")


def _check_schedule(cron: str, timezone: str) -> None:
    """Prefect's own check of the schedule, before anything is registered."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as e:
        why = e.errors()[0].get("msg", "invalid")
        raise VeilError(f"--cron {cron!r} --timezone {timezone!r}: {why}") from None


def _serve_retraining(policy, source, fmt, cron, timezone, base_model, public_corpus, name, mapping) -> None:
    import os
    import signal

    from flows.pipeline import serve_retraining  # startup

    s = _settings()   # the schedule was checked first thing (`retrain`: _check_schedule)
    if not os.environ.get("PREFECT_API_URL"):
        raise VeilError("--serve needs a Prefect server: set PREFECT_API_URL (or prefect_api_url in veil.toml)")
    err.print(f"serving veil-retrain/retrain-{name} on '{cron}' ({timezone}) at {os.environ['PREFECT_API_URL']}; "
              "Ctrl-C stops", soft_wrap=True)
    got = serve_retraining(str(policy.resolve()), str(source.resolve()), fmt, cron, timezone=timezone,
                           home=str(s.home), base_model_dir=str(base_model.resolve()) if base_model else None,
                           public_corpus=str(public_corpus.resolve()) if public_corpus else None,
                           model_name=name, mapping=mapping)
    if got is not None:
        err.print(f"stopped serving veil-retrain/retrain-{name} ({signal.Signals(got).name}); its schedule is "
                  "paused on the server", soft_wrap=True)
        raise typer.Exit(128 + got)


def approve(flow_run_id: str = typer.Argument(..., help="the paused veil-retrain run (its id, in its log line)"),
            promoter: str = typer.Option(..., "--promoter", help="your name as listed in release.promoters"),
            reject: bool = typer.Option(False, "--reject", help="reject the release instead")) -> None:
    """Answer a retraining paused for a promoter's approval (the Prefect UI's Resume form does the same).
    A name not in the policy's release.promoters is refused by the run, which waits on."""
    from uuid import UUID

    from prefect.exceptions import FlowPauseTimeout, ObjectNotFound
    from prefect.flow_runs import NotPausedError, resume_flow_run

    _settings()
    try:
        run_id = UUID(flow_run_id)
    except ValueError:
        raise VeilError(f"{flow_run_id!r}: not a flow run id") from None
    try:
        resume_flow_run(run_id, run_input={"promoter": promoter, "approve": not reject})
    except NotPausedError:
        raise VeilError(f"flow run {run_id} is not paused for approval") from None
    except FlowPauseTimeout:
        raise VeilError(f"flow run {run_id}: its approval window has closed") from None
    except ObjectNotFound:
        raise VeilError(f"flow run {run_id}: no such run on this Prefect server") from None
    out.print(f"sent {'rejection' if reject else 'approval'} as {promoter} to flow run {run_id}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
    app.command("approve")(approve)
    app.command("demo-data")(demo_data)
    app.command("base-model")(base_model)
    app.command("run")(run)
    app.command("retrain")(retrain)
    app.command("train")(train)
    app.command("register")(register_cmd)
    app.command("models")(models)
