"""Which accelerator trains: `VEIL_DEVICE` / `device` in veil.toml.

`auto` takes CUDA, then Apple's MPS, then the CPU. A device that is named explicitly must exist:
training on the CPU when the operator asked for a GPU (hours instead of minutes, and a certificate
that says `cpu` where they expected `cuda`) is an error, not a fallback.
"""
from __future__ import annotations

import os
import re

from components.core.errors import VeilError

_FORM = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
VALID = "auto, cpu, cuda, cuda:N or mps"


def check_device(value: str, where: str = "VEIL_DEVICE") -> str:
    """The setting's value, normalised; an unknown one is refused (a typo must not mean `auto`)."""
    v = str(value).strip().lower()
    if not _FORM.match(v):
        raise VeilError(f"{where}={value!r}: not a device; use {VALID}")
    return v


def resolve_device(value: str | None, where: str = "VEIL_DEVICE") -> str:
    """The torch device string to train on; raises VeilError when the named device is missing.

    Under torchrun (LOCAL_RANK set) `auto`/`cuda` mean this rank's GPU."""
    import torch

    v = check_device(value or "auto", where)
    local_rank = os.environ.get("LOCAL_RANK")
    if v == "auto":
        if torch.cuda.is_available():
            v = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        else:
            return "cpu"
    if v == "cpu":
        return v
    if v == "mps":
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise VeilError(f"{where}=mps: no Apple MPS device on this machine")
        return v
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise VeilError(f"{where}={value}: no CUDA device on this machine ({why}); set {where}=cpu to train on the CPU")
    if v == "cuda":
        return f"cuda:{int(local_rank)}" if local_rank is not None and int(local_rank) < n else "cuda"
    index = int(v.split(":")[1])
    if index >= n:
        raise VeilError(f"{where}={value}: this machine has {n} CUDA device(s) (cuda:0…cuda:{n - 1})")
    return v
