"""The demo's base model: a small GPT-2-style causal LM pretrained briefly on public text, and a
loader for any local Hugging Face causal-LM directory.

The base stands in for a public pretrained model. It must only ever see public text: the
user-inference audit uses it as the reference model and perplexity-based selection scores with
it, and both are sound only because it never saw anyone's private data.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from components.core.device import resolve_device as _resolve
from components.core.errors import VeilError
from components.core.hashing import sha256_file, sha256_json
from components.core.progress import progress as _progress
from components.core.progress import step as _step
from components.modeling.tokenizer import train_tokenizer

FACTS_FILE = "veil_base.json"
_LOAD_LOCK = threading.RLock()
FACTS_SCHEMA = "veil.base/1"


@dataclass(frozen=True)
class BaseModelConfig:
    """Size and schedule of the demo base. Defaults on the demo's public corpus (seed 0): ~0.85M
    parameters (tied embeddings, ~2.6k-token vocabulary), 200 steps of ~0.18 s single-core compute
    each, held-out loss 8.1 (uniform) -> 1.2."""

    vocab_size: int = 4096
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 256
    steps: int = 200
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    eval_frac: float = 0.03  # share of the texts held out to report an eval loss
    seed: int = 0

    def check(self) -> None:
        for name in ("vocab_size", "n_layer", "n_embd", "n_head", "n_positions", "steps", "seq_len", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise VeilError(f"base model: {name} must be a positive integer, got {v!r}")
        if self.n_embd % self.n_head:
            raise VeilError(f"base model: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.seq_len > self.n_positions:
            raise VeilError(f"base model: seq_len ({self.seq_len}) exceeds n_positions ({self.n_positions})")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise VeilError(f"base model: lr must be positive, got {self.lr}")
        if not 0 <= self.eval_frac < 0.5:
            raise VeilError(f"base model: eval_frac must be in [0, 0.5), got {self.eval_frac}")


def _token_stream(tokenizer, texts: list[str]) -> list[int]:
    """Documents joined as <eos> doc <eos> doc …, so the model learns where documents start."""
    eos = tokenizer.eos_token_id
    # The backend tokenizer directly: documents may exceed model_max_length (we cut windows later).
    ids = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    stream: list[int] = []
    for doc in ids:
        stream.append(eos)
        stream.extend(doc)
    stream.append(eos)
    return stream


def _lr_at(step: int, cfg: BaseModelConfig) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    warm = max(1, int(cfg.warmup_frac * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _eval_loss(model, blocks) -> float | None:
    import torch

    if blocks is None or len(blocks) == 0:
        return None
    model.eval()
    with torch.no_grad():
        losses = [model(input_ids=b, labels=b).loss.item() for b in torch.split(blocks, 16)]
        sizes = [len(b) for b in torch.split(blocks, 16)]
    model.train()
    return float(sum(l * s for l, s in zip(losses, sizes)) / sum(sizes))


def build_base_model(public_texts, out_dir: str | Path, *, vocab_size: int = BaseModelConfig.vocab_size,
                     n_layer: int = BaseModelConfig.n_layer, n_embd: int = BaseModelConfig.n_embd,
                     n_head: int = BaseModelConfig.n_head, n_positions: int = BaseModelConfig.n_positions,
                     steps: int = BaseModelConfig.steps, seq_len: int = BaseModelConfig.seq_len,
                     batch_size: int = BaseModelConfig.batch_size, lr: float = BaseModelConfig.lr,
                     seed: int = BaseModelConfig.seed, progress: bool = True) -> Path:
    """Train a tokenizer and a small GPT-2-style causal LM on public text; save both under `out_dir`.

    Plain PyTorch loop (AdamW, warm-up + cosine, grad-norm clip 1.0), random windows of the token
    stream, deterministic for a seed on a given machine. Writes `save_pretrained` model + tokenizer
    and `veil_base.json` (data sha256, config, loss curve, eval loss before/after, wall time).
    Returns `out_dir`.
    """
    import torch
    import tokenizers
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = BaseModelConfig(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                          n_positions=n_positions, steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr,
                          seed=seed)
    cfg.check()
    texts = [t for t in public_texts if isinstance(t, str) and t.strip()]
    if len(texts) < 2:
        raise VeilError(f"base model: need at least 2 non-empty public texts, got {len(texts)}")
    out = Path(out_dir)
    t0 = time.perf_counter()

    # Held-out tail (by a seeded permutation) for an honest "better than uniform" figure.
    perm = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = int(cfg.eval_frac * len(texts))
    eval_texts = [texts[i] for i in sorted(perm[:n_eval])]
    train_texts = [texts[i] for i in sorted(perm[n_eval:])]

    with _step(f"base model: tokenizer on {len(train_texts)} public texts", on=progress):
        tokenizer = train_tokenizer(train_texts, vocab_size=cfg.vocab_size, model_max_length=cfg.n_positions)
        stream = torch.tensor(_token_stream(tokenizer, train_texts), dtype=torch.long)
    if len(stream) <= cfg.seq_len:
        raise VeilError(f"base model: public text has {len(stream)} tokens, fewer than seq_len={cfg.seq_len}")
    eval_blocks = None
    if eval_texts:
        es = torch.tensor(_token_stream(tokenizer, eval_texts), dtype=torch.long)
        nb = min(64, len(es) // cfg.seq_len)
        eval_blocks = es[: nb * cfg.seq_len].view(nb, cfg.seq_len) if nb else None

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = GPT2LMHeadModel(config)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed + 1)
    offsets = torch.arange(cfg.seq_len)
    eval_before = _eval_loss(model, eval_blocks)

    losses: list[float] = []
    with _progress("pretraining base model", cfg.steps, on=progress) as tick:
        for step in range(cfg.steps):
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, cfg)
            starts = torch.randint(0, len(stream) - cfg.seq_len + 1, (cfg.batch_size,), generator=gen)
            batch = stream[starts[:, None] + offsets]
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.item()))
            tick(1, loss=f"{losses[-1]:.3f}")  # public corpus: its loss may be shown
    eval_after = _eval_loss(model, eval_blocks)
    seconds = time.perf_counter() - t0

    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    tail = max(1, cfg.steps // 10)
    facts = {
        "schema": FACTS_SCHEMA,
        "data_sha256": sha256_json(texts),
        "n_texts": len(texts),
        "n_train_texts": len(train_texts),
        "n_eval_texts": len(eval_texts),
        "n_train_tokens": int(len(stream)),
        "config": asdict(cfg),
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "tokenizer_sha256": sha256_file(out / "tokenizer.json"),
        "uniform_loss": math.log(len(tokenizer)),
        "initial_loss": losses[0],
        "final_loss": float(sum(losses[-tail:]) / tail),  # mean of the last 10% of steps
        "eval_loss_before": eval_before,
        "eval_loss_after": eval_after,
        "losses": [round(x, 5) for x in losses],
        "train_seconds": round(seconds, 2),
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
    }
    (out / FACTS_FILE).write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    if progress:
        print(f"base model: {cfg.steps} steps in {seconds:.1f}s, loss {facts['initial_loss']:.3f} -> "
              f"{facts['final_loss']:.3f} (uniform {facts['uniform_loss']:.3f}; held-out "
              f"{_fmt(eval_before)} -> {_fmt(eval_after)}) -> {out}", file=sys.stderr)
    return out


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def read_base_facts(path: str | Path) -> dict | None:
    """The `veil_base.json` of a base built here, or None for a base from elsewhere."""
    f = Path(path) / FACTS_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def resolve_device(device: str | None) -> str:
    """The torch device for `device` (auto/cpu/cuda/cuda:N/mps); a named device that is missing is an error."""
    return _resolve(device, where="device")


def load_base(path: str | Path, device: str = "cpu", dtype=None):
    """(model, tokenizer) from any local Hugging Face causal-LM directory; never touches the hub.

    The model comes back in eval mode, in `dtype` (default float32; training's bf16/fp16 precision
    loads the base in 16 bits directly, never a float32 copy first), on `device` ("auto": CUDA if present). A tokenizer
    without a pad token gets its eos (or unk) as pad, so batching works for every model family;
    padded positions are always masked, so the choice does not change any score.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    p = Path(path).expanduser()
    if not p.exists():
        raise VeilError(f"{p}: base model directory does not exist")
    if not p.is_dir() or not (p / "config.json").is_file():
        raise VeilError(f"{p}: not a Hugging Face model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(p, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure here is a bad directory, named for the user
        raise VeilError(f"{p}/config.json: not a readable model config ({type(e).__name__}: {e})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise VeilError(f"{p}: no usable tokenizer in the model directory ({type(e).__name__}: {e})") from None
    try:
        # transformers builds the model on the meta device under a process-wide context: two threads
        # loading at once (a study's or an ensemble's thread/Dask-thread workers) leave one on meta
        with _LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=dtype or torch.float32)
    except Exception as e:  # noqa: BLE001
        raise VeilError(f"{p}: cannot load a causal LM (model_type '{getattr(config, 'model_type', '?')}'): "
                        f"{type(e).__name__}: {e}") from None
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise VeilError(f"{p}: tokenizer has no pad, eos or unk token to pad batches with")
        tokenizer.pad_token = fallback
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    dev = resolve_device(device)
    try:
        model.to(dev)
    except (RuntimeError, AssertionError) as e:
        raise VeilError(f"device '{device}': cannot place the model there ({e})") from None
    model.eval()
    return model, tokenizer


def load_finetuned(base_dir: str | Path, *, adapter_dir: str | Path | None = None,
                   model_dir: str | Path | None = None, device: str = "cpu"):
    """(model, tokenizer) of a fine-tuned model: a fully fine-tuned directory (`model_dir`), or the
    base with a peft adapter on top (`adapter_dir`), or the base alone. Eval mode, like `load_base`."""
    if model_dir is not None:
        return load_base(model_dir, device=device)
    model, tokenizer = load_base(base_dir, device=device)
    if adapter_dir is not None:
        from peft import PeftModel

        a = Path(adapter_dir).expanduser()
        if not (a / "adapter_config.json").is_file():
            raise VeilError(f"{a}: not a peft adapter directory (no adapter_config.json)")
        with _LOAD_LOCK:
            model = PeftModel.from_pretrained(model, str(a)).eval()
    return model, tokenizer
