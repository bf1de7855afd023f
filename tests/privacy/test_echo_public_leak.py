"""One canary moves the echo audit's public section no more than its coarsening allows (issue 25).

The echo audit (components/audit/echo.py, `veil audit-synthetic`) runs on the plan's private canaries —
their suffixes and which of them were trained — so its public section is not covered by the certificate.
As for the model audit (tests/privacy/test_audit_public_leak.py), it may carry verdicts and coarse
aggregates only. Neighbouring worlds here: one canary added or removed (trained or held out), or one
record of the corpus echoing a canary or not. Checked:

- a canary's statistics are a function of the corpus and its own suffix (the bigram model's vocabulary
  once counted every canary's words, so one canary moved every other canary's score);
- one canary moves each AUROC and each group's mean echo fraction by at most Δ = 1/(n − 1) and the
  intervals' ends by at most INTERVAL_SPREAD·Δ (n: the smaller group's public lower end), so each
  published bucket moves by at most one step, and rarely;
- the interval's spread bound itself, on a sweep of Â and group sizes;
- too few canaries for any grid: no AUROC, interval or mean is published, and people needed is a
  function of the published buckets (two worlds with the same buckets publish the same section);
- no canary id, suffix or exact private value is in the section.
"""
import json
import math

import numpy as np
import pytest

from components.audit import public as pub
from components.audit.canaries import VOCAB
from components.audit.echo import INTERVAL_SPREAD, EchoCanary, echo_audit, echo_scores, public_section
from components.audit.verdict import auroc_interval, z_value
from _published import newcombe_ends, published_numbers

CERT = {"privacy_unit": "user", "epsilon": 2.0, "delta": 1e-5}
META = {"corpus": {"certificate_sha256": "c" * 64, "records": 200}, "model": {"name": "m", "version": "1"}}


def _world(rng, n_in, n_out, *, echo_p=0.5, records=120):
    """Canaries with 8-word suffixes from the public word list; a member is echoed (a run of 3–8 of its words
    in one record) with probability `echo_p`; held-out canaries are never trained, so never echoed."""
    canaries = [EchoCanary(f"canary-{i:03d}@canary.veil.invalid",
                           tuple(VOCAB[j] for j in rng.choice(len(VOCAB), 8, replace=False)), i < n_in)
                for i in range(n_in + n_out)]
    texts = [" ".join(VOCAB[j] for j in rng.integers(len(VOCAB), size=12)) for _ in range(records)]
    for c in canaries:
        if c.member and rng.random() < echo_p:
            k = int(rng.integers(3, 9))
            texts.append("  * Fix build with " + " ".join(c.suffix[:k]))
    return texts, canaries


def _fresh(rng, i, member):
    return EchoCanary(f"fresh-{i:03d}@canary.veil.invalid",
                      tuple(VOCAB[j] for j in rng.choice(len(VOCAB), 8, replace=False)), member)


def _audit(texts, canaries):
    return echo_audit(texts, canaries, CERT, bootstrap=2)


def test_a_canary_score_depends_on_its_suffix_and_the_corpus_only():
    rng = np.random.default_rng(0)
    texts, canaries = _world(rng, 10, 10)
    before = {r["user_id"]: r for r in echo_scores(texts, canaries)}
    # words in no other canary and not in the corpus — even words outside the public list
    odd = EchoCanary("odd@canary.veil.invalid", ("zqx", "vvkk", "plorb", "wuzz", "qqa", "xyzzy", "frob", "glim"), True)
    after = {r["user_id"]: r for r in echo_scores(texts, canaries + [odd])}
    assert all(after[u] == before[u] for u in before)
    alone = {r["user_id"]: r for r in echo_scores(texts, [canaries[3]])}
    assert alone[canaries[3].user_id] == before[canaries[3].user_id]


def _neighbours(rng, texts, canaries):
    """Canary sets one canary away, the corpus fixed: 20 canaries removed (one at a time); fresh canaries added (trained or
    held out); one canary replaced by one the corpus echoes whole (its suffix is a record's) or by a fresh one
    it does not echo — "one record echoing vs not" for that canary."""
    out = [canaries[:i] + canaries[i + 1:] for i in rng.permutation(len(canaries))[:20].tolist()]
    out += [canaries + [_fresh(rng, i, bool(i % 2))] for i in range(6)]
    echoed = tuple(w for w in texts[-1].split()[4:])
    for i in rng.permutation(len(canaries))[:8]:
        i = int(i)
        c = canaries[i]
        other = EchoCanary(c.user_id, echoed if rng.random() < 0.5 else _fresh(rng, i, c.member).suffix, c.member)
        out.append(canaries[:i] + [other] + canaries[i + 1:])
    return out


