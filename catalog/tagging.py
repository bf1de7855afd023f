"""Secret tagging: policy rules → spans (record, secret id, detector, start, end).

Two passes, so that tagging a million records costs one vectorised scan:

1. a prefilter: one RE2 alternation of every rule (`pyarrow.compute.match_substring_regex`) over
   the whole text column. It is built to be *looser* than the exact pass (literals without their
   word boundaries, `\\b` removed), so a row it rejects cannot hold a match;
2. the exact pass: RE2 (google-re2, linear time in the text whatever the pattern: a policy regex
   such as `(a+)+$` cannot hang an ingest) on the rows that passed, giving every span. A policy
   pattern RE2 cannot run (backreferences, lookarounds) is refused when the rules are compiled.

Offsets are Python string indices (code points): `text[start:end]` is the matched value.
secret_id is `"<secret_class>:<normalized value>"`; a class normalizes all its matches the way its
built-in detector does (email: lower case, phone: '+' and digits), so a phone found by the detector
and by a regex of the same class is one secret. Literal rules map a match to the literal as the
policy wrote it. A path_glob match names the glob and covers the whole record.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import re2

from catalog import detectors as _det

from catalog import ner as _ner
from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.policy import load_policy

RULE_KINDS = ("literal", "keyword", "regex", "path_glob", "detector")
# Long or multi-line values (private-key blocks) are named by their hash: ids stay one short line.
_MAX_ID_VALUE = 128

# Built-in detectors (catalog/detectors.py): name -> patterns.
BUILTIN_DETECTORS: dict[str, list[_det.Pattern]] = {
    "credentials": _det.credential_patterns(), "email": _det.EMAIL, "phone": _det.PHONE,
    "payment_card": _det.CARD, "iban": _det.IBAN, "national_id": _det.NATIONAL_ID,
    "high_entropy": _det.HIGH_ENTROPY,
}
DETECTOR_VERSION = _det.DETECTOR_VERSION

DEFAULT_RULES: list[dict] = [
    {"secret_class": "credential", "kind": "detector", "patterns": ["credentials"], "case_sensitive": True},
    {"secret_class": "email", "kind": "detector", "patterns": ["email"], "case_sensitive": False},
    {"secret_class": "phone", "kind": "detector", "patterns": ["phone"], "case_sensitive": True},
]


def _norm_identity(v: str) -> str:
    return v


def _norm_email(v: str) -> str:
    return v.lower()


_NORMALIZERS: dict[str, Callable[[str], str]] = {"email": _norm_email, "phone": _det.norm_phone,
                                                  "credentials": _norm_identity}

_RE2_OPTS = re2.Options()
_RE2_OPTS.log_errors = False


# The candidate test's groups: at most this many RE2 instructions each (Tagger._candidate_groups).
_GROUP_PROGRAM = 2000


def compile_re2(pattern: str, *, case_sensitive: bool = True, as_bytes: bool = False):
    """A pattern on RE2: linear time in the text, whatever the pattern (no backtracking, so no
    `(a+)+$` hang). Raises `re2.error` for what RE2 cannot run (backreferences, lookarounds,
    repeats over 1000). `as_bytes`: matched against UTF-8 bytes (RE2's own encoding: half the cost
    of the str wrapper, which re-encodes the text on every call)."""
    p = pattern if case_sensitive else "(?i)" + pattern
    return re2.compile(p.encode() if as_bytes else p, _RE2_OPTS)


def _match_spans(rx, raw: bytes):
    """Each match of `rx` (compiled on bytes) in `raw`, as its groups' byte spans (index 0: the whole
    match; (-1, -1): a group that did not take part) — what google-re2's `finditer` yields for bytes,
    the same loop, without a match object (and its bounds checks) per match: the exact pass runs
    this for every candidate row and named pattern."""
    inner = getattr(rx, "_regexp", None)
    anchor = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if inner is None or anchor is None:  # another binding's layout: its public API
        for hit in rx.finditer(raw):
            yield [hit.span(g) for g in range(rx.groups + 1)]
        return
    pos, end = 0, len(raw)
    while True:
        spans = inner.Match(anchor, raw, pos, end)
        if spans[0] == (-1, -1):
            return
        yield spans
        if pos == end:
            return
        pos = pos + 1 if pos == spans[0][1] else spans[0][1]  # an empty match: step on (finditer's rule)


_UNANCHORED = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)


def _re2_entry(rx):
    """google-re2's internal match call of a compiled pattern (what `_match_spans` loops over), or
    None where the binding's layout differs (then `_match_spans` uses the public API)."""
    inner = getattr(rx, "_regexp", None)
    return inner.Match if inner is not None and _UNANCHORED is not None else None


