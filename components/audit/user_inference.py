"""User inference (seed 003): was *any* of this person's data used to fine-tune the model?

For a user with attacker samples x⁽¹⁾…x⁽ᵐ⁾ (fresh samples, never trained on), the statistic is

    T̂(u) = (1/m) Σ_i [log p_model(x⁽ⁱ⁾) − log p_ref(x⁽ⁱ⁾)],

with the base model as reference (for LoRA: the same model with the adapter off). Members are the
trained users, non-members the users held out at plan time; the attack is judged threshold-free by
AUROC and TPR at low FPR across users, next to the ceiling the certificate's (ε, δ) allows.

Per-user scores are membership evidence in themselves: `score_users` returns them to the caller,
`user_inference_report` reduces them to (private, exact) aggregates and the verdict, `public` quantizes
those, and only `report.write_private` stores the scores.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.audit.ceiling import auroc_ceiling, tpr_ceiling
from components.audit.metrics import (FPR_TARGETS, auroc_from_groups, bootstrap_metrics,
                                      empirical_epsilon_lower_bound)
from components.audit.scoring import reference_of, sequence_logprobs
from components.audit.verdict import CONFIDENCE, FAILED, PASSED, auroc_verdict
from components.core.errors import VeilError

SCORES_SCHEMA = pa.schema([("user_id", pa.string()), ("member", pa.bool_()), ("m", pa.int64()),
                           ("score", pa.float64())])


def _check_samples(samples: pa.Table) -> None:
    missing = {"user_id", "text", "member"} - set(samples.column_names)
    if missing:
        raise VeilError(f"audit samples: missing column(s) {', '.join(sorted(missing))}")
    if samples.num_rows == 0:
        raise VeilError("audit samples: no attacker samples to score")
    per_user = samples.group_by("user_id").aggregate([("member", "min"), ("member", "max")])
    mixed = pc.not_equal(per_user["member_min"], per_user["member_max"])
    if pc.any(mixed).as_py():
        bad = per_user.filter(mixed)["user_id"][0].as_py()
        raise VeilError(f"audit samples: user {bad!r} is labelled both member and non-member")


def score_samples(model, tokenizer, texts, *, reference=None, seq_len: int, batch_size: int = 16,
                  progress: bool = False) -> np.ndarray:
    """log p_model(x) − log p_ref(x) for each text."""
    lp = sequence_logprobs(model, tokenizer, texts, seq_len=seq_len, batch_size=batch_size,
                           progress="scoring model" if progress else None)
    with reference_of(model, reference) as ref:
        lr = sequence_logprobs(ref, tokenizer, texts, seq_len=seq_len, batch_size=batch_size,
                               progress="scoring reference" if progress else None)
    return lp - lr


def aggregate_user_scores(samples: pa.Table, ratios: np.ndarray) -> pa.Table:
    """Mean of the per-sample log-likelihood ratios per user (seed 003: mean beats min/max)."""
    t = pa.table({"user_id": samples["user_id"].cast(pa.string()), "member": samples["member"].cast(pa.bool_()),
                  "r": pa.array(np.asarray(ratios, dtype=np.float64))})
    g = t.group_by(["user_id", "member"]).aggregate([("r", "mean"), ("r", "count")])
    out = pa.table({"user_id": g["user_id"], "member": g["member"], "m": g["r_count"].cast(pa.int64()),
                    "score": g["r_mean"]}, schema=SCORES_SCHEMA)
    return out.sort_by("user_id")


def score_users(model, tokenizer, samples: pa.Table, *, reference=None, seq_len: int, batch_size: int = 16,
                progress: bool = False) -> pa.Table:
    """Per-user statistic. samples: (user_id, text, member) -> (user_id, member, m, score).

    The result is membership evidence: keep it out of logs, tags and artifacts.
    """
    _check_samples(samples)
    texts = samples["text"].to_pylist()
    ratios = score_samples(model, tokenizer, texts, reference=reference, seq_len=seq_len,
                           batch_size=batch_size, progress=progress)
    return aggregate_user_scores(samples, ratios)


def auroc_by_m(samples: pa.Table, ratios: np.ndarray, ms, *, bootstrap: int = 0, seed: int = 0) -> list[dict]:
    """Seed 003's ablation: AUROC when the attacker holds only m′ samples per user — the mean over
    the first m′ of a seeded shuffle of each user's samples (users with fewer keep all of theirs).
    Each row: m, the Mann–Whitney AUROC (point), users_in, users_out (and, with `bootstrap` > 0, the
    bootstrap std). Private aggregates: the verdict (`verdict.auroc_verdict`) decides on them and the
    public section keeps only that. samples: (user_id, member) aligned with `ratios`."""
    users = samples["user_id"].cast(pa.string()).to_pylist()
    member = samples["member"].to_pylist()
    r = np.asarray(ratios, dtype=np.float64)
    by_user: dict[str, list[int]] = {}
    for i, u in enumerate(users):
        by_user.setdefault(u, []).append(i)
    rng = np.random.default_rng(seed)
    order = {u: rng.permutation(idx) for u, idx in sorted(by_user.items())}
    labels = np.array([bool(member[idx[0]]) for _, idx in sorted(by_user.items())])
    out = []
    if labels.all() or not labels.any():
        return out
    for m in sorted({int(x) for x in ms if int(x) >= 1}):
        scores = np.array([r[order[u][:m]].mean() for u in sorted(by_user)])
        row = {"m": m, "auroc": auroc_from_groups(scores[labels], scores[~labels]),
               "users_in": int(labels.sum()), "users_out": int((~labels).sum())}
        if bootstrap >= 2:
            row["auroc_std"] = bootstrap_metrics(scores, labels, n_boot=bootstrap, seed=seed)["auroc_std"]
        out.append(row)
    return out


def user_inference_report(scores: pa.Table, epsilon: float | None, delta: float | None, *,
                          bootstrap: int = 100, seed: int = 0, max_auroc: float | None = None,
                          auroc_ceiling_pld: float | None = None, by_m: list[dict] | None = None,
                          confidence: float = CONFIDENCE) -> dict:
    """Exact aggregates of the attack next to the DP ceiling, and the verdict (private: see `public`).

    - `auroc`: the Mann–Whitney AUROC; `auroc_interval`: its score interval (`verdict`), simultaneous
      over the full statistic and every m of `by_m` (`auroc_by_m` rows); bootstrap mean/std/percentiles
      and TPR at low FPR beside it (see metrics for the TPR convention).
    - `auroc_ceiling`: 1 − (1−δ)²/(1+e^ε) for the certificate's user-level (ε, δ); 1.0 when the model
      has no user-level guarantee (epsilon None). `auroc_ceiling_pld`: the tighter ceiling from the
      certified mechanism's whole privacy-loss profile; the verdict uses the tighter of the two.
    - `verdict`: failed when, at some m, the interval lies above the ceiling or the policy's
      `max_auroc`, or the empirical ε lower bound (95 %, Clopper–Pearson over the ROC) exceeds the
      certified ε; passed when every interval lies below `max_auroc` (the ceiling without one);
      inconclusive otherwise, with `people_needed`. None when there is nothing to compare with.
    """
    missing = {"member", "score"} - set(scores.column_names)
    if missing:
        raise VeilError(f"audit scores: missing column(s) {', '.join(sorted(missing))}")
    s = scores["score"].to_numpy(zero_copy_only=False)
    y = scores["member"].to_numpy(zero_copy_only=False).astype(bool)
    m = bootstrap_metrics(s, y, n_boot=bootstrap, seed=seed, targets=FPR_TARGETS)
    dp = epsilon is not None and delta is not None and math.isfinite(epsilon)
    ceiling = auroc_ceiling(epsilon, delta) if dp else 1.0
    binding = (min(ceiling, auroc_ceiling_pld) if auroc_ceiling_pld is not None else ceiling) if dp else None
    tpr_ceilings = {k: (float(tpr_ceiling(float(k), epsilon, delta)) if dp else 1.0) for k in m["tpr_at_fpr"]}
    full = {"m": None, "auroc": m["auroc_point"], "users_in": m["users_in"], "users_out": m["users_out"]}
    curves = [dict(c) for c in (by_m or [])]
    # the sweep's largest m is the full statistic when every user has that many samples: count it once
    if not (curves and abs(curves[-1]["auroc"] - full["auroc"]) < 1e-12
            and curves[-1]["users_in"] == full["users_in"] and curves[-1]["users_out"] == full["users_out"]):
        curves.append(full)
    dec = auroc_verdict(curves, threshold=max_auroc, ceiling=binding, confidence=confidence)
    eps_lb = empirical_epsilon_lower_bound(s, y, delta if dp else 0.0)
    eps_over = bool(dp and eps_lb > epsilon)
    verdict = FAILED if eps_over else dec["verdict"]
    failures = []
    for c in dec["curves"]:
        where = "all samples" if c["m"] is None else f"m={c['m']}"
        lo, hi = c["interval"]
        if c["above_ceiling"]:
            failures.append(f"auroc {c['auroc']:.4f} ({where}) interval [{lo:.4f}, {hi:.4f}] above DP ceiling "
                            f"{binding:.4f}: the certificate or the code is wrong (training, accounting or the "
                            "privacy unit)")
        elif c["verdict"] == FAILED:
            failures.append(f"auroc {c['auroc']:.4f} ({where}) interval [{lo:.4f}, {hi:.4f}] above policy max "
                            f"{max_auroc}")
    if eps_over:
        failures.append(f"empirical epsilon lower bound {eps_lb:.3f} > certified epsilon {epsilon}: "
                        "the certificate or the code is wrong (training, accounting or the privacy unit)")
    main = dec["curves"][-1]
    return {
        "verdict": verdict,
        "passed": verdict in (PASSED, None),
        "auroc": m["auroc_point"],
        "auroc_interval": main["interval"],
        "auroc_ceiling": ceiling,
        "auroc_ceiling_pld": auroc_ceiling_pld if dp else None,
        "binding_ceiling": binding,
        "users_in": m["users_in"],
        "users_out": m["users_out"],
        "curves": dec["curves"],
        "confidence": confidence,
        "simultaneous_over": dec["simultaneous_over"],
        "z": dec["z"],
        "people_needed": dec["people_needed"],
        "people_needed_unbounded": dec["people_needed_unbounded"],
        "above_ceiling": bool(dec["above_ceiling"] or eps_over),
        "epsilon_lower_bound": eps_lb,
        "epsilon_lower_bound_exceeds": eps_over,
        "auroc_bootstrap_mean": m["auroc"],
        "auroc_std": m["auroc_std"],
        "auroc_ci95_bootstrap": m["auroc_ci95"],
        "tpr_at_fpr": m["tpr_at_fpr"],
        "tpr_at_fpr_std": m["tpr_at_fpr_std"],
        "tpr_at_fpr_ceiling": tpr_ceilings,
        "tpr_at_fpr_resolved": m["tpr_at_fpr_resolved"],
        "fpr_resolution": m["fpr_resolution"],
        "epsilon": epsilon if dp else None,
        "delta": delta if dp else None,
        "threshold": max_auroc,
        "n_bootstrap": m["n_bootstrap"],
        "bootstrap_seed": m["bootstrap_seed"],
        "failures": failures,
    }


def auroc_by_share(scores, labels, share, edges, *, bootstrap: int = 0, seed: int = 0) -> list[dict]:
    """Seed 003's claim "the attack grows with a person's share of the data", per bin of `share`.

    `share` is, for each person, the quantity the bins are cut on (their share of the training rows,
    or their count of records — for a held-out person, what it would have been had they been trained).
    Bin i holds the people with edges[i] <= share < edges[i+1] (the last bin is closed). Each row:
    lo, hi, users_in, users_out, mean_share and the Mann–Whitney AUROC of members against non-members
    *of that bin* (None when one side is empty); with `bootstrap` >= 2 also its bootstrap std
    (members and non-members resampled within the bin). Private aggregates, like `auroc_by_m`."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    x = np.asarray(share, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    if not (s.shape == y.shape == x.shape and s.ndim == 1):
        raise VeilError("scores, labels, share: need three 1-D arrays of the same length")
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise VeilError("edges: need at least two increasing bin edges")
    out = []
    for i in range(e.size - 1):
        last = i == e.size - 2
        inside = (x >= e[i]) & ((x <= e[i + 1]) if last else (x < e[i + 1]))
        yi = y[inside]
        row = {"lo": float(e[i]), "hi": float(e[i + 1]), "users_in": int(yi.sum()),
               "users_out": int((~yi).sum()), "mean_share": float(x[inside].mean()) if inside.any() else None,
               "auroc": None}
        if yi.any() and (~yi).any():
            row["auroc"] = auroc_from_groups(s[inside][yi], s[inside][~yi])
            if bootstrap >= 2:
                row["auroc_std"] = bootstrap_metrics(s[inside], yi, n_boot=bootstrap, seed=seed)["auroc_std"]
        out.append(row)
    return out


def share_slope_gap(scores, labels, log_share) -> float:
    """How much faster members' scores rise with (log) share than non-members': slope_in − slope_out
    of the two least-squares lines score ~ a + b·log_share. In the fully interacted regression
    score ~ 1 + member + x + member·x this is the interaction coefficient: > 0 when the attack's
    separation grows with a person's share. Needs two distinct x values on each side."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    x = np.asarray(log_share, dtype=np.float64)
    slopes = []
    for side in (y, ~y):
        xs, ss = x[side], s[side]
        if xs.size < 2 or np.ptp(xs) == 0:
            raise VeilError("share_slope_gap: each side needs at least two distinct share values")
        xc = xs - xs.mean()
        slopes.append(float((xc * (ss - ss.mean())).sum() / (xc * xc).sum()))
    return slopes[0] - slopes[1]
