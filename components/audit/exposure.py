"""Secret exposure (Carlini et al.'s "Secret Sharer" measure) for secrets with a known lead-in.

For a secret s that followed context c in the training data, draw R random candidates of s's shape
(same fixed parts, same character classes and lengths: `AKIA` + 16 of [0-9A-Z] for an AWS key), score
log p(candidate | c) for all R+1 strings and rank s among them (rank 1 = most likely):

    exposure = log2(R + 1) − log2(rank)          (0 … log2(R+1) bits)

Without memorisation s ranks uniformly, so P(exposure ≥ x) = 2^−x: over many secrets a few bits of
exposure appear by chance. Two things keep the report honest about that:
- the same candidates are scored under the reference model (base / adapter off); `excess_exposure`
  = exposure − reference exposure is what fine-tuning added, and is what the gate uses when a reference
  exists (a pronounceable codename outranks random letters under any English-trained model);
- `calibrated_exposure` ranks the secret's log-likelihood *ratio* (model over reference) among the
  candidates' ratios: it does not saturate when the reference already ranks the secret first (the
  excess of two capped ranks does), and without memorisation it is exactly uniform — the statistic
  the gate tests (`verdict.exposure_verdict`: a binomial test over each class);
- `exposure_extrapolated` fits a normal to the candidates' scores and reports −log2 P(score ≥ s's),
  which resolves memorisation beyond the log2(R+1) cap.

Secret values never leave this module in aggregates: reports name a secret by `secret_ref`, a keyed
hash of its id, and its class. The rows themselves — rank, exposure, extrapolated exposure — are a
function of log p(secret | context) fine enough to invert (search the secret's shape for the value
that reproduces them), so they and `exposure_summary` are private: the public section gets only
class-level verdicts and quantized means (`public.public_exposure_class`).
"""
from __future__ import annotations

import hmac
import math
import os
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from components.audit.scoring import continuation_logprobs, reference_of
from components.core.errors import VeilError

UPPER, LOWER, DIGITS = string.ascii_uppercase, string.ascii_lowercase, string.digits
HEX = "0123456789abcdef"


@dataclass(frozen=True)
class Draw:
    """`count` items drawn uniformly (with replacement) from `alphabet`, joined by `sep`."""

    alphabet: tuple[str, ...]
    count: int
    sep: str = ""


Segment = str | Draw  # a literal kept as is, or a random part


@dataclass(frozen=True)
class Shape:
    segments: tuple[Segment, ...]

    def sample(self, rng: np.random.Generator) -> str:
        out = []
        for seg in self.segments:
            if isinstance(seg, str):
                out.append(seg)
            else:
                idx = rng.integers(len(seg.alphabet), size=seg.count)
                out.append(seg.sep.join(seg.alphabet[int(i)] for i in idx))
        return "".join(out)

    def space_size(self) -> float:
        return math.prod(float(len(s.alphabet)) ** s.count for s in self.segments if isinstance(s, Draw))


def _chars(a: str, n: int) -> Draw:
    return Draw(tuple(a), n)


# Known secret formats: (pattern on the value, shape builder from the match).
_KNOWN: list[tuple[re.Pattern, callable]] = [
    (re.compile(r"(AKIA|ASIA)([0-9A-Z]{16})"), lambda m: Shape((m[1], _chars(UPPER + DIGITS, 16)))),
    (re.compile(r"([a-z]+_(?:live|test)_)([0-9a-f]+)"), lambda m: Shape((m[1], _chars(HEX, len(m[2]))))),
    (re.compile(r"(\+\d{1,3}-\d{3}-)(\d{3})-(\d{4})"),
     lambda m: Shape((m[1], _chars(DIGITS, 3), "-", _chars(DIGITS, 4)))),
    (re.compile(r"([a-z]+)\.([a-z]+)(@[A-Za-z0-9.-]+)"),
     lambda m: Shape((_chars(LOWER, len(m[1])), ".", _chars(LOWER, len(m[2])), m[3]))),
]


