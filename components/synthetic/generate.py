"""Sample a synthetic corpus from a loaded model: post-processing of the model alone.

This module takes a model, its tokenizer, public prompts and public sampling settings; it imports
nothing that reads data (no catalog, no snapshot, no plan annex — tests/synthetic checks the imports
and that swapping the private snapshot after training leaves the output byte-identical). Every
record starts at the document boundary the model was trained on (training joins records with EOS,
and Veil's tokenizer's BOS is its EOS), followed by its prompt's public text.

Determinism: the sampler is seeded per batch from (seed, prompt index, batch index), batches are a
fixed size and hold one prompt each (no padding), so one seed on one machine and library build gives
the same bytes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from components.core.errors import VeilError
from components.synthetic.prompts import UNCONDITIONAL, Prompts

BATCH_SIZE = 16
SMALL_MODEL_PARAMETERS = 50_000_000


@dataclass(frozen=True)
class Sampling:
    records: int
    seed: int = 0
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = BATCH_SIZE

    def check(self) -> None:
        if not 1 <= self.records <= 10_000_000:
            raise VeilError(f"--records {self.records}: must be between 1 and 10000000")
        if not 1 <= self.max_new_tokens <= 4096:
            raise VeilError(f"--max-new-tokens {self.max_new_tokens}: must be between 1 and 4096")
        if not (self.temperature > 0 and self.temperature <= 10):
            raise VeilError(f"--temperature {self.temperature}: must be in (0, 10]")
        if not 0 < self.top_p <= 1:
            raise VeilError(f"--top-p {self.top_p}: must be in (0, 1]")
        if not 0 <= self.seed < 2 ** 63:
            raise VeilError(f"--seed {self.seed}: must be between 0 and 2^63 - 1")
        if not 1 <= self.batch_size <= 1024:
            raise VeilError(f"batch size {self.batch_size}: must be between 1 and 1024")

    def public(self) -> dict:
        return {"records": self.records, "seed": self.seed, "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "batch_size": self.batch_size}


def _batch_seed(seed: int, prompt_index: int, batch_index: int) -> int:
    h = hashlib.sha256(f"veil.synthetic/{seed}/{prompt_index}/{batch_index}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def boundary_token(tokenizer) -> int:
    """The token a record starts after: BOS, else EOS (what training put between records)."""
    for attr in ("bos_token_id", "eos_token_id"):
        tid = getattr(tokenizer, attr, None)
        if tid is not None:
            return int(tid)
    raise VeilError("synthesize: the model's tokenizer has neither a BOS nor an EOS token to start records from")


def generate_records(model, tokenizer, sampling: Sampling, prompts: Prompts | None = None,
                     progress=None) -> list[dict]:
    """`sampling.records` records as {"index", "control_code", "text"}; `text` = prompt text + sample.

    `prompts` None: unconditional (every record continues the document boundary alone)."""
    import torch

    sampling.check()
    conditioned = prompts is not None
    prompts = prompts or UNCONDITIONAL
    start = boundary_token(tokenizer)
    eos = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = eos if pad is None else pad
    cfg = model.config
    context = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    device = next(model.parameters()).device
    model.eval()
    # One CPU thread for a small model: decoding is one short forward pass per token, where thread
    # synchronisation costs more than it saves (measured: 16 records × 64 tokens of the demo-sized
    # model, 0.9 s on one thread against 15.9 s on two on a loaded 2-core machine). Fixed, not taken
    # from the environment, so the bytes do not depend on the caller's thread settings.
    small = device.type == "cpu" and sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS
    threads = torch.get_num_threads()
    if small:
        torch.set_num_threads(1)
    try:
        return _generate(model, tokenizer, sampling, prompts, conditioned, start, eos, pad, context, device,
                         progress)
    finally:
        torch.set_num_threads(threads)


def _generate(model, tokenizer, sampling, prompts, conditioned, start, eos, pad, context, device, progress):
    import torch

    out: list[dict] = []
    for pi, (prompt, count) in enumerate(zip(prompts.prompts, prompts.allot(sampling.records))):
        ids = [start] + list(tokenizer(prompt.text, add_special_tokens=False, verbose=False)["input_ids"]
                             if prompt.text else [])
        new = sampling.max_new_tokens
        if context:
            if len(ids) >= context:
                raise VeilError(f"prompt {prompt.code!r}: {len(ids)} tokens, the model's context is {context}")
            new = min(new, context - len(ids))
        done = 0
        for bi in range(0, (count + sampling.batch_size - 1) // sampling.batch_size):
            n = min(sampling.batch_size, count - done)
            inp = torch.tensor([ids] * n, dtype=torch.long, device=device)
            torch.manual_seed(_batch_seed(sampling.seed, pi, bi))
            with torch.no_grad():
                gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=True,
                                     temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                                     max_new_tokens=new, pad_token_id=pad, eos_token_id=eos)
            for row in gen[:, len(ids):].tolist():
                if eos is not None and eos in row:
                    row = row[:row.index(eos)]   # a record ends where the model ends its document
                text = tokenizer.decode(row, skip_special_tokens=True)
                out.append({"index": len(out), "control_code": prompt.code if conditioned else None,
                            "text": prompt.text + text})
            done += n
            if progress is not None:
                progress(len(out))
    return out
