"""The columnar planning primitives (issue 27) against straightforward per-person references.

The references below are the per-record Python implementations planning used before it moved to
columns (one dict per person, one HMAC and one numpy Generator per person); the columnar code must
return exactly what they return — same people, same records, same order — on small random tables
with odd ids: unicode, quotes and backslashes, control characters, empty strings, duplicate record
ids and duplicate texts.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from components.draws import streams
from components.draws.annex import (population_digest, prf, prf_column, prf_seed, prf_seed_column, prf_uniform,
                                    prf_uniform_column)
from components.draws.audit_split import split_for_audit
from components.draws.eval_split import reserve_evaluation
from components.draws.selection import select_records

KEY = bytes(range(100, 132))
ODD = ["", " ", "a", "A", "é", "e\u0301", "中文", "𝄞", 'q"uote', "back\\slash", "tab\t", "nl\n", "\x00nul",
       "\x7f", "\u2028", "z" * 40, "user@example.org", "null", "0", "[1]"]


# --- the per-person references ------------------------------------------------------------------
def ref_evaluation(users, rids, cont, fraction, seed):
    drawn = {u: fraction > 0 and prf_uniform(KEY, "evaluation", int(seed), u) < fraction for u in set(users)}
    rest = [i for i, u in enumerate(users) if not drawn[u]]
    rep: dict = {}
    for u, r, t in zip(users, rids, cont):
        if drawn[u]:
            d = rep.setdefault(u, {})
            if t not in d or r < d[t]:
                d[t] = r
    rows = sorted((r, u) for u, d in rep.items() for r in d.values())
    return sorted(rep), rows, rest


def ref_split(users, rids, cont, *, holdout, m, seed, unit, rate, evaluation):
    eval_users, eval_rows = [], []
    if evaluation > 0:
        eval_users, eval_rows, rest = ref_evaluation(users, rids, cont, evaluation, seed)
    else:
        rest = list(range(len(users)))
    u_, r_, c_ = [users[i] for i in rest], [rids[i] for i in rest], [cont[i] for i in rest]
    held = lambda u: holdout > 0 and prf_uniform(KEY, "holdout", int(seed), u) < holdout  # noqa: E731
    by_user: dict = {}
    for u, r, t in zip(u_, r_, c_):
        d = by_user.setdefault(u, {})
        if t not in d or r < d[t]:
            d[t] = r
    att, excluded, out, eligible = [], {}, set(), 0
    for u in sorted(by_user):
        d = by_user[u]
        if unit == "record":
            if held(u):
                out.add(u)
            chosen = sorted((t for t in d if rate > 0 and prf_uniform(KEY, "attacker-record", int(seed), u, t) < rate),
                            key=lambda t: d[t])
            eligible += bool(chosen)
        else:
            if len(d) < m + 1:
                continue
            eligible += 1
            if held(u):
                out.add(u)
            distinct = sorted(d)
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), *prf_seed(KEY, "attacker", u)]))
            chosen = sorted((distinct[i] for i in rng.choice(len(distinct), size=m, replace=False)), key=lambda t: d[t])
        excluded[u] = set(chosen)
        att += [(d[t], u, u not in out) for t in chosen]
    keep = [rest[i] for i, (u, t) in enumerate(zip(u_, c_)) if u not in out and t not in excluded.get(u, ())]
    trained = sorted({users[i] for i in keep})
    return {"held": sorted(out), "trained": trained, "attacker": att, "keep": keep, "eligible": eligible,
            "eval_users": eval_users, "eval_rows": eval_rows}


def ref_select(users, rids, texts, k, strategy, seed, exactly_k):
    groups: dict = {}
    for i, u in enumerate(users):
        groups.setdefault(u, []).append(i)
    keep = []
    for u, rows in groups.items():
        rows.sort(key=lambda r: rids[r])
        if strategy == "random":
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), *prf_seed(KEY, "select", u)]))
            chosen = ([rows[i] for i in sorted(rng.choice(len(rows), size=k, replace=False))] if len(rows) > k
                      else list(rows))
        else:
            sign = -1.0 if strategy in ("longest", "ppl-high") else 1.0
            f = _ppl if strategy.startswith("ppl") else len
            chosen = sorted(rows, key=lambda r: (sign * f(texts[r]), rids[r]))[:k]
        if exactly_k and len(chosen) < k:
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), *prf_seed(KEY, "resample", u)]))
            chosen = chosen + [chosen[i] for i in rng.choice(len(chosen), size=k - len(chosen), replace=True)]
        keep += chosen
    return keep


def _ppl(text: str) -> float:
    return float(len(text.encode()) % 5) + 0.25          # a deterministic stand-in scorer, many ties


# --- random odd tables --------------------------------------------------------------------------
def odd_table(rng: np.random.Generator, n_users: int) -> pa.Table:
    ids = list(dict.fromkeys(ODD[: min(len(ODD), n_users)] + [f"u{i}\u00e9" for i in range(n_users)]))[:n_users]
    texts = ["", "hello", "Hello", "héllo", 'say "hi"', "a\\b", "\n", "same", "same ", "𝄞 music"]
    rows = []
    for u in ids:
        for j in range(int(rng.integers(1, 9))):
            t = texts[int(rng.integers(len(texts)))] if rng.random() < 0.7 else f"{u}:{j}"
            rid = f"r{int(rng.integers(0, 40)):02d}" if rng.random() < 0.3 else f"{u}#{j}"   # duplicate ids too
            rows.append((rid, u, t))
    order = rng.permutation(len(rows))
    rid, user, text = zip(*[rows[i] for i in order])
    return pa.table({"record_id": pa.array(rid, pa.string()), "user_id": pa.array(user, pa.string()),
                     "text": pa.array(text, pa.string())})


@pytest.mark.parametrize("case", range(12))
def test_columnar_split_matches_the_per_person_reference(case):
    rng = np.random.default_rng(case)
    recs = odd_table(rng, int(rng.integers(5, 60)))
    unit = ("user", "secret", "record")[case % 3]
    kw = {"holdout": float(rng.choice([0.0, 0.3, 0.6])), "m": int(rng.integers(1, 4)), "seed": int(rng.integers(0, 2 ** 33)),
          "evaluation": float(rng.choice([0.0, 0.2])), "rate": float(rng.choice([0.0, 0.4]))}
    cont = recs["text"].to_pylist()
    if unit == "secret":
        cont = [t.replace("e", "\x00x\x00") for t in cont]          # a content other than the text
    want = ref_split(recs["user_id"].to_pylist(), recs["record_id"].to_pylist(), cont, unit=unit, **kw)
    try:
        got = split_for_audit(recs, holdout=kw["holdout"], m=kw["m"], seed=kw["seed"], key=KEY, unit=unit,
                              attacker_record_rate=kw["rate"], content=cont if unit == "secret" else None,
                              evaluation=kw["evaluation"])
    except Exception as e:          # the reference's refusals (everyone held out) are the split's too
        assert "every one of" in str(e) and (not want["trained"]), e
        return
    assert got.held_out_users == want["held"]
    assert got.trained_users == want["trained"]
    assert got.n_eligible == want["eligible"]
    assert list(zip(*[got.attacker[c].to_pylist() for c in ("record_id", "user_id", "member")])) == \
        sorted(want["attacker"], key=lambda a: (a[1], a[0]))
    assert got.train.equals(recs.take(pa.array(want["keep"], pa.int64())))
    assert got.evaluation.users == want["eval_users"]
    assert list(zip(*[got.evaluation.records[c].to_pylist() for c in ("record_id", "user_id")])) == want["eval_rows"]


def test_columnar_evaluation_rest_matches_the_reference():
    recs = odd_table(np.random.default_rng(99), 50)
    users, rids, texts = (recs[c].to_pylist() for c in ("user_id", "record_id", "text"))
    res, rest = reserve_evaluation(recs, fraction=0.3, seed=4, key=KEY)
    want_users, want_rows, want_rest = ref_evaluation(users, rids, texts, 0.3, 4)
    assert res.users == want_users and rest.tolist() == want_rest
    assert list(zip(res.records["record_id"].to_pylist(), res.records["user_id"].to_pylist())) == want_rows


@pytest.mark.parametrize("strategy,exactly_k", [("random", False), ("random", True), ("longest", False),
                                                ("shortest", True), ("ppl-high", False), ("ppl-low", True)])
def test_columnar_selection_matches_the_reference(strategy, exactly_k):
    for case in range(4):
        rng = np.random.default_rng(1000 + case)
        recs = odd_table(rng, 40)
        k = int(rng.integers(1, 4))
        got = select_records(recs, k, strategy, seed=case, exactly_k=exactly_k, key=KEY,
                             scorer=lambda ts: [_ppl(t) for t in ts])
        want = ref_select(recs["user_id"].to_pylist(), recs["record_id"].to_pylist(), recs["text"].to_pylist(), k,
                          strategy, case, exactly_k)
        assert got.equals(recs.take(pa.array(want, pa.int64()))), (strategy, case)


def test_population_digest_matches_the_reference(monkeypatch):
    import hashlib

    from components.draws import annex

    recs = odd_table(np.random.default_rng(7), 30)
    h = hashlib.sha256()
    for u, r in sorted(zip(recs["user_id"].to_pylist(), recs["record_id"].to_pylist())):
        h.update(u.encode() + b"\x1f" + r.encode() + b"\n")
    want = prf(KEY, "population-digest", h.hexdigest()).hex()
    assert population_digest(KEY, recs) == want
    monkeypatch.setattr(annex, "_DIGEST_SLICE", 7)          # several slices, several chunks
    chunked = pa.concat_tables([recs.slice(0, 11), recs.slice(11, 50), recs.slice(61)])
    assert population_digest(KEY, chunked) == want


def test_prf_columns_are_the_scalar_prf_row_by_row():
    ids = pa.array(ODD + [None], pa.string())
    texts = [t[::-1] + "x" for t in ODD] + ["y"]
    assert [bytes(d) for d in prf_column(KEY, "holdout", 3, ids)] == [prf(KEY, "holdout", 3, u) for u in ids.to_pylist()]
    assert prf_uniform_column(KEY, "r", 0, ids, texts).tolist() == [prf_uniform(KEY, "r", 0, u, t)
                                                                    for u, t in zip(ids.to_pylist(), texts)]
    assert prf_seed_column(KEY, "attacker", ids).tolist() == [prf_seed(KEY, "attacker", u) for u in ids.to_pylist()]


def test_streams_replay_each_persons_numpy_generator():
    rng = np.random.default_rng(3)
    words = rng.integers(0, 2 ** 32, size=(400, 4), dtype=np.uint64).astype(np.uint32)
    words[:3] = [0, 0, 0, 0]
    for seed in (0, 1, 2 ** 32 - 1, 2 ** 40 + 11):
        for size in (1, 2, 5):
            pop = rng.integers(size, 300, size=len(words))
            assert np.array_equal(streams.floyd_choice(seed, words, pop, size),
                                  streams._numpy_choice(seed, words, pop, size)), (seed, size)
    assert streams._verified()


def test_sorted_rows_are_checked_not_resorted_and_counted_as_runs(monkeypatch):
    """is_sorted / sort_rows / distinct_count (issue 27: the planner sorts its training rows once) agree
    with Arrow's sort and count on odd ids, across slices and chunks, sorted or not."""
    from components.draws import columns
    from components.draws.columns import distinct_count, is_sorted, sort_rows

    monkeypatch.setattr(columns, "_CHECK_SLICE", 5)          # several slices
    for case in range(6):
        recs = odd_table(np.random.default_rng(100 + case), 25)
        keys = ["user_id", "record_id"]
        want = recs.sort_by([(k, "ascending") for k in keys])
        chunked = pa.concat_tables([want.slice(0, 9), want.slice(9, 30), want.slice(39)])
        for t in (want, chunked):
            assert is_sorted(t, keys) and sort_rows(t, keys) is t
            assert distinct_count(t["user_id"]) == pc.count_distinct(t["user_id"]).as_py()
        assert not is_sorted(recs, keys) and sort_rows(recs, keys).equals(want)
        assert distinct_count(recs["user_id"]) == pc.count_distinct(recs["user_id"]).as_py()
        # equal users, record ids out of order: unsorted on the pair, sorted on the user alone
        swapped = want.take(pa.array([1, 0] + list(range(2, want.num_rows)))) if want["user_id"][0] == want["user_id"][1] \
            else None
        if swapped is not None and want["record_id"][0] != want["record_id"][1]:
            assert not is_sorted(swapped, keys) and is_sorted(swapped, ["user_id"])
    nulls = pa.table({"user_id": pa.array(["a", None, "b"]), "record_id": pa.array(["1", "2", "3"])})
    assert not is_sorted(nulls, ["user_id", "record_id"])
    assert distinct_count(nulls["user_id"]) == 2


@pytest.mark.parametrize("unit", ["user", "record"])
def test_members_trained_says_whether_every_member_has_a_training_row(unit):
    """The split's flag that lets make_plan skip keep_trained_members is computed, not assumed: with
    record units every text of a person can go to the attacker, leaving a "member" with no row."""
    recs = odd_table(np.random.default_rng(5), 40)
    kw = dict(holdout=0.3, m=2, seed=11, key=KEY, unit=unit, attacker_record_rate=0.97 if unit == "record" else 0.0)
    split = split_for_audit(recs, **kw)
    members = set(split.attacker.filter(split.attacker["member"])["user_id"].to_pylist())
    trained = set(split.train["user_id"].to_pylist())
    assert split.members_trained == members.issubset(trained)
    if unit == "record":
        assert not split.members_trained           # at rate 0.97 some person lost every text to the attacker
    assert split.trained_users == sorted(trained)
