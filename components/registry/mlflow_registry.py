"""Register, list and load certified models in MLflow (sqlite tracking + registry by default)."""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from components.audit.public import public_metrics, public_tags, SECTION_SCHEMA
from components.certificate import describe, verify_certificate
from components.certificate import attach_audit
from components.certificate.seal import load_signing_key, make_seal, public_key_pem, trusted_keys
from components.certificate.verify import (
    artifact_bindings, certified_artifacts_mismatch, check_amendment, recheck_guarantee, verify_package,
)
from components.core.errors import VeilError
from components.core.faults import kill_point
from components.core.hashing import sha256_json
from components.core.quiet import quiet_third_party
from components.core.settings import Settings
from components.core.sqlite_files import check_existing
from components.evaluation.dp import PublishedEvaluation
from components.mechanisms import get as get_mechanism
from components.modeling import load_base
from components.modeling.base import read_base_facts
from components.draws.annex import load_annex
from components.publication import publish
from components.registry import local_store
from components.registry.local_store import MLFLOW_RESTORE
from components.registry.artifacts import (  # noqa: F401 (privacy_tags, PLAN_TAG: this module's names too)
    CERT_ARTIFACT, PLAN_ARTIFACT, PLAN_TAG, SEAL_ARTIFACT, privacy_tags, run_json,
)
from components.registry.verification import (
    check_alias_gates, check_registry_side, package_artifacts, REGISTRY_CHECKED_BY_CALLER, verify_version,
)

# What the pyfunc needs at load time, pinned to the versions that registered it (`veil` itself is
# not on an index: its `components` package travels inside the model as `code_paths`).
RUNTIME_REQUIREMENTS = ("torch", "transformers", "peft", "tokenizers", "safetensors", "accelerate", "numpy",
                        "scipy", "pandas", "pyyaml", "dp-accounting", "cryptography")
INPUT_EXAMPLE_PROMPT = "The weekly report"




def check_store(settings: Settings) -> None:
    """An SQLite tracking/registry store that exists but is empty, truncated or garbled is refused in one
    line (components.core.sqlite_files): MLflow would otherwise migrate a fresh schema into an empty
    file — a registry that lists no models, exit 0 — or die with a long traceback on a damaged one."""
    for uri in {settings.mlflow_tracking_uri, settings.mlflow_registry_uri}:
        if uri and uri.startswith("sqlite:///"):
            path = Path(uri[len("sqlite:///"):])
            check_existing(path, "MLflow store", MLFLOW_RESTORE)
            if path.exists():
                _check_complete_schema(path)
            else:
                create_store_aside(path)


def _check_complete_schema(path: Path) -> None:
    """An MLflow store holding some of MLflow's tables but not all is one whose creation was killed
    (issue 28): MLflow would run its migrations over it from the start and die on every later command
    with `table … already exists`. Refused in one line instead."""
    import sqlalchemy
    from mlflow.store.db.utils import _all_tables_exist

    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        tables = [t for t in sqlalchemy.inspect(engine).get_table_names() if not t.startswith("sqlite_")]
        if tables and not _all_tables_exist(engine):
            raise VeilError(f"MLflow store {path} is half-created ({len(tables)} tables: its first creation was "
                            f"killed, or an older Veil left it so); if no model was ever registered in it, move it "
                            f"aside and run again (it is re-created whole), else {MLFLOW_RESTORE}")
    except sqlalchemy.exc.DatabaseError as e:
        raise VeilError(f"MLflow store {path}: cannot be read ({str(e).splitlines()[0][:120]}); {MLFLOW_RESTORE}") from None
    finally:
        engine.dispose()


_EMPTY_STORE: bytes | None = None   # a freshly migrated empty store, once per process


