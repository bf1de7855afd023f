"""The canary echo audit of a synthetic corpus ("The Canary's Echo", Meeus et al., ICML 2025).

What is released is the corpus, not the model, so the audit reads the corpus alone. Echo canaries
(`canaries.make_canary_users(prefixes=…)`) are synthetic users whose every record is a public
in-distribution opening followed by the same random suffix of words; the plan trains half of them and
holds the other half out (`draws.audit_split.split_canaries`, a keyed order over canary ids). For each
canary, two statistics of the corpus and the canary's suffix:

- `echo`: the longest run of consecutive suffix words that occurs, in order and contiguous, in some
  synthetic record, as a fraction of the suffix (0 … 1): how much of the canary the corpus echoes;
- `bigram`: the mean log-probability of the suffix's word bigrams under an add-one bigram model of the
  corpus — the paper's strongest attack that sees only synthetic text (its 2-gram "membership
  inference from synthetic data"); continuous, so it ranks canaries the run length leaves tied.

Membership test: AUROC of each statistic, trained vs held-out canaries, with the model audit's
interval and rule (`user_inference.user_inference_report`: Newcombe intervals simultaneous over both
statistics, the certificate's ceiling, the empirical ε bound) → passed / failed / inconclusive with the
people needed. Why this is valid: docs/privacy/synthetic-echo.md.

Words are maximal runs of letters and digits, lower-cased: the tokenizer's spacing does not matter.
Suffixes are private (they are the canaries' secrets): rows carry the canary's id, never its suffix.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from components.audit import public as pub
from components.audit.canaries import VOCAB, canary_substring
from components.audit.ceiling import certificate_ceilings
from components.audit.metrics import auroc
from components.audit.user_inference import user_inference_report
from components.audit.verdict import FAILED, INCONCLUSIVE, PASSED
from components.core.errors import VeilError

_WORD = re.compile(r"[^\W_]+")
ALPHA = 1.0           # add-one smoothing of the bigram model (the paper's choice)
STATISTICS = ("bigram", "echo")
SECTION_SCHEMA = "veil.audit.synthetic-echo/v1"
COVERAGE_NOTE = ("Not covered by the certificate: measured on the plan's private canary split; published only as "
                 "verdicts and coarsely quantized aggregates (one canary moves a published value with probability "
                 "<= 10 %; a value no grid can hold to that is not published).")
# How many Δ one canary moves an end of the AUROC's interval (the model audit's bound: `public.INTERVAL_SPREAD`).
INTERVAL_SPREAD = pub.INTERVAL_SPREAD


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class EchoCanary:
    user_id: str
    suffix: tuple[str, ...]     # private: the canary's secret words
    member: bool

    def __repr__(self) -> str:  # never print a suffix by accident
        return f"EchoCanary({self.user_id!r}, <{len(self.suffix)} words>, member={self.member})"


def echo_canaries(canary_records: pa.Table, held_out: Iterable[str]) -> list[EchoCanary]:
    """One canary per canary user of the plan's canary records file (their substring in `metadata`);
    a member unless its id is among `held_out` (the annex's held-out users)."""
    out = set(held_out)
    seen: dict[str, tuple[str, ...]] = {}
    for u, md in zip(canary_records["user_id"].to_pylist(), canary_records["metadata"].to_pylist()):
        s = canary_substring(md)
        if s is None:
            continue
        w = tuple(words(s))
        if seen.setdefault(u, w) != w:
            raise VeilError("canary records: a canary user's records carry different substrings")
    if not seen:
        raise VeilError("the plan's canary records carry no canary substrings")
    return [EchoCanary(u, w, u not in out) for u, w in sorted(seen.items())]


def _counts(texts: Iterable[str], suffixes: Sequence[tuple[str, ...]]):
    """One pass over the corpus: which suffix n-grams occur, and the counts the bigram model needs."""
    grams = {s[i:j] for s in suffixes for i in range(len(s)) for j in range(i + 1, len(s) + 1)}
    pairs = {s[i:i + 2] for s in suffixes for i in range(len(s) - 1)}
    lefts = {p[0] for p in pairs}
    found: set[tuple[str, ...]] = set()
    big: Counter = Counter()
    left: Counter = Counter()
    vocab: set[str] = set()
    longest = max((len(s) for s in suffixes), default=0)
    for t in texts:
        w = words(t)
        vocab.update(w)
        for i, a in enumerate(w):
            if i + 1 < len(w):
                if a in lefts:
                    left[a] += 1
                    if (a, w[i + 1]) in pairs:
                        big[(a, w[i + 1])] += 1
            # the sub-n-grams of the suffixes are closed under prefixes: stop at the first miss
            j = i + 1
            while j <= min(len(w), i + longest) and tuple(w[i:j]) in grams:
                found.add(tuple(w[i:j]))
                j += 1
    # the smoothing's vocabulary: the corpus' words and the public word list suffixes are drawn from —
    # never the other canaries' words, so a canary's score is a function of the corpus and its own suffix
    # alone (one canary added or removed moves no other canary's score; echo_scores adds a canary's own
    # words outside this set)
    vocab.update(VOCAB)
    return found, big, left, vocab


def echo_scores(texts: Sequence[str], canaries: Sequence[EchoCanary], *, alpha: float = ALPHA) -> list[dict]:
    """Per canary: user_id, member, suffix_words, echoed_words (longest contiguous run of the suffix found
    in one record), echo (that over the suffix's length), bigrams_found (suffix bigrams that occur in the
    corpus) and bigram (mean log P(w_i | w_{i−1}) of the suffix under the corpus' add-alpha bigram model,
    vocabulary: the corpus' words, the public word list `canaries.VOCAB` and the canary's own words).
    Each row depends on the corpus and that canary's suffix only. Private rows: exact values of the canaries' secrets against a public corpus."""
    if not texts:
        raise VeilError("echo audit: the corpus has no records")
    if not canaries:
        raise VeilError("echo audit: no canaries")
    found, big, left, vocab = _counts(texts, [c.suffix for c in canaries])
    rows = []
    for c in canaries:
        s, n = c.suffix, len(c.suffix)
        v = len(vocab) + len(set(s) - vocab)
        run = max((j - i for i in range(n) for j in range(i + 1, n + 1) if s[i:j] in found), default=0)
        pairs = [s[i:i + 2] for i in range(n - 1)]
        lp = [math.log((big[p] + alpha) / (left[p[0]] + alpha * v)) for p in pairs]
        rows.append({"user_id": c.user_id, "member": c.member, "suffix_words": n, "echoed_words": run,
                     "echo": run / n if n else 0.0, "bigrams_found": sum(1 for p in pairs if big[p]),
                     "bigram": float(np.mean(lp)) if lp else 0.0})
    return rows


def echo_audit(texts: Sequence[str], canaries: Sequence[EchoCanary], certificate: dict | None, *,
               threshold: float | None = None, bootstrap: int = 100, seed: int = 0) -> dict:
    """The private report: per-canary rows, the membership test on both statistics and the verdict.

    The verdict is the model audit's rule on the bigram statistic's AUROC with the echo statistic's
    AUROC as a second estimate, both inside one simultaneous 95 % family (Bonferroni): failed when an
    interval lies above the certificate's ceiling (or `threshold`), or the empirical ε bound exceeds
    the certified ε; passed when every interval lies below; inconclusive otherwise, with people needed."""
    rows = echo_scores(texts, canaries)
    y = np.array([r["member"] for r in rows], dtype=bool)
    n_in, n_out = int(y.sum()), int((~y).sum())
    cert = dict(certificate or {})
    eps = delta = None
    if cert.get("privacy_unit") == "user" and cert.get("epsilon") is not None:
        eps, delta = float(cert["epsilon"]), float(cert["delta"])
    means = {g: {k: (float(np.mean([r[k] for r, m in zip(rows, y) if m == want])) if (y == want).any() else None)
                 for k in ("echo", "echoed_words", "bigrams_found", "bigram")}
             for g, want in (("members", True), ("held_out", False))}
    out = {"canaries": len(rows), "users_in": n_in, "users_out": n_out, "rows": rows, "means": means,
           "epsilon": eps, "delta": delta, "threshold": threshold}
    if not n_in or not n_out:
        out.update(verdict=INCONCLUSIVE, why="the plan's canaries are all trained or all held out")
        return out
    table = pa.table({"user_id": [r["user_id"] for r in rows], "member": y.tolist(),
                      "score": [r["bigram"] for r in rows]})
    echo_curve = {"m": "echo", "auroc": auroc(np.array([r["echo"] for r in rows]), y),
                  "users_in": n_in, "users_out": n_out}
    ceilings = certificate_ceilings(cert) if eps is not None else {"auroc_ceiling_pld": None}
    rep = user_inference_report(table, eps, delta, bootstrap=bootstrap, seed=seed, max_auroc=threshold,
                                auroc_ceiling_pld=ceilings["auroc_ceiling_pld"], by_m=[echo_curve])
    out.update(report=rep, verdict=rep["verdict"] or INCONCLUSIVE, auroc={"bigram": rep["auroc"],
                                                                            "echo": echo_curve["auroc"]})
    return out


def public_section(private: dict, *, corpus: dict, model: dict) -> dict:
    """What may leave: verdicts, count buckets, the AUROCs and each group's mean echo fraction on a grid,
    the intervals on a grid of their own, the certificate's ceilings, people needed on the 1-2-5 ladder.

    Neighbouring: one canary added, removed or replaced (its suffix, its label, or whether the corpus echoes
    it). Each canary's statistics depend on the corpus and its own suffix only (`echo_scores`), so one canary
    moves a Mann–Whitney AUROC or a group's mean echo fraction (in [0, 1]) by at most Δ = 1/(n − 1), n the
    smaller group's public lower end, and an interval's ends by at most INTERVAL_SPREAD·Δ. Each is published
    on the finest grid w with (its spread)·Δ/w ≤ 10 % (`public.strict_auroc_grid`) — or not at all when no
    grid qualifies (the smaller group under 30 canaries for the point, under 50 for the interval). People needed is
    computed from published values only (the AUROC bucket's midpoint, or 1/2 when none is published, and
    the count buckets' lower ends), so it moves only when they do. Checked by
    tests/privacy/test_echo_public_leak.py."""
    n_in, n_out = private["users_in"], private["users_out"]
    sec = {"schema": SECTION_SCHEMA, "verdict": private["verdict"], "passed": private["verdict"] == PASSED,
           "covered_by_certificate": False, "coverage_note": COVERAGE_NOTE,
           "corpus": corpus, "model": model,
           "canaries_in": pub.count_bucket(n_in), "canaries_out": pub.count_bucket(n_out),
           "epsilon": private["epsilon"], "delta": private["delta"], "threshold": private["threshold"],
           "statistics": {"bigram": "mean log P(w_i | w_{i-1}) of the canary's suffix under an add-one word bigram "
                                    "model of the corpus (Meeus et al. 2025)",
                          "echo": "longest run of the suffix's words found contiguous in one synthetic record, "
                                  "over the suffix's length"},
           "reasons": []}
    rep = private.get("report")
    if rep is None:
        sec.update(auroc=None, auroc_interval=None, auroc_grid=None, interval_grid=None, echo_auroc=None,
                   auroc_ceiling=None, auroc_ceiling_pld=None, mean_echo=None, people_needed=None)
        sec["reasons"].append(f"echo audit: INCONCLUSIVE — {private.get('why')}")
        return sec
    w = pub.strict_auroc_grid(n_in, n_out)
    wi = pub.strict_auroc_grid(n_in, n_out, INTERVAL_SPREAD)
    by = {c["m"]: c for c in rep["curves"]}
    ec = by.get("echo")
    ceiling = rep["binding_ceiling"]
    sec.update(auroc=None if w is None else pub.bucket(rep["auroc"], w),
               auroc_interval=None if wi is None else pub.outward(rep["auroc_interval"], wi),
               auroc_grid=w, interval_grid=wi,
               echo_auroc=None if ec is None else {
                   "auroc": None if w is None else pub.bucket(ec["auroc"], w),
                   "auroc_interval": None if wi is None else pub.outward(ec["interval"], wi),
                   "verdict": ec["verdict"]},
               auroc_ceiling=rep["auroc_ceiling"] if rep.get("epsilon") is not None else None,
               auroc_ceiling_pld=rep["auroc_ceiling_pld"], binding_ceiling=ceiling,
               confidence=rep["confidence"],
               mean_echo=None if w is None else {g: pub.bucket(private["means"][g]["echo"], w)
                                                 for g in ("members", "held_out")},
               empirical_epsilon_exceeds_certified=bool(rep["epsilon_lower_bound_exceeds"]),
               above_ceiling=bool(rep["above_ceiling"]), people_needed=None)
    if w is None:
        sec["reasons"].append("echo audit: too few canaries for a public AUROC (one canary would move its coarsest "
                              "bucket more than 10 % of the time): verdicts and counts only")
    if private["verdict"] == INCONCLUSIVE:
        # from published values only: the bucket's midpoint (1/2, an audit that finds nothing, without one)
        # and the count buckets' lower ends — never the exact Â or group sizes
        sec["people_needed"], sec["people_needed_basis"] = pub.published_people_needed(
            sec["auroc"], sec["canaries_in"], sec["canaries_out"], rep["z"], threshold=private["threshold"],
            ceiling=ceiling)
    for c in rep["curves"]:
        what = "echo" if c["m"] == "echo" else "bigram"
        if c["above_ceiling"]:
            sec["reasons"].append(f"echo audit ({what}): the {rep['confidence']:.0%} interval of AUROC lies above the "
                                  f"certified ceiling {rep['binding_ceiling']:.3f}: THE CERTIFICATE OR THE CODE IS "
                                  "WRONG; do not release the corpus")
        elif c["verdict"] == FAILED:
            sec["reasons"].append(f"echo audit ({what}): the {rep['confidence']:.0%} interval of AUROC lies above the "
                                  f"policy's maximum {rep['threshold']:g}")
    if rep["epsilon_lower_bound_exceeds"]:
        sec["reasons"].append(f"echo audit: the attack's ROC forces (95 %) an ε above the certified {rep['epsilon']:g}: "
                              "THE CERTIFICATE OR THE CODE IS WRONG; do not release the corpus")
    if private["verdict"] == INCONCLUSIVE:
        need = sec["people_needed"]
        need_s = f"about {need['in']} trained and {need['out']} held-out canaries" if isinstance(need, dict) else str(need)
        sec["reasons"].append(f"echo audit: INCONCLUSIVE — too few canaries to decide "
                              f"({sec['canaries_in'][0]}+ trained, {sec['canaries_out'][0]}+ held out); needs "
                              f"{need_s} (audit.canaries.users)")
    return sec


def private_json(private: dict) -> bytes:
    return json.dumps(private, indent=2, sort_keys=True, allow_nan=False, default=float).encode()