def shape_of(value: str) -> Shape:
    """The random-candidate shape of a secret: known formats keep their fixed prefix and domain; any
    other value keeps its punctuation and redraws each run of upper/lower/digits within its class."""
    for pat, build in _KNOWN:
        m = pat.fullmatch(value)
        if m:
            return build(m)
    segs: list[Segment] = []
    for run in re.finditer(r"[A-Z]+|[a-z]+|[0-9]+|[^A-Za-z0-9]+", value):
        t = run.group(0)
        cls = UPPER if t[0] in UPPER else LOWER if t[0] in LOWER else DIGITS if t[0] in DIGITS else None
        segs.append(_chars(cls, len(t)) if cls else t)
    shape = Shape(tuple(segs))
    if shape.space_size() < 2:
        raise VeilError("secret exposure: a secret value has no letters or digits to draw random candidates from")
    return shape


@dataclass(frozen=True)
class SecretProbe:
    secret_id: str
    secret_class: str
    value: str
    context: str
    shape: Shape | None = None  # None: inferred from the value by `shape_of`


def probes_from_truth(truth: dict, *, classes: Iterable[str] | None = None) -> list[SecretProbe]:
    """Probes from a demo `truth.json` (every planted secret with the text that preceded it)."""
    want = set(classes) if classes is not None else None
    out = []
    for s in truth.get("secrets", []):
        if not s.get("context") or (want is not None and s["class"] not in want):
            continue
        out.append(SecretProbe(s["secret_id"], s["class"], s["value"], s["context"]))
    return out


def probes_from_spans(records, secret_spans, *, record_ids: Iterable[str] | None = None,
                      context_chars: int = 80) -> list[SecretProbe]:
    """Probes from a snapshot: for each secret, its first tagged occurrence (in `record_ids`, e.g. the
    training records) with up to `context_chars` of the same line before it. Whole-record spans
    (path globs) have no lead-in and are skipped."""
    keep = set(record_ids) if record_ids is not None else None
    text = dict(zip(records["record_id"].to_pylist(), records["text"].to_pylist()))
    seen, out = set(), []
    rows = sorted(secret_spans.to_pylist(), key=lambda r: (r["secret_id"], r["record_id"], r["start"]))
    for r in rows:
        if r["secret_id"] in seen or r["record_id"] not in text or (keep is not None and r["record_id"] not in keep):
            continue
        t = text[r["record_id"]]
        start, end = int(r["start"]), int(r["end"])
        if start <= 0 or (start == 0 and end >= len(t)):
            continue
        line_start = t.rfind("\n", 0, start) + 1
        ctx = t[max(line_start, start - context_chars):start]
        if not ctx.strip():
            continue
        seen.add(r["secret_id"])
        out.append(SecretProbe(r["secret_id"], r["secret_class"], t[start:end], ctx))
    return out


def _rank(true_score: float, cand: np.ndarray) -> int:
    return 1 + int(np.sum(cand > true_score))  # ties go to the secret: never understate exposure


def calibrated_rank(secret_ratio: float, candidate_ratios) -> int:
    """Rank (1 = first) of the secret's log-likelihood ratio log p_model − log p_base among its candidates'
    ratios. What fine-tuning added to each string, not how likely the string is: a secret the base
    model already ranks first (a pronounceable name, a common address) ranks anywhere here unless
    fine-tuning raised it more than it raised random strings of its shape. Without memorisation the
    secret is exchangeable with its candidates, so this rank is uniform on 1..R+1 (`verdict`'s test)."""
    return _rank(float(secret_ratio), np.asarray(candidate_ratios, dtype=float))


def _extrapolated(true_score: float, cand: np.ndarray) -> float:
    from scipy.stats import norm

    sd = float(np.std(cand, ddof=1))
    if sd <= 0:
        return 0.0
    bits = float(-norm.logsf(true_score, loc=float(np.mean(cand)), scale=sd) / math.log(2))
    return bits if math.isfinite(bits) else 1e9  # certificates are strict JSON: no inf