def create_store_aside(path: Path) -> None:
    """Create a new SQLite MLflow store whole: its schema migrated in a temporary file of the same
    folder, which is then linked into place (never over a store another process made meanwhile). A
    kill leaves either no store or a complete one, never the half-migrated file MLflow's in-place
    creation left (issue 28), plus at worst a stray `.mlflow.db.*.creating` file."""
    import os

    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    global _EMPTY_STORE
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.creating")
    for stale in (tmp, tmp.with_name(tmp.name + "-journal")):
        stale.unlink(missing_ok=True)
    if _EMPTY_STORE is not None:
        # the same MLflow in the same process migrates to the same bytes (a migrated store holds its schema
        # and alembic's revision, nothing about its path: MLflow adds the default experiment when a client
        # first opens it): a copy, not ~4.5 CPU s of migrations again
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_EMPTY_STORE)
            f.flush()
            os.fsync(f.fileno())
    else:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        _EMPTY_STORE = tmp.read_bytes()
    try:
        os.link(tmp, path)          # atomic, and fails rather than replace a store made meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def _client(settings: Settings):
    import mlflow
    from mlflow import MlflowClient

    check_store(settings)
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
    # a database store (sqlite, or a team's PostgreSQL) has no artifact server: without a location
    # MLflow writes artifacts to ./mlruns under whatever the working directory is
    if not settings.mlflow_tracking_uri.startswith(("http:", "https:", "databricks")):
        location = (settings.mlflow_artifacts_dir / name).as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


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


def runtime_requirements() -> list[str]:
    """`name==version` for each runtime dependency installed here (local build tags like +cpu dropped)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in RUNTIME_REQUIREMENTS:
        try:
            out.append(f"{name}=={version(name).split('+', 1)[0]}")
        except PackageNotFoundError:
            continue
    return out


def model_signature():
    """A `prompt` string column in, one string out, `max_new_tokens` as a parameter."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec("string", "prompt")]), outputs=Schema([ColSpec("string")]),
                          params=ParamSchema([ParamSpec("max_new_tokens", "long", 32)]))


def _components_dir() -> str:
    return str(Path(__file__).resolve().parents[1])


