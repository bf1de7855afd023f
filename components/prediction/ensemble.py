"""The ensemble: one LoRA adapter per shard (non-private fine-tuning from the same public base and seed),
and the engine that serves PMixED tokens with one forward per token for every member.

Training a shard reads that shard's texts only: no validation, early stopping or model selection across
shards (a shared choice would make one shard's adapter depend on another shard's people).

Serving: base + every adapter resident (stacked, `batched_lora`); each step is ONE batched forward whose rows
are [public, member 0, …, member N−1], row k through adapter k, with one KV cache (a row per member). Running every member at every token (not only the selected ones) keeps each member's cache
current without catch-up passes and makes the work per token independent of the selection — no timing
signal about |S_t|. Only the selected members' rows enter the mixture.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from components.core.errors import VeilError
from components.modeling import attach_lora, load_base, lora_config
from components.modeling.scoring import pad_right
from components.prediction import mixing
from components.prediction.batched_lora import BatchedLoRAModel

# transformers' from_pretrained initialises on the meta device through process-global state: two threads
# loading at once (a threaded Prefect/Dask runner) break each other. Loading is serialized; training is not.
_LOAD_LOCK = threading.Lock()  # peft's name for "no adapter" in a mixed batch


def dir_sha256(path: str | Path) -> str:
    """sha256 over the adapter directory's files (names and bytes, sorted): what the registry records."""
    h = hashlib.sha256()
    root = Path(path)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class ShardTraining:
    epochs: int = 3
    learning_rate: float = 5e-3
    seq_len: int = 64
    batch_size: int = 8
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    seed: int = 0


def train_shard(base_dir: str | Path, texts: Sequence[str], cfg: ShardTraining, out_dir: str | Path, *,
                device: str = "cpu") -> dict:
    """Fine-tune one adapter on one shard's texts (plain AdamW, fixed seed); save it; return its facts.

    An empty shard still yields an adapter (B = 0: the member equals the public base) because N is public
    and fixed."""
    import torch

    if cfg.lora_dropout:
        raise VeilError("pmixed: LoRA dropout must be 0 (it would draw from the RNG concurrent shards share)")
    with _LOAD_LOCK:
        model, tok = load_base(base_dir, device=device)
        model = attach_lora(model, lora_config(r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout,
                                               model=model), seed=cfg.seed)
    bos = [] if tok.bos_token_id is None else [int(tok.bos_token_id)]
    eos = [] if tok.eos_token_id is None else [int(tok.eos_token_id)]
    seqs = [(bos + list(ids) + eos)[:cfg.seq_len] for ids in
            (tok(list(texts), add_special_tokens=False)["input_ids"] if len(texts) else [])]
    seqs = [s for s in seqs if len(s) >= 2]
    g = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.01)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    steps, loss_sum = 0, 0.0
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for _ in range(cfg.epochs if seqs else 0):
            order = torch.randperm(len(seqs), generator=g).tolist()
            for b in range(0, len(order), cfg.batch_size):
                batch = [seqs[i] for i in order[b:b + cfg.batch_size]]
                ids, mask = pad_right(batch, pad)
                labels = ids.masked_fill(mask == 0, -100)
                ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
                loss_sum += float(loss.detach())
    model.eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    # The adapter's facts stay private with it (loss is a statistic of the shard's data).
    facts = {"records": len(seqs), "steps": steps, "mean_loss": (loss_sum / steps) if steps else None}
    (out / "veil_shard.json").write_text(json.dumps(facts, sort_keys=True))
    return {**facts, "sha256": dir_sha256(out)}


def prompt_char_bound(tokenizer, max_positions: int) -> int:
    """The longest prompt, in characters, that could still fit in `max_positions − 1` tokens: (max_positions − 1) × L,
    L the longest vocabulary entry (added tokens included), in characters of its token string.

    Why it is safe (never refuses a prompt that fits): every token covers at most L characters of the prompt. For a
    byte-level BPE (GPT-2 and its kin) a token string has one character per byte it covers and a byte decodes to at
    most one character; for SentencePiece-style vocabularies the token string is the text it covers ('▁' for a
    space); byte-fallback pieces ('<0xE2>') are longer than the one byte they cover. So a prompt longer than the
    bound needs more tokens than the model has positions. (A tokenizer whose normaliser deletes characters could
    fit a longer prompt; such a prompt is refused, which costs the caller nothing private.)"""
    vocab = tokenizer.get_vocab()
    added = getattr(tokenizer, "get_added_vocab", lambda: {})()
    longest = max([len(t) for t in vocab] + [len(t) for t in added] + [1])
    return max(1, int(max_positions) - 1) * longest


