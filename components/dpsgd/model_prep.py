"""The model a spec trains: all parameters trainable, or a peft LoRA adapter on top (own module so
that the engine and the diagnostics that share it do not import each other)."""
from __future__ import annotations

import torch
from components.core.errors import VeilError
from components.dpsgd.precision import trainable_to_float32
from components.modeling import attach_lora
from components.modeling.lora import plan_lora_config


def prepare_model(model: torch.nn.Module, spec) -> torch.nn.Module:
    """Wrap in a peft LoRA adapter when the spec asks for one (and it is not wrapped yet); activation
    checkpointing on or off as the spec says."""
    model = _trainable(model, spec)
    set_gradient_checkpointing(model, bool(getattr(spec, "gradient_checkpointing", False)))
    return model


def _trainable(model: torch.nn.Module, spec) -> torch.nn.Module:
    if spec.lora is None:
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import PeftModel



    if not isinstance(model, PeftModel):
        # Targets per architecture (GPT-2: c_attn and c_proj) unless the plan names them.
        model = attach_lora(model, plan_lora_config(spec.lora), seed=int(spec.seed))
    trainable_to_float32(model)   # float32 adapters on a 16-bit base, whatever peft's default
    return model


def checkpointing_on(model: torch.nn.Module) -> bool:
    """True when some module of `model` recomputes its forward in the backward (HF's convention: a
    `gradient_checkpointing` attribute set on the checkpointed layers)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def set_gradient_checkpointing(model: torch.nn.Module, on: bool) -> None:
    """Turn activation checkpointing of a Hugging Face model (or the base of a peft model) on or
    off, as the spec says: the spec, not the state the model was loaded in, decides.

    On means torch's non-reentrant checkpoint around each decoder layer: the first forward keeps
    the autograd graph (so the per-record samplers' tensor hooks on layer outputs fire once, as
    without checkpointing) and only drops the saved activations, which the backward recomputes.
    The reentrant variant runs the first forward without grad and would hide every checkpointed
    layer from the samplers, so it is never used. HF's `enable_input_require_grads` hook, which
    only the reentrant variant needs, is taken off again: it calls `requires_grad_` inside the
    forward, which torch.func refuses."""

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not on:
        if checkpointing_on(base):
            off = getattr(base, "activation_checkpointing_disable", None) or base.gradient_checkpointing_disable
            off()
        return
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise VeilError(f"gradient_checkpointing: the model ({type(base).__name__}) does not support activation "
                        "checkpointing; set gradient_checkpointing: false")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):   # transformers ≥ 5.x (the old name is deprecated)
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(base, "disable_input_require_grads"):
        base.disable_input_require_grads()
    if not checkpointing_on(base):
        raise VeilError(f"gradient_checkpointing: the model ({type(base).__name__}) has no layer that checkpoints; "
                        "set gradient_checkpointing: false")
