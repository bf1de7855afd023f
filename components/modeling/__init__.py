"""Base models: a locally trained tokenizer + small GPT-2-style LM, loading any local HF causal LM,
LoRA adapters whose target modules are found per architecture, and sequence log-likelihoods.

No hub access anywhere: everything is built from config or loaded with `local_files_only=True`.
"""
from components.modeling.base import BaseModelConfig, build_base_model, load_base, load_finetuned, read_base_facts
from components.modeling.lora import attach_lora, lora_config, lora_target_modules
from components.modeling.scoring import perplexity_scores, sequence_logprobs
from components.modeling.tokenizer import BOS_EOS_TOKEN, PAD_TOKEN, train_tokenizer

__all__ = [
    "BaseModelConfig",
    "build_base_model",
    "load_base",
    "load_finetuned",
    "read_base_facts",
    "lora_config",
    "attach_lora",
    "lora_target_modules",
    "sequence_logprobs",
    "perplexity_scores",
    "train_tokenizer",
    "BOS_EOS_TOKEN",
    "PAD_TOKEN",
]
