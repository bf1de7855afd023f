"""Contribution bounding: per-user, deterministic, and blind to every other user's data."""
from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from components.core.errors import VeilError
from components.draws.audit_split import split_for_audit
from components.draws.selection import select_records

sys.path.insert(0, str(Path(__file__).parent))
from _planning_fixtures import make_snapshot  # noqa: E402


@pytest.fixture(scope="module")
def recs():
    return make_snapshot(30, seed=3).records.select(["record_id", "user_id", "text"])


def _by_user(t: pa.Table) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r, u in zip(t["record_id"].to_pylist(), t["user_id"].to_pylist()):
        out.setdefault(u, []).append(r)
    return out


@pytest.mark.parametrize("strategy", ["random", "longest", "shortest"])
def test_at_most_k_per_user_from_the_users_own_records(recs, strategy):
    k = 3
    sel = select_records(recs, k, strategy, seed=5)
    own = _by_user(recs)
    for u, rs in _by_user(sel).items():
        assert len(rs) == min(k, len(own[u])) and set(rs) <= set(own[u]) and len(set(rs)) == len(rs)
    assert set(_by_user(sel)) == set(own)


def test_longest_and_shortest_pick_by_length(recs):
    text = dict(zip(recs["record_id"].to_pylist(), recs["text"].to_pylist()))
    own = _by_user(recs)
    for strategy, pick in (("longest", max), ("shortest", min)):
        sel = _by_user(select_records(recs, 2, strategy, seed=0))
        for u, rs in sel.items():
            lens = sorted((len(text[r]) for r in own[u]), reverse=(strategy == "longest"))
            assert sorted((len(text[r]) for r in rs), reverse=(strategy == "longest")) == lens[:2]


def test_perplexity_strategies_use_the_scorer_and_need_one(recs):
    score = {t: float(len(t) % 7) + len(t) / 1e4 for t in recs["text"].to_pylist()}
    scorer = lambda texts: [score[t] for t in texts]  # noqa: E731
    text = dict(zip(recs["record_id"].to_pylist(), recs["text"].to_pylist()))
    own = _by_user(recs)
    hi = _by_user(select_records(recs, 2, "ppl-high", seed=0, scorer=scorer))
    lo = _by_user(select_records(recs, 2, "ppl-low", seed=0, scorer=scorer))
    for u in own:
        ranked = sorted((score[text[r]] for r in own[u]))
        assert sorted(score[text[r]] for r in hi[u]) == sorted(ranked[-2:])
        assert sorted(score[text[r]] for r in lo[u]) == ranked[:2]
    with pytest.raises(VeilError, match="base model"):
        select_records(recs, 2, "ppl-high", seed=0)
    with pytest.raises(VeilError, match="one finite perplexity"):
        select_records(recs, 2, "ppl-low", seed=0, scorer=lambda texts: [1.0])


def test_selection_of_one_user_ignores_everyone_else(recs):
    """Adding/removing a user never changes another user's records (the user-level neighbour argument)."""
    users = sorted(set(recs["user_id"].to_pylist()))
    full = _by_user(select_records(recs, 2, "random", seed=9))
    without = recs.filter(pc.not_equal(recs["user_id"], users[0]))
    part = _by_user(select_records(without, 2, "random", seed=9))
    assert all(part[u] == full[u] for u in users[1:])
    shuffled = recs.take(list(range(recs.num_rows))[::-1])
    assert _by_user(select_records(shuffled, 2, "random", seed=9)) == full
    assert _by_user(select_records(recs, 2, "random", seed=10)) != full


def test_group_resamples_short_users_up_to_exactly_k(recs):
    k = 6
    sel = select_records(recs, k, "random", seed=1, exactly_k=True)
    own = _by_user(recs)
    for u, rs in _by_user(sel).items():
        assert len(rs) == k and set(rs) <= set(own[u])
        if len(own[u]) < k:
            assert len(set(rs)) == len(own[u])          # every own record, plus duplicates


def test_random_chunk_keeps_everything_and_bad_inputs(recs):
    assert select_records(recs, 1, "random-chunk", seed=0).num_rows == recs.num_rows
    with pytest.raises(VeilError, match="unknown strategy"):
        select_records(recs, 2, "median", seed=0)
    with pytest.raises(VeilError, match="at least 1"):
        select_records(recs, 0, "random", seed=0)


def test_audit_split_eligibility_and_counts(recs):
    m = 3
    sp = split_for_audit(recs, holdout=0.3, m=m, seed=0)
    distinct = {}
    for u, t in zip(recs["user_id"].to_pylist(), recs["text"].to_pylist()):
        distinct.setdefault(u, set()).add(t)
    eligible = {u for u, ts in distinct.items() if len(ts) >= m + 1}
    assert sp.n_eligible == len(eligible)
    # each eligible user is held out by their own draw: not a fixed count
    assert set(sp.held_out_users) <= eligible and 0 < len(sp.held_out_users) < len(eligible)
    assert set(sp.attacker["user_id"].to_pylist()) == eligible
    assert not set(sp.held_out_users) & set(sp.trained_users)
    # users too small for the audit are trained on whole
    small = set(distinct) - eligible
    assert small <= set(sp.trained_users)
    # a count would need the (private) number of users: refused
    with pytest.raises(VeilError, match="probability below 1"):
        split_for_audit(recs, holdout=5, m=m, seed=0)
    with pytest.raises(VeilError, match="leaving none to train"):
        split_for_audit(recs.filter(pc.is_in(recs["user_id"], pa.array(sorted(eligible)[:1]))),
                        holdout=0.999999, m=m, seed=0)