def _exact(rep):
    """The private values each published bucket is drawn from."""
    r = rep["report"]
    echo = next(c for c in r["curves"] if c["m"] == "echo")
    return {"auroc": r["auroc"], "echo_auroc": echo["auroc"], "mean_members": rep["means"]["members"]["echo"],
            "mean_held_out": rep["means"]["held_out"]["echo"],
            "interval": list(r["auroc_interval"]) + list(echo["interval"])}


def _index(b, w):
    return None if b is None else round(b[0] / w)


def test_one_canary_moves_each_published_value_by_at_most_one_bucket():
    rng = np.random.default_rng(30)
    n_in, n_out = 30, 45
    moved = total = 0
    for world in range(3):
        texts, canaries = _world(rng, n_in, n_out)
        rep = _audit(texts, canaries)
        sec = public_section(rep, **META)
        x = _exact(rep)
        for c2 in _neighbours(rng, texts, canaries):
            rep2 = _audit(texts, c2)
            sec2 = public_section(rep2, **META)
            y = _exact(rep2)
            n = min(sec["canaries_in"][0], sec["canaries_out"][0], sec2["canaries_in"][0], sec2["canaries_out"][0])
            d = 1 / (n - 1)
            for k in ("auroc", "echo_auroc", "mean_members", "mean_held_out"):
                assert abs(x[k] - y[k]) <= d + 1e-12, (k, x[k], y[k], d)
            assert max(abs(a - b) for a, b in zip(x["interval"], y["interval"])) <= INTERVAL_SPREAD * d + 1e-9
            for k in ("canaries_in", "canaries_out"):
                assert abs(sec[k][0] - sec2[k][0]) <= pub.COUNT_GRID
            w, wi = sec["auroc_grid"], sec["interval_grid"]
            n_own = min(sec["canaries_in"][0], sec["canaries_out"][0])
            assert w is not None and 1 / (n_own - 1) / w <= pub.MOVE_PROBABILITY + 1e-12
            if sec2["auroc_grid"] != w or sec2["interval_grid"] != wi:
                continue      # a count crossed a bucket edge: the grid itself changed (public)
            pairs = [(sec["auroc"], sec2["auroc"], w), (sec["echo_auroc"]["auroc"], sec2["echo_auroc"]["auroc"], w),
                     (sec["mean_echo"]["members"], sec2["mean_echo"]["members"], w),
                     (sec["mean_echo"]["held_out"], sec2["mean_echo"]["held_out"], w)]
            if wi is not None:
                pairs += [([a, a], [b, b], wi) for a, b in zip(sec["auroc_interval"] + sec["echo_auroc"]["auroc_interval"],
                                                              sec2["auroc_interval"] + sec2["echo_auroc"]["auroc_interval"])]
            for a, b, g in pairs:
                assert abs(_index(a, g) - _index(b, g)) <= 1, (a, b, g)
            total += 4
            moved += sum(a != b for a, b, _ in pairs[:4])
    # the rule: a value sitting anywhere in its bucket moves with probability <= Δ/w <= 10 %
    assert moved <= pub.MOVE_PROBABILITY * total, (moved, total)


def test_one_record_more_in_the_corpus():
    """The other neighbour: the corpus (a DP release, public) gains one record echoing one canary. That
    canary's statistics change; every other canary's echo is unchanged and its bigram score shifts only
    through the corpus' counts (a left word's count, the vocabulary's size: small shifts), so the echo AUROC
    and means move by at most Δ and the bigram AUROC by Δ plus what those shifts reorder — here at most
    half a Δ more; the bucket by at most one step. (The corpus' own change is the certificate's to bound.)"""
    rng = np.random.default_rng(5)
    texts, canaries = _world(rng, 40, 40)
    rep = _audit(texts, canaries)
    rows = {r["user_id"]: r for r in rep["rows"]}
    sec = public_section(rep, **META)
    d = 1 / (min(sec["canaries_in"][0], sec["canaries_out"][0]) - 1)
    for i in range(0, len(canaries), 5):
        c = canaries[i]
        rep2 = _audit(texts + ["  * Update the " + " ".join(c.suffix)], canaries)
        rows2 = {r["user_id"]: r for r in rep2["rows"]}
        assert rows2[c.user_id]["echo"] == 1.0
        for u, r in rows.items():
            if u != c.user_id:
                assert rows2[u]["echo"] == r["echo"]
        x, y = _exact(rep), _exact(rep2)
        for k in ("echo_auroc", "mean_members", "mean_held_out"):
            assert abs(x[k] - y[k]) <= d + 1e-12, k
        assert abs(x["auroc"] - y["auroc"]) <= 1.5 * d
        sec2 = public_section(rep2, **META)
        assert abs(_index(sec["auroc"], sec["auroc_grid"]) - _index(sec2["auroc"], sec["auroc_grid"])) <= 1


