"""Scheduled retraining: one Prefect flow that the schedule (prefect.yaml), `veil retrain` and tests run.

ingest → unchanged data? stop, no spend → plan → train (ledger reservation first) → certify →
register → audit → promote (the `production` alias moves only on a passed audit and a certificate
carrying the policy's required fields, and — when the policy names `release.promoters` — once one of
them approved it: the run pauses on the Prefect server for their input).

What a release line last trained on is kept per (policy, source, model name) in the private area:
the snapshot's content hash (records and secret spans: everything training reads) and the base
model's content hash (its files, not its path: a base replaced in place is a new base). The file names a source path and a model URI, nothing about a person, but it sits with the
ledger because it decides spend.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.input import RunInput

from components.core.errors import VeilError
from components.core.faults import kill_point
from components.core.settings import Settings, load_settings, private_umask
from components.publication import publish
from flows import stages
from flows.prefect_boundary import original_error, prefect_safe
from components.registry.gate import FIELD_PATHS, SNAPSHOT_ALIASES, promotion_gate  # noqa: F401 (re-exported)
from flows.pipeline import (audit_task, base_model_task, certify_task, evaluate_task, ingest_task, log_audit,
                            log_plan, log_step, plan_task, register_task)

PRODUCTION = "production"
LATEST = "latest-certified"
STATE_DIR = "retrain"


def line_key(policy_sha256: str, source: str, model_name: str) -> str:
    """One release line: the policy's content, the source's absolute path and the registered name."""
    return hashlib.sha256(f"{policy_sha256}\n{Path(source).resolve()}\n{model_name}".encode()).hexdigest()[:24]


def _state_path(settings: Settings, key: str) -> Path:
    return settings.private_dir / STATE_DIR / f"{key}.json"


def load_state(settings: Settings, key: str) -> dict | None:
    p = _state_path(settings, key)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise VeilError(f"{p}: not valid JSON ({e}); move it away to retrain from scratch") from None


def save_state(settings: Settings, key: str, doc: dict) -> None:
    p = _state_path(settings, key)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.chmod(tmp, 0o600)
    os.replace(tmp, p)


def training_content(settings: Settings, snapshot_id: str) -> str:
    """The snapshot's content hash (its records and secret spans, not its date or lineage)."""
    from catalog.snapshots import load_snapshot

    return load_snapshot(settings, snapshot_id, verify=False).manifest["content_sha256"]


def base_content(base_dir: str) -> str:
    """The base model directory's content hash (every file; the certificate's `run.base_model`)."""
    from components.core.fingerprints import directory_fingerprint

    return directory_fingerprint(base_dir)["sha256"]


class PromotionApproval(RunInput):
    """What a promoter sends to resume a retraining paused for approval (Prefect UI form, `veil approve`,
    or `prefect.flow_runs.resume_flow_run(id, run_input={"promoter": …})`)."""
    promoter: str
    approve: bool = True


def _api_server() -> str | None:
    """The Prefect API the run reports to, or None on the ephemeral in-process API (nobody can
    reach a run paused there to approve it)."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


def _back_to_running() -> None:
    """After an unanswered pause the run is still PAUSED on the server: mark it running again so it
    can finish (and report `not promoted`) instead of being failed by Prefect."""
    from prefect import get_client
    from prefect.context import FlowRunContext
    from prefect.states import Running

    ctx = FlowRunContext.get()
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(ctx.flow_run.id, Running(), force=True)


def await_approval(promoters: list[str], timeout_s: int, model_uri: str, *, poll_s: int = 5) -> dict:
    """One of `promoters` approves through a Prefect pause-for-input step. Returns {"approved",
    "by", "at", "reason", "refused"}: `refused` lists the names that answered but are not promoters
    (their answer is ignored and the run waits on, up to the same deadline). The name is who the
    answer says it is from: the Prefect API's own access control decides who may answer at all."""
    from prefect.exceptions import FlowPauseTimeout
    from prefect.flow_runs import pause_flow_run

    log = get_run_logger()
    if not promoters:
        return {"approved": True, "by": None, "at": None, "refused": [],
                "reason": "the policy names no promoters: promoted on its gates"}
    if _api_server() is None:
        return {"approved": False, "by": None, "at": None, "refused": [],
                "reason": "the policy's promoters approve through a Prefect server, and this run has none "
                          "(set PREFECT_API_URL): awaiting no one"}
    deadline, refused = time.monotonic() + timeout_s, []
    allowed = {p.strip() for p in promoters}
    while (left := math.ceil(deadline - time.monotonic())) > 0:
        log.info("%s passed its gates: waiting up to %d s for one of release.promoters (%s) to approve "
                 "(resume this run with input {\"promoter\": NAME, \"approve\": true|false})",
                 model_uri, left, ", ".join(promoters))
        try:
            got = pause_flow_run(wait_for_input=PromotionApproval, timeout=left, poll_interval=max(1, min(poll_s, left)))
        except FlowPauseTimeout:
            _back_to_running()
            break
        name, at = got.promoter.strip(), datetime.now(timezone.utc).isoformat(timespec="seconds")
        if name not in allowed:
            refused.append(name)
            log.warning("refused: %r is not one of release.promoters; %s stays unpromoted and the run waits on",
                        name, model_uri)
            continue
        if not got.approve:
            return {"approved": False, "by": name, "at": at, "refused": refused,
                    "reason": f"rejected by promoter {name} at {at}"}
        return {"approved": True, "by": name, "at": at, "refused": refused,
                "reason": f"approved by promoter {name} at {at}"}
    return {"approved": False, "by": None, "at": None, "refused": refused,
            "reason": f"no promoter approved within {timeout_s} s"}


