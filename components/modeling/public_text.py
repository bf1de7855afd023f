"""Public text for a base model: files the operator names, or this machine's own public text.

A base model must only ever see public text (components/modeling/base.py). `read_corpus` accepts
  * a JSONL file with a `text` field per line (the demo's public corpus),
  * a plain-text file (.txt, .md, .rst, …): paragraphs split at blank lines,
  * a directory: every such file below it, sorted (hidden files and folders skipped),
  * `system`: this machine's public text — the Python standard library's docstrings (`ast`, never
    imported), the licence texts in /usr/share/common-licenses and man pages (sections 1, 5, 8; roff
    markup stripped). Files whose name says changelog/NEWS/changes are skipped, so a base built from it
    has not seen a Debian changelog (the project's real-data studies fine-tune on those).
Deterministic: file lists are sorted.
"""
from __future__ import annotations

import ast
import gzip
import json
import re
import sys
from pathlib import Path

from components.core.errors import VeilError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
MIN_CHARS = 40   # shorter paragraphs (headings, blank-ish lines) teach the model little

_ROFF_ESC = re.compile(r"\\f[BIRP1-4]|\\f\(..|\\\(..|\\[-&e|^~ 0]|\\s[-+]?\d+|\\\*\(..|\\\*.")
_SKIP = re.compile(r"changelog|news|changes", re.IGNORECASE)


def stdlib_docstrings(root: Path, limit_files: int) -> list[str]:
    out = []
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    for p in files[:limit_files]:
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d and len(d) >= 40:
                    out.append(d)
    return out


def licences(root: Path) -> list[str]:
    out = []
    for p in sorted(root.glob("*")):
        if p.is_file() and not p.is_symlink():
            text = p.read_text(encoding="utf-8", errors="replace")
            out.extend(x.strip() for x in re.split(r"\n\s*\n", text) if len(x.strip()) >= 40)
    return out


def man_pages(root: Path, sections: tuple[str, ...], limit: int) -> list[str]:
    out = []
    for sec in sections:
        for p in sorted((root / f"man{sec}").glob("*.gz"))[:limit]:
            if p.is_symlink() or _SKIP.search(p.name):
                continue
            try:
                raw = gzip.decompress(p.read_bytes()).decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            lines = []
            for ln in raw.splitlines():
                if ln.startswith((".", "'")):
                    # macro lines: keep the words of headings and tagged paragraphs
                    m = re.match(r"^\.(SH|SS|TP|IP|B|I|BR|IR|RB)\s+(.*)$", ln)
                    if m:
                        lines.append(_ROFF_ESC.sub("", m.group(2)).replace('"', ""))
                    continue
                lines.append(_ROFF_ESC.sub("", ln).replace("\\", ""))
            text = "\n".join(lines)
            out.extend(x.strip() for x in re.split(r"\n\s*\n", text) if len(x.strip()) >= 40)
    return out


def collect(python_root: Path, licence_root: Path, man_root: Path, *, py_files: int, man_limit: int) -> dict:
    parts = {"python-docstrings": stdlib_docstrings(python_root, py_files) if python_root.is_dir() else [],
             "common-licenses": licences(licence_root) if licence_root.is_dir() else [],
             "man-pages": man_pages(man_root, ("1", "5", "8"), man_limit) if man_root.is_dir() else []}
    return parts




def system_text(*, python_root: Path | None = None, licence_root: Path = Path("/usr/share/common-licenses"),
                man_root: Path = Path("/usr/share/man"), py_files: int = 1500, man_limit: int = 400) -> list[str]:
    """This machine's public text (see the module docstring): what `bench/public_base.py` trains on."""
    root = python_root or Path(f"/usr/lib/python3.{sys.version_info.minor}")
    return [t for v in collect(root, licence_root, man_root, py_files=py_files, man_limit=man_limit).values()
            for t in v]


def _paragraphs(text: str) -> list[str]:
    return [x.strip() for x in re.split(r"\n\s*\n", text) if len(x.strip()) >= MIN_CHARS]


def _read_file(p: Path) -> list[str]:
    if p.suffix == ".jsonl":
        out = []
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                t = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError):
                raise VeilError(f"{p}:{n}: expected a JSON object with a `text` field") from None
            if isinstance(t, str) and t.strip():
                out.append(t)
        return out
    return _paragraphs(p.read_text(encoding="utf-8", errors="replace"))


def read_corpus(source: str | Path) -> list[str]:
    """The texts of a corpus named on the command line (see the module docstring)."""
    if str(source) == "system":
        texts = system_text()
    else:
        p = Path(source)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and (f.suffix in TEXT_SUFFIXES or f.suffix == ".jsonl")
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            if not files:
                raise VeilError(f"{p}: no .jsonl, .txt, .md or .rst files in this directory")
            texts = [t for f in files for t in _read_file(f)]
        elif p.is_file():
            texts = _read_file(p)
        else:
            raise VeilError(f"{p}: no such file or directory (a corpus is a JSONL/text file, a directory, or `system`)")
    if len(texts) < 2:
        raise VeilError(f"{source}: {len(texts)} usable text(s); a base model needs at least 2 (paragraphs of "
                        f"≥ {MIN_CHARS} characters, or JSONL `text` fields)")
    return texts
