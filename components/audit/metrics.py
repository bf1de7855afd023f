"""Threshold-free attack metrics on user-level scores: ROC, AUROC, TPR at low FPR, user bootstrap.

Conventions (the paper leaves them open; these are ours):
- label 1 = member (held-in user), 0 = non-member (held-out user); a higher score means "member".
- AUROC is the Mann–Whitney statistic P(S_in > S_out) + ½ P(S_in = S_out): ties count one half.
- TPR at a target FPR is the largest TPR among the empirical ROC's operating points (deterministic
  thresholds) whose FPR does not exceed the target. No interpolation between points, so the attack is
  never credited with an operating point it did not reach; with n_out non-members the FPR resolution is
  1/n_out, and below it the figure is the TPR at zero false positives (`resolved` says which).
- Bootstrap: resample members and non-members with replacement *within* each group, 100 times with a
  seeded generator; report mean ± std (as the paper) and the 2.5/97.5 percentiles.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

from components.core.errors import VeilError

FPR_TARGETS: tuple[float, ...] = (0.001, 0.01, 0.1)


def _split(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(bool)
    if s.shape != y.shape or s.ndim != 1:
        raise VeilError("scores, labels: need two 1-D arrays of the same length")
    if not np.all(np.isfinite(s)):
        raise VeilError("scores: contains NaN or infinite values")
    return s[y], s[~y]


def auroc_from_groups(pos: np.ndarray, neg: np.ndarray) -> float:
    n1, n0 = len(pos), len(neg)
    if n1 == 0 or n0 == 0:
        raise VeilError(f"AUROC needs members and non-members; got {n1} members, {n0} non-members")
    ranks = rankdata(np.concatenate([pos, neg]))  # average ranks: ties count one half
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    return float(u / (n1 * n0))


def auroc(scores, labels) -> float:
    """Mann–Whitney AUROC with ties counted one half."""
    return auroc_from_groups(*_split(scores, labels))


def roc_from_groups(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empirical ROC: one point per distinct threshold t (predict member iff score >= t), from (0,0)."""
    thr = np.unique(np.concatenate([pos, neg]))[::-1]
    ps, ns = np.sort(pos), np.sort(neg)
    tpr = (len(ps) - np.searchsorted(ps, thr, side="left")) / len(ps)
    fpr = (len(ns) - np.searchsorted(ns, thr, side="left")) / len(ns)
    return (np.concatenate([[0.0], fpr]), np.concatenate([[0.0], tpr]),
            np.concatenate([[np.inf], thr]))


def roc_curve(scores, labels):
    """(fpr, tpr, thresholds), starting at (0, 0) with threshold +inf."""
    return roc_from_groups(*_split(scores, labels))


def tpr_at_fpr_from_roc(fpr: np.ndarray, tpr: np.ndarray, target: float) -> float:
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max())  # (0, 0) is always an operating point


def tpr_at_fpr(scores, labels, targets: Sequence[float] = FPR_TARGETS) -> dict[float, float]:
    fpr, tpr, _ = roc_curve(scores, labels)
    return {t: tpr_at_fpr_from_roc(fpr, tpr, t) for t in targets}


