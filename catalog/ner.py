"""Optional NER pass: person names and places/addresses, from a model already on this machine.

Nothing is downloaded and nothing is bundled. `VEIL_NER_MODEL` (or `ingest_source(ner=PATH)`) names a
local Hugging Face token-classification model directory (`config.json` with `id2label`, weights, a
tokenizer); `load_ner` loads it with `local_files_only`, on the CPU, and the tagger then runs it over
every accepted record. Without one the pass is **off** and says so (`IngestReport.ner`): names and
postal addresses are then found only by the policy's own `literal` rules.

Labels map to two secret classes: PER/PERSON → `person_name`; LOC/GPE/FAC/ADDRESS/STREET →
`location`; everything else (ORG, MISC, dates…) is ignored. A secret id is the class and the entity
text, case- and space-folded (`person_name:ann lee`). The detector is `ner.<class>`, its version the
sha256 of the model directory's files (a new model re-tags; `veil catalog retag` replaces the spans).

A plug-in is any object with `name`, `version` and `find(texts) -> [[(start, end, label, score)]]`
(code-point offsets); `Tagger(rules, ner=plugin)` takes it. spaCy pipelines are not supported in
this build (spaCy is not installed); a spaCy plug-in would wrap `nlp.pipe` the same way.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Protocol, Sequence

from components.core.errors import VeilError

ENV = "VEIL_NER_MODEL"
OFF = f"off: no NER model configured ({ENV} unset); names and postal addresses are not detected"
CLASSES = {"PER": "person_name", "PERSON": "person_name",
           "LOC": "location", "GPE": "location", "FAC": "location", "ADDRESS": "location",
           "ADDR": "location", "STREET": "location", "STREET_ADDRESS": "location"}
MIN_SCORE = 0.5


class NerPlugin(Protocol):
    name: str
    version: str

    def find(self, texts: Sequence[str]) -> list[list[tuple[int, int, str, float]]]: ...


def secret_class(label: str) -> str | None:
    """The secret class an entity label maps to (B-/I- prefixes stripped), or None."""
    lab = re.sub(r"^[BIES]-", "", str(label).upper())
    return CLASSES.get(lab)


def normalize(value: str) -> str:
    return " ".join(value.split()).casefold()


def _dir_sha256(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


class HFTokenClassifier:
    """A local transformers token-classification model (aggregation 'simple': whole entities)."""

    def __init__(self, path: Path, *, batch_size: int = 32):
        try:
            from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline
        except ImportError as e:  # pragma: no cover - transformers is a dependency
            raise VeilError(f"{ENV}: transformers is needed for an NER model ({e})") from None
        try:
            tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = AutoModelForTokenClassification.from_pretrained(str(path), local_files_only=True)
        except Exception as e:
            raise VeilError(f"{ENV}: {path} is not a token-classification model directory "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
        if not tok.is_fast:
            raise VeilError(f"{ENV}: {path}: the tokenizer must be a fast tokenizer (character offsets)")
        self._pipe = pipeline("token-classification", model=model, tokenizer=tok, device=-1,
                              aggregation_strategy="simple")
        self.batch_size = batch_size
        self.name = f"hf:{path.name}"
        self.version = "ner-" + _dir_sha256(path)[:16]

    def find(self, texts: Sequence[str]) -> list[list[tuple[int, int, str, float]]]:
        out = []
        for ents in self._pipe(list(texts), batch_size=self.batch_size):
            out.append([(int(e["start"]), int(e["end"]), str(e["entity_group"]), float(e["score"]))
                        for e in ents if e.get("start") is not None])
        return out


def load_ner(path: str | Path | None = None) -> tuple[NerPlugin | None, str]:
    """(plug-in, status line). `path` None: `VEIL_NER_MODEL`; neither: (None, OFF)."""
    raw = str(path) if path is not None else os.environ.get(ENV, "").strip()
    if not raw:
        return None, OFF
    p = Path(raw).expanduser()
    if not (p / "config.json").is_file():
        raise VeilError(f"{ENV}: {p} has no config.json: expected a local token-classification model directory "
                        "(nothing is downloaded)")
    plugin = HFTokenClassifier(p)
    return plugin, f"on: {plugin.name} ({plugin.version})"
