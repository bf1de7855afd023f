"""The pipeline's Prefect tasks and its run-log lines, shared by the flows that run them: the whole
pipeline and the demo (flows.pipeline) and scheduled retraining (flows.retrain).

Tasks are thin wrappers over `flows.stages`; nothing is cached by Prefect (each stage's own
artifacts are content-addressed already, and privacy spend must never be skipped silently). Importing
this module sets up every flow process alike: quiet third-party output, owner-only files, one-line
user errors in Prefect's loggers.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from components.core.quiet import quiet_environment, quiet_third_party

quiet_environment()  # before Prefect's import: a worker's flow-run process imports this module first

from prefect import task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from components.core.errors import VeilError  # noqa: E402
from components.core.settings import load_settings, private_umask  # noqa: E402
from components.publication import publish  # noqa: E402
from flows import stages  # noqa: E402
from flows.prefect_boundary import prefect_safe  # noqa: E402

# The flows' processes write the catalog, snapshots, plans, runs and MLflow's files: owner-only
# (0600/0700) whatever the umask they were started under (a served deployment's worker included).
private_umask()
# Wherever these flows run (the CLI, `veil retrain --serve`, a work pool's flow-run process), third-party
# warnings and progress bars stay out of the terminal and the Prefect log.
quiet_third_party()


class _UserErrorsWithoutTraceback(logging.Filter):
    """A VeilError is bad input or a refused release, said in one line: Prefect's task and flow
    loggers would print its traceback too. Real bugs keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, VeilError):
            record.exc_info, record.exc_text = None, None
        return True


for _name in ("prefect.task_runs", "prefect.flow_runs", "prefect.engine"):
    logging.getLogger(_name).addFilter(_UserErrorsWithoutTraceback())

# persist_result=False: results (exact counts, plans with their annex paths, certificates before the gate) never go
# to Prefect's result storage or its API, whatever PREFECT_RESULTS_PERSIST_BY_DEFAULT says (issue 22)
_task = dict(cache_policy=NO_CACHE, retries=0, persist_result=False)

STEPS = ("ingested", "base model ready", "planned", "trained", "registered", "audited", "evaluated")


def log_step(log, step: str) -> None:
    """A Prefect log line at a step boundary, so a run's log shows where it is (issue 26: a 13-minute
    silence). The words are fixed (STEPS), through the publication gate like every Prefect line."""
    if step not in STEPS:
        raise ValueError(f"unknown step {step!r}")
    # the run's log only: the terminal has the steps' own progress lines, and a user error stays one line
    log.info("step: %s", publish("prefect", {"step": step})["step"], extra={"veil_console": False})


def plan_log_fields(plan_doc: dict) -> dict:
    """The plan's own public statements, for the run's log before training (issue 26: the scheduled flow
    must say up front whether its audit can settle): the audit sizing's statement and what cannot pass,
    and the schedule's ε per release. Post-processings of N̂ and policy values (the plan channel's)."""
    sizing = (plan_doc.get("audit") or {}).get("sizing") or {}
    sched = plan_doc.get("schedule") or {}
    audit = str(sizing.get("statement") or "no audit sizing in this plan")
    if sizing.get("cannot_pass"):
        audit += ": " + "; ".join(map(str, sizing["cannot_pass"]))
    when = ""
    if sched.get("releases"):
        when = (f"schedule of {sched['releases']} releases: ε per release {sched.get('epsilon_per_release')}"
                + (" (lowered from the target)" if sched.get("lowered") else ""))
    return {"plan_audit": [audit, when]}


def log_plan(log, plan_doc: dict) -> None:
    log.info("plan: %s%s", *(lambda a, w: (a, f"; {w}" if w else ""))(
        *publish("prefect", plan_log_fields(plan_doc))["plan_audit"]))


@task(name="ingest", **_task)
@prefect_safe("ingest")
def ingest_task(home, source, fmt, policy, mapping):
    return stages.ingest(load_settings(home), source, fmt, policy=policy, **mapping)


@task(name="base-model", **_task)
@prefect_safe("base-model")
def base_model_task(home, public_corpus, base_model_dir):
    return stages.base_model(load_settings(home), public_corpus=public_corpus, base_model_dir=base_model_dir)


@task(name="plan", **_task)
@prefect_safe("plan")
def plan_task(home, policy, snapshot_id, base_dir, exclusions_file=None):
    """`exclusions_file`: a private JSON file whose "excluded" lists the person ids to leave out. Task parameters
    are public handles only (paths, names, hashes): the ids themselves never pass through Prefect (issue 22)."""
    excluded = json.loads(Path(exclusions_file).read_text())["excluded"] if exclusions_file else None
    return stages.plan(load_settings(home), policy, snapshot_id=snapshot_id, base_dir=base_dir,
                       exclude_people=excluded)


@task(name="train", **_task)
@prefect_safe("train")
def train_task(home, plan_path, base_dir, precision=None):
    return stages.train(load_settings(home), plan_path, base_dir, precision=precision)


@task(name="certify", **_task)
@prefect_safe("certify")
def certify_task(home, plan_path, train_result):
    return stages.certify(load_settings(home), plan_path, train_result)


@task(name="register", **_task)
@prefect_safe("register")
def register_task(home, name, certificate, plan_path, base_dir, adapter_dir, alias="latest-certified"):
    return stages.register(load_settings(home), name=name, certificate=certificate, plan_path=plan_path,
                           base_dir=base_dir, adapter_dir=adapter_dir, alias=alias)


@task(name="audit", **_task)
@prefect_safe("audit")
def audit_task(home, model_uri, policy, truth):
    return stages.audit(load_settings(home), model_uri, policy=policy, truth=truth)


@task(name="evaluate", **_task)
@prefect_safe("evaluate")
def evaluate_task(home, model_uri, policy=None):
    return stages.evaluate(load_settings(home), model_uri, missing_ok=True, policy=policy)


def audit_log_fields(summary: dict | None) -> dict:
    """The audit's Prefect log line, from its public section only: verdict, what the policy's gate
    requires, whether it is met and every reason for a non-pass (public reasons: verdicts, counts on the
    published grid, policy values)."""
    if summary is None:
        return {"audit": ["not audited", "", "", ""]}
    gate = summary.get("gate") or {}
    return {"audit": [str(summary.get("verdict")), str(gate.get("require", "passed")),
                      "meets" if gate.get("meets") else "does not meet",
                      str(gate.get("reason") or "; ".join(summary.get("reasons") or []))]}


def log_audit(log, summary: dict | None) -> None:
    log.info("audit %s (the policy requires %s: %s): %s", *publish("prefect", audit_log_fields(summary))["audit"])
