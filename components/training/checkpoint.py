"""Crash-safe run state: one file replaced atomically, plus a step ledger.

`checkpoint.pt` holds the trainable weights, optimizer, torch RNG, sampler position, steps taken,
losses and batch sizes — tensors and plain values only. It is loaded with
`torch.load(weights_only=True)`: whoever can write a run folder must not be able to run code on
resume, so a checkpoint holding any other pickled object is refused, and a truncated or corrupt
one is a one-line error, never a traceback. Files are written 0600 (they are private).
`progress.json` records the highest step ever started, written before the step runs, so a step
begun before a crash is never forgotten. A resumed run replays those steps with the same per-step
randomness, so they release nothing new.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import secrets
import zipfile
from pathlib import Path

import torch

from components.core.errors import VeilError

CHECKPOINT = "checkpoint.pt"
LEDGER = "progress.json"
PRIVATE_SEED = "private_seed"
# What engine.train saves; a loaded checkpoint must hold all of them.
REQUIRED_KEYS = ("step", "spec", "data", "private_seed_sha", "trainable", "optimizer", "torch_rng",
                 "losses", "batch_sizes")


def _atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600, fsync: bool = True) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.chmod(tmp, mode)  # an existing tmp file keeps its old mode under O_CREAT
    os.replace(tmp, path)


# A checkpoint is one file: this header, the sha256 of what follows (64 hex digits), a newline, then
# torch.save's bytes (issue 28: bytes garbled on disk loaded as weights, and the run was then blamed on
# "the model's trainable weights are not finite" and resumed forever). The hash travels in the file it
# covers, so it is replaced with it atomically. A checkpoint from before (torch's zip, "PK") loads unhashed.
MAGIC = b"VEILCKPT1 sha256="


class _HashingWriter:
    """A write-only file for torch.save that hashes what it writes."""

    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()

    def write(self, b) -> int:
        self.h.update(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint(out_dir: Path, state: dict) -> None:
    tmp = out_dir / (CHECKPOINT + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(MAGIC + b"0" * 64 + b"\n")
        w = _HashingWriter(f)
        torch.save(state, w)
        f.seek(len(MAGIC))
        f.write(w.h.hexdigest().encode())
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, out_dir / CHECKPOINT)


def _checked_payload(p: Path) -> io.BytesIO | Path:
    """The torch.save bytes of checkpoint `p`, their sha256 checked (a legacy checkpoint: its path)."""
    with open(p, "rb") as f:
        head = f.read(len(MAGIC) + 65)
        if not head.startswith(MAGIC):
            if head.startswith(b"PK"):
                return p        # written before checkpoints carried a hash: loaded as before
            raise VeilError(f"{p}: not a Veil checkpoint (garbled header); remove it to restart the run from step 0 "
                            "(the steps already taken stay charged: progress.json keeps them)")
        want = head[len(MAGIC):len(MAGIC) + 64].decode("ascii", "replace")
        payload = f.read()
    got = hashlib.sha256(payload).hexdigest()
    if got != want:
        raise VeilError(f"{p}: truncated or corrupt on disk (its bytes hash to sha256 {got[:12]}…, the checkpoint "
                        f"says {want[:12]}…): not loaded; "
                        "remove it to restart the run from step 0 (the steps already taken stay charged: "
                        "progress.json keeps them)")
    return io.BytesIO(payload)


def load_checkpoint(out_dir: Path) -> dict | None:
    """The run's checkpoint, or None when there is none. Only tensors and plain values load, and only
    when the bytes are the ones written (their sha256)."""
    p = Path(out_dir) / CHECKPOINT
    if not p.exists():
        return None
    src = _checked_payload(p)
    try:
        state = torch.load(src, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e).lower():
            raise VeilError(f"{p}: refused: it holds pickled objects other than tensors and plain values "
                            "(loading them could run code); remove the run folder and retrain") from None
        raise VeilError(f"{p}: unreadable checkpoint (truncated or corrupt: {_first_line(e)}); "
                        "remove it to restart the run from step 0") from None
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError, zipfile.BadZipFile) as e:
        raise VeilError(f"{p}: unreadable checkpoint (truncated or corrupt: {_first_line(e)}); "
                        "remove it to restart the run from step 0") from None
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
        raise VeilError(f"{p}: not a Veil checkpoint (missing {', '.join(missing)}); remove it to restart the run")
    return state


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]


def read_ledger(out_dir: Path) -> int:
    p = out_dir / LEDGER
    if not p.exists():
        return 0
    try:
        return int(json.loads(p.read_text())["steps_attempted"])
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        # reading 0 here would forget steps that ran and under-charge the certificate
        raise VeilError(f"{p}: unreadable step ledger; it records steps that were started and must be charged: "
                        "restore it or retrain in a fresh folder") from None


def write_ledger(out_dir: Path, steps_attempted: int) -> None:
    _atomic_write_bytes(out_dir / LEDGER, json.dumps({"steps_attempted": int(steps_attempted)}).encode(),
                        fsync=False)


def private_seed_for(out_dir: Path, resume: bool) -> int:
    """The run's secret seed: reused on resume, else fresh OS entropy, persisted (0600) before use."""
    p = out_dir / PRIVATE_SEED
    if resume and p.exists():
        return int(p.read_text().strip(), 16)
    seed = secrets.randbits(128)
    _atomic_write_bytes(p, f"{seed:032x}\n".encode(), mode=0o600)
    return seed