def register_model(settings: Settings, *, name: str, certificate: Mapping[str, Any], plan: Mapping[str, Any],
                   base_model_dir: str | Path, adapter_dir: str | Path | None,
                   policy_max_epsilon: float | None = None, experiment: str = "veil",
                   alias: str | None = "latest-certified", ledger_release_id: int | None = None,
                   ledger_entry: str | None = None, signing_key=None) -> Registration:
    """Seal the certificate, log the model with it and register a new version.

    The seal (components.certificate.seal) signs the certificate's hash with the hashes of the
    weights, base model, tokenizer and plan being logged, the policy and the ledger entry. Refuses a
    certificate that does not verify, whose ε is not what its parameters give, or whose ε exceeds the
    policy's target.
    """
    import mlflow
    import pandas as pd

    from components.planning.plan import assert_public  # startup
    from components.registry.pyfunc_model import VeilCausalLM  # startup

    cert = verify_certificate(certificate).to_dict()
    recheck_guarantee(cert)   # never sign a certificate whose numbers its own parameters contradict
    if cert["epsilon"] is not None and policy_max_epsilon is not None and cert["epsilon"] > policy_max_epsilon + 1e-12:
        raise VeilError(f"certificate ε={cert['epsilon']:.4f} exceeds the policy's ε={policy_max_epsilon}: not registered")
    if not cert.get("within_target", True):
        raise VeilError(f"certificate does not meet its policy's target ({describe(cert)}): not registered")
    if plan.get("sha256") != cert["plan_sha256"]:
        raise VeilError("certificate and plan do not match (plan sha256 differs)")

    # Only the public part of a plan is ever logged or embedded; its annex names people.
    assert_public(dict(plan), "plan to register")
    publish("plan", dict(plan), subject=str(plan.get("sha256")))
    if sha256_json({k: v for k, v in plan.items() if k != "sha256"}) != plan.get("sha256"):
        raise VeilError("plan: its content does not hash to its sha256 (edited after planning)")
    if (plan.get("policy") or {}).get("sha256") != cert["policy"]["sha256"]:
        raise VeilError("certificate and plan name different policies (policy sha256 differs)")
    weights_key = None
    if adapter_dir:
        if not Path(adapter_dir).is_dir():
            raise VeilError(f"{adapter_dir}: no such adapter/model directory")
        # peft's layout (adapter_config.json + adapter_model.safetensors) or a full HF model directory.
        weights_key = "adapter" if (Path(adapter_dir) / "adapter_config.json").is_file() else "model"
    lifetime = lifetime_check(settings, cert, plan, ledger_release_id)
    key = signing_key if signing_key is not None else load_signing_key(settings)
    if ledger_entry is None and (lifetime or {}).get("ledger_release_id") is not None:
        ledger_entry = str(lifetime["ledger_release_id"])   # the per-person ledger's release (components.ledger)
    bindings = artifact_bindings(weights_dir=adapter_dir, base_model_dir=base_model_dir, plan=plan,
                                 ledger_entry=ledger_entry, code_dir=_components_dir())
    wrong = certified_artifacts_mismatch(cert, bindings)
    if wrong:
        raise VeilError(f"{wrong[0][1]}: not registered")
    seal = make_seal(cert, bindings, key)
    client = _client(settings)
    exp_id = _experiment(settings, experiment)
    done = _registered_for_plan(client, settings, exp_id, name, str(plan["sha256"]))
    if done is not None:
        # A run killed after MLflow registered the version (before the ledger's event, or before it
        # recorded its own state) registers nothing twice: the plan's one version is taken as it is.
        _record_registered(settings, lifetime, done.tags.get("privacy.certificate_sha256"))
        if alias:
            client.set_registered_model_alias(name, alias, done.version)
        return Registration(name=name, version=str(done.version), run_id=done.run_id,
                            model_uri=f"models:/{name}/{done.version}",
                            certificate_sha256=str(done.tags.get("privacy.certificate_sha256")), lifetime=lifetime)
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, plan_path = Path(tmp) / CERT_ARTIFACT, Path(tmp) / PLAN_ARTIFACT
        seal_path, pub_path = Path(tmp) / SEAL_ARTIFACT, Path(tmp) / "signing_key.pub.pem"
        cert_path.write_text(json.dumps(cert, indent=2, sort_keys=True))
        plan_path.write_text(json.dumps(dict(plan), indent=2, sort_keys=True))
        seal_path.write_text(json.dumps(seal, indent=2, sort_keys=True))

        pub_path.write_text(public_key_pem(key.public_key()))
        artifacts = {"certificate": str(cert_path), "seal": str(seal_path), "plan": str(plan_path),
                     "base_model": str(base_model_dir)}
        if weights_key:
            artifacts[weights_key] = str(adapter_dir)
        with mlflow.start_run(experiment_id=exp_id, run_name=f"{name}-{cert['sha256'][:8]}") as run:
            mlflow.log_params(publish("registry.param", {
                "mechanism": cert["mechanism"], "noise_multiplier": cert["noise_multiplier"],
                "sampling_rate": cert["sampling_rate"], "steps": cert["steps"], "clip_norm": cert["clip_norm"],
                "delta": cert["delta"]}, subject=cert["plan_sha256"]))
            # A metric, not only a tag: MLflow can filter runs on metrics with `<`.
            metrics = {} if cert["epsilon"] is None else {"privacy_epsilon": float(cert["epsilon"])}
            for cls, c in (cert.get("secrets") or {}).items():
                metrics[f"privacy_secret_max_gamma_{cls}"] = float(c["max_gamma"])
            mlflow.log_metrics(publish("registry.metric", metrics, subject=cert["plan_sha256"]))
            run_tags = {**privacy_tags(cert), "privacy.signing_key": seal["public_key"]["fingerprint"],
                        # how a registration killed before its version existed is found again (above)
                        PLAN_TAG: str(plan["sha256"])}
            if lifetime is not None:
                # The release id and the budget only. How many people were admitted or retired is an
                # exact private count (it is N), and the ledger's spend distribution depends on who was
                # in which release: both stay in the private ledger (`veil ledger` for administrators).
                run_tags["privacy.ledger_release_id"] = str(lifetime["ledger_release_id"])
                if lifetime["budget_epsilon"] is not None:
                    run_tags["privacy.lifetime_budget"] = f"{lifetime['budget_epsilon']!r}@{lifetime['delta']!r}"
            mlflow.set_tags(publish("registry.tag", run_tags, subject=cert["plan_sha256"]))
            # The run's certificate and seal are logged before the model: logging validates the
            # input example by loading the model, whose load_context checks the run side too.
            for p in (cert_path, seal_path, plan_path, pub_path):
                mlflow.log_artifact(str(p))
            info = mlflow.pyfunc.log_model(
                name="model", python_model=VeilCausalLM(), artifacts=artifacts,
                code_paths=[_components_dir()], pip_requirements=runtime_requirements(),
                signature=model_signature(), input_example=pd.DataFrame({"prompt": [INPUT_EXAMPLE_PROMPT]}))
            run_id = run.info.run_id
    _verify_logged(client, info.model_uri, run_id, settings)
    kill_point("during-registration")
    tags = publish("registry.tag", {**privacy_tags(cert), "privacy.signing_key": seal["public_key"]["fingerprint"]},
                   subject=cert["plan_sha256"])
    mv = mlflow.register_model(info.model_uri, name, tags=tags)
    if alias:
        client.set_registered_model_alias(name, alias, mv.version)
    # MLflow copies artifacts with their source's mode (a base model outside VEIL_HOME is typically 0644)
    settings.make_private(settings.mlflow_artifacts_dir)
    kill_point("after-registration")
    # the ledger's event after what it records (issue 28: it used to come first, for versions a kill
    # then left unregistered)
    _record_registered(settings, lifetime, cert["sha256"])
    return Registration(name=name, version=str(mv.version), run_id=run_id,
                        model_uri=f"models:/{name}/{mv.version}", certificate_sha256=cert["sha256"],
                        lifetime=lifetime)


