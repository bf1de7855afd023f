"""auroc_by_share / share_slope_gap (seed 003 on the real corpus, bench/user_inference_real.py),
checked against independent computations: a brute-force pair count and a 4-parameter least squares."""
import numpy as np
import pytest

from components.audit.user_inference import auroc_by_share, share_slope_gap
from components.core.errors import VeilError


def _pairs_auroc(pos, neg):
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auroc_by_share_matches_pair_count_per_bin():
    rng = np.random.default_rng(3)
    n = 300
    share = rng.lognormal(0, 1.5, n)
    y = rng.random(n) < 0.5
    # members' scores rise with share, with ties (rounded) to exercise the one-half rule
    s = np.round(rng.normal(0, 1, n) + y * 0.5 * np.log1p(share), 1)
    edges = [0.0, 0.5, 2.0, float(share.max())]
    rows = auroc_by_share(s, y, share, edges)
    assert [r["users_in"] + r["users_out"] for r in rows] == [
        int(((share >= 0) & (share < 0.5)).sum()), int(((share >= 0.5) & (share < 2)).sum()),
        int(((share >= 2) & (share <= share.max())).sum())]
    for r, (lo, hi, last) in zip(rows, [(0, 0.5, False), (0.5, 2, False), (2, share.max(), True)]):
        inside = (share >= lo) & ((share <= hi) if last else (share < hi))
        want = _pairs_auroc(s[inside & y], s[inside & ~y])
        assert r["auroc"] == pytest.approx(want, abs=1e-12)
        assert r["mean_share"] == pytest.approx(share[inside].mean())
    # the effect grows with share: the top bin separates better than the bottom one
    assert rows[-1]["auroc"] > rows[0]["auroc"]


def test_auroc_by_share_empty_side_and_bad_edges():
    rows = auroc_by_share([1.0, 2.0, 3.0], [True, True, False], [0.1, 0.2, 5.0], [0, 1, 10], bootstrap=10)
    assert rows[0]["auroc"] is None and rows[0]["users_in"] == 2 and rows[0]["users_out"] == 0
    assert rows[1]["auroc"] is None and rows[1]["users_out"] == 1
    with pytest.raises(VeilError):
        auroc_by_share([1.0], [True], [1.0], [1, 1])


def test_share_slope_gap_is_the_interaction_coefficient():
    rng = np.random.default_rng(5)
    n = 200
    x = rng.normal(0, 1, n)
    y = rng.random(n) < 0.4
    s = 0.3 + 0.2 * y + 0.1 * x + 0.7 * y * x + rng.normal(0, 0.5, n)
    X = np.column_stack([np.ones(n), y, x, y * x])
    coef, *_ = np.linalg.lstsq(X, s, rcond=None)
    assert share_slope_gap(s, y, x) == pytest.approx(coef[3], abs=1e-10)
    with pytest.raises(VeilError):
        share_slope_gap(s, y, np.ones(n))
