"""Register, list and load certified models in MLflow (sqlite tracking + registry by default)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from components.certificate import describe, verify_certificate
from components.core.errors import VeilError
from components.core.settings import Settings

CERT_ARTIFACT = "certificate.json"
PLAN_ARTIFACT = "plan.json"


def _client(settings: Settings):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    mlflow.set_registry_uri(settings.mlflow_registry_uri)
    return MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_registry_uri)


def _experiment(settings: Settings, name: str) -> str:
    """Get or create an experiment whose artifacts live under VEIL_HOME (not the cwd)."""
    import mlflow

    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if settings.mlflow_tracking_uri.startswith("sqlite:"):
        location = (settings.mlflow_artifacts_dir / name).as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


def privacy_tags(cert: Mapping[str, Any]) -> dict[str, str]:
    tags = {
        "privacy.certificate_sha256": cert["sha256"],
        "privacy.schema": cert["schema"],
        "privacy.unit": cert["privacy_unit"],
        "privacy.neighbouring": cert["neighbouring"],
        "privacy.mechanism": cert["mechanism"],
        "privacy.noise_multiplier": repr(float(cert["noise_multiplier"])),
        "privacy.sampling_rate": repr(float(cert["sampling_rate"])),
        "privacy.steps": str(cert["steps"]),
        "privacy.clip_norm": repr(float(cert["clip_norm"])),
        "privacy.accountant": cert["accountant"]["name"],
        "privacy.snapshot_id": cert["dataset"]["snapshot_id"],
        "privacy.policy_sha256": cert["policy"]["sha256"],
    }
    if cert["epsilon"] is not None:
        tags["privacy.epsilon"] = repr(float(cert["epsilon"]))
        tags["privacy.delta"] = repr(float(cert["delta"]))
    for cls, c in (cert.get("secrets") or {}).items():
        tags[f"privacy.secret.{cls}.max_gamma"] = repr(float(c["max_gamma"]))
        tags[f"privacy.secret.{cls}.kappa"] = repr(float(c["kappa"]))
    audit = cert.get("audit") or {}
    for key in ("auroc", "auroc_ceiling", "passed"):
        if key in audit:
            tags[f"audit.{key}"] = str(audit[key])
    return tags


@dataclass(frozen=True)
class Registration:
    name: str
    version: str
    run_id: str
    model_uri: str
    certificate_sha256: str
    lifetime: dict | None = None    # the ledger's aggregates for this release (components.ledger)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def register_model(settings: Settings, *, name: str, certificate: Mapping[str, Any], plan: Mapping[str, Any],
                   base_model_dir: str | Path, adapter_dir: str | Path | None,
                   policy_max_epsilon: float | None = None, experiment: str = "veil",
                   alias: str | None = "latest-certified", ledger_release_id: int | None = None) -> Registration:
    """Log the model with its certificate and register a new version.

    Refuses a certificate that does not verify, or whose ε exceeds the policy's target.
    """
    import mlflow

    from components.registry.pyfunc_model import VeilCausalLM

    cert = verify_certificate(certificate).to_dict()
    if cert["epsilon"] is not None and policy_max_epsilon is not None and cert["epsilon"] > policy_max_epsilon + 1e-12:
        raise VeilError(f"certificate ε={cert['epsilon']:.4f} exceeds the policy's ε={policy_max_epsilon}: not registered")
    if not cert.get("within_target", True):
        raise VeilError(f"certificate does not meet its policy's target ({describe(cert)}): not registered")
    if plan.get("sha256") != cert["plan_sha256"]:
        raise VeilError("certificate and plan do not match (plan sha256 differs)")
    from components.planning.plan import assert_public

    # Only the public part of a plan is ever logged or embedded; its annex names people.
    assert_public(dict(plan), "plan to register")
    lifetime = lifetime_check(settings, cert, plan, ledger_release_id)
    client = _client(settings)
    exp_id = _experiment(settings, experiment)
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, plan_path = Path(tmp) / CERT_ARTIFACT, Path(tmp) / PLAN_ARTIFACT
        cert_path.write_text(json.dumps(cert, indent=2, sort_keys=True))
        plan_path.write_text(json.dumps(dict(plan), indent=2, sort_keys=True))
        artifacts = {"certificate": str(cert_path), "plan": str(plan_path), "base_model": str(base_model_dir)}
        if adapter_dir:
            artifacts["adapter"] = str(adapter_dir)
        with mlflow.start_run(experiment_id=exp_id, run_name=f"{name}-{cert['sha256'][:8]}") as run:
            mlflow.log_params({"mechanism": cert["mechanism"], "noise_multiplier": cert["noise_multiplier"],
                               "sampling_rate": cert["sampling_rate"], "steps": cert["steps"],
                               "clip_norm": cert["clip_norm"], "delta": cert["delta"]})
            # A metric, not only a tag: MLflow can filter runs on metrics with `<`.
            if cert["epsilon"] is not None:
                mlflow.log_metric("privacy_epsilon", float(cert["epsilon"]))
            for cls, c in (cert.get("secrets") or {}).items():
                mlflow.log_metric(f"privacy_secret_max_gamma_{cls}", float(c["max_gamma"]))
            mlflow.set_tags(privacy_tags(cert))
            if lifetime is not None:
                # The release id and the budget only. How many people were admitted or retired is an
                # exact private count (it is N), and the ledger's spend distribution depends on who was
                # in which release: both stay in the private ledger (`veil ledger` for administrators).
                mlflow.set_tags({"privacy.ledger_release_id": str(lifetime["ledger_release_id"])})
                if lifetime["budget_epsilon"] is not None:
                    mlflow.set_tags({"privacy.lifetime_budget": f"{lifetime['budget_epsilon']!r}@{lifetime['delta']!r}"})
            mlflow.log_artifact(str(cert_path))
            mlflow.log_artifact(str(plan_path))
            info = mlflow.pyfunc.log_model(name="model", python_model=VeilCausalLM(), artifacts=artifacts,
                                           pip_requirements=["veil"])
            run_id = run.info.run_id
    mv = mlflow.register_model(info.model_uri, name, tags=privacy_tags(cert))
    if alias:
        client.set_registered_model_alias(name, alias, mv.version)
    return Registration(name=name, version=str(mv.version), run_id=run_id,
                        model_uri=f"models:/{name}/{mv.version}", certificate_sha256=cert["sha256"],
                        lifetime=lifetime)


def lifetime_check(settings: Settings, cert: Mapping[str, Any], plan: Mapping[str, Any],
                   ledger_release_id: int | None = None) -> dict | None:
    """The per-person ledger's word on this release (issue 13; components.ledger, docs/privacy/ledger.md).

    Replaces the old global sum over the registry. The release must hold a reservation made before
    training (`components.ledger.reserve_release`, called between plan and train); found by id, by the
    plan's `ledger.release_id`, or by the plan's sha256. Without one, the release is reserved now from the
    plan's training rows (a model on disk is a release) and refused if the filter retires anyone, since
    they are in the model already. Registration appends a `registered` event; the charge never moves,
    whatever happens to the version afterwards. Returns aggregates only (counts, ε of the budget)."""
    from components.ledger import Ledger, reserve_release

    led = Ledger.open(settings)
    try:
        rid = ledger_release_id or ((plan.get("ledger") or {}).get("release_id"))
        if rid is None:
            found = led.releases_for_plan(str(plan.get("sha256")))
            rid = found[-1] if found else None
        late = False
        if rid is None:
            try:
                from components.planning.annex import load_annex
                from components.planning.data import train_rows
                rows = train_rows(load_annex(settings.private_dir, dict(plan)))
            except (VeilError, KeyError, TypeError):
                if plan.get("lifetime_budget") is None and led.budget() is None:
                    return None   # no budget anywhere and no rows to charge: nothing the ledger can check
                raise VeilError(f"ledger: plan {str(plan.get('sha256'))[:12]} has no reservation and its training "
                                "rows cannot be read to charge it now: not registered (reserve before training)") from None
            if plan.get("mechanism") == "uls-filtered" and plan.get("lifetime_budget") is None \
                    and led.budget() is None:
                return None   # no Rényi curve to charge (docs/privacy/ledger.md) and no budget to enforce
            res = reserve_release(settings, plan, rows, ledger=led)
            rid, late = res.release_id, True
            if res.retired:
                led.record(rid, "refused", reason="trained before reserving; the filter retires some of its people")
                raise VeilError(f"ledger: this model was trained without a reservation and {len(res.retired)} of its "
                                "people have no budget left for it: not registered (their charge for the others stays)")
        from sqlalchemy import select

        from components.ledger import store as st
        with st.read_only(led.engine) as conn:
            row = conn.execute(select(st.releases).where(st.releases.c.id == int(rid))).first()
        if row is None:
            raise VeilError(f"ledger: no release {rid}: not registered")
        if row.plan_sha256 is not None and row.plan_sha256 != plan.get("sha256"):
            raise VeilError(f"ledger: release {rid} was reserved for another plan: not registered")
        if row.admitted == 0:
            led.record(int(rid), "refused", reason="the filter retired everyone")
            raise VeilError("ledger: the per-person filter retired every person of this release (no budget left): "
                            "not registered")
        led.record(int(rid), "registered", certificate_sha256=cert.get("sha256"))
        b = led.budget()
        return {"ledger_release_id": int(rid), "admitted": int(row.admitted), "retired": int(row.retired),
                "reserved_late": late, "budget_epsilon": None if b is None else b.epsilon,
                "delta": None if b is None else b.delta, "spend": led.summary()["spend"]}
    finally:
        led.dispose()


def _resolve_version(client, model_uri: str):
    """`models:/name/version`, `models:/name@alias` -> ModelVersion."""
    if not model_uri.startswith("models:/"):
        raise VeilError(f"model URI {model_uri!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    rest = model_uri[len("models:/"):]
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            return client.get_model_version_by_alias(name, alias)
        name, version = rest.rsplit("/", 1)
        return client.get_model_version(name, version)
    except VeilError:
        raise
    except Exception:
        raise VeilError(f"model URI {model_uri!r}: no such registered model version") from None


def _run_certificate(client, run_id: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, CERT_ARTIFACT, tmp)
        return json.loads(Path(path).read_text())


@dataclass
class LoadedModel:
    name: str
    version: str
    run_id: str
    model: Any
    tokenizer: Any
    certificate: dict
    plan: dict
    extra: dict = field(default_factory=dict)


def load_model(model_uri: str, settings: Settings) -> LoadedModel:
    """The consumer path: resolve, verify the certificate against the registry's hash, load."""
    import mlflow

    client = _client(settings)
    mv = _resolve_version(client, model_uri)
    cert = verify_certificate(_run_certificate(client, mv.run_id),
                              expected_sha256=mv.tags.get("privacy.certificate_sha256"))
    pyfunc = mlflow.pyfunc.load_model(f"models:/{mv.name}/{mv.version}")
    inner = pyfunc.unwrap_python_model()
    # The model's embedded certificate is the pre-audit one; privacy fields must agree.
    embedded = inner.certificate
    for key in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps", "plan_sha256"):
        if embedded[key] != cert.doc[key]:
            raise VeilError(f"model {model_uri}: embedded certificate disagrees with the registered one on {key}")
    return LoadedModel(name=mv.name, version=str(mv.version), run_id=mv.run_id, model=inner.model,
                       tokenizer=inner.tokenizer, certificate=cert.to_dict(), plan=inner.plan)


