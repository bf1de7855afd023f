"""AUROC, ROC and TPR@FPR against brute force over all pairs / all thresholds."""
import numpy as np
import pytest

from components.audit.metrics import auroc, bootstrap_metrics, roc_curve, tpr_at_fpr
from components.core.errors import VeilError


def _brute_auroc(s, y):
    pos, neg = s[y], s[~y]
    tot = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return tot / (len(pos) * len(neg))


def _brute_tpr_at(s, y, target):
    pos, neg = s[y], s[~y]
    best = 0.0
    for t in list(np.unique(s)) + [np.inf]:
        fpr = np.mean(neg >= t)
        if fpr <= target:
            best = max(best, np.mean(pos >= t))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_auroc_and_tpr_match_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    y = rng.random(n) < 0.5
    y[0], y[1] = True, False
    s = np.round(rng.normal(size=n) + 0.7 * y, 1)  # rounding makes ties
    assert auroc(s, y) == pytest.approx(_brute_auroc(s, y), abs=1e-12)
    for t, v in tpr_at_fpr(s, y, (0.001, 0.01, 0.1, 0.3)).items():
        assert v == pytest.approx(_brute_tpr_at(s, y, t))


def test_roc_curve_area_equals_auroc_and_is_monotone():
    rng = np.random.default_rng(3)
    y = rng.random(200) < 0.4
    s = np.round(rng.normal(size=200) + y, 1)
    fpr, tpr, thr = roc_curve(s, y)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0) and np.all(np.diff(thr) < 0)
    assert np.trapezoid(tpr, fpr) == pytest.approx(auroc(s, y))  # trapezoids = ties count 1/2


def test_extremes():
    assert auroc([3, 4, 1, 2], [1, 1, 0, 0]) == 1.0
    assert auroc([1, 2, 3, 4], [1, 1, 0, 0]) == 0.0
    assert auroc([1, 1, 1, 1], [1, 1, 0, 0]) == 0.5
    assert tpr_at_fpr([3, 4, 1, 2], [1, 1, 0, 0])[0.001] == 1.0


def test_bootstrap_is_seeded_and_aggregate_only():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(80, bool), np.zeros(120, bool)]
    s = rng.normal(size=200) + 0.8 * y
    a = bootstrap_metrics(s, y, n_boot=100, seed=5)
    b = bootstrap_metrics(s, y, n_boot=100, seed=5)
    c = bootstrap_metrics(s, y, n_boot=100, seed=6)
    assert a == b and a["auroc"] != c["auroc"]
    assert abs(a["auroc"] - a["auroc_point"]) < 3 * a["auroc_std"]
    assert 0.01 < a["auroc_std"] < 0.08  # ~sqrt(AUC(1-AUC)/n) scale
    assert a["users_in"] == 80 and a["users_out"] == 120
    assert set(a["tpr_at_fpr"]) == {"0.001", "0.01", "0.1"}
    assert a["tpr_at_fpr_resolved"] == {"0.001": False, "0.01": True, "0.1": True}
    flat = repr(a)
    assert not any(repr(float(v)) in flat for v in s[:20])  # no score leaks into the aggregates


def test_errors():
    with pytest.raises(VeilError):
        auroc([1.0, 2.0], [1, 1])
    with pytest.raises(VeilError):
        auroc([1.0, float("nan")], [1, 0])


def test_empirical_epsilon_lower_bound_is_valid_and_informative():
    import math

    from components.audit.metrics import empirical_epsilon_lower_bound
    eps = 1.0
    p = math.exp(eps) / (1 + math.exp(eps))
    over, bounds = 0, []
    for seed in range(20):  # randomized response is exactly ε-DP: the bound must rarely exceed ε
        rng = np.random.default_rng(seed)
        y = np.r_[np.ones(3000, bool), np.zeros(3000, bool)]
        s = np.where(rng.random(6000) < p, y, ~y).astype(float)
        lb = empirical_epsilon_lower_bound(s, y, 0.0)
        over += lb > eps
        bounds.append(lb)
    assert over <= 2 and np.median(bounds) > 0.75
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(300, bool), np.zeros(300, bool)]
    assert empirical_epsilon_lower_bound(rng.normal(size=600) + 6 * y, y, 1e-5) > 2.0
    assert empirical_epsilon_lower_bound(rng.normal(size=600), y, 1e-5) < 0.5
