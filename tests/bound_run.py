"""Test helper: the run-binding fields a train result must carry to be certified (the data file it
read, k, selection, the trained weights' fingerprint), for tests that certify hand-made results.
Import by path: `load_helper()` in the test modules that need it."""
from __future__ import annotations

import tempfile
from pathlib import Path

from components.core.fingerprints import base_fingerprints, weights_fingerprint


def binding(plan: dict, weights_dir: str | Path | None = None, base_dir: str | Path | None = None) -> dict:
    wdir = Path(weights_dir or tempfile.mkdtemp(prefix="veil-weights-"))
    wdir.mkdir(parents=True, exist_ok=True)
    if not any(wdir.iterdir()):
        (wdir / "adapter_model.safetensors").write_bytes(b"weights of " + str(plan.get("sha256")).encode())
        (wdir / "adapter_config.json").write_text("{}")
    return {"train_records_commitment": plan["data"].get("train_records_commitment"),
            "records_per_user": plan.get("records_per_user"), "extra": {"selection": plan.get("selection")},
            "adapter_dir": str(wdir), "model_dir": None, "weights": weights_fingerprint(wdir),
            **_base(base_dir),
            "device": "cpu", "precision": "float32", "world_size": 1}


def _base(base_dir) -> dict:
    if base_dir is None:
        return {"base_model": {"sha256": "b" * 64, "n_files": 3}, "tokenizer": {"sha256": "c" * 64, "files": {}}}
    base, tok = base_fingerprints(base_dir)
    return {"base_model": base, "tokenizer": tok}