def bootstrap_metrics(scores, labels, *, n_boot: int = 100, seed: int = 0,
                      targets: Sequence[float] = FPR_TARGETS) -> dict:
    """Point estimates and user-bootstrap mean/std/percentiles of AUROC and TPR@FPR.

    Only aggregates come back: no per-user score leaves this function.
    """
    pos, neg = _split(scores, labels)
    if len(pos) == 0 or len(neg) == 0:
        raise VeilError(f"audit needs members and non-members; got {len(pos)} and {len(neg)}")
    if n_boot < 2:
        raise VeilError(f"bootstrap: need at least 2 resamples, got {n_boot}")
    rng = np.random.default_rng(seed)
    aucs = np.empty(n_boot)
    tprs = np.empty((n_boot, len(targets)))
    for b in range(n_boot):
        p = pos[rng.integers(0, len(pos), len(pos))]
        n = neg[rng.integers(0, len(neg), len(neg))]
        aucs[b] = auroc_from_groups(p, n)
        f, t, _ = roc_from_groups(p, n)
        tprs[b] = [tpr_at_fpr_from_roc(f, t, x) for x in targets]
    f, t, _ = roc_from_groups(pos, neg)
    key = _fpr_key
    return {
        "auroc": float(aucs.mean()),
        "auroc_std": float(aucs.std(ddof=1)),
        "auroc_point": auroc_from_groups(pos, neg),
        "auroc_ci95": [float(np.percentile(aucs, 2.5)), float(np.percentile(aucs, 97.5))],
        "tpr_at_fpr": {key(x): float(tprs[:, i].mean()) for i, x in enumerate(targets)},
        "tpr_at_fpr_std": {key(x): float(tprs[:, i].std(ddof=1)) for i, x in enumerate(targets)},
        "tpr_at_fpr_point": {key(x): tpr_at_fpr_from_roc(f, t, x) for x in targets},
        # TPR at a target below 1/n_out is the TPR at zero false positives, not a resolved figure.
        "tpr_at_fpr_resolved": {key(x): bool(x >= 1.0 / len(neg)) for x in targets},
        "fpr_resolution": 1.0 / len(neg),
        "users_in": int(len(pos)),
        "users_out": int(len(neg)),
        "n_bootstrap": int(n_boot),
        "bootstrap_seed": int(seed),
    }


def _fpr_key(x: float) -> str:
    return format(x, "g") if x >= 1e-4 else repr(x)


def _cp_lower(k: np.ndarray, n: int, a: float) -> np.ndarray:
    from scipy.stats import beta

    return np.where(k > 0, beta.ppf(a, k, n - k + 1), 0.0)


def _cp_upper(k: np.ndarray, n: int, a: float) -> np.ndarray:
    from scipy.stats import beta

    return np.where(k < n, beta.ppf(1 - a, k + 1, n - k), 1.0)


def empirical_epsilon_lower_bound(scores, labels, delta: float, *, confidence: float = 0.95) -> float:
    """A one-sided lower confidence bound on ε implied by the attack's ROC (seed 003 §7.4).

    At every threshold, (ε, δ)-DP requires TPR ≤ e^ε FPR + δ and TNR ≤ e^ε FNR + δ. We take
    Clopper–Pearson bounds (TPR, TNR from below; FPR, FNR from above) with a Bonferroni split of
    1 − confidence over all thresholds and both inequalities, and return the largest ε they force
    (0 when none does). Under a correct (ε, δ) guarantee and random in/out assignment of users, the
    bound exceeds ε with probability at most 1 − confidence.
    """
    pos, neg = _split(scores, labels)
    if len(pos) == 0 or len(neg) == 0:
        raise VeilError(f"audit needs members and non-members; got {len(pos)} and {len(neg)}")
    thr = np.unique(np.concatenate([pos, neg]))
    ps, ns = np.sort(pos), np.sort(neg)
    tp = len(ps) - np.searchsorted(ps, thr, side="left")   # members at or above t
    fp = len(ns) - np.searchsorted(ns, thr, side="left")
    a = (1.0 - confidence) / (2 * 2 * len(thr))  # two-sided CP pieces x thresholds x directions
    tpr_lo, fpr_hi = _cp_lower(tp, len(ps), a), _cp_upper(fp, len(ns), a)
    tnr_lo, fnr_hi = _cp_lower(len(ns) - fp, len(ns), a), _cp_upper(len(ps) - tp, len(ps), a)
    best = 0.0
    for num, den in ((tpr_lo - delta, fpr_hi), (tnr_lo - delta, fnr_hi)):
        ok = (num > 0) & (den > 0)
        if np.any(ok):
            best = max(best, float(np.max(np.log(num[ok] / den[ok]))))
    return best


# --- one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run") ----------
#
# m audited people, each *independently* a member with probability 1/2 (Z_i uniform on {in, out}); the
# attacker guesses in/out for r of them from the trained model alone and gets v right. For an ε-DP
# mechanism the number of correct guesses is stochastically dominated by Binomial(r, e^ε/(1+e^ε))
# (their Theorem 3.1); for (ε, δ)-DP their Theorem 5.2 adds 2mδ·max_{1≤i≤v} (f(v−i) − f(v))/i with
# f(v) = P[Binomial(r, q) ≥ v]. So "v or more correct" has p-value at most `one_run_p_value`, and the
# largest ε whose p-value is below β is a lower bound on ε at confidence 1 − β. The guesses here are
# "the top k scores are in, the bottom k are out" for k on a fixed grid of fractions of m, chosen
# after seeing the scores: a Bonferroni split of β over the grid keeps the whole search at 1 − β.