# How often (in batches) the candidate test times its two layouts again (Tagger._scan).
_REPROBE = 16


def _any_match(texts, alternations: list[str]) -> pa.Array:
    """Rows matching any of `alternations` (RE2, via Arrow; null texts: no)."""
    mask = None
    for alt in alternations:
        hit = pc.fill_null(pc.match_substring_regex(texts, alt), False)
        mask = hit if mask is None else pc.or_(mask, hit)
    return mask


def _literal_regexes(patterns: list[str], case: bool) -> list[tuple[list[str], object]]:
    """One RE2 regex for a literal list (longest first, so the longest literal wins at a position),
    or, for a list too large for RE2 to compile whole (~80k ten-letter literals), the list cut in
    halves until each compiles. Word boundaries only count where the literal's edge is a word
    character (RE2 has no lookarounds; \\b at a word-character edge means exactly that)."""
    parts = [(r"\b" if re.match(r"\w", p, re.ASCII) else "") + re.escape(p)
             + (r"\b" if re.search(r"\w$", p, re.ASCII) else "") for p in patterns]
    try:
        return [(patterns, compile_re2("(?:" + "|".join(parts) + ")", case_sensitive=case, as_bytes=True))]
    except re2.error:
        if len(patterns) == 1:
            raise
        half = len(patterns) // 2
        return _literal_regexes(patterns[:half], case) + _literal_regexes(patterns[half:], case)


def re2_problem(pattern: str) -> str | None:
    """Why RE2 cannot run `pattern` (None: it can)."""
    try:
        compile_re2(pattern)
        return None
    except re2.error as e:
        msg = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        return msg


class Span(NamedTuple):
    row: int            # index into the tagged batch
    secret_id: str
    secret_class: str
    detector: str
    detector_version: str
    start: int
    end: int


@dataclass(frozen=True)
class _Matcher:
    secret_class: str
    detector: str
    version: str
    regex: object                        # a compiled RE2 pattern
    group: int | None                    # None: the first group that matched, else the whole match
    normalize: Callable[[str], str]
    literal_map: dict | None = None      # literal rules: matched text (folded) -> canonical literal
    check: Callable[[str, str, int, int], bool] | None = None   # (value, text, start, end) -> keep
    family: str | None = None            # detector sub-patterns of one family: overlaps keep the longest
    prefilter: str | None = None         # RE2 pattern implied by every match; None: scan every row


def _skip_group(pattern: str, i: int) -> int:
    """Index just past the group opening at `i` (balanced parentheses, escapes and classes respected)."""
    depth, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


_QUANT = re.compile(r"\{(\d+)(,(\d*))?\}")