def _record_registered(settings: Settings, lifetime: dict | None, certificate_sha256: str | None) -> None:
    """The ledger's `registered` event, once MLflow holds the version (once: a resumed registration
    that finds it there already does not add a second)."""
    if not lifetime or lifetime.get("ledger_release_id") is None:
        return
    from components.ledger import Ledger  # startup

    led = Ledger.open(settings)
    try:
        rid = int(lifetime["ledger_release_id"])
        if not any(e["status"] == "registered" for e in led.events(rid)):
            led.record(rid, "registered", certificate_sha256=certificate_sha256)
    finally:
        led.dispose()


def _registered_for_plan(client, settings: Settings, exp_id: str, name: str, plan_sha256: str):
    """The version of `name` already registered for this plan (its run tagged PLAN_TAG and the
    release verifying), or None. A run killed before its version was registered is left as it is:
    it has no version, and nothing loads a run."""
    runs = client.search_runs([exp_id], filter_string=f"tags.`{PLAN_TAG}` = '{plan_sha256}'")
    for run in runs:
        for mv in client.search_model_versions(f"run_id='{run.info.run_id}'"):
            if mv.name != name:
                continue
            v = verify_version(client, mv, trusted_keys(settings))
            if not v.valid:
                raise VeilError(f"plan {plan_sha256[:12]} is registered already as models:/{name}/{mv.version}, which "
                                f"does not verify ({v.reason}); registering it again would make two versions of one "
                                "release: restore that version's run, or delete the version (its charge stays)")
            return mv
    return None


def _verify_logged(client, model_uri: str, run_id: str, settings: Settings) -> None:
    """Verify what was just logged, as a consumer will, before it becomes a registered version
    (a package that does not verify — e.g. the signing key is not in this installation's trust
    store — is never registered)."""
    trusted = trusted_keys(settings)
    with tempfile.TemporaryDirectory() as tmp:
        import mlflow

        pkg = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp)
        v, embedded, embedded_seal = verify_package(package_artifacts(pkg), trusted)
    check_registry_side(client, run_id, [], embedded, embedded_seal, trusted, v)
    if not v.valid:
        raise VeilError(f"the logged model does not verify ({v.reason}): not registered")