ONE_RUN_GUESS_FRACTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[at least v of r guesses correct] under an (ε, δ)-DP mechanism, m people audited (Thm 5.2)."""
    from scipy.stats import binom

    if not (0 <= v <= r <= m) or epsilon < 0 or not 0 <= delta <= 1:
        raise VeilError(f"one-run audit: need 0 <= v <= r <= m, ε >= 0, δ in [0, 1]; got m={m} r={r} v={v} "
                        f"ε={epsilon} δ={delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0
    f_v = float(binom.sf(v - 1, r, q))                  # P[B >= v]
    worst = 0.0
    if delta > 0 and v > 0:
        pmf = binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v-1], P[B = v-2], …, P[B = 0]
        gap = np.cumsum(pmf)                             # f(v-i) - f(v) = P[v-i <= B < v], i = 1..v
        worst = float(np.max(gap / np.arange(1, v + 1)))
    return min(1.0, f_v + 2.0 * m * delta * worst)


def one_run_epsilon(m: int, r: int, v: int, delta: float, beta: float) -> float:
    """The largest ε (to 1e-6) with p-value < β for v of r correct; 0 when even ε = 0 is not rejected."""
    if one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < beta:   # p-value grows with ε: find a bracket
        lo, hi = hi, 2 * hi
        if hi > 700:
            return lo
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if one_run_p_value(m, r, v, mid, delta) < beta else (lo, mid)
    return lo


def one_run_epsilon_lower_bound(scores, labels, delta: float, *, confidence: float = 0.95,
                                fractions: Sequence[float] = ONE_RUN_GUESS_FRACTIONS) -> dict:
    """The one-run ε lower bound from per-person scores whose labels were drawn independently with
    probability 1/2 each (see `balance_by_thinning` for a split with another prior).

    Returns {epsilon_lower_bound, confidence, m, guesses, correct, delta}: the best bound over the
    guess grid (Bonferroni over it), and the (r, v) that gave it. Private: r and v are counts of
    people; the public section publishes the bound rounded down (`public.public_one_run`)."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(bool)
    if s.shape != y.shape or s.ndim != 1:
        raise VeilError("scores, labels: need two 1-D arrays of the same length")
    if not 0 < confidence < 1:
        raise VeilError(f"confidence must be in (0, 1), got {confidence}")
    m = int(s.size)
    out = {"epsilon_lower_bound": 0.0, "confidence": float(confidence), "m": m, "guesses": 0, "correct": 0,
           "delta": float(delta)}
    if m == 0:
        return out
    order = np.argsort(-s, kind="stable")               # highest score first: guessed "in"
    beta = (1.0 - confidence) / len(fractions)
    for f in fractions:
        k = max(1, int(math.floor(f * m / 2)))
        top, bottom = order[:k], order[m - k:] if 2 * k <= m else order[k:]
        r = int(top.size + bottom.size)
        v = int(y[top].sum() + (~y[bottom]).sum())
        eps = one_run_epsilon(m, r, v, delta, beta)
        if eps > out["epsilon_lower_bound"]:
            out.update(epsilon_lower_bound=eps, guesses=r, correct=v)
    return out


def balance_by_thinning(labels, prior: float, uniforms) -> np.ndarray:
    """A subset of people whose membership labels are independent fair coins, from labels that are
    independent Bernoulli(prior) draws: keep every person of the rarer side, and a person of the
    commoner side when their own uniform draw (`uniforms`, independent of everything else: a keyed PRF
    of the person) is below (rarer prior)/(commoner prior). Given the kept set, each kept label is
    in with probability exactly 1/2, independently — the one-run theorem's setting. Returns the mask."""
    y = np.asarray(labels).astype(bool)
    u = np.asarray(uniforms, dtype=float)
    if not 0 < prior < 1:
        raise VeilError(f"balance_by_thinning: prior must be in (0, 1), got {prior}")
    if prior >= 0.5:
        return ~y | (u < (1 - prior) / prior)
    return y | (u < prior / (1 - prior))
