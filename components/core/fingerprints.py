"""Content hashes of what a run used and produced, so the certificate can name them: the trained
weights (adapter or full model), the base model directory and its tokenizer.

A directory's hash is the sha256 of the canonical JSON of {relative path: sha256 of the file},
so it is independent of file order and timestamps and anyone can recompute it with `tree_sha256`.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path

from components.core.errors import VeilError
from components.core.hashing import sha256_file, sha256_json

# Files a Hugging Face tokenizer is loaded from (fast and slow, BPE and sentencepiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "*.tiktoken", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")


def file_hashes(root: str | Path, patterns: tuple[str, ...] | None = None) -> dict[str, str]:
    """{relative posix path: sha256} of the regular files under `root` (matching `patterns` by
    name when given). Symlinks are hashed by what they point to; nothing is skipped silently."""
    root = Path(root)
    if not root.is_dir():
        raise VeilError(f"{root}: not a directory (cannot hash it)")
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        if patterns is not None and not any(fnmatch.fnmatch(p.name, pat) for pat in patterns):
            continue
        out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def tree_sha256(files: dict[str, str]) -> str:
    """One hash for a {path: sha256} listing."""
    return sha256_json(files)


def directory_fingerprint(root: str | Path, patterns: tuple[str, ...] | None = None) -> dict:
    """{"sha256": tree hash, "files": {path: sha256}} of a directory (or of its matching files)."""
    files = file_hashes(root, patterns)
    return {"sha256": tree_sha256(files), "files": files}


def weights_fingerprint(weights_dir: str | Path) -> dict:
    """The trained weights: every file training saved (adapter or full model directory)."""
    return directory_fingerprint(weights_dir)


def base_fingerprints(base_dir: str | Path) -> tuple[dict, dict]:
    """(base model directory, tokenizer) fingerprints; the tokenizer is loaded from the base directory."""
    base = directory_fingerprint(base_dir)
    tok = directory_fingerprint(base_dir, TOKENIZER_FILES)
    if not tok["files"]:
        raise VeilError(f"{base_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES[:5])}, …) to hash")
    return {"sha256": base["sha256"], "n_files": len(base["files"])}, {"sha256": tok["sha256"],
                                                                        "files": tok["files"]}
