"""Content hashes for artifacts: every stage reads a hashed artifact and writes one."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no whitespace) — the form that gets hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj))


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# Files a Hugging Face tokenizer is loaded from (fast and slow tokenizers, sentencepiece, chat
# templates). Everything else in a model directory is the model: config, weights, generation config.
_TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "tokenizer.model",
                    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")


def is_tokenizer_file(rel_path: str) -> bool:
    """Whether a file of a model directory (relative POSIX path) belongs to its tokenizer."""
    name = rel_path.rsplit("/", 1)[-1]
    return name in _TOKENIZER_NAMES or name.startswith("tokenizer.")


def sha256_dir(path: str | Path, *, include=None) -> str:
    """The canonical hash of a directory: sha256 of the sorted (relative POSIX path, file sha256) pairs.

    Names count (a renamed weight file changes the hash), timestamps and permissions do not, so the
    same files hash the same after MLflow copies them. `include(rel_path) -> bool` selects a subset
    (e.g. the tokenizer's files). A single file hashes as a directory holding only it. Caches that
    loaders write beside the files (`__pycache__`, `.ipynb_checkpoints`) are skipped.
    """
    p = Path(path)
    if p.is_file():
        entries = [[p.name, sha256_file(p)]]
    elif p.is_dir():
        entries = []
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(p).as_posix()
            if not f.is_file() or any(part in ("__pycache__", ".ipynb_checkpoints") for part in f.relative_to(p).parts):
                continue
            if include is None or include(rel):
                entries.append([rel, sha256_file(f)])
        entries.sort()
    else:
        raise FileNotFoundError(str(p))
    return sha256_json({"kind": "veil.dir/v1", "files": entries})


def model_dir_hashes(path: str | Path) -> dict[str, str]:
    """{"model": …, "tokenizer": …}: a HF model directory split into its tokenizer and everything else."""
    return {"model": sha256_dir(path, include=lambda rel: not is_tokenizer_file(rel)),
            "tokenizer": sha256_dir(path, include=is_tokenizer_file)}
