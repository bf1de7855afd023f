"""Public control codes for conditioned synthetic generation: a small YAML the operator declares public.

    schema: veil.synthetic-prompts/v1
    prompts:
      - code: fix          # [a-z0-9_-], unique; names the records it conditions
        text: "  * Fix"    # the public prefix the model continues (may be empty: unconditional)
        weight: 2          # optional, default 1: the share of records this code gets

Nothing in this file may come from the private snapshot: it is published whole on the corpus'
certificate (`generation.prompts`), so what it says is what anyone reads. Bad input is one line naming
the file and the entry (a VeilError: exit 2 at the CLI).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.errors import VeilError
from components.core.hashing import sha256_json

SCHEMA = "veil.synthetic-prompts/v1"
CODE_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_PROMPTS = 1000
MAX_TEXT = 2000


@dataclass(frozen=True)
class Prompt:
    code: str
    text: str
    weight: float = 1.0


@dataclass(frozen=True)
class Prompts:
    prompts: tuple[Prompt, ...]

    @property
    def sha256(self) -> str:
        """The canonical content's hash (whitespace and comments in the file do not move it)."""
        return sha256_json(self.public())

    def public(self) -> dict:
        return {"schema": SCHEMA, "prompts": [{"code": p.code, "text": p.text, "weight": p.weight}
                                              for p in self.prompts]}

    def allot(self, records: int) -> list[int]:
        """Records per prompt, in file order: ⌊N·w/W⌋ plus one for the largest remainders (ties: file
        order). A function of N and the public weights only."""
        total = sum(p.weight for p in self.prompts)
        raw = [records * p.weight / total for p in self.prompts]
        out = [int(math.floor(r)) for r in raw]
        left = records - sum(out)
        order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
        for i in order[:left]:
            out[i] += 1
        return out


UNCONDITIONAL = Prompts((Prompt(code="", text="", weight=1.0),))


def parse_prompts(doc: Any, where: str) -> Prompts:
    if not isinstance(doc, dict):
        raise VeilError(f"{where}: expected a mapping with a 'prompts' list")
    unknown = sorted(set(doc) - {"schema", "prompts"})
    if unknown:
        raise VeilError(f"{where}: unknown key {unknown[0]!r} (allowed: schema, prompts)")
    if doc.get("schema", SCHEMA) != SCHEMA:
        raise VeilError(f"{where}: schema: {doc.get('schema')!r} is not {SCHEMA}")
    items = doc.get("prompts")
    if not isinstance(items, list) or not items:
        raise VeilError(f"{where}: prompts: must be a non-empty list")
    if len(items) > MAX_PROMPTS:
        raise VeilError(f"{where}: prompts: {len(items)} entries, at most {MAX_PROMPTS}")
    out, seen = [], set()
    for i, item in enumerate(items):
        at = f"{where}: prompts[{i}]"
        if not isinstance(item, dict):
            raise VeilError(f"{at}: expected a mapping with code, text and optional weight")
        extra = sorted(set(item) - {"code", "text", "weight"})
        if extra:
            raise VeilError(f"{at}: unknown key {extra[0]!r} (allowed: code, text, weight)")
        code, text, weight = item.get("code"), item.get("text", ""), item.get("weight", 1)
        if not isinstance(code, str) or not CODE_RE.match(code):
            raise VeilError(f"{at}.code: {code!r} must match {CODE_RE.pattern}")
        if code in seen:
            raise VeilError(f"{at}.code: {code!r} appears twice")
        seen.add(code)
        if not isinstance(text, str):
            raise VeilError(f"{at}.text: must be a string")
        if len(text) > MAX_TEXT:
            raise VeilError(f"{at}.text: {len(text)} characters, at most {MAX_TEXT}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
                or weight <= 0:
            raise VeilError(f"{at}.weight: {weight!r} must be a positive number")
        out.append(Prompt(code=code, text=text, weight=float(weight)))
    return Prompts(tuple(out))


def load_prompts(path: str | Path) -> Prompts:
    """Read and validate a public prompts YAML file (one line naming what is wrong, else the prompts)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise VeilError(f"--prompts {p}: no such file")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise VeilError(f"{p}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise VeilError(f"{p}: not valid YAML{where}") from None
    return parse_prompts(doc, str(p))