def lifetime_check(settings: Settings, cert: Mapping[str, Any], plan: Mapping[str, Any],
                   ledger_release_id: int | None = None) -> dict | None:
    """The per-person ledger's word on this release (issue 13; components.ledger, docs/privacy/ledger.md).

    Replaces the old global sum over the registry. The release must hold a reservation made before
    training (`components.ledger.reserve_release`, called between plan and train); found by id, by the
    plan's `ledger.release_id`, or by the plan's sha256. Without one, the release is reserved now from the
    plan's training rows (a model on disk is a release) and refused if the filter retires anyone, since
    they are in the model already. `register_model` appends the `registered` event once MLflow holds the version; the charge never moves,
    whatever happens to the version afterwards. Returns aggregates only (counts, ε of the budget)."""
    from components.draws.data import train_rows  # startup
    from components.ledger import Ledger, reserve_release  # startup

    led = Ledger.open(settings)
    try:
        rid = ledger_release_id or ((plan.get("ledger") or {}).get("release_id"))
        if rid is None:
            found = led.releases_for_plan(str(plan.get("sha256")))
            rid = found[-1] if found else None
        late = False
        if rid is None:
            try:
                rows = train_rows(load_annex(settings.private_dir, dict(plan)))
            except (VeilError, KeyError, TypeError):
                if plan.get("lifetime_budget") is None and led.budget() is None:
                    return None   # no budget anywhere and no rows to charge: nothing the ledger can check
                raise VeilError(f"ledger: plan {str(plan.get('sha256'))[:12]} has no reservation and its training "
                                "rows cannot be read to charge it now: not registered (reserve before training)") from None
            if not get_mechanism(plan.get("mechanism")).ledger_curve and plan.get("lifetime_budget") is None \
                    and led.budget() is None:
                return None   # no Rényi curve to charge (docs/privacy/ledger.md) and no budget to enforce
            res = reserve_release(settings, plan, rows, ledger=led)
            rid, late = res.release_id, True
            if res.retired:
                led.record(rid, "refused", reason="trained before reserving; the filter retires some of its people")
                raise VeilError(f"ledger: this model was trained without a reservation and {len(res.retired)} of its "
                                "people have no budget left for it: not registered (their charge for the others stays)")
        from sqlalchemy import select

        from components.ledger import store as st  # startup
        with st.read_only(led.engine) as conn:
            row = conn.execute(select(st.releases).where(st.releases.c.id == int(rid))).first()
        if row is None:
            raise VeilError(f"ledger: no release {rid}: not registered")
        if row.plan_sha256 is not None and row.plan_sha256 != plan.get("sha256"):
            raise VeilError(f"ledger: release {rid} was reserved for another plan: not registered")
        # a release with no person-level claim (secret protection) admits nobody by design: not a refusal
        if row.admitted == 0 and get_mechanism(plan.get("mechanism")).ledger_person_claim:
            led.record(int(rid), "refused", reason="the filter retired everyone")
            raise VeilError("ledger: the per-person filter retired every person of this release (no budget left): "
                            "not registered")
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


def _uri_alias(model_uri: str) -> str | None:
    rest = model_uri[len("models:/"):] if model_uri.startswith("models:/") else ""
    return rest.split("@", 1)[1] if "@" in rest else None


def _download_package(mv, dst: str) -> str:
    import mlflow

    try:
        return mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=dst)
    except Exception as e:  # noqa: BLE001
        raise VeilError(f"model {mv.name}/{mv.version}: package {mv.source} cannot be downloaded "
                        f"({type(e).__name__})") from None


def verify_model(model_uri: str, settings: Settings):
    """Every check for a registered version (`veil verify`): a Verification, never an exception for
    an invalid release (a bad URI is still a VeilError).

    A local registry (Veil's default: SQLite and file artifacts) is read without MLflow
    (components.registry.local_store: the same rows and files, ~4 s of MLflow imports saved); any
    other store, or anything that reader does not resolve exactly, goes through MLflow's client."""
    store = local_store.open_local_store(settings)
    if store is not None:
        try:
            found = local_store.resolve(store, model_uri)
            if found is not None:
                mv, package = found
                v = verify_version(store, mv, trusted_keys(settings), package_dir=package,
                                   read_package=local_store.package_artifacts)
                check_alias_gates(store, mv, v)
                return v
        finally:
            store.close()
    client = _client(settings)
    mv = _resolve_version(client, model_uri)
    v = verify_version(client, mv, trusted_keys(settings))
    check_alias_gates(client, mv, v)    # every gated alias on the version, the one asked for included
    return v


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


