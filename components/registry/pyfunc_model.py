"""The pyfunc wrapper MLflow stores: a causal LM (base + optional LoRA adapter) that generates text.

MLflow's transformers flavor reaches for the hub, so Veil ships its own small pyfunc.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc


class VeilCausalLM(mlflow.pyfunc.PythonModel):
    """Input: a DataFrame with a `prompt` column (or a list of strings); output: continuations."""

    def load_context(self, context):
        from components.certificate import verify_certificate
        from components.modeling import load_base

        arts = context.artifacts
        self.certificate = verify_certificate(json.loads(Path(arts["certificate"]).read_text())).to_dict()
        # The public plan only (register_model refuses one with annex fields); the annex never ships.
        self.plan = json.loads(Path(arts["plan"]).read_text())
        model, self.tokenizer = load_base(arts["base_model"])
        adapter = arts.get("adapter")
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
        self.model = model.eval()

    def predict(self, context, model_input, params=None):
        import torch

        params = params or {}
        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else list(model_input)
        out = []
        for prompt in prompts:
            enc = self.tokenizer(prompt, return_tensors="pt")
            with torch.no_grad():
                ids = self.model.generate(**enc, max_new_tokens=int(params.get("max_new_tokens", 32)),
                                          do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
            out.append(self.tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
        return out
