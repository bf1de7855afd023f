"""The publication gate: the one door between Veil's private area and everyone else.

Every value Veil publishes (a plan, a certificate, a seal, a registry tag, param, metric or artifact,
the audit's public section, evaluation, study and selection outputs, the `--json` of `veil models`,
`verify` and `ledger`, a PMixED response, what reaches Prefect) passes `publish(channel, doc)`. Each
leaf of `doc` must match a declaration of that channel (`components.publication.fields`), which says
what kind of value it is:

  PUBLIC     public by construction: a policy value, a constant, a hash of public inputs, or a
             function of the relation's public part only;
  DP         DP-released: its mechanism, its sensitivity, whom it counts and the ledger charge each
             of them gets (or a post-processing of such a release, naming it);
  UNCOVERED  published without a DP guarantee, with its coarsening rule and the test showing one
             person moves it with probability ≤ 10 %.

An undeclared leaf is refused at run time: a feature cannot decide for itself what it publishes.
`recording()` hands the neighbour harness (tests/privacy/neighbours) every value that went out, with
its declaration, so a scenario run on D and on D without one person can be diffed field by field.

Paths: dict keys joined by '.', list items transparent (a list's items share the list's path).
Patterns: '*' matches one segment (or part of one: 'eval_*'), '**' any number of segments.
"""
from __future__ import annotations

import contextlib
import enum
import fnmatch
import itertools
import math
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.core.errors import VeilError


class Kind(str, enum.Enum):
    PUBLIC = "public by construction"
    DP = "DP-released"
    UNCOVERED = "published uncovered"


@dataclass(frozen=True)
class Channel:
    """Where published values go and who reads them."""
    name: str
    readers: str


@dataclass(frozen=True)
class Field:
    """One declared published field (or subtree, with '**')."""
    channel: str
    pattern: str
    kind: Kind
    what: str
    # PUBLIC only under one neighbouring relation (e.g. N under replace-one): a person-removal may move it,
    # and a release publishing it claims that relation, not add/remove (the harness checks both)
    relation: str = ""
    # PUBLIC and computationally hiding: a salted commitment or a keyed hash (the salt and the key stay in
    # the private area); it moves with the data yet reveals nothing without them (PRF assumption)
    hiding: bool = False
    # PUBLIC: a hash of the document it is in (its own sha256, a signature over it), or of another document
    # published in full on its own channel (a plan's sha256 quoted elsewhere): it moves exactly when a leaf
    # of that document moves, and says nothing those leaves (declared and checked there) do not
    digest: bool = False
    # DP: the release and its price, or the release it post-processes
    mechanism: str = ""
    sensitivity: str = ""
    counts: str = ""
    charge: str = ""
    post_processing_of: str = ""
    # UNCOVERED: how it is coarsened, and the test that bounds one person's influence
    coarsening: str = ""
    test: str = ""

    def __post_init__(self):
        if self.kind is Kind.DP and not (self.post_processing_of or (self.mechanism and self.sensitivity
                                                                      and self.counts and self.charge)):
            raise ValueError(f"{self.channel}:{self.pattern}: a DP field names its mechanism, sensitivity, "
                             "whom it counts and their charge (or the release it post-processes)")
        if self.kind is Kind.UNCOVERED and not (self.coarsening and self.test):
            raise ValueError(f"{self.channel}:{self.pattern}: an uncovered field names its coarsening and its test")

    def matches(self, path: str) -> bool:
        return _match(self.pattern.split("."), path.split(".")) if path else self.pattern in ("", "**")


def _match(pat: list[str], segs: list[str]) -> bool:
    if not pat:
        return not segs
    if pat[0] == "**":
        return any(_match(pat[1:], segs[i:]) for i in range(len(segs) + 1))
    return bool(segs) and fnmatch.fnmatchcase(segs[0], pat[0]) and _match(pat[1:], segs[1:])


@dataclass(frozen=True)
class Published:
    """One leaf that went out: its channel, its path, its value and the declaration that let it."""
    channel: str
    subject: str
    path: str
    value: Any
    field: Field = field(compare=False)
    call: int = 0          # which publish() call let it out (one document per call)


_CHANNELS: dict[str, Channel] = {}
_FIELDS: dict[str, list[Field]] = {}
_local = threading.local()
_recorders: list[list[Published]] = []
_lock = threading.Lock()
_calls = itertools.count(1)


_MIRRORS: dict[str, list[tuple[str, str]]] = {}


def mirror(name: str, prefix: str, source: str) -> None:
    """Leaves of `name` under `prefix` are declared as `source` declares them (a certificate's audit
    section is the audit's public section; `veil models --json` carries certificates)."""
    _MIRRORS.setdefault(name, []).append((prefix, source))


def channel(name: str, readers: str) -> None:
    _CHANNELS[name] = Channel(name, readers)
    _FIELDS.setdefault(name, [])


def declare(*fields: Field) -> None:
    for f in fields:
        if f.channel not in _CHANNELS:
            raise ValueError(f"publication: unknown channel {f.channel!r}")
        _FIELDS[f.channel].append(f)