def load_model(model_uri: str, settings: Settings, *, with_base: bool = False,
               interrupted_audit_ok: bool = False) -> LoadedModel:
    """The consumer path: resolve, verify every check (registry + package), then load the package.

    The package's own `load_context` verifies again what it is about to serve (so does plain
    `mlflow.pyfunc.load_model`); a failed check is a `ReleaseInvalid` (a VeilError) in one line.
    `with_base`: also load the package's (sealed) public base as `extra["base_model"]`, a
    (model, tokenizer) pair — what evaluation compares the fine-tuned model against.
    A gated alias in the URI (components.registry.gate) must be one the policy's gate allows on the
    version. `interrupted_audit_ok` (the audit only): a release an audit left halfway loads, to be
    audited again (its package verifies alone; `_interrupted_audit`).
    """
    import sys

    import mlflow

    # before the download: MLflow's "Downloading artifacts" bars and library notices stay off the
    # consumer's screen (Prefect's console is configured only in a process that already uses it)
    quiet_third_party(prefect="prefect" in sys.modules)
    client = _client(settings)
    mv = _resolve_version(client, model_uri)
    with tempfile.TemporaryDirectory() as tmp:
        package = _download_package(mv, tmp)
        v = verify_version(client, mv, trusted_keys(settings), package_dir=package)
        # the alias asked for, when it is gated (a load by version — the audit's — is not refused for an
        # alias someone moved onto that version)
        check_alias_gates(client, mv, v, aliases=[_uri_alias(model_uri)] if _uri_alias(model_uri) else [])
        if not (interrupted_audit_ok and not v.valid and _interrupted_audit(client, mv, package, settings, v)):
            v.raise_if_invalid(f"model {model_uri}")
        token = REGISTRY_CHECKED_BY_CALLER.set(True)
        try:
            inner = mlflow.pyfunc.load_model(package).unwrap_python_model()
        finally:
            REGISTRY_CHECKED_BY_CALLER.reset(token)
        extra: dict = {"verification": v.to_dict()}
        if with_base:
            base_dir = getattr(inner, "base_model_dir", None)
            if base_dir is None:  # a package whose own code predates it
                raise VeilError(f"model {model_uri}: its package does not expose its base model; re-register it")
            extra["base_model"] = load_base(base_dir)

            extra["base_facts"] = read_base_facts(base_dir)   # public: size, steps, loss on its public text
    return LoadedModel(name=mv.name, version=str(mv.version), run_id=mv.run_id, model=inner.model,
                       tokenizer=inner.tokenizer, plan=inner.plan, extra=extra,
                       # the registered (audited) certificate load_model verified; the package's own load
                       # checked the package only (REGISTRY_CHECKED_BY_CALLER)
                       certificate=v.certificate if v.valid and v.certificate else inner.certificate)


def record_audit(settings: Settings, model_uri: str, audit: Mapping[str, Any], *,
                 plot_path: str | Path | None = None) -> dict:
    """Put the audit's public section into the certificate (new hash), the run and the version's tags.

    `audit` must be the public section (`AuditResult.summary()`): verdicts and quantized aggregates,
    marked `covered_by_certificate: false`. Metrics and tags carry only its public values (bucket
    edges, ceilings, the verdict) — never an exact AUROC, exposure or per-person figure.

    Amends the release: a new certificate (`supersedes` = the model's embedded, pre-audit one;
    nothing else differs), sealed with the same bindings, in the run and the version's tags. A
    re-audit replaces the audit section; the chain is always one link long.
    """
    if audit.get("schema") != SECTION_SCHEMA or audit.get("covered_by_certificate") is not False:
        raise VeilError(f"audit: record_audit takes the public audit section ({SECTION_SCHEMA}, "
                        "covered_by_certificate: false), not the private report")

    client = _client(settings)
    mv = _resolve_version(client, model_uri)
    embedded, embedded_seal = _verified_embedded(client, mv, settings, model_uri)
    new = attach_audit(embedded, audit).to_dict()
    seal = make_seal(new, embedded_seal["bindings"], load_signing_key(settings))
    with tempfile.TemporaryDirectory() as tmp:
        for name, doc in ((CERT_ARTIFACT, new), (SEAL_ARTIFACT, seal)):
            p = Path(tmp) / name
            p.write_text(json.dumps(doc, indent=2, sort_keys=True))
            client.log_artifact(mv.run_id, str(p))
            kill_point("during-audit")      # the new certificate logged, its seal and tags not yet
    if plot_path:
        client.log_artifact(mv.run_id, str(plot_path), artifact_path="audit")
    publish("audit.public", dict(audit), subject=new["plan_sha256"])
    for key, value in publish("registry.metric", public_metrics(audit), subject=new["plan_sha256"]).items():
        client.log_metric(mv.run_id, key, value)
    tags = {**privacy_tags(new), **public_tags(audit), "privacy.signing_key": seal["public_key"]["fingerprint"]}
    for key, value in publish("registry.tag", tags, subject=new["plan_sha256"]).items():
        for other in client.search_model_versions(f"run_id='{mv.run_id}'"):
            client.set_model_version_tag(other.name, other.version, key, value)
        client.set_tag(mv.run_id, key, value)
    return new


