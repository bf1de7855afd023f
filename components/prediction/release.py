"""The PMixED ensemble's certificate, its MLflow registration, and loading it back for serving.

What is registered (public): the certificate, a manifest (mechanism parameters, base model sha256,
one *commitment* per adapter) and the public base model. What is not: the adapters. They are non-private
fine-tunes — as sensitive as their shards' raw text — and stay under VEIL_HOME/private/pmixed/<id>/.
The commitment is sha256(salt ‖ adapter sha256) with a private 32-byte salt: the operator (who holds the
salt) can prove which adapters a certificate covers, while an outsider cannot test a guessed adapter
(retrained with or without someone) against a bare hash.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.prediction import mechanism as mech
from components.publication import publish

SCHEMA = "veil.certificate.pmixed/v1"
MECHANISM = "pmixed-pointwise/v1"
SALT_FILE = "commitment.salt"


def private_root(settings) -> Path:
    d = Path(settings.private_dir) / "pmixed"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _salt(settings) -> bytes:
    from components.prediction.partition import secret_file

    return secret_file(private_root(settings) / SALT_FILE)


def commitment(settings, adapter_sha256: str) -> str:
    return hashlib.sha256(_salt(settings) + bytes.fromhex(adapter_sha256)).hexdigest()


def make_certificate(*, params: mech.MechanismParams, target: Mapping, policy_name: str, policy_sha256: str,
                     snapshot_commitment: str, base_sha256: str, commitments: Sequence[str],
                     when_exhausted: str, ledger: Mapping | None, ensemble_id: str,
                     people: Mapping | None = None) -> dict:
    """Every number recomputed here from the public parameters by `mechanism` (tests check it independently)."""
    eps = params.epsilon()
    if eps > float(target["epsilon"]) + 1e-12:
        raise VeilError(f"pmixed: ε={eps:.4f} for {params.tokens} tokens exceeds the policy's ε={target['epsilon']}")
    cert = {
        "schema": SCHEMA,
        "mechanism": MECHANISM,
        "paper": "arXiv 2403.15638 (PMixED), Theorem 5.1 NOT used: repaired bound, docs/privacy/pmixed.md",
        "threat_model": "black-box callers who see sampled tokens only; adapters never released; no "
                        "log-probabilities, top-k, λ or selection telemetry; no caller seeds (OS CSPRNG)",
        "privacy_unit": "user",
        "neighbouring": "add_remove_one_user (keyed-hash partition: one ensemble member replaced)",
        "guarantee_covers": "the transcript of all private tokens served by this ensemble, whoever asks",
        "epsilon": eps,
        "delta": float(params.delta),
        "token_budget": int(params.tokens),
        "when_exhausted": when_exhausted,
        "per_token": {"epsilon_pure": params.token_epsilon(), "orders": list(mech.ORDERS),
                      "rdp": [float(x) for x in params.token_rdp()]},
        "accountant": {"name": "pure-DP per token (pointwise mollifier, Poisson selection, replace-one-member) → "
                               "RDP min(ε, αε²/2) (Bun–Steinke 2016) → T-fold composition → Balle et al. 2020"},
        "ensemble": {"shards": int(params.shards), "subsample_rate": float(params.q), "radius": float(params.radius),
                     "temperature": float(params.temperature), "selection": "poisson (Bernoulli per member)",
                     "decoding": "ancestral sampling from the mixture; temperature per model before mixing",
                     "adapter_commitments": list(commitments), "adapters_released": False},
        "public_model": {"sha256": base_sha256, "assumed_independent_of_private_data": True},
        # the snapshot's id and sha256 are content hashes (a membership test): its salted commitment only,
        # the same one a plan of this snapshot publishes (components.draws.annex.snapshot_commitment)
        "dataset": {"snapshot_commitment": snapshot_commitment,
                    **({"people": dict(people)} if people else {})},   # policy-named exclusions only
        "policy": {"name": policy_name, "sha256": policy_sha256},
        "ledger": dict(ledger) if ledger else None,
        "ensemble_id": ensemble_id,
        "caveats": [
            "float64 arithmetic: the enforced radius is 1e-9 nats inside the accounted one; rounding of the served "
            "distribution and the 53-bit inverse-CDF draw are not formally bounded",
            "timing is constant in the selection (every member runs every token) but not a proven side-channel bound",
            "records shared by several people cross shards: protected only by group privacy",
            "the adapters are not DP: anyone who obtains one learns its shard's data",
        ],
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    cert["sha256"] = sha256_json(cert)
    return cert


def verify_certificate(cert: Mapping) -> dict:
    c = dict(cert)
    want = c.pop("sha256", None)
    if want != sha256_json(c):
        raise VeilError("pmixed certificate: its sha256 does not match its contents")
    p = mech.MechanismParams(shards=c["ensemble"]["shards"], q=c["ensemble"]["subsample_rate"],
                             radius=c["ensemble"]["radius"], tokens=c["token_budget"], delta=c["delta"])
    if abs(p.epsilon() - float(c["epsilon"])) > 1e-9:
        raise VeilError("pmixed certificate: its ε does not follow from its parameters")
    return dict(cert)


def register_ensemble(settings, *, name: str, certificate: Mapping, manifest: Mapping, base_dir: str | Path,
                      experiment: str = "veil-pmixed") -> dict:
    import mlflow

    from components.prediction.pyfunc import PMixEDEnsemble
    from components.registry.mlflow_registry import _client, _experiment

    cert = verify_certificate(certificate)
    client = _client(settings)
    exp = _experiment(settings, experiment)
    tags = {"privacy.schema": SCHEMA, "privacy.mechanism": MECHANISM, "privacy.unit": "user",
            "privacy.epsilon": repr(cert["epsilon"]), "privacy.delta": repr(cert["delta"]),
            "privacy.token_budget": str(cert["token_budget"]), "privacy.certificate_sha256": cert["sha256"],
            "privacy.threat_model": "black-box sampled tokens; adapters not released"}
    publish("pmixed.release", {"certificate": dict(cert), "manifest": dict(manifest)}, subject=cert["sha256"])
    publish("registry.tag", tags, subject=cert["sha256"])
    with tempfile.TemporaryDirectory() as tmp:
        cp, mp = Path(tmp) / "certificate.json", Path(tmp) / "manifest.json"
        cp.write_text(json.dumps(cert, indent=2, sort_keys=True))
        mp.write_text(json.dumps(dict(manifest), indent=2, sort_keys=True))
        with mlflow.start_run(experiment_id=exp, run_name=f"{name}-{cert['sha256'][:8]}") as run:
            mlflow.log_params(publish("registry.param", {
                "mechanism": MECHANISM, "shards": cert["ensemble"]["shards"],
                "subsample_rate": cert["ensemble"]["subsample_rate"], "radius": cert["ensemble"]["radius"],
                "token_budget": cert["token_budget"], "delta": cert["delta"]}, subject=cert["sha256"]))
            mlflow.log_metrics(publish("registry.metric", {"privacy_epsilon": float(cert["epsilon"])},
                                       subject=cert["sha256"]))
            mlflow.set_tags(tags)
            mlflow.log_artifact(str(cp))
            mlflow.log_artifact(str(mp))
            info = mlflow.pyfunc.log_model(name="model", python_model=PMixEDEnsemble(),
                                           artifacts={"certificate": str(cp), "manifest": str(mp),
                                                      "base_model": str(base_dir)},
                                           pip_requirements=["veil"])
            run_id = run.info.run_id
    mv = mlflow.register_model(info.model_uri, name, tags=tags)
    client.set_registered_model_alias(name, "latest-certified", mv.version)
    # MLflow copies the public base with its source's mode (shutil.copy2: typically 0644 outside VEIL_HOME);
    # the registry is private like the rest of the home (issue 28), as flows.stages.register does for models
    settings.make_private(settings.mlflow_artifacts_dir)
    return {"model_uri": f"models:/{name}/{mv.version}", "run_id": run_id, "version": str(mv.version)}


def resolve(settings, model_uri: str) -> dict:
    """model_uri → {certificate, manifest, base_dir}: what a server needs (adapters come from the private area)."""
    from components.registry.mlflow_registry import _client, _resolve_version

    client = _client(settings)
    mv = _resolve_version(client, model_uri)
    dst = Path(tempfile.mkdtemp(prefix="veil-pmixed-"))
    cert = json.loads(Path(client.download_artifacts(mv.run_id, "certificate.json", str(dst))).read_text())
    manifest = json.loads(Path(client.download_artifacts(mv.run_id, "manifest.json", str(dst))).read_text())
    if cert.get("schema") != SCHEMA:
        raise VeilError(f"{model_uri}: not a PMixED ensemble (certificate schema {cert.get('schema')!r})")
    verify_certificate(cert)
    if mv.tags.get("privacy.certificate_sha256") != cert["sha256"]:
        raise VeilError(f"{model_uri}: the run's certificate is not the one registered with this version")
    import mlflow

    pkg = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{mv.name}/{mv.version}",
                                                   dst_path=str(dst / "model")))
    import yaml

    mlmodel = yaml.safe_load((pkg / "MLmodel").read_text())
    base = pkg / mlmodel["flavors"]["python_function"]["artifacts"]["base_model"]["path"]
    if not (base / "config.json").is_file():
        raise VeilError(f"{model_uri}: the registered package has no public base model")
    return {"certificate": cert, "manifest": manifest, "base_dir": base}


def open_ensemble(settings, resolved: Mapping, device: str = "cpu"):
    """Load the adapters from the private area, checking each against the certificate's commitments."""
    from components.prediction.ensemble import Ensemble, dir_sha256

    cert, man = resolved["certificate"], resolved["manifest"]
    root = private_root(settings) / cert["ensemble_id"]
    dirs = [root / f"shard-{i:04d}" for i in range(cert["ensemble"]["shards"])]
    for d, c in zip(dirs, cert["ensemble"]["adapter_commitments"]):
        if not d.is_dir():
            raise VeilError(f"pmixed: adapter {d.name} is not in this host's private area ({root}); adapters are "
                            "never in the registry — serve from the host that built the ensemble")
        if commitment(settings, dir_sha256(d)) != c:
            raise VeilError(f"pmixed: adapter {d.name} does not match the certificate's commitment")
    e = cert["ensemble"]
    return Ensemble(resolved["base_dir"], dirs, radius=e["radius"], q=e["subsample_rate"],
                    temperature=e["temperature"], device=device)


def manifest_of(params: mech.MechanismParams, base_sha256: str) -> dict:
    return {"schema": "veil.pmixed.manifest/v1", "mechanism": MECHANISM, "params": asdict(params),
            "base_sha256": base_sha256}
