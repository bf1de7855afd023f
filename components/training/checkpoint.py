"""Crash-safe run state: one file replaced atomically, plus a step ledger.

`checkpoint.pt` holds the trainable weights, optimizer, torch RNG, sampler position, steps taken,
losses and batch sizes. `progress.json` records the highest step ever started, written before the
step runs, so a step begun before a crash is never forgotten. A resumed run replays those steps
with the same per-step randomness, so they release nothing new.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import torch

CHECKPOINT = "checkpoint.pt"
LEDGER = "progress.json"
PRIVATE_SEED = "private_seed"


def _atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(out_dir: Path, state: dict) -> None:
    tmp = out_dir / (CHECKPOINT + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_dir / CHECKPOINT)


def load_checkpoint(out_dir: Path) -> dict | None:
    p = out_dir / CHECKPOINT
    if not p.exists():
        return None
    return torch.load(p, map_location="cpu", weights_only=False)


def read_ledger(out_dir: Path) -> int:
    p = out_dir / LEDGER
    if not p.exists():
        return 0
    try:
        return int(json.loads(p.read_text())["steps_attempted"])
    except (ValueError, KeyError, json.JSONDecodeError):
        return 0


def write_ledger(out_dir: Path, steps_attempted: int) -> None:
    p = out_dir / LEDGER
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"steps_attempted": int(steps_attempted)}))
    os.replace(tmp, p)


def private_seed_for(out_dir: Path, resume: bool) -> int:
    """The run's secret seed: reused on resume, else fresh OS entropy, persisted (0600) before use."""
    p = out_dir / PRIVATE_SEED
    if resume and p.exists():
        return int(p.read_text().strip(), 16)
    seed = secrets.randbits(128)
    _atomic_write_bytes(p, f"{seed:032x}\n".encode(), mode=0o600)
    return seed
