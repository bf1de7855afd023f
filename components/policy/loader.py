"""Read a policy file and explain every problem as `file:line: field: what is wrong`.

PyYAML's composer keeps a line for every node; pydantic reports error locations as key paths. Walking
the node tree along a path gives the line a governance author should look at.
"""
from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.policy.model import Policy
from components.policy.prediction import PredictionPolicy


@dataclass(frozen=True)
class PolicyProblem:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class PolicyError(VeilError):
    """An invalid policy; `.problems` lists every problem found, the message names the first."""

    def __init__(self, problems: list[PolicyProblem]):
        self.problems = list(problems)
        msg = str(self.problems[0])
        if len(self.problems) > 1:
            msg += f" (and {len(self.problems) - 1} more problem(s); run `veil policy check` to list them)"
        super().__init__(msg)


# Bounds on what the checker reads, so that no file can pin a core (issue 28: a policy of 10⁶ literals or
# 10⁵ regexes kept `veil policy check` busy past 120 s). Far above any policy a governance team writes
# and reviews (the largest in policies/ is 7 KB and ~300 values); measured at the limits, refusing or
# checking takes seconds (policies/README.md, Limits; tests/policy/test_policy_hangs.py).
MAX_POLICY_BYTES = 4 << 20          # the file, before it is decoded
MAX_NODES = 100_000                 # YAML values (keys, list items, scalars), counted while composing
MAX_REGEX_PATTERNS = 10_000         # `kind: regex` patterns over all rules: each is compiled twice (re, RE2)
MAX_REGEX_CHARS = 1 << 20           # their total length: compile time grows with it

# Characters YAML does not allow in a document (PyYAML's reader refuses them with a traceback-worthy
# error): C0 controls but tab/LF/CR, DEL, C1 controls but NEL, surrogates, U+FFFE/FFFF.
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


class _TooManyNodes(Exception):
    def __init__(self, mark):
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads YAML 1.2 floats such as `1e-5` (1.1 reads them as text), and stops
    composing past MAX_NODES values (before the document's size costs any more time)."""

    _nodes = 0

    def compose_node(self, parent, index):
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _TooManyNodes(self.peek_event().start_mark)
        return super().compose_node(parent, index)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+][0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


# A policy is a few hundred nodes. Aliases let a few KB describe billions (each level doubling the
# last: the "billion laughs"); every walk over the document (validation, error locations) would pin
# a core. Expanded size is computed once per distinct node, so the check itself is linear.
MAX_EXPANDED_NODES = 100_000


def _alias_expansion_problem(root: yaml.Node) -> tuple[int, str] | None:
    """(line, message) if aliases make the document recursive or expand it past MAX_EXPANDED_NODES."""
    size: dict[int, int] = {}
    on_path: set[int] = set()

    def walk(node: yaml.Node) -> int:
        k = id(node)
        if k in size:
            return size[k]
        if k in on_path:
            raise _Recursive(node)
        on_path.add(k)
        n = 1
        if isinstance(node, yaml.MappingNode):
            for a, b in node.value:
                n += walk(a) + walk(b)
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                n += walk(v)
        on_path.discard(k)
        size[k] = n = min(n, MAX_EXPANDED_NODES + 1)
        return n

    try:
        total = walk(root)
    except _Recursive as e:
        return _line(e.node), "not a policy: a YAML alias refers to a node containing itself (recursive)"
    except RecursionError:
        return _line(root), "not a policy: YAML nested too deeply"
    if total > MAX_EXPANDED_NODES:
        return _line(root), (f"not a policy: YAML aliases expand it to more than {MAX_EXPANDED_NODES:,} nodes "
                             "(an alias bomb?); write the values out")
    return None


class _Recursive(Exception):
    def __init__(self, node):
        self.node = node


def _duplicate_keys(node: yaml.Node, path: str, out: list[tuple[int, str, str]]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            key = str(k.value)
            sub = f"{path}.{key}" if path else key
            if key in seen:
                out.append((_line(k), sub, f"key '{key}' appears twice (first on line {seen[key]})"))
            else:
                seen[key] = _line(k)
            _duplicate_keys(v, sub, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _duplicate_keys(v, f"{path}[{i}]", out)


def _locate(root: yaml.Node, loc: tuple) -> int:
    """Line of the deepest node along `loc` (the key's line for mapping entries)."""
    node, line = root, _line(root)
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == str(part):
                    node, line = v, _line(k)
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = _line(node)
        else:
            break
    return line


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(loc: tuple, root: type[BaseModel] = Policy) -> type[BaseModel] | None:
    """The pydantic model that the path `loc` points into (to list allowed keys)."""
    tp: typing.Any = root
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(part, int):
            args = typing.get_args(tp)
            tp = args[0] if args else None
        elif isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _kind(value) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if value is None:
        return "nothing (null)"
    return f"the text {str(value)!r}"


def _explain(err: dict, root: type[BaseModel] = Policy) -> tuple[tuple, str]:
    """(location, plain message) for one pydantic error."""
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in {"int", "float", "str"})))
    typ, inp, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    msg = err["msg"]
    if typ == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        model = _model_at(loc[:-1], root)
        allowed = sorted(model.model_fields) if model else []
        near = difflib.get_close_matches(key, allowed, n=1)
        text = f"unknown key '{key}'"
        if near:
            text += f" (did you mean '{near[0]}'?)"
        if allowed:
            text += f"; allowed here: {', '.join(allowed)}"
        return loc, text
    if typ == "invalid_key":
        return loc, f"key {loc[-1]!r} is not a name; keys are words like 'epsilon'" if loc else "keys must be names"
    if typ == "missing":
        return loc, "required but missing"
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        return loc, f"expected a mapping (indented 'key: value' lines), got {_kind(inp)}"
    if typ == "list_type":
        return loc, f"expected a list ('- item' lines), got {_kind(inp)}"
    if typ == "literal_error":
        return loc, f"{_kind(inp)} is not allowed; use one of: {ctx.get('expected', '')}".replace("'", "")
    if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        words = {"greater_than": "greater than", "greater_than_equal": "at least",
                 "less_than": "less than", "less_than_equal": "at most"}[typ]
        bound = next(iter(ctx.values())) if ctx else "?"
        bound = f"{bound:g}" if isinstance(bound, float) else bound
        return loc, f"must be {words} {bound}, got {inp}"
    if typ in ("float_parsing", "int_parsing", "float_type", "int_type", "int_from_float"):
        want = "a whole number" if typ.startswith("int") else "a number"
        return loc, f"expected {want}, got {_kind(inp)}"
    if typ == "finite_number":
        return loc, "must be a finite number"
    if typ in ("bool_parsing", "bool_type"):
        return loc, f"expected true or false, got {_kind(inp)}"
    if typ in ("string_type",):
        return loc, f"expected text, got {_kind(inp)}"
    if typ in ("too_short", "string_too_short"):
        return loc, "must not be empty"
    if typ == "value_error":
        text = msg.removeprefix("Value error, ")
        m = re.match(r"^@([\w.]+)@ (.*)$", text)
        if m:  # a cross-field rule names the field it is about
            return loc + tuple(int(x) if x.isdigit() else x for x in m.group(1).split(".")), m.group(2)
        return loc, text
    return loc, msg