def channels() -> dict[str, Channel]:
    _load()
    return dict(_CHANNELS)


def declared(name: str | None = None) -> list[Field]:
    _load()
    if name is None:
        return [f for fs in _FIELDS.values() for f in fs]
    return list(_FIELDS.get(name, ()))


def _load() -> None:
    # The declarations (components.publication.fields) register themselves when the package is
    # imported (components/publication/__init__.py), which any import of this module does first:
    # the gate itself never imports them, so the two modules form no circle.
    if not _FIELDS:
        raise RuntimeError("publication: no declarations registered (import components.publication)")


def leaves(doc: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf; list items share their list's path, an empty dict/list is a leaf."""
    if isinstance(doc, Mapping):
        if not doc:
            yield prefix, {}
        for k, v in doc.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(doc, (list, tuple)):
        if not doc:
            yield prefix, []
        for v in doc:
            yield from leaves(v, prefix)
    else:
        yield prefix, doc


def _specificity(f: Field) -> tuple:
    return (f.pattern.count("**"), f.pattern.count("*"), -len(f.pattern))


def field_for(name: str, path: str) -> Field | None:
    """The most specific declaration matching `path` (fewest wildcards, then the longest pattern)."""
    hits = [f for f in declared(name) if f.matches(path)]
    if hits:        # a channel's own declaration wins over the one it mirrors
        return min(hits, key=_specificity)
    for prefix, source in _MIRRORS.get(name, ()):
        if path == prefix or path.startswith(prefix + "."):
            return field_for(source, path[len(prefix) + 1:])
    return None


def publish(name: str, doc: Any, *, subject: str = "") -> Any:
    """Let `doc` out on channel `name` if every leaf is declared there; else refuse, naming the leaf.

    Returns `doc` unchanged, so a call site reads `mlflow.set_tags(publish("registry.tag", tags))`.
    `subject` names the release or document (a plan sha, a model version) for the recorder."""
    _load()
    if name not in _CHANNELS:
        raise VeilError(f"publication gate: channel {name!r} is not declared (components/publication/fields.py)")
    out, call = [], next(_calls)
    for path, value in leaves(doc):
        f = field_for(name, path)
        if f is None:
            raise VeilError(f"publication gate: {name} field '{path}' is not declared in "
                            "components/publication/fields.py (declare its kind: public, DP-released with its "
                            "charge, or uncovered with its coarsening and test); refusing to publish it")
        if isinstance(value, float) and not math.isfinite(value) and f.kind is not Kind.PUBLIC:
            raise VeilError(f"publication gate: {name} field '{path}' is not a finite number; refusing to publish it")
        out.append(Published(name, subject, path, value, f, call))
    if _recorders:
        with _lock:
            for rec in _recorders:
                rec.extend(out)
    return doc


@contextlib.contextmanager
def recording() -> Iterator[list[Published]]:
    """Collect everything published while the block runs (any thread): the neighbour harness' eyes."""
    rec: list[Published] = []
    with _lock:
        _recorders.append(rec)
    try:
        yield rec
    finally:
        with _lock:
            _recorders.remove(rec)


def table_markdown() -> str:
    """The published-field table of docs/privacy/threat-model.md, generated from the declarations."""
    _load()

    def cell(x: str) -> str:
        return x.replace("|", "\\|").replace("\n", " ")

    lines = []
    for name, ch in _CHANNELS.items():
        lines += [f"### `{name}` — {cell(ch.readers)}", "",
                  "| field | kind | what | mechanism · sensitivity · counts · charge / coarsening · test |",
                  "|---|---|---|---|"]
        for prefix, source in _MIRRORS.get(name, ()):
            lines.append(f"| `{prefix}.**` | as `{source}` | declared by channel `{source}` | |")
        for f in _FIELDS[name]:
            kind = f.kind.value + (f" (under {f.relation})" if f.relation else "") + \
                (", hiding" if f.hiding else "") + (", digest" if f.digest else "")
            if f.kind is Kind.DP:
                how = (f"post-processing of `{f.post_processing_of}`" if f.post_processing_of else
                       f"{f.mechanism} · {f.sensitivity} · {f.counts} · {f.charge}")
            elif f.kind is Kind.UNCOVERED:
                how = f"{f.coarsening} · `{f.test}`"
            else:
                how = ""
            lines.append(f"| `{f.pattern}` | {kind} | {cell(f.what)} | {cell(how)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


BEGIN = ("<!-- published-fields:begin — generated from components/publication/fields.py by "
         "`python -m components.publication --write`; do not edit by hand -->")
END = "<!-- published-fields:end -->"


def with_table(doc: str) -> str:
    """`doc` (the threat model) with its generated section replaced (or appended)."""
    body = f"{BEGIN}\n\n{table_markdown()}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + body + rest.split(END, 1)[1]
    return doc.rstrip() + "\n\n## Every published field\n\nEach value Veil publishes passes one gate " \
        "(`components/publication`, docs/privacy/publication.md); this table is generated from its " \
        "declarations.\n\n" + body + "\n"