def loosen(pattern: str) -> str:
    """A pattern matching wherever `pattern` matches, in a form RE2 runs as a small DFA: assertions
    (\\b, \\B, lookarounds) dropped, counted repeats {m,n} widened to {min(m, 8),}."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            if not in_class and pattern[i + 1] in "bB":
                i += 2
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            out.append(c)
            in_class = c != "]"
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1:i + 2] == "]":
                out.append("]")
                i += 1
            i += 1
            continue
        if c == "(" and pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            i = _skip_group(pattern, i)
            continue
        if c == "{":
            m = _QUANT.match(pattern, i)
            if m:
                # keep a small lower bound (a token's length is what tells it from a word: `AC[a-z0-9]{32}`
                # loosened to `AC[a-z0-9]+` would pass "ACme"), drop the upper one (DFA size)
                lo = min(int(m.group(1)), 8)
                out.append("*" if lo == 0 else "+" if lo == 1 else "{%d,}" % lo)
                i = m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _glob_to_regex(glob: str) -> str:
    """Path glob → anchored regex: `**` crosses '/', `*` and `?` do not; `**/` also matches nothing."""
    i, out = 0, []
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = glob.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = glob[i + 1:j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return "^" + "".join(out) + "$"


def _re2_ok(pattern: str) -> bool:
    try:
        pc.match_substring_regex(pa.array(["x"]), pattern)
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


def _rule_case(r: dict) -> bool:
    return bool(r.get("case_sensitive", r.get("kind") not in ("literal", "keyword")))


def load_rules(rules: Sequence[dict] | str | Path | None) -> list[dict]:
    """Rules as a list of dicts: given directly, read from a policy file, or the built-in default."""
    if rules is None:
        return [dict(r) for r in DEFAULT_RULES]
    if isinstance(rules, (str, Path)):
        return load_policy(rules).tagging_rules()
    return [dict(r) for r in rules]


class Tagger:
    """Compiled tagging rules. `tag(texts, paths)` returns the spans of one batch."""

    def __init__(self, rules: Sequence[dict] | str | Path | None = None, *, ner=None):
        self.rules = load_rules(rules)
        # An NER plug-in (catalog/ner.py) is part of what the tags mean: its version joins the hash,
        # so re-ingesting under a new model re-tags instead of counting as "already ingested".
        self.ner = ner
        self.rules_sha256 = (sha256_json(self.rules) if ner is None else
                             sha256_json({"rules": self.rules, "ner": ner.version}))
        self._matchers: list[_Matcher] = []
        self._globs: list[tuple[str, str, str, re.Pattern]] = []  # (class, glob, version, regex)
        # A class whose detectors are all of one kind normalizes its regex matches that way too
        # (a phone found by a regex and by the phone detector is one secret).
        class_dets: dict[str, set[str]] = {}
        for r in self.rules:
            if r.get("kind") == "detector":
                for name in r.get("patterns") or []:
                    if name in _NORMALIZERS:
                        class_dets.setdefault(r.get("secret_class"), set()).add(name)
        class_norm = {c: _NORMALIZERS[next(iter(d))] for c, d in class_dets.items() if len(d) == 1}
        for i, r in enumerate(self.rules):
            where = f"tagging rule {i + 1}"
            cls, kind, patterns = r.get("secret_class"), r.get("kind"), r.get("patterns")
            if not cls or not isinstance(cls, str):
                raise VeilError(f"{where}: secret_class: missing or not a string")
            if kind not in RULE_KINDS:
                raise VeilError(f"{where}: kind: {kind!r} is not one of {', '.join(RULE_KINDS)}")
            if not patterns or not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) and p for p in patterns):
                raise VeilError(f"{where}: patterns: must be a non-empty list of non-empty strings")
            case = bool(r.get("case_sensitive", kind not in ("literal", "keyword")))
            version = "rule-" + sha256_json({"secret_class": cls, "kind": kind, "patterns": list(patterns),
                                             "case_sensitive": case})[:12]
            norm = class_norm.get(cls, _norm_identity)
            ci = "" if case else "(?i)"
            if kind in ("literal", "keyword"):
                for chunk, rx in _literal_regexes(sorted(patterns, key=len, reverse=True), case):
                    alts = "|".join(re.escape(p) for p in chunk)
                    lmap = {(p if case else p.lower()): p for p in chunk}
                    self._add(_Matcher(cls, "literal", version, rx, 0, norm, literal_map=lmap),
                              ci + "(?:" + alts + ")")
            elif kind == "regex":
                for p in patterns:
                    why = re2_problem(p)
                    if why is not None:
                        raise VeilError(f"{where}: patterns: regex {p!r} cannot run on RE2 (the linear-time "
                                        f"engine tagging uses): {why}")
                    rx = compile_re2(p, case_sensitive=case, as_bytes=True)
                    group = rx.groupindex.get(b"secret", 0)
                    self._add(_Matcher(cls, "regex", version, rx, group,
                                       norm if case else (lambda v, n=norm: n(v).lower())), ci + "(?:" + loosen(p) + ")")
            elif kind == "path_glob":
                for g in patterns:
                    self._globs.append((cls, g, version, compile_re2(_glob_to_regex(g), case_sensitive=case)))
            else:  # detector
                for name in patterns:
                    if name not in BUILTIN_DETECTORS:
                        raise VeilError(f"{where}: patterns: unknown detector {name!r}; built-in: "
                                        f"{', '.join(BUILTIN_DETECTORS)}")
                    for d in BUILTIN_DETECTORS[name]:
                        m = _Matcher(cls, f"{name}.{d.sub}", DETECTOR_VERSION, compile_re2(d.regex, as_bytes=True), d.group,
                                     d.normalize or _NORMALIZERS.get(name, _norm_identity),
                                     check=d.check, family=f"{cls}/{name}")
                        self._add(m, d.prefilter or loosen(d.regex))
        # each matcher's RE2 match entry (google-re2's internal `Match`), or None: its public API (spans_of)
        self._runner = {id(m): _re2_entry(m.regex) for m in self._matchers}
        self._prefilters = self._candidate_groups()
        one = "|".join(self._prefilters)  # (None where Arrow's RE2 cannot take it whole)
        self._one = (one if _re2_ok(one) else None) if len(self._prefilters) > 1 else (one or None)
        self._calls, self._cost = 0, [None, None]  # CPU s per byte: [per group, one alternation]
        self._unfiltered = [m for m in self._matchers if m.prefilter is None]
        # Matchers of one detector family share a first scan (one alternation): the per-pattern scans
        # then run over the rows that family may match, not over every candidate row.
        fams: dict[str, list[_Matcher]] = {}
        self._groups: list[tuple[str | None, list[_Matcher]]] = []
        for m in self._matchers:
            if m.prefilter is None:
                continue
            if m.family is None:
                self._groups.append((None, [m]))
            else:
                fams.setdefault(m.family, []).append(m)
        for ms in fams.values():
            alt = "|".join("(?:" + m.prefilter + ")" for m in ms)
            self._groups.append((alt if len(ms) > 1 and _re2_ok(alt) else None, ms))
        # One RE2 set of every filtered matcher's prefilter, in the groups' order: one pass over a
        # candidate row names the matchers to run (Arrow's per-pattern scans recompile each pattern
        # for every batch, which cost more than the scans). A set whose DFA runs out of memory
        # answers "no match", so a row it names nothing for goes the per-pattern way instead.
        self._set_matchers = [m for _, ms in self._groups for m in ms]
        self._set = None
        if self._set_matchers:
            try:
                import re2 as _re2

                opts = _re2.Options()
                opts.max_mem = 64 << 20
                st = _re2.Set.SearchSet(opts)
                for m in self._set_matchers:
                    st.Add(m.prefilter)
                st.Compile()
                self._set = st
            except Exception:  # pragma: no cover - each prefilter compiles alone; then scan per pattern
                self._set = None
        self._glob_prefilter = "|".join("(?:" + g[3].pattern + ")" for g in self._globs) or None
        if self._glob_prefilter and any(not _rule_case(r) for r in self.rules if r.get("kind") == "path_glob"):
            self._glob_prefilter = "(?i)" + self._glob_prefilter  # looser: fine for a prefilter
        if self._glob_prefilter and not _re2_ok(self._glob_prefilter):
            self._glob_prefilter = ".*"

    def _candidate_groups(self) -> list[str]:
        """The candidate test's alternations: the matchers' prefilters, cut in order into groups of at
        most _GROUP_PROGRAM instructions. One alternation of them all is one pass over the text, but
        its DFA outgrows RE2's cache on real text (many partial matches: "key", "token", "@", digits)
        and RE2 then crawls: measured on 22.5k real Debian changelog entries, 0.43 CPU s for the whole
        alternation of the built-in detectors against 0.08–0.10 s for two groups (and on source code
        0.059 against 0.032 s), while on the synthetic bench's small vocabulary the single alternation
        is the cheaper (so _scan times both; bench/ingest.py --real). A group Arrow cannot compile leaves its
        matchers without a prefilter — run exactly on every row — never silently unscanned."""
        groups: list[list[_Matcher]] = []
        size = 0
        for m in self._matchers:
            if m.prefilter is None:
                continue
            try:
                n = re2.compile(m.prefilter, _RE2_OPTS).programsize
            except re2.error:  # larger than this binding compiles: a group of its own (Arrow decides)
                n = _GROUP_PROGRAM + 1
            if groups and size + n <= _GROUP_PROGRAM:
                groups[-1].append(m)
                size += n
            else:
                groups.append([m])
                size = n
        out = []
        for ms in groups:
            alt = "|".join("(?:" + m.prefilter + ")" for m in ms)
            if _re2_ok(alt):
                out.append(alt)
            else:  # too large for Arrow's RE2 together: alone if it can, else exactly on every row
                for m in ms:
                    if _re2_ok("(?:" + m.prefilter + ")"):
                        out.append("(?:" + m.prefilter + ")")
                    else:
                        object.__setattr__(m, "prefilter", None)
        return out

    def _add(self, m: _Matcher, prefilter: str) -> None:
        object.__setattr__(m, "prefilter", prefilter if _re2_ok(prefilter) else None)
        self._matchers.append(m)

    @property
    def mask_only(self) -> bool:
        """`tag(texts, mask=…)` looks only at the rows `mask` marks (no rule without a prefilter, no
        NER, which read every row)."""
        return not self._unfiltered and self.ner is None

    @property
    def has_path_rules(self) -> bool:
        return bool(self._globs)

    def candidate_mask(self, texts: pa.Array | pa.ChunkedArray, paths=None) -> pa.Array:
        """Rows that may hold a match of a prefiltered rule or a path glob (a superset of those that do)."""
        n = len(texts)
        mask = self._scan(texts) if n and self._prefilters else None
        if self._glob_prefilter is not None and paths is not None and n:
            m2 = pc.fill_null(pc.match_substring_regex(paths, self._glob_prefilter), False)
            mask = m2 if mask is None else pc.or_(mask, m2)
        if mask is None:
            return pa.array([False] * n)
        return mask

    def _scan(self, texts) -> pa.Array:
        """The candidate test over `texts`, in the cheaper of two layouts that mark the same rows: one
        pass per group (_candidate_groups: where one DFA thrashes, as on real text) or one alternation
        of every group (one pass: cheaper where RE2's DFA stays small, as on the synthetic bench's
        small vocabulary). Each batch runs one layout, timed on this thread's CPU clock per byte:
        the groups first (real text's safe choice, and a one-batch source's only one), the
        alternation next, then the cheaper, with the other timed again every _REPROBE batches (a
        source's text may change). Only the speed depends on the choice, never the rows marked
        (tested)."""
        if self._one is None or len(self._prefilters) == 1:
            return _any_match(texts, [self._one] if self._one is not None else self._prefilters)
        self._calls += 1
        cost = self._cost
        if cost[0] is None:
            layout = 0
        elif cost[1] is None:
            layout = 1
        else:
            best = 0 if cost[0] <= cost[1] else 1
            layout = 1 - best if self._calls % _REPROBE == 0 else best
        t = time.thread_time()
        mask = _any_match(texts, self._prefilters if layout == 0 else [self._one])
        cost[layout] = (time.thread_time() - t) / max(1, texts.nbytes)
        return mask

    def spans_of(self, row: int, text: str, path: str | None = None, matchers=None, globs: bool = True) -> list[Span]:
        """Every span of one record, exactly (of `matchers` only, when given).

        The exact pass runs this for every candidate row and each matcher the RE2 set named (~4 a
        row on the bench): RE2's match entry is looked up once per matcher (`_runner`), not once
        per call, and the match loop is `_match_spans` inlined (the same positions, the same
        empty-match rule), without a generator per matcher and row."""
        if not text:
            return []
        out: list[Span] = []
        fam: dict[str, list[Span]] | None = None
        raw = text.encode("utf-8", "surrogatepass")
        ascii_only = len(raw) == len(text)
        end_ = len(raw)
        runner = self._runner
        for m in (self._matchers if matchers is None else matchers):
            match = runner.get(id(m))
            if match is None:
                found = _match_spans(m.regex, raw)
            else:
                found = []
                pos = 0
                while True:
                    spans = match(_UNANCHORED, raw, pos, end_)
                    s0 = spans[0]
                    if s0[0] < 0:
                        break
                    found.append(spans)
                    if pos == end_:
                        break
                    pos = pos + 1 if pos == s0[1] else s0[1]  # an empty match: step on (finditer's rule)
                if not found:
                    continue
            group, check = m.group, m.check
            for spans in found:
                if group is None:  # the first group that matched (detect-secrets' convention)
                    start, end = next((sp for sp in spans[1:] if sp[0] >= 0 and sp[1] > sp[0]), spans[0])
                else:
                    start, end = spans[group]
                if start < 0 or end <= start:
                    continue
                if not ascii_only:  # byte offsets -> code points (text[start:end] is the value)
                    start, end = len(raw[:start].decode("utf-8", "surrogatepass")), \
                        len(raw[:end].decode("utf-8", "surrogatepass"))
                value = text[start:end]
                if check is not None and not check(value, text, start, end):
                    continue
                if m.literal_map is not None:
                    key = value if value in m.literal_map else value.lower()
                    norm = m.literal_map.get(key, value)
                else:
                    norm = m.normalize(value)
                if len(norm) > _MAX_ID_VALUE or "\n" in norm:
                    norm = "sha256:" + sha256_json(norm)[:32]
                span = Span(row, f"{m.secret_class}:{norm}", m.secret_class, m.detector, m.version, start, end)
                if m.family:
                    if fam is None:
                        fam = {}
                    fam.setdefault(m.family, []).append(span)
                else:
                    out.append(span)
        if fam:
            for spans in fam.values():
                # One detector, several patterns (e.g. international vs national phone): a match inside a
                # longer one is the same occurrence, not a second secret.
                spans.sort(key=lambda s: (s.start, -(s.end - s.start)))
                kept: list[Span] = []
                for s in spans:
                    if kept and s.start < kept[-1].end:
                        if s.end - s.start > kept[-1].end - kept[-1].start:
                            kept[-1] = s
                        continue
                    kept.append(s)
                out.extend(kept)
        if path and globs:
            for cls, glob, version, rx in self._globs:
                if rx.match(path):
                    out.append(Span(row, f"{cls}:{glob}", cls, "path_glob", version, 0, len(text)))
        return out

    def candidate_sql(self, text_col: str, path_col: str) -> str:
        """The candidate test as a DuckDB expression (DuckDB runs the same RE2 engine, on all threads)."""
        def q(p: str) -> str:
            return "'" + p.replace("'", "''") + "'"

        parts = []
        for alt in self._prefilters:
            parts.append(f"coalesce(regexp_matches({text_col}, {q(alt)}), false)")
        if self._glob_prefilter is not None:
            parts.append(f"coalesce(regexp_matches({path_col}, {q(self._glob_prefilter)}), false)")
        return " OR ".join(parts) if parts else "false"

    def tag(self, texts: pa.Array | pa.ChunkedArray, paths=None, mask=None) -> list[Span]:
        """Spans of a batch (`row` indexes `texts`): one RE2 scan picks candidate rows (or `mask`, the
        same test computed elsewhere), a per-rule RE2 scan of those picks the rules to run exactly,
        RE2 gives the spans."""
        n = len(texts)
        if n == 0:
            return []
        if isinstance(texts, pa.ChunkedArray):  # (combine_chunks copies even a single chunk)
            texts = texts.chunk(0) if texts.num_chunks == 1 else texts.combine_chunks()
        if paths is not None and isinstance(paths, pa.ChunkedArray):
            paths = paths.combine_chunks()
        if pa.types.is_null(texts.type):
            texts = texts.cast(pa.string())
        if paths is not None and pa.types.is_null(paths.type):
            paths = None
        if mask is None:
            mask = self.candidate_mask(texts, paths)
        elif isinstance(mask, pa.ChunkedArray):
            mask = mask.combine_chunks()
        idx = pc.indices_nonzero(mask)
        out: list[Span] = []
        if len(idx):
            cand = texts.take(idx)
            rows = idx.to_pylist()
            ctexts = cand.to_pylist()
            per_row: list[list[_Matcher]] = [[] for _ in rows]
            rest = list(range(len(rows)))
            if self._set is not None:
                rest = []
                for j, t in enumerate(ctexts):
                    hits = self._set.Match(t) if t else None
                    if hits is None:
                        rest.append(j)   # nothing named (or the set's DFA gave up): scan per pattern
                    else:
                        per_row[j] = [self._set_matchers[h] for h in sorted(hits)]
            if rest:
                sub_rows = cand if len(rest) == len(rows) else cand.take(pa.array(rest, pa.int64()))
                for j, ms in zip(rest, self._per_pattern(sub_rows)):
                    per_row[j] = ms
            cpaths = paths.take(idx).to_pylist() if paths is not None else [None] * len(rows)
            for j, row in enumerate(rows):
                if ctexts[j] and (per_row[j] or cpaths[j]):
                    out.extend(self.spans_of(row, ctexts[j], cpaths[j], matchers=per_row[j]))
        if self._unfiltered:  # rules RE2 cannot take: every row, those rules only
            for row, text in enumerate(texts.to_pylist()):
                if text:
                    out.extend(self.spans_of(row, text, None, matchers=self._unfiltered, globs=False))
            out.sort(key=lambda s: s.row)
        if self.ner is not None:  # a model sees every record: names have no prefilter
            out.extend(self._ner_spans(texts))
            out.sort(key=lambda s: s.row)
        return out

    def _ner_spans(self, texts: pa.Array) -> list[Span]:
        vals = texts.to_pylist()
        rows = [i for i, t in enumerate(vals) if t]
        spans: list[Span] = []
        for row, ents in zip(rows, self.ner.find([vals[i] for i in rows])):
            seen = set()
            for start, end, label, score in ents:
                cls = _ner.secret_class(label)
                if cls is None or score < _ner.MIN_SCORE or not 0 <= start < end <= len(vals[row]):
                    continue
                value = _ner.normalize(vals[row][start:end])
                if not value or (start, end, cls) in seen:
                    continue
                seen.add((start, end, cls))
                spans.append(Span(row, f"{cls}:{value}", cls, f"ner.{cls}", self.ner.version, start, end))
        return spans

    def _per_pattern(self, cand: pa.Array) -> list[list[_Matcher]]:
        """For each text, the matchers whose prefilter matches it (Arrow scans, family by family)."""
        per_row: list[list[_Matcher]] = [[] for _ in range(len(cand))]
        for group_filter, ms in self._groups:
            sub, back = cand, None
            if group_filter is not None:
                g = pc.indices_nonzero(pc.fill_null(pc.match_substring_regex(cand, group_filter), False))
                if len(g) == 0:
                    continue
                sub, back = cand.take(g), g.to_pylist()
            for m in ms:
                hit = pc.indices_nonzero(pc.fill_null(pc.match_substring_regex(sub, m.prefilter), False))
                for j in hit.to_pylist():
                    per_row[j if back is None else back[j]].append(m)
        return per_row

    def tag_all(self, texts: Iterable[str], paths: Iterable[str | None] | None = None) -> list[Span]:
        """Exact pass on every row, no prefilter (the reference the tests compare against)."""
        plist = list(paths) if paths is not None else None
        out: list[Span] = []
        for i, t in enumerate(texts):
            out.extend(self.spans_of(i, t or "", plist[i] if plist else None))
        return out