def _problems_from_text(raw: bytes, path: str, *, any_kind: bool = False) -> tuple[list[PolicyProblem], BaseModel | None]:
    """`any_kind`: validate a PredictionPolicy (PMixED) by its own schema too (`veil policy check`);
    loading a training policy accepts only kind PrivacyPolicy."""
    if len(raw) > MAX_POLICY_BYTES:
        return [_too_big(path, len(raw))], None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return [PolicyProblem(path, 1, "", f"not UTF-8 text ({e.reason} at byte {e.start})")], None
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        col = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        c = ord(bad.group())
        name = {0: " (NUL)", 0x1B: " (ESC)", 0x7F: " (DEL)"}.get(c, "")
        return [PolicyProblem(path, line, "", f"not a policy: control character U+{c:04X}{name} at column {col}; "
                                              "a policy is plain text")], None
    many = _over_node_limit(text)
    if many is not None:
        return [_too_many_nodes(path, many)], None
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return [PolicyProblem(path, 1, "", "the file is empty; a policy starts with "
                                               "'apiVersion: veil.dev/v1'")], None
        why = _alias_expansion_problem(root)
        if why:
            return [PolicyProblem(path, why[0], "", why[1])], None
        data = loader.construct_document(root)
    except _TooManyNodes as e:
        return [_too_many_nodes(path, e.mark)], None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        return [PolicyProblem(path, line, "", f"not valid YAML: {e.problem or e.context}")], None
    except yaml.YAMLError as e:
        return [PolicyProblem(path, 1, "", f"not valid YAML: {e}")], None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        return [PolicyProblem(path, _line(root), "", f"expected a mapping at the top level "
                                                     f"(apiVersion, kind, metadata, spec), got {_kind(data)}")], None
    problems = [PolicyProblem(path, line, field, msg) for line, field, msg in _dups(root)]
    over = _regex_budget(data)
    if over:  # before validation compiles them: past the budget, compiling is the hang
        loc, msg = over
        return [PolicyProblem(path, _locate(root, loc), _dotted(loc), msg)], None
    model: type[BaseModel] = Policy
    if any_kind and data.get("kind") == "PredictionPolicy":
        model = PredictionPolicy
    try:
        policy = model.model_validate(data)
    except ValidationError as e:
        for err in e.errors(include_url=False):
            loc, msg = _explain(err, model)
            if any_kind and loc == ("kind",):
                msg = f"{_kind(data.get('kind'))} is not a policy kind; use PrivacyPolicy (training) or PredictionPolicy (PMixED)"
            problems.append(PolicyProblem(path, _locate(root, loc), _dotted(loc), msg))
        policy = None
    problems.sort(key=lambda p: (p.line, p.field))
    return problems, (policy if not problems else None)


