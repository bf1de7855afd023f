"""LoRA adapters (peft) with target modules chosen per architecture.

Which layers get adapters, by `model_type`:

| family | targets | why |
|---|---|---|
| gpt2, gpt_bigcode | `c_attn`, `c_proj` | fused q/k/v projection + the attention and MLP output projections (GPT-2 names both `c_proj`); these are `Conv1D`, so `fan_in_fan_out` is set |
| llama, mistral, mixtral, qwen2/3, gemma/2, opt, gpt_neo, gptj, stablelm, phi | `q_proj`, `v_proj` | the LoRA paper's choice (query and value) |
| gpt_neox, falcon, bloom | `query_key_value` | fused q/k/v |
| mpt | `Wqkv`; codegen: `qkv_proj` | fused q/k/v |
| anything else, or a listed family whose modules are named differently | every `Linear`/`Conv1D` layer except the output head (`lm_head`) | always applicable; more adapter parameters |
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.core.errors import VeilError

_QV = ["q_proj", "v_proj"]
ARCH_TARGETS: dict[str, list[str]] = {
    "gpt2": ["c_attn", "c_proj"],
    "gpt_bigcode": ["c_attn", "c_proj"],
    **{t: _QV for t in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "opt", "gpt_neo",
                        "gptj", "stablelm", "phi")},
    **{t: ["query_key_value"] for t in ("gpt_neox", "falcon", "bloom")},
    "mpt": ["Wqkv"],
    "codegen": ["qkv_proj"],
}


def _adaptable(model) -> dict[str, object]:
    """Leaf name -> one module, for every Linear/Conv1D layer except the output head."""
    import torch
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found: dict[str, object] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.Linear, Conv1D)) or mod is head:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "lm_head":
            continue
        found.setdefault(leaf, mod)
    return found


def lora_target_modules(model) -> list[str]:
    """The module names LoRA adapts for this model (see the table in the module docstring)."""
    layers = _adaptable(model)
    if not layers:
        raise VeilError(f"lora: model {type(model).__name__} has no Linear layers to adapt")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    known = ARCH_TARGETS.get(model_type)
    if known and all(t in layers for t in known):
        return list(known)
    return sorted(layers)


def lora_config(r: int = 8, alpha: float = 16, dropout: float = 0.0, target_modules: list[str] | None = None, *,
                model=None):
    """A `peft.LoraConfig` for causal-LM fine-tuning.

    `target_modules=None` means "per architecture": resolved now when `model` is given, otherwise by
    `attach_lora` from the model it is attached to. peft stores target modules as a set; sort it
    for documents (`sorted(cfg.target_modules)`).
    """
    from peft import LoraConfig

    if not isinstance(r, int) or r < 1:
        raise VeilError(f"lora: r must be a positive integer, got {r!r}")
    if not alpha > 0:
        raise VeilError(f"lora: alpha must be positive, got {alpha!r}")
    if not 0.0 <= dropout < 1.0:
        raise VeilError(f"lora: dropout must be in [0, 1), got {dropout!r}")
    if target_modules is not None:
        target_modules = [str(t) for t in target_modules]
        if not target_modules:
            raise VeilError("lora: target_modules is empty; leave it out to pick them per architecture")
    elif model is not None:
        target_modules = lora_target_modules(model)
    cfg = LoraConfig(task_type="CAUSAL_LM", r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none",
                     target_modules=target_modules)
    if model is not None:
        cfg.fan_in_fan_out = _uses_conv1d(model, target_modules)
    return cfg


def _uses_conv1d(model, targets) -> bool:
    from transformers.pytorch_utils import Conv1D

    targets = set(targets)
    return any(isinstance(m, Conv1D) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in targets)


def attach_lora(model, config, *, seed: int | None = None):
    """Wrap `model` in a `PeftModel` with the adapter described by `config`.

    Fills in per-architecture targets when the config has none, sets `fan_in_fan_out` for GPT-2's
    Conv1D layers, and checks every named target exists. With `seed`, the adapter's random init (A;
    B starts at zero so the wrapped model equals the base) is reproducible without touching the
    global RNG.
    """
    import torch
    from peft import get_peft_model

    cfg = copy.deepcopy(config)
    if cfg.target_modules is None:
        cfg.target_modules = lora_target_modules(model)
    targets = sorted(cfg.target_modules) if not isinstance(cfg.target_modules, str) else None
    if targets is not None:
        have = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        missing = [t for t in targets if t not in have]
        if missing:
            raise VeilError(f"lora: target_modules {missing} not found in {type(model).__name__}; "
                            f"adaptable layers: {', '.join(sorted(_adaptable(model)))}")
        cfg.fan_in_fan_out = _uses_conv1d(model, targets)
    if seed is None:
        return get_peft_model(model, cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, cfg)


def plan_lora_config(lora: Mapping[str, Any]):
    """The `peft.LoraConfig` of a plan's `training.lora` section (targets per architecture unless named)."""
    return lora_config(r=int(lora["r"]), alpha=float(lora.get("alpha", 2 * int(lora["r"]))),
                       dropout=float(lora.get("dropout", 0.0)), target_modules=lora.get("target_modules") or None)


def count_trainable_parameters(base_dir: str | Path, lora: Mapping[str, Any] | None) -> int:
    """d: the parameters training will update — the LoRA adapter's (`lora`: a plan's `training.lora`)
    or, for full fine-tuning (`lora` None), all of the model's. A public fact of the architecture:
    the model is built from its config on the meta device, so no weight is read or allocated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(base_dir).expanduser()
    try:
        config = AutoConfig.from_pretrained(p, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a bad directory, named for the user
        raise VeilError(f"{p}: not a readable model config ({type(e).__name__}: {e})") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        if lora is None:
            return int(sum(t.numel() for t in model.parameters()))
        model = attach_lora(model, plan_lora_config(lora))
    return int(sum(t.numel() for t in model.parameters() if t.requires_grad))
