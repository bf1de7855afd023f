"""A tiny GPT-2 + byte-level BPE tokenizer built from config (no hub), and a plain fine-tune loop."""
from __future__ import annotations

import numpy as np

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu red green blue amber silver "
         "north south east west river stone cloud field").split()


def filler(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(len(WORDS), size=n))


def build_tokenizer(extra_texts=()):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = np.random.default_rng(0)
    corpus = [filler(rng, 30) for _ in range(200)] + list(extra_texts)
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def build_model(tokenizer, seed: int = 0):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=96, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return GPT2LMHeadModel(cfg).eval()


def with_lora(model):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["c_attn", "c_fc"],
                     fan_in_fan_out=True)
    return get_peft_model(model, cfg)


def finetune(model, tokenizer, texts, *, steps: int = 40, lr: float = 1e-2, seq_len: int = 64):
    """Plain full-batch Adam steps on the trainable parameters (enough to memorise a few texts)."""
    import torch

    bos = [tokenizer.bos_token_id]
    seqs = [(bos + tokenizer(t, add_special_tokens=False)["input_ids"])[:seq_len] for t in texts]
    width = max(map(len, seqs))
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
    return model.eval()