@task(name="promote", cache_policy=NO_CACHE, retries=0, persist_result=False)
@prefect_safe("promote")
def promote_task(home: str, model_uri: str, cert: dict, audit_summary: dict | None, required: list[str],
                 alias: str, approval: dict | None = None, require: str | None = None) -> dict:
    """Move `alias` when the gates pass and (when asked for) a promoter approved; tag the version with
    the decision and, when there was one, who approved or rejected it and when."""
    from components.registry.mlflow_registry import _client

    settings = load_settings(home)
    ok, why = promotion_gate(cert, audit_summary, required, require)
    if ok and approval is not None and not approval["approved"]:
        ok, why = False, f"{why}, but {approval['reason']}"
    elif ok and approval is not None:
        why = f"{why}; {approval['reason']}"
    name, version = model_uri[len("models:/"):].split("/", 1)
    client = _client(settings)
    # latest-certified: the newest version whose audit did not fail (it moves after the audit now)
    if (audit_summary or {}).get("verdict") != "failed":
        client.set_registered_model_alias(name, LATEST, version)
    if approval is not None and approval.get("by"):
        client.set_model_version_tag(name, version, "veil.approval.by", approval["by"])
        client.set_model_version_tag(name, version, "veil.approval.at", approval["at"])
        client.set_model_version_tag(name, version, "veil.approval.decision",
                                     "approved" if approval["approved"] else "rejected")
    kill_point("during-promotion")
    if ok:
        client.set_registered_model_alias(name, alias, version)
        client.set_model_version_tag(name, version, "veil.promotion", f"{alias}: {why}")
    else:
        client.set_model_version_tag(name, version, "veil.promotion", f"not promoted: {why}")
        try:
            current = client.get_model_version_by_alias(name, alias).version
            why += f"; {alias} stays on models:/{name}/{current}"
        except Exception:  # noqa: BLE001 - MLflow raises when the alias is not set yet
            why += f"; no version is {alias} yet"
    return {"promoted": ok, "reason": why}


@task(name="train-or-resume", cache_policy=NO_CACHE, retries=0, persist_result=False)
@prefect_safe("train-or-resume")
def train_or_resume_task(home: str, plan_path: str, base_dir: str) -> dict:
    """Train (resuming from the run's checkpoint) or, when this plan's run already finished, take its
    result: a retraining stopped after training never trains or charges twice."""
    settings = load_settings(home)
    done = stages.finished_training(settings, plan_path)
    return done if done is not None else stages.train(settings, plan_path, base_dir)


def planning_exclusions(settings: Settings, key: str, pol, snapshot_id: str, content: str,
                        base_sha: str) -> list[str]:
    """Who this release line's plan leaves out for lack of budget (`stages.exhausted_people`),
    decided once per (snapshot content, base) and kept privately: a run killed after its reservation
    (which charged the same people) plans again with the same exclusions, so the same plan, and
    resumes instead of retiring the people it is training."""
    from catalog.snapshots import load_snapshot

    name = f"{key}.planning"
    saved = load_state(settings, name)
    if saved and saved.get("snapshot_content_sha256") == content and saved.get("base_sha256") == base_sha:
        return list(saved["excluded"])
    users = load_snapshot(settings, snapshot_id, verify=False).records.column("user_id").to_pylist()
    excluded = sorted(stages.exhausted_people(settings, pol, users))
    save_state(settings, name, {"snapshot_content_sha256": content, "base_sha256": base_sha, "excluded": excluded})
    return excluded


def _people(settings: Settings, plan_doc: dict, reg: dict) -> tuple[int | None, int]:
    """Exact counts, from the ledger's record of this release (private: see `veil retrain`): trained,
    and retired by the reservation's filter (people excluded before planning are added by the caller)."""
    life = reg.get("lifetime")
    if life:
        return int(life["admitted"]), int(life["retired"])
    from components.draws.annex import load_annex

    counts = load_annex(settings.private_dir, plan_doc).get("counts") or {}
    return counts.get("n_train_users"), 0


