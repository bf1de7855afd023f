"""The pyfunc wrapper MLflow stores: a causal LM (base + optional LoRA adapter) that generates text.

MLflow's transformers flavor reaches for the hub, so Veil ships its own small pyfunc. It verifies
the release before it loads a single weight (components.registry.verification): a plain
`mlflow.pyfunc.load_model("models:/…")` refuses a tampered model with one line.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlflow.pyfunc
from components.core.quiet import quiet_third_party
from components.core.settings import repair_loaded_package
from components.modeling import load_finetuned
from components.registry.verification import verify_loaded_package


class VeilCausalLM(mlflow.pyfunc.PythonModel):
    """Input: a DataFrame with a `prompt` column (or a list of strings); output: continuations.

    `predict` takes several input shapes, so it has no type hint for MLflow to validate against. MLflow
    checks for one when the class is created — when a consumer's plain `mlflow.pyfunc.load_model`
    imports this module, before any Veil code runs — and prints "Add type hints to the `predict`
    method" in raw ANSI colour. `_skip_type_hint_validation` (what MLflow's own multi-shape models
    set) skips that check and nothing else. A type hint is no way out: MLflow caches it on the
    instance, so it would be pickled with the model, and the package's pickle check refuses any
    import outside Veil's allow-list (pandas.DataFrame for a DataFrame hint).

    Artifacts: `certificate` + `seal` (the pre-audit certificate and its signature), `plan` (public),
    `base_model` (HF directory, tokenizer included) and either `adapter` (peft layout:
    `adapter_config.json` + `adapter_model.safetensors`) or `model` (a fully fine-tuned HF directory).
    """

    _skip_type_hint_validation = True

    def load_context(self, context):
        import sys

        # A consumer's plain `mlflow.pyfunc.load_model` enters Veil here: no library notices or progress
        # bars on their screen either (Prefect is configured only when the process already uses it).
        quiet_third_party(prefect="prefect" in sys.modules)

        arts = context.artifacts
        repair_loaded_package(arts["plan"])  # MLflow's registered_model_meta, written with the caller's umask
        verification, embedded, registered = verify_loaded_package(arts)
        verification.raise_if_invalid("model")
        # Registered = the audited amendment when the registry was consulted; it differs from the
        # embedded one only by its audit section (checked: embedded_matches_registered).
        self.certificate = registered or embedded
        self.embedded_certificate = embedded
        self.verification = verification.to_dict()
        # The public plan only (register_model refuses one with annex fields); the annex never ships.

        self.plan = json.loads(Path(arts["plan"]).read_text())
        model, self.tokenizer = load_finetuned(arts["base_model"], adapter_dir=arts.get("adapter") or None,
                                               model_dir=arts.get("model") or None)
        self.model = model.eval()
        # Where the public base lives inside the package: `load_model(..., with_base=True)` reads it
        # to compare the fine-tuned model with what it started from (`veil evaluate`).
        self.base_model_dir = arts["base_model"]

    def predict(self, context, model_input, params=None):
        import torch

        params = params or {}
        if hasattr(model_input, "columns"):
            prompts = list(model_input["prompt"])
        elif isinstance(model_input, dict):
            prompts = list(model_input["prompt"]) if not isinstance(model_input["prompt"], str) else [model_input["prompt"]]
        else:
            prompts = list(model_input)
        cfg = self.model.config
        context_len = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
        out = []
        for prompt in prompts:
            enc = self.tokenizer(prompt, return_tensors="pt", verbose=False)  # cut to the model's positions below
            new = int(params.get("max_new_tokens", 32))
            if context_len:
                # Stay inside the model's positions: keep the prompt's end and shorten the continuation.
                new = max(1, min(new, context_len // 2))
                keep = context_len - new
                enc = {k: v[:, -keep:] for k, v in enc.items()}
            with torch.no_grad():
                ids = self.model.generate(**enc, max_new_tokens=new,
                                          do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
            out.append(self.tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
        return out
