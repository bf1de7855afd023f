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

    from components.modeling import attach_lora
    from components.modeling.lora import plan_lora_config

    if isinstance(model, PeftModel):
        return model
    # Targets per architecture (GPT-2: c_attn and c_proj) unless the plan names them.
    return attach_lora(model, plan_lora_config(spec.lora), seed=int(spec.seed))
