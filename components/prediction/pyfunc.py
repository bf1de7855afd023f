"""The pyfunc MLflow stores for a PMixED ensemble, and its registration. Loading it needs the serving host's
private area (the adapters are not in the package) and charges the same durable token budget as `veil serve`."""
from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path

import mlflow
import mlflow.pyfunc

from components.core.settings import load_settings, repair_loaded_package
from components.prediction.budget import TokenBudget
from components.prediction.release import MECHANISM, SCHEMA, open_ensemble, verify_certificate
from components.publication import publish
from components.registry.mlflow_registry import _client, _experiment


class PMixEDEnsemble(mlflow.pyfunc.PythonModel):
    """Input: a DataFrame with a `prompt` column (or a list of strings); output: sampled continuations."""

    def load_context(self, context):
        arts = context.artifacts
        repair_loaded_package(arts["certificate"])  # MLflow's registered_model_meta, written with the caller's umask
        self.certificate = verify_certificate(json.loads(Path(arts["certificate"]).read_text()))
        manifest = json.loads(Path(arts["manifest"]).read_text())
        self.settings = load_settings().ensure()
        self.ensemble = open_ensemble(self.settings, {"certificate": self.certificate, "manifest": manifest,
                                                      "base_dir": arts["base_model"]})
        self.budget = TokenBudget.open(self.settings)

    def predict(self, context, model_input, params=None):
        params = params or {}
        eid = self.certificate["ensemble_id"]
        refuse = self.certificate["when_exhausted"] == "refuse"
        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else list(model_input)
        n = int(params.get("max_tokens", 32))
        out = []
        for p in prompts:
            if refuse and self.budget.remaining(eid) <= 0:
                out.append("")  # the policy refuses once the private budget is spent
                continue
            g = self.ensemble.generate(p, n, charge=self.budget.prepaid(eid, min(8, n)))
            ids = g["ids"][:g["private_tokens"]] if refuse else g["ids"]
            eos = self.ensemble.tokenizer.eos_token_id
            out.append(self.ensemble.tokenizer.decode([t for t in ids if t != eos], skip_special_tokens=True))
        return out


def register_ensemble(settings, *, name: str, certificate: Mapping, manifest: Mapping, base_dir: str | Path,
                      experiment: str = "veil-pmixed") -> dict:
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