def record_evaluation(settings: Settings, run_id: str, published) -> dict:
    """Log one DP evaluation release (`components.evaluation.dp.PublishedEvaluation`: noisy
    `eval_*` metrics and the `evaluation.*` tags) on the model's run, each through the publication gate.

    Anything else is refused: exact evaluation figures are a near-exact function of every evaluation
    person's text (issue 22, case 4), so the registry takes them only as a release that the ledger
    charged. Never on the version's tags, and never counts of the evaluation people or records."""
    if not isinstance(published, PublishedEvaluation):
        raise VeilError("evaluation: refusing to log metrics that are not a DP evaluation release "
                        "(components.evaluation.release.publish_evaluation)")
    metrics = {k: float(v) for k, v in published.metrics.items() if v is not None}
    bad = [k for k in metrics if not k.startswith("eval_") or k.endswith(("_people", "_records", "_tokens"))]
    if bad:
        raise VeilError(f"evaluation: refusing to log {', '.join(bad)} (eval_* rates only; counts are private)")
    publish("registry.metric", metrics, subject=run_id)
    publish("registry.tag", published.tags, subject=run_id)
    client = _client(settings)
    for key, value in metrics.items():
        client.log_metric(run_id, key, value)
    for key, value in published.tags.items():
        client.set_tag(run_id, key, value)
    return metrics


def _verified_embedded(client, mv, settings: Settings, model_uri: str) -> tuple[dict, dict]:
    """The model package's embedded (pre-audit) certificate and seal, after the whole release verified."""
    with tempfile.TemporaryDirectory() as tmp:
        package = _download_package(mv, tmp)
        v = verify_version(client, mv, trusted_keys(settings), package_dir=package)
        if not v.valid and _interrupted_audit(client, mv, package, settings, v):
            v = None    # an audit recorded halfway (killed): this one rewrites the run's side from the package
        if v is not None:
            v.raise_if_invalid(f"audit of {model_uri}")
        arts = package_artifacts(package)
        return json.loads(Path(arts["certificate"]).read_text()), json.loads(Path(arts["seal"]).read_text())


def _interrupted_audit(client, mv, package: str, settings: Settings, v) -> bool:
    """Whether a release that does not verify is one an audit left halfway (issue 28: a retraining
    killed inside `record_audit` left a run whose certificate, seal, tags and metrics disagree, and
    every later audit refused it, so it stayed unaudited). True only when the sealed package verifies
    on its own, the run's plan is the sealed one, and the run's certificate is the package's or an
    audit amendment of it: what `record_audit` then writes comes from the package alone."""
    if not v.checks.get("weights", True) or not v.checks.get("plan", True):
        return False
    alone, embedded, _ = verify_package(package_artifacts(package), trusted_keys(settings))
    if not alone.valid or embedded is None:
        return False
    try:
        run_cert = run_json(client, mv.run_id, CERT_ARTIFACT)
        if run_cert.get("sha256") != embedded["sha256"]:
            check_amendment(verify_certificate(run_cert).to_dict(), embedded)
    except VeilError:
        return False
    return True


def list_models(settings: Settings) -> list[dict]:
    """Every registered version with its certificate, newest first; `verified` only when every
    check passes (components.registry.verification), else `INVALID: <check>: <why>`."""
    client = _client(settings)
    trusted = trusted_keys(settings)
    out = []
    for rm in client.search_registered_models():
        aliases: dict[str, list[str]] = {}
        for alias, version in (rm.aliases or {}).items():
            aliases.setdefault(str(version), []).append(alias)
        for mv in client.search_model_versions(f"name='{rm.name}'"):
            v = verify_version(client, mv, trusted)
            check_alias_gates(client, mv, v, aliases=aliases.get(str(mv.version), []))
            cert = v.certificate if v.valid else None
            out.append({"name": mv.name, "version": str(mv.version), "aliases": aliases.get(str(mv.version), []),
                        "run_id": mv.run_id, "created_at_ms": mv.creation_timestamp,
                        "certificate_status": "verified" if v.valid else f"INVALID: {v.reason}",
                        "checks": v.checks, "certificate": cert})
    out.sort(key=lambda r: (r["name"], -int(r["version"])))
    return out