class Ensemble:
    """Base + N adapters, resident; `generate` serves PMixED tokens."""

    def __init__(self, base_dir: str | Path, adapter_dirs: Sequence[str | Path], *, radius: float, q: float,
                 temperature: float = 1.0, device: str = "cpu", expected_sha256: Sequence[str] | None = None):
        if expected_sha256 is not None:
            for d, want in zip(adapter_dirs, expected_sha256):
                if dir_sha256(d) != want:
                    raise VeilError(f"pmixed: adapter {Path(d).name} does not match the registered sha256")
        base, self.tokenizer = load_base(base_dir, device=device)
        self.n = len(adapter_dirs)
        if self.n < 1:
            raise VeilError("pmixed: an ensemble needs at least one adapter")
        self.model = BatchedLoRAModel(base.eval(), adapter_dirs)
        self.radius, self.q, self.temperature, self.device = float(radius), float(q), float(temperature), device
        self.rows = list(range(self.n + 1))  # batch row k runs stacked adapter k (0: none, the public model)
        self.max_positions = int(getattr(base.config, "n_positions", None)
                                 or getattr(base.config, "max_position_embeddings", 1024))
        self._lock = threading.Lock()  # one generation at a time on this process's model
        self.max_prompt_chars = prompt_char_bound(self.tokenizer, self.max_positions)

    def check_prompt(self, prompt: str) -> None:
        """Refuse, before any tokenising, a prompt that cannot fit the model's positions (issue 28: a 20 MB prompt
        was tokenised in full, > 120 s and +0.5 GB) or that is not valid Unicode (a lone surrogate: the tokenizer's
        own error was an HTTP 500)."""
        if len(prompt) > self.max_prompt_chars:
            raise VeilError(f"prompt: {len(prompt)} characters; at most {self.max_prompt_chars} can fit the model's "
                            f"{self.max_positions - 1} prompt tokens")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise VeilError(f"prompt: not valid Unicode (a lone surrogate at character {e.start})") from None

    def encode(self, prompt: str) -> list[int]:
        bos = [] if self.tokenizer.bos_token_id is None else [int(self.tokenizer.bos_token_id)]
        # verbose=False: a prompt past the model's positions is refused by `generate` in Veil's own words
        ids = bos + list(self.tokenizer(prompt, add_special_tokens=False, verbose=False)["input_ids"])
        if not ids and self.tokenizer.eos_token_id is not None:
            # an empty prompt (an unconditional synthetic record) with a tokenizer that has no BOS: start after
            # the EOS that ends a document, not from zero tokens (a forward needs one)
            ids = [int(self.tokenizer.eos_token_id)]
        return ids

    def _forward(self, ids, cache, rows: Sequence[int]):
        out = self.model.forward(ids, cache, rows)
        return out.logits[:, -1, :].double().cpu().numpy(), out.past_key_values

    def generate(self, prompt: str, max_tokens: int, *, charge: Callable[[], bool],
                 public_only: bool = False, rng=None, stop_when_refused: bool = False) -> dict:
        """Up to `max_tokens` tokens. Before each private token `charge()` must durably count it and return
        True; when it returns False the rest is public-only (p₀) — or, with `stop_when_refused` (a synthetic
        corpus: no public-only tail inside a private record), generation stops there, keeping the tokens
        drawn so far — or generation stops if `charge` raised.

        Returns {"ids", "text", "private_tokens", "public_tokens", "refused"}; nothing about λ, S or
        probabilities. `refused`: whether `charge()` said no."""
        import torch

        self.check_prompt(prompt)
        ids = self.encode(prompt)
        room = self.max_positions - len(ids)
        if room <= 0:
            raise VeilError(f"prompt: {len(ids)} tokens, the model takes at most {self.max_positions - 1}")
        max_tokens = min(int(max_tokens), room)
        eos = self.tokenizer.eos_token_id
        out: list[int] = []
        private = public = 0
        refused = False
        with self._lock:
            rows = [0] if public_only else self.rows
            x = torch.tensor([ids] * len(rows), dtype=torch.long, device=self.device)
            logits, cache = self._forward(x, None, rows)
            for _ in range(max_tokens):
                lp0 = mixing.log_softmax64(logits[0], self.temperature)
                use_private = not public_only and charge()  # durable charge BEFORE anything is drawn
                if not use_private and not public_only:
                    refused = True
                    if stop_when_refused:
                        break
                if use_private:
                    sel = mixing.poisson_select(self.n, self.q, rng)
                    lps = [mixing.log_softmax64(logits[1 + i], self.temperature) for i in sel]
                    logp, _ = mixing.mixture_log(lps, lp0, self.radius)
                    private += 1
                else:
                    logp = lp0
                    public += 1
                tok = mixing.sample_token(logp, rng)
                out.append(tok)
                if eos is not None and tok == eos:
                    break
                if len(out) == max_tokens:
                    break
                if not use_private and not public_only:
                    public_only = True  # budget spent: keep going on the public row alone
                    cache = _keep_first_row(cache)
                    rows = [0]
                x = torch.tensor([[tok]] * len(rows), dtype=torch.long, device=self.device)
                logits, cache = self._forward(x, cache, rows)
        text = self.tokenizer.decode([t for t in out if t != eos], skip_special_tokens=True)
        return {"ids": out, "text": text, "private_tokens": private, "public_tokens": public, "refused": refused}


def _keep_first_row(cache):
    """Drop every member's row from the KV cache, keeping the public model's."""
    if hasattr(cache, "batch_select_indices"):
        import torch

        cache.batch_select_indices(torch.tensor([0]))
        return cache
    return tuple(tuple(t[:1] for t in layer) for layer in cache)