def record_audit(settings: Settings, model_uri: str, audit: Mapping[str, Any], *,
                 plot_path: str | Path | None = None) -> dict:
    """Put the audit's public section into the certificate (new hash), the run and the version's tags.

    `audit` must be the public section (`AuditResult.summary()`): verdicts and quantized aggregates,
    marked `covered_by_certificate: false`. Metrics and tags carry only its public values (bucket
    edges, ceilings, the verdict) — never an exact AUROC, exposure or per-person figure.
    """
    from components.audit.public import SECTION_SCHEMA, public_metrics, public_tags
    from components.certificate import attach_audit

    if audit.get("schema") != SECTION_SCHEMA or audit.get("covered_by_certificate") is not False:
        raise VeilError(f"audit: record_audit takes the public audit section ({SECTION_SCHEMA}, "
                        "covered_by_certificate: false), not the private report")

    client = _client(settings)
    mv = _resolve_version(client, model_uri)
    old = verify_certificate(_run_certificate(client, mv.run_id),
                             expected_sha256=mv.tags.get("privacy.certificate_sha256"))
    new = attach_audit(old.to_dict(), audit).to_dict()
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / CERT_ARTIFACT
        p.write_text(json.dumps(new, indent=2, sort_keys=True))
        client.log_artifact(mv.run_id, str(p))
    if plot_path:
        client.log_artifact(mv.run_id, str(plot_path), artifact_path="audit")
    for key, value in public_metrics(audit).items():
        client.log_metric(mv.run_id, key, value)
    for key, value in {**privacy_tags(new), **public_tags(audit)}.items():
        client.set_model_version_tag(mv.name, mv.version, key, value)
        client.set_tag(mv.run_id, key, value)
    return new


def list_models(settings: Settings) -> list[dict]:
    """Every registered version with its (verified) certificate, newest first."""
    client = _client(settings)
    out = []
    for rm in client.search_registered_models():
        aliases: dict[str, list[str]] = {}
        for alias, version in (rm.aliases or {}).items():
            aliases.setdefault(str(version), []).append(alias)
        for mv in client.search_model_versions(f"name='{rm.name}'"):
            try:
                cert = verify_certificate(_run_certificate(client, mv.run_id),
                                          expected_sha256=mv.tags.get("privacy.certificate_sha256")).to_dict()
                status = "verified"
            except VeilError as e:
                cert, status = None, f"INVALID: {e}"
            out.append({"name": mv.name, "version": str(mv.version), "aliases": aliases.get(str(mv.version), []),
                        "run_id": mv.run_id, "created_at_ms": mv.creation_timestamp,
                        "certificate_status": status, "certificate": cert})
    out.sort(key=lambda r: (r["name"], -int(r["version"])))
    return out
