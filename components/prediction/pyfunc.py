"""The pyfunc MLflow stores for a PMixED ensemble. Loading it needs the serving host's private area (the
adapters are not in the package) and charges the same durable token budget as `veil serve`."""
from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc


class PMixEDEnsemble(mlflow.pyfunc.PythonModel):
    """Input: a DataFrame with a `prompt` column (or a list of strings); output: sampled continuations."""

    def load_context(self, context):
        from components.core.settings import load_settings
        from components.prediction.budget import TokenBudget
        from components.prediction.release import open_ensemble, verify_certificate

        arts = context.artifacts
        self.certificate = verify_certificate(json.loads(Path(arts["certificate"]).read_text()))
        manifest = json.loads(Path(arts["manifest"]).read_text())
        self.settings = load_settings().ensure()
        self.ensemble = open_ensemble(self.settings, {"certificate": self.certificate, "manifest": manifest,
                                                      "base_dir": arts["base_model"]})
        self.budget = TokenBudget.open(self.settings)

    def predict(self, context, model_input, params=None):
        params = params or {}
        eid = self.certificate["ensemble_id"]
        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else list(model_input)
        n = int(params.get("max_tokens", 32))
        public_only = self.certificate["when_exhausted"] == "public_only"
        return [self.ensemble.generate(p, n, charge=lambda: self.budget.charge(eid, 1),
                                       public_only=False)["text"] if (public_only or self.budget.remaining(eid) > 0)
                else "" for p in prompts]
