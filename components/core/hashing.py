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


# Files a Hugging Face tokenizer is loaded from (fast and slow, BPE and sentencepiece, chat
# templates), matched by file name. Everything else in a model directory is the model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "*.tiktoken", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")


def is_tokenizer_file(rel_path: str) -> bool:
    """Whether a file of a model directory (relative POSIX path) belongs to its tokenizer."""
    import fnmatch

    name = rel_path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, pat) for pat in TOKENIZER_FILES)


def file_hashes(path: str | Path, *, include=None) -> dict[str, str]:
    """{relative POSIX path: sha256} of the regular files under `path` (symlinks hashed by target),
    optionally only those `include(rel_path)` accepts. A single file lists just itself."""
    p = Path(path)
    if p.is_file():
        return {p.name: sha256_file(p)}
    if not p.is_dir():
        raise FileNotFoundError(str(p))
    out = {}
    for f in sorted(p.rglob("*")):
        rel = f.relative_to(p).as_posix()
        if f.is_file() and (include is None or include(rel)):
            out[rel] = sha256_file(f)
    return out


def sha256_dir(path: str | Path, *, include=None) -> str:
    """The canonical hash of a directory: sha256 of the canonical JSON of {relative path: file sha256}.

    Names count (a renamed weight file changes the hash), timestamps, permissions and listing order
    do not, so the same files hash the same after MLflow copies them, and anyone can recompute it.
    The one directory hash of the project: seals, certificates' run section and training use it.
    """
    return sha256_json(file_hashes(path, include=include))


def not_cache(rel_path: str) -> bool:
    """Skip interpreter caches (`__pycache__`), which Python rewrites beside code it imports."""
    return "__pycache__" not in rel_path.split("/")


def model_dir_hashes(path: str | Path) -> dict[str, str]:
    """{"model": the whole HF model directory, "tokenizer": its tokenizer files only}."""
    return {"model": sha256_dir(path), "tokenizer": sha256_dir(path, include=is_tokenizer_file)}