def test_the_interval_ends_move_at_most_interval_spread_deltas():
    z = z_value(0.95, 2)
    a = np.linspace(0.0, 1.0, 4001)
    for probe in (0.0, 0.37, 0.93, 1.0):              # the vectorised ends are the audit's
        lo, hi = auroc_interval(probe, 21, 30, z)
        vlo, vhi = newcombe_ends(np.array([probe]), 21, 30, z)
        assert vlo[0] == pytest.approx(lo, abs=1e-9) and vhi[0] == pytest.approx(hi, abs=1e-9)
    for m in (20, 21, 41, 101, 201):
        lo0, hi0 = newcombe_ends(a, m, m, z)
        worst = 0.0
        for dn_in, dn_out in ((1, 0), (-1, 0), (0, 1), (0, -1), (0, 0)):
            step = 1 / min(m + dn_in, m + dn_out)      # how far one canary moves Â at these sizes
            for sign in (-1, 1):
                lo1, hi1 = newcombe_ends(np.clip(a + sign * step, 0, 1), m + dn_in, m + dn_out, z)
                worst = max(worst, float(np.max(np.abs(lo1 - lo0))), float(np.max(np.abs(hi1 - hi0))))
        assert worst * (m - 1) <= INTERVAL_SPREAD, (m, worst * (m - 1))


def test_too_few_canaries_publish_verdicts_and_counts_only():
    """12 + 12 canaries: Δ = 1/9, and even the 0.5 grid would move with probability 22 %: no AUROC, interval or
    mean echo. Two worlds with the same count buckets and verdict publish the same section."""
    rng = np.random.default_rng(7)
    secs = []
    for echo_p in (0.3, 0.9):
        texts, canaries = _world(rng, 12, 12, echo_p=echo_p)
        rep = _audit(texts, canaries)
        secs.append(public_section(rep, **META))
        assert rep["auroc"]["bigram"] != 0.5
    for s in secs:
        assert s["auroc"] is s["auroc_interval"] is s["mean_echo"] is s["auroc_grid"] is s["interval_grid"] is None
        assert s["echo_auroc"]["auroc"] is None and s["echo_auroc"]["auroc_interval"] is None
        assert any("too few canaries for a public AUROC" in r for r in s["reasons"])
    if secs[0]["verdict"] == secs[1]["verdict"]:
        a, b = (json.dumps(s, sort_keys=True) for s in secs)
        assert a == b


def test_people_needed_is_a_function_of_published_values():
    """Two inconclusive worlds whose exact AUROCs differ inside one published bucket publish the same
    people needed (it was computed from the exact Â and group sizes)."""
    rng = np.random.default_rng(3)
    seen = {}
    for _ in range(40):
        texts, canaries = _world(rng, 30, 34, echo_p=float(rng.uniform(0.0, 0.3)))
        rep = echo_audit(texts, canaries, {"privacy_unit": "user", "epsilon": 1.0, "delta": 1e-5}, bootstrap=2)
        s = public_section(rep, **META)
        if s["verdict"] != "inconclusive":
            continue
        key = json.dumps([s["auroc"], s["canaries_in"], s["canaries_out"]])
        seen.setdefault(key, set()).add((json.dumps(s["people_needed"]), round(rep["auroc"]["bigram"], 12)))
    pairs = [v for v in seen.values() if len({a for _, a in v}) > 1]
    assert pairs, "no two inconclusive worlds shared a bucket"
    assert all(len({p for p, _ in v}) == 1 for v in seen.values())


def test_no_id_suffix_or_exact_private_value_is_published():
    rng = np.random.default_rng(11)
    texts, canaries = _world(rng, 45, 45)
    rep = _audit(texts, canaries)
    sec = public_section(rep, **META)
    text = json.dumps(sec)
    for c in canaries:
        assert c.user_id not in text and c.user_id.split("@")[0] not in text
        assert " ".join(c.suffix[:3]) not in text
    private = [v for r in rep["rows"] for k, v in r.items() if k in ("echo", "bigram", "echoed_words", "bigrams_found")]
    private += [v for g in rep["means"].values() for v in g.values() if v is not None]
    private += [rep["auroc"]["bigram"], rep["auroc"]["echo"], *rep["report"]["auroc_interval"],
                rep["report"]["epsilon_lower_bound"], rep["users_in"], rep["users_out"]]
    published = published_numbers(sec)
    for v in private:
        v = float(v)
        if abs(v / 0.05 - round(v / 0.05)) < 1e-9 or (v == int(v) and int(v) % 10 == 0):
            continue      # a grid value or a multiple of the count grid can coincide with a bucket edge
        assert all(abs(v - x) > 1e-9 * max(1.0, abs(v)) for x in published), v
    assert math.isfinite(sec["binding_ceiling"])