def _skip(reason: str, model_uri: str | None = None) -> dict:
    return {"action": "skipped", "reason": reason, "model_uri": model_uri, "promoted": False,
            "approval": None, "people_trained": 0, "people_retired": 0}


# returns exact people counts; prints stay off Prefect's log (flows.pipeline.pipeline_flow)
@flow(name="veil-retrain", log_prints=False, persist_result=False)
@prefect_safe("veil-retrain")
def retrain_flow(policy: str, source: str, fmt: str = "jsonl", *, home: str | None = None,
                 base_model_dir: str | None = None, public_corpus: str | None = None,
                 model_name: str = "veil", mapping: dict | None = None, truth: str | None = None,
                 alias: str = PRODUCTION, approval_poll_s: int = 5) -> dict:
    """One retraining. Returns {action ("trained", "skipped", or "resumed": a killed run's registered
    release finished — its audit, its promotion), reason, model_uri, promoted, approval, people_trained,
    people_retired}, and `evaluation` (`stages.evaluate`'s document; None when the policy reserves no
    evaluation people, or for a resumed or skipped run) (approval: who approved or rejected it and when,
    None when nobody was asked); the people counts and the evaluation's exact figures are private: they
    are returned to the caller, never logged."""
    from components.policy import load_policy

    private_umask()
    settings = load_settings(home).ensure()
    home = str(settings.home)
    log = get_run_logger()
    # a work pool's worker with VEIL_DEVICE naming a GPU it lacks: said at the run's start, not after ingest
    from components.core.device import resolve_device

    resolve_device(settings.device)
    pol = load_policy(policy)
    # the base first: a missing base model is a one-line error before ingest has run
    base = base_model_task(home, public_corpus, base_model_dir)
    log_step(log, "base model ready")
    ing = ingest_task(home, source, fmt, policy, mapping or {})
    log_step(log, "ingested")
    content = training_content(settings, ing["snapshot_id"])
    key = line_key(pol.sha256, source, model_name)
    last = load_state(settings, key)
    base_sha = base_content(base)
    if last and last.get("snapshot_content_sha256") == content and last.get("base_sha256") == base_sha:
        # Issue 28: a run killed after registering (during its audit or its promotion) finishes that
        # release before anything is called unchanged: otherwise it stayed unaudited, unpromotable.
        left = unfinished(settings, last["model_uri"])
        if left is not None:
            log.info("resuming: %s", publish("prefect", {"resuming": [last["model_uri"], left]})["resuming"][1])
            plan_doc = _saved_plan(settings, last)
            return _finish(settings, home, log, pol, policy, truth, alias, approval_poll_s, last["model_uri"],
                           plan_doc, reg=None, excluded_people=0, audit_needed=(left == "audit"), resumed=True)
        # Prefect readers are not the operator: the snapshot's salted commitment, never its id (issue 22)
        reason = (f"the data eligible for training did not change since {last['model_uri']} "
                  f"(snapshot commitment {stages.snapshot_commitment_of(settings, ing['snapshot_id'])[:12]}…, same base "
                  "model): nothing trained, no budget spent")
        log.info("skipped: %s", publish("prefect", {"skipped": reason})["skipped"])
        return _skip(reason, last.get("model_uri"))

    try:
        # plan only with people who have budget left (N̂, q and the audit split are the trainable's)
        excluded = planning_exclusions(settings, key, pol, ing["snapshot_id"], content, base_sha)
        # the ids stay in the private state file: the task gets its path (a Prefect task parameter is a public handle)
        planned = plan_task(home, policy, ing["snapshot_id"], base,
                            exclusions_file=str(_state_path(settings, f"{key}.planning")) if excluded else None)
        log_step(log, "planned")
        kill_point("after-plan")
        plan_doc = planned["plan"]
        log_plan(log, plan_doc)
        trained = train_or_resume_task(home, planned["plan_path"], base)
        log_step(log, "trained")
    except VeilError as e:
        why = str(original_error(e))     # a task's failure reaches the flow as StepFailed (flows.prefect_boundary)
        if "spent their lifetime budget" in why:
            log.info("skipped: %s", publish("prefect", {"skipped": why})["skipped"])
            return _skip(why, last.get("model_uri") if last else None)
        raise
    cert = certify_task(home, planned["plan_path"], trained)
    # (a registration killed after MLflow registered its version finds that version: one per plan)
    reg = register_task(home, model_name, cert, planned["plan_path"], base,
                        trained.get("adapter_dir") or trained.get("model_dir"), alias=None)
    log.info("registered %s (plan %s, certificate %s)", *publish("prefect", {"registered": [
        reg["model_uri"], plan_doc["sha256"][:12], cert["sha256"][:12]]})["registered"])
    # Recorded before the audit: the release exists and was charged, so the same data must not be
    # trained (and charged) again even if the audit below fails; a run killed from here on finds the
    # state and finishes the audit and the promotion (`unfinished`).
    state = {"snapshot_id": ing["snapshot_id"], "snapshot_content_sha256": content, "base_dir": base,
             "base_sha256": base_sha,
             "model_uri": reg["model_uri"], "plan_sha256": plan_doc["sha256"], "source": str(Path(source).resolve()),
             "policy_sha256": pol.sha256}
    save_state(settings, key, state)
    return _finish(settings, home, log, pol, policy, truth, alias, approval_poll_s, reg["model_uri"], plan_doc,
                   reg=reg, excluded_people=int(planned.get("excluded_people") or 0),
                   audit_needed=True, resumed=False)


