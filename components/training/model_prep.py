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

    from components.training.precision import trainable_to_float32

    if not isinstance(model, PeftModel):
        # Targets per architecture (GPT-2: c_attn and c_proj) unless the plan names them.
        model = attach_lora(model, plan_lora_config(spec.lora), seed=int(spec.seed))
    trainable_to_float32(model)   # float32 adapters on a 16-bit base, whatever peft's default
    return model
