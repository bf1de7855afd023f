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

        from components.core.settings import repair_loaded_package

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