def unfinished(settings: Settings, model_uri: str) -> str | None:
    """What a registered release of a retraining still lacks: "audit" (no audit section in a certificate
    that verifies — never audited, or an audit killed halfway), "promotion" (audited; the decision, which
    `promote_task` tags last, not taken), or None (finished)."""
    from components.certificate.seal import trusted_keys
    from components.registry.mlflow_registry import _client, _resolve_version
    from components.registry.verification import verify_version

    client = _client(settings)
    try:
        mv = _resolve_version(client, model_uri)
    except VeilError:       # the version was deleted since: nothing of it to finish
        return None
    if mv.tags.get("veil.promotion"):
        # the last thing a retraining writes (promote_task, after the audit was recorded): finished, and
        # a skipped run need not download and verify the package to say so
        return None
    v = verify_version(client, mv, trusted_keys(settings))
    if not v.valid or not isinstance((v.certificate or {}).get("audit"), dict):
        return "audit"
    return "promotion"


def _saved_plan(settings: Settings, state: dict) -> dict:
    from components.planning import load_plan

    return load_plan(settings.plans_dir / f"{state['plan_sha256']}.json").to_dict()


def _finish(settings: Settings, home: str, log, pol, policy: str, truth: str | None, alias: str,
            approval_poll_s: int, model_uri: str, plan_doc: dict, *, reg: dict | None, excluded_people: int,
            audit_needed: bool, resumed: bool) -> dict:
    """Audit (unless the release is audited already), then decide the promotion: the tail of a
    retraining, and what a run killed there resumes."""
    from components.registry.mlflow_registry import _client, _resolve_version
    from components.registry.verification import verify_version
    from components.certificate.seal import trusted_keys

    if audit_needed:
        aud = audit_task(home, model_uri, policy, truth)
        log_step(log, "audited")
        kill_point("after-audit")
        final_cert, summary = aud["certificate"], aud["summary"]
    else:   # audited before the kill: the registered (verified) certificate holds its public section
        client = _client(settings)
        v = verify_version(client, _resolve_version(client, model_uri), trusted_keys(settings))
        v.raise_if_invalid(f"model {model_uri}")
        final_cert, summary = v.certificate, v.certificate["audit"]
    required = list(pol.spec.release.required_certificate_fields)
    require = pol.spec.audit.require
    log_audit(log, summary)
    # Evaluated as `veil run` does, before the promoters are asked: the version's run gets the DP release
    # of the metrics (charged to the evaluation people); the exact figures are returned to the operator,
    # never logged. Not on a resumed run: a kill after the evaluation must not charge its people twice
    # (a kill between the audit and the evaluation leaves the version without metrics, nothing worse).
    ev = None if resumed else evaluate_task(home, model_uri, policy)
    if ev is not None:
        log_step(log, "evaluated")
    approval = None
    if promotion_gate(final_cert, summary, required, require)[0]:
        # only a release that passed its gates is put to the promoters (the flow pauses, not a task)
        approval = await_approval(list(pol.spec.release.promoters), pol.spec.release.approval_timeout_seconds,
                                  model_uri, poll_s=approval_poll_s)
    gate = promote_task(home, model_uri, final_cert, summary, required, alias, approval, require)
    log.info("%s: %s", *publish("prefect", {"promotion": ["promoted" if gate["promoted"] else "not promoted",
                                                           gate["reason"]]})["promotion"])
    kill_point("after-promotion")
    trained_n, retired_n = _people(settings, plan_doc, reg or {})
    retired_n += excluded_people  # out before planning + retired at the reservation
    public_approval = None if approval is None else {k: approval[k] for k in ("approved", "by", "at", "refused")}
    return {"action": "resumed" if resumed else "trained", "reason": gate["reason"], "model_uri": model_uri,
            "promoted": gate["promoted"], "approval": public_approval,
            "people_trained": trained_n, "people_retired": retired_n, "evaluation": ev}
