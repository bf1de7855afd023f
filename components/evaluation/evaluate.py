"""`evaluate_texts`: token-weighted perplexity and next-token accuracy over a list of texts."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from components.core.errors import VeilError
from components.modeling.scoring import token_statistics


@dataclass(frozen=True)
class EvalResult:
    perplexity: float           # exp(mean_nll)
    next_token_accuracy: float  # share of predicted tokens that were the model's argmax
    tokens: int                 # predicted tokens (each text contributes its length - 1, BOS included)
    records: int                # texts evaluated
    mean_nll: float             # Σ -log p(x_t | x_<t) / tokens, in nats

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate_texts(model, tokenizer, texts: Sequence[str], *, max_length: int, batch_size: int = 64,
                   progress: str | None = None) -> EvalResult:
    """Evaluate `model` (a HF causal LM, or a peft model wrapping one) on `texts`.

    `max_length`: tokens per text in all, BOS included (the plan's `training.seq_len`). Texts that
    leave nothing to predict (empty after tokenization) still count as records but add no tokens;
    a list with no token to predict at all is an error, not a perplexity of 1.
    """
    return evaluate_texts_per_text(model, tokenizer, texts, max_length=max_length, batch_size=batch_size,
                                   progress=progress)[0]


def evaluate_texts_per_text(model, tokenizer, texts: Sequence[str], *, max_length: int, batch_size: int = 64,
                            progress: str | None = None) -> tuple[EvalResult, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`evaluate_texts` and its per-text statistics (Σ log p, scored tokens, argmax hits): the DP
    release (components.evaluation.dp) groups the latter by person."""
    texts = list(texts)
    if not texts:
        raise VeilError("evaluation: no texts to evaluate")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise VeilError(f"evaluation: text #{bad} is {type(texts[bad]).__name__}, not a string")
    # batches are also capped in tokens (components.modeling.scoring.MAX_BATCH_TOKENS): a large batch_size
    # is safe for long texts and big vocabularies
    sums, counts, correct = token_statistics(model, tokenizer, texts, int(max_length), int(batch_size),
                                             progress=progress)
    tokens = int(counts.sum())
    if tokens == 0:
        raise VeilError(f"evaluation: none of the {len(texts)} texts has a token to predict (empty texts?)")
    # float64 sums over every token: the order of batches cannot change the result beyond rounding.
    mean_nll = float(-sums.sum() / tokens)
    if not math.isfinite(mean_nll) or mean_nll > 700:   # exp would overflow; no working LM gets near
        raise VeilError(f"evaluation: the model's mean negative log-likelihood is {mean_nll!r} nats per token "
                        "(non-finite or absurd): its weights are broken")
    return (EvalResult(perplexity=math.exp(mean_nll), next_token_accuracy=float(correct.sum() / tokens),
                       tokens=tokens, records=len(texts), mean_nll=mean_nll), (sums, counts, correct))
