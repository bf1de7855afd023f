"""A byte-level BPE tokenizer trained locally on public text (HF `tokenizers`).

Train it on public text only: merges learnt from private text would themselves leak (a credential
seen often enough becomes a token). Byte-level BPE still encodes any private string, byte by byte.
"""
from __future__ import annotations

from collections.abc import Iterable

from components.core.errors import VeilError

BOS_EOS_TOKEN = "<|endoftext|>"  # GPT-2's convention: one token marks both ends of a document
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2,
                    model_max_length: int = 1024):
    """Train a byte-level BPE tokenizer and wrap it as a `PreTrainedTokenizerFast`.

    bos = eos = `<|endoftext|>`, pad = `<|pad|>` (a separate id, so padding never looks like a
    document boundary). The tokenizer adds no special tokens by itself (like GPT-2); callers that
    want a BOS prepend it (see `sequence_logprobs`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [t for t in texts if isinstance(t, str) and t]
    if not texts:
        raise VeilError("tokenizer: no training text (need at least one non-empty string)")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise VeilError(f"tokenizer: vocab_size must be at least {len(alphabet) + 2} (256 bytes + 2 special "
                        f"tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=[BOS_EOS_TOKEN, PAD_TOKEN], initial_alphabet=alphabet)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS_EOS_TOKEN, eos_token=BOS_EOS_TOKEN,
                                   pad_token=PAD_TOKEN, model_max_length=model_max_length, padding_side="right",
                                   clean_up_tokenization_spaces=False)
