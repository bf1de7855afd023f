"""Utility of a causal LM on held-out text: perplexity and next-token accuracy.

One definition for the platform (`veil evaluate`, `veil study`, benches): every predicted token of
every text weighs the same, so perplexity = exp(Σ NLL / Σ tokens) over the whole list, not a mean of
per-text perplexities (which short texts would dominate). Tokens are scored exactly as
`components.modeling.sequence_logprobs` scores them (BOS prepended when the tokenizer has one, texts
cut at `max_length` tokens in all) — pass the plan's `training.seq_len` so the model is judged on the
windows it was trained to model. No gradients, batched by length, deterministic (argmax ties go to
the lowest id), and the model's train/eval mode is left as it was.

Those exact figures are the operator's (the terminal). What the registry gets is the DP release of
`dp` (per-person clipped metrics + Gaussian noise, charged to the evaluation people by `release`).
"""
from components.evaluation.evaluate import EvalResult, evaluate_texts, evaluate_texts_per_text

__all__ = ["EvalResult", "evaluate_texts", "evaluate_texts_per_text"]