def _over_node_limit(text: str):
    """The mark where the document passes MAX_NODES values, counted on libyaml's C event stream (~10×
    faster than composing in Python, which _Loader also bounds); None within the limit, without
    libyaml, or where libyaml cannot parse the text (the Python loader then names the problem)."""
    if not getattr(yaml, "__with_libyaml__", False):
        return None
    n = 0
    kinds = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)
    try:
        for ev in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(ev, kinds):
                n += 1
                if n > MAX_NODES:
                    return ev.start_mark
    except yaml.YAMLError:
        return None
    return None


def _too_many_nodes(path: str, mark) -> PolicyProblem:
    return PolicyProblem(path, mark.line + 1, "", f"not a policy: more than {MAX_NODES:,} YAML values (keys, list "
                                                  "items, scalars); policies are bounded "
                                                  "(policies/README.md, Limits)")


def _too_big(path: str, size: int) -> PolicyProblem:
    return PolicyProblem(path, 1, "", f"not a policy: {size:,} bytes, over the {MAX_POLICY_BYTES:,}-byte limit "
                                      "(policies/README.md, Limits)")


def _regex_budget(data: dict) -> tuple[tuple, str] | None:
    """(location, message) of the rule where the policy's regex patterns pass MAX_REGEX_PATTERNS or
    MAX_REGEX_CHARS; None within both. Reads the raw document (any shape: validation comes after)."""
    spec = data.get("spec")
    classes = spec.get("secrets", {}).get("classes") if isinstance(spec, dict) and isinstance(
        spec.get("secrets"), dict) else None
    if not isinstance(classes, list):
        return None
    n = chars = 0
    for i, c in enumerate(classes):
        rules = c.get("rules") if isinstance(c, dict) else None
        for j, r in enumerate(rules if isinstance(rules, list) else ()):
            if not isinstance(r, dict) or r.get("kind") != "regex" or not isinstance(r.get("patterns"), list):
                continue
            pats = [p for p in r["patterns"] if isinstance(p, str)]
            n += len(pats)
            chars += sum(len(p) for p in pats)
            loc = ("spec", "secrets", "classes", i, "rules", j, "patterns")
            if n > MAX_REGEX_PATTERNS:
                return loc, (f"more than {MAX_REGEX_PATTERNS:,} regex patterns in the policy; list fixed strings "
                             "as kind: literal (policies/README.md, Limits)")
            if chars > MAX_REGEX_CHARS:
                return loc, (f"regex patterns total more than {MAX_REGEX_CHARS:,} characters; list fixed strings "
                             "as kind: literal (policies/README.md, Limits)")
    return None


def _dups(root) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    _duplicate_keys(root, "", out)
    return out


def _read(path: str | Path) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise VeilError(f"{path}: no such policy file")
    try:
        size = p.stat().st_size
        if size > MAX_POLICY_BYTES:  # refused unread
            raise PolicyError([_too_big(str(path), size)])
        with open(p, "rb") as f:
            return f.read(MAX_POLICY_BYTES + 1)   # (a file growing meanwhile is cut, then refused)
    except OSError as e:
        raise VeilError(f"{path}: cannot read the policy ({e.strerror or e})") from None


def check_policy(path: str | Path) -> list[PolicyProblem]:
    """Every problem in a policy file of either kind — a training policy (PrivacyPolicy) or a PMixED
    prediction policy (PredictionPolicy) — (empty list: the policy is valid)."""
    try:
        raw = _read(path)
    except PolicyError as e:  # over the size limit: a problem like any other, the file left unread
        return e.problems
    problems, _ = _problems_from_text(raw, str(path), any_kind=True)
    return problems


def load_policy(path: str | Path) -> Policy:
    """Validate and load a policy file; raises `PolicyError` (a VeilError) naming file, line and field."""
    raw = _read(path)
    problems, policy = _problems_from_text(raw, str(path))
    if problems:
        raise PolicyError(problems)
    assert policy is not None
    policy._sha256 = sha256_bytes(raw)
    policy._path = str(Path(path).resolve())
    return policy


def parse_policy(text: str, name: str = "<policy>") -> Policy:
    """Validate policy text (for tests and tools); `path` is `name`, sha256 of the UTF-8 bytes."""
    raw = text.encode()
    problems, policy = _problems_from_text(raw, name)
    if problems:
        raise PolicyError(problems)
    assert policy is not None
    policy._sha256 = sha256_bytes(raw)
    policy._path = name
    return policy


def load_prediction_policy(path: str | Path) -> tuple[PredictionPolicy, bytes]:
    """A PMixED endpoint's policy (components.policy.prediction) and the file's bytes (their sha256 is the
    policy's identity in the certificate and the ledger); bad input is one VeilError naming the field."""
    p = Path(path)
    if not p.is_file():
        raise VeilError(f"{p}: no such policy file")
    raw = p.read_bytes()
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise VeilError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    try:
        return PredictionPolicy.model_validate(data), raw
    except ValidationError as e:
        # the training policy's wording: a cross-field rule's "@field.path@ message" names its field
        # (never shown as such: issue 26 saw `@aliases.0@` on screen)
        err = e.errors(include_url=False)[0]
        loc, msg = _explain(err) if err["type"] == "value_error" else (tuple(err["loc"]), err["msg"])
        raise VeilError(f"{p}: {_dotted(loc) or '(document)'}: {msg}") from None
