"""The model a spec trains: all parameters trainable, or a peft LoRA adapter on top (own module so
that the engine and the diagnostics that share it do not import each other)."""
from __future__ import annotations

import torch


def prepare_model(model: torch.nn.Module, spec) -> torch.nn.Module:
    """Wrap in a peft LoRA adapter when the spec asks for one (and it is not wrapped yet)."""
    if spec.lora is None:
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import PeftModel

    from components.modeling import attach_lora, lora_config

    if isinstance(model, PeftModel):
        return model
    lo = spec.lora
    # Targets per architecture (GPT-2: c_attn and c_proj) unless the plan names them.
    cfg = lora_config(r=int(lo["r"]), alpha=float(lo.get("alpha", 2 * int(lo["r"]))),
                      dropout=float(lo.get("dropout", 0.0)), target_modules=lo.get("target_modules") or None)
    return attach_lora(model, cfg, seed=int(spec.seed))