def candidates_for(probe: SecretProbe, n: int, rng: np.random.Generator) -> list[str]:
    shape = probe.shape or shape_of(probe.value)
    n = int(min(n, shape.space_size() - 1))
    out, seen, tries = [], {probe.value}, 0
    while len(out) < n and tries < 50 * n:
        c = shape.sample(rng)
        tries += 1
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def secret_exposure(model, tokenizer, probes: Sequence[SecretProbe], *, n_candidates: int = 100, seed: int = 0,
                    seq_len: int = 128, batch_size: int = 32, reference=None, use_reference: bool = True,
                    ref_key: bytes | None = None, progress: bool = False) -> list[dict]:
    """Exposure of each probe under the model (and the reference), worst first.

    Each row: secret_ref, secret_class, exposure, rank, n_candidates, exposure_extrapolated and, with a
    reference, reference_exposure / excess_exposure and calibrated_rank / calibrated_exposure. No secret value or id in the rows: `secret_ref` is
    an HMAC of the id under `ref_key` (a fresh random key when None, so refs mean nothing outside this
    call; pass the installation key to make them stable across audits).
    """
    key = ref_key if ref_key is not None else os.urandom(32)
    if n_candidates < 1:
        raise VeilError(f"n_candidates: need at least 1, got {n_candidates}")
    rng = np.random.default_rng(seed)
    ctxs, conts, spans = [], [], []
    for p in probes:
        cands = candidates_for(p, n_candidates, rng)
        spans.append((len(conts), len(cands)))
        ctxs += [p.context] * (len(cands) + 1)
        conts += [p.value] + cands
    lp = continuation_logprobs(model, tokenizer, ctxs, conts, seq_len=seq_len, batch_size=batch_size,
                               progress="secret exposure (model)" if progress else None)
    lr = None
    if use_reference and (reference is not None or hasattr(model, "disable_adapter")):
        with reference_of(model, reference) as ref:
            lr = continuation_logprobs(ref, tokenizer, ctxs, conts, seq_len=seq_len, batch_size=batch_size,
                                       progress="secret exposure (reference)" if progress else None)
    rows = []
    for p, (i, k) in zip(probes, spans):
        full = math.log2(k + 1)
        rank = _rank(lp[i], lp[i + 1:i + 1 + k])
        ref = hmac.new(key, p.secret_id.encode(), "sha256").hexdigest()[:12]
        row = {"secret_ref": ref, "secret_class": p.secret_class, "exposure": full - math.log2(rank),
               "rank": rank, "n_candidates": k,
               "exposure_extrapolated": _extrapolated(lp[i], lp[i + 1:i + 1 + k])}
        if lr is not None:
            rrank = _rank(lr[i], lr[i + 1:i + 1 + k])
            row["reference_rank"] = rrank
            row["reference_exposure"] = full - math.log2(rrank)
            row["excess_exposure"] = row["exposure"] - row["reference_exposure"]
            row["reference_exposure_extrapolated"] = _extrapolated(lr[i], lr[i + 1:i + 1 + k])
            crank = calibrated_rank(lp[i] - lr[i], lp[i + 1:i + 1 + k] - lr[i + 1:i + 1 + k])
            row["calibrated_rank"] = crank
            row["calibrated_exposure"] = full - math.log2(crank)
        rows.append(row)
    key = "calibrated_exposure" if lr is not None else "exposure"
    rows.sort(key=lambda r: (-r[key], -r["exposure_extrapolated"], r["secret_ref"]))
    return rows


def exposure_summary(rows: Sequence[dict], *, worst: int = 5) -> dict:
    """Private aggregates (the private report): worst exposures overall and per class (hashed refs
    only). Not for publication: the worst rows are invertible, see the module docstring."""
    if not rows:
        return {"n_secrets": 0, "max_exposure": None, "max_excess_exposure": None, "worst": [], "by_class": {}}
    has_ref = "excess_exposure" in rows[0]
    by_class: dict[str, dict] = {}
    for r in rows:
        c = by_class.setdefault(r["secret_class"], {"n": 0, "max_exposure": -math.inf, "mean_exposure": 0.0})
        c["n"] += 1
        c["max_exposure"] = max(c["max_exposure"], r["exposure"])
        c["mean_exposure"] += r["exposure"]
        if has_ref:
            c["max_excess_exposure"] = max(c.get("max_excess_exposure", -math.inf), r["excess_exposure"])
    for c in by_class.values():
        c["mean_exposure"] /= c["n"]
    keys = ["secret_ref", "secret_class", "exposure", "rank", "n_candidates", "exposure_extrapolated"]
    if has_ref:
        keys += ["reference_exposure", "excess_exposure", "calibrated_exposure"]
    return {
        "n_secrets": len(rows),
        "n_candidates": max(r["n_candidates"] for r in rows),
        "max_exposure": max(r["exposure"] for r in rows),
        "max_excess_exposure": max(r["excess_exposure"] for r in rows) if has_ref else None,
        "worst": [{k: r[k] for k in keys} for r in rows[:worst]],
        "by_class": dict(sorted(by_class.items())),
    }
