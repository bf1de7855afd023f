"""Prefect flows: the whole pipeline, the demo, and serving scheduled retraining (flows.retrain).

The tasks they run are `flows.tasks` (thin wrappers over `flows.stages`, shared with flows.retrain).
"""
from __future__ import annotations

from pathlib import Path

# flows.tasks first: it quiets third-party output before Prefect's import (a worker's flow-run process imports
# this module first), makes the flows' files owner-only and keeps user errors to one line in Prefect's log
from flows.tasks import (  # noqa: F401 (STEPS, the log helpers and the tasks: this module's names too)
    STEPS, audit_log_fields, audit_task, base_model_task, certify_task, evaluate_task, ingest_task, log_audit,
    log_plan, log_step, plan_log_fields, plan_task, register_task, train_task,
)

from prefect import flow, get_run_logger  # noqa: E402

from components.certificate import describe as describe_guarantee  # noqa: E402
from components.core.device import resolve_device  # noqa: E402
from components.core.settings import load_settings, private_umask  # noqa: E402
from components.publication import publish  # noqa: E402
from flows import stages  # noqa: E402
from flows.prefect_boundary import prefect_safe  # noqa: E402
from flows.retrain import retrain_flow  # noqa: E402


# log_prints=False: a print() (progress, the audit's "scoring N attacker samples of M users") would reach
# Prefect's API log ungated, exact counts included; the run's log gets the gated log_step lines instead
@flow(name="veil-pipeline", log_prints=False, persist_result=False)
@prefect_safe("veil-pipeline")
def pipeline_flow(policy: str, source: str, fmt: str = "jsonl", *, home: str | None = None,
                  public_corpus: str | None = None, base_model_dir: str | None = None,
                  model_name: str = "veil", mapping: dict | None = None, audit: bool = True,
                  truth: str | None = None, precision: str | None = None) -> dict:
    """ingest → base model → plan → DP fine-tune → certificate → MLflow registration → audit.
    `precision`: overrides the plan's training precision (fp32 | bf16 | fp16; a public setting)."""
    private_umask()
    settings = load_settings(home).ensure()
    home = str(settings.home)
    log = get_run_logger()
    resolve_device(settings.device)  # a missing GPU is said before ingest and model loading, not after
    ing = ingest_task(home, source, fmt, policy, mapping or {})
    log_step(log, "ingested")
    # Prefect's readers are not the operator: the snapshot's salted commitment only (its id is a content
    # hash, issue 22); exact record counts are private (the CLI's summary shows them on the operator's terminal)
    log.info("ingested snapshot commitment %s…", publish("prefect", {"snapshot_commitment": stages.snapshot_commitment_of(
        settings, ing["snapshot_id"])[:12]})["snapshot_commitment"])
    base = base_model_task(home, public_corpus, base_model_dir)
    log_step(log, "base model ready")
    planned = plan_task(home, policy, ing["snapshot_id"], base)
    log_step(log, "planned")
    log_plan(log, planned["plan"])
    trained = train_task(home, planned["plan_path"], base, precision)
    log_step(log, "trained")
    cert = certify_task(home, planned["plan_path"], trained)
    log.info("certificate %s: %s", *publish("prefect", {"certificate": [cert["sha256"][:12], describe_guarantee(cert)]})
             ["certificate"])
    reg = register_task(home, model_name, cert, planned["plan_path"], base,
                        trained.get("adapter_dir") or trained.get("model_dir"))
    log_step(log, "registered")
    aud = audit_task(home, reg["model_uri"], policy, truth) if audit else None
    if aud is not None:
        log_audit(log, aud["summary"])
        log_step(log, "audited")
        stages.settle_latest(settings, reg["model_uri"], aud["summary"])
    ev = evaluate_task(home, reg["model_uri"], policy)
    if ev is not None:
        log_step(log, "evaluated")
    return {"ingest": ing, "plan_path": planned["plan_path"], "plan": planned["plan"], "train": trained,
            "certificate": aud["certificate"] if aud else cert, "registration": reg,
            "audit": aud["summary"] if aud else None, "evaluation": ev}


@flow(name="veil-demo", log_prints=False, persist_result=False)
@prefect_safe("veil-demo")
def demo_flow(home: str | None = None, audit: bool = True) -> dict:
    """The demo organization through the whole pipeline on embedded defaults."""
    settings = load_settings(home).ensure()
    org = stages.demo_data(settings)
    return pipeline_flow(str(stages.DEMO_POLICY), org["messages"], "jsonl", home=str(settings.home),
                         public_corpus=org["public"], model_name="veil-demo", mapping=stages.DEMO_MAPPING,
                         audit=audit, truth=org["truth"])


def serve_retraining(policy: str, source: str, fmt: str, cron: str, *, timezone: str = "UTC",
                     home: str | None = None, base_model_dir: str | None = None, public_corpus: str | None = None,
                     model_name: str = "veil", mapping: dict | None = None) -> int | None:
    """Scheduled retraining without a work pool: serve `retrain_flow` (skips unchanged data, promotes
    only on a passed audit and a promoter's approval) on a cron schedule in `timezone`, one run at a
    time; needs a Prefect server (prefect.yaml is the deployment with a work pool).

    Blocks until SIGINT or SIGTERM, then stops the runner (its schedule is paused on the server) and
    returns that signal's number; returns None if the runner stopped by itself."""
    import signal

    from prefect.schedules import Cron

    got: list[int] = []

    def stop(signum, _frame):
        got.append(signum)
        raise KeyboardInterrupt  # Prefect's serve() stops its runner on this

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        retrain_flow.serve(name=f"retrain-{model_name}", schedules=[Cron(cron, timezone=timezone)], limit=1,
                           print_starting_message=False,
                           parameters={"policy": str(Path(policy).resolve()), "source": str(Path(source).resolve()),
                                       "fmt": fmt, "home": home, "base_model_dir": base_model_dir,
                                       "public_corpus": public_corpus, "model_name": model_name,
                                       "mapping": mapping or {}})
    except KeyboardInterrupt:  # a signal that arrived outside the runner's own loop
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return got[0] if got else None
