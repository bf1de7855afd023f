"""User inference (seed 003): was *any* of this person's data used to fine-tune the model?

For a user with attacker samples x⁽¹⁾…x⁽ᵐ⁾ (fresh samples, never trained on), the statistic is

    T̂(u) = (1/m) Σ_i [log p_model(x⁽ⁱ⁾) − log p_ref(x⁽ⁱ⁾)],

with the base model as reference (for LoRA: the same model with the adapter off). Members are the
trained users, non-members the users held out at plan time; the attack is judged threshold-free by
AUROC and TPR at low FPR across users, next to the ceiling the certificate's (ε, δ) allows.

Per-user scores are membership evidence in themselves: `score_users` returns them to the caller,
`user_inference_report` reduces them to aggregates, and only `report.write_private_scores` stores them.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.audit.ceiling import auroc_ceiling, tpr_ceiling
from components.audit.metrics import FPR_TARGETS, bootstrap_metrics, empirical_epsilon_lower_bound
from components.audit.scoring import reference_of, sequence_logprobs
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


def auroc_by_m(samples: pa.Table, ratios: np.ndarray, ms, *, bootstrap: int = 100, seed: int = 0) -> list[dict]:
    """Seed 003's ablation: AUROC when the attacker holds only m′ samples per user — the mean over
    the first m′ of a seeded shuffle of each user's samples (users with fewer keep all of theirs).
    Aggregates only. samples: (user_id, member) aligned with `ratios`."""
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
    for m in sorted({int(x) for x in ms if int(x) >= 1}):
        scores = np.array([r[order[u][:m]].mean() for u in sorted(by_user)])
        if labels.all() or not labels.any():
            break
        b = bootstrap_metrics(scores, labels, n_boot=bootstrap, seed=seed)
        out.append({"m": m, "auroc": b["auroc"], "auroc_std": b["auroc_std"]})
    return out


def user_inference_report(scores: pa.Table, epsilon: float | None, delta: float | None, *,
                          bootstrap: int = 100, seed: int = 0, max_auroc: float | None = None,
                          max_tpr_at_fpr: dict | None = None, auroc_ceiling_pld: float | None = None) -> dict:
    """Aggregates of the attack next to the DP ceiling, and the verdict.

    - `auroc`, `auroc_std`: mean ± std over `bootstrap` resamples of users (within members and
      within non-members); `tpr_at_fpr` likewise (see metrics for the TPR convention).
    - `auroc_ceiling`: 1 − (1−δ)²/(1+e^ε) for the certificate's user-level (ε, δ); 1.0 when the
      model has no user-level guarantee (epsilon None). `auroc_ceiling_pld` (optional): the tighter
      ceiling from the certified mechanism's whole privacy-loss profile (`ceiling.certificate_ceilings`).
    - `above_ceiling`: the attack clearly beats what DP allows — the bootstrap mean − 2·std of AUROC
      exceeds the ceiling (the PLD one when given), or `epsilon_lower_bound` (95% one-sided, from the ROC) exceeds ε. That is a
      bug in training, accounting or the privacy unit, and fails the audit whatever the policy says.
      TPR ceilings are reported beside the TPRs but not gated on: at low FPR the empirical FPR is too
      coarse (1/n_out) for a bootstrap to say anything, which the ε lower bound handles properly.
    - `passed`: not above the ceiling and within the policy's thresholds (`max_auroc`: the
      bootstrap mean must not exceed it; `max_tpr_at_fpr`: {"0.01": 0.05, …} likewise).
    """
    missing = {"member", "score"} - set(scores.column_names)
    if missing:
        raise VeilError(f"audit scores: missing column(s) {', '.join(sorted(missing))}")
    s = scores["score"].to_numpy(zero_copy_only=False)
    y = scores["member"].to_numpy(zero_copy_only=False).astype(bool)
    m = bootstrap_metrics(s, y, n_boot=bootstrap, seed=seed, targets=FPR_TARGETS)
    dp = epsilon is not None and delta is not None and math.isfinite(epsilon)
    ceiling = auroc_ceiling(epsilon, delta) if dp else 1.0
    tpr_ceilings = {k: (float(tpr_ceiling(float(k), epsilon, delta)) if dp else 1.0) for k in m["tpr_at_fpr"]}
    # "Clearly above": the bootstrap mean minus two std still beats the ceiling; or the ROC forces,
    # at 95% confidence (Clopper-Pearson, Bonferroni over thresholds), an ε above the certified one.
    eps_lb = empirical_epsilon_lower_bound(s, y, delta if dp else 0.0)
    binding = min(ceiling, auroc_ceiling_pld) if (dp and auroc_ceiling_pld is not None) else ceiling
    auroc_over = m["auroc"] - 2 * m["auroc_std"] > binding
    eps_over = dp and eps_lb > epsilon
    above = bool(auroc_over or eps_over)
    failures = []
    if auroc_over:
        failures.append(f"auroc {m['auroc']:.4f} - 2 std {m['auroc_std']:.4f} > DP ceiling {binding:.4f}: "
                        "treat as a bug in training, accounting or the privacy unit")
    if eps_over:
        failures.append(f"empirical epsilon lower bound {eps_lb:.3f} > certified epsilon {epsilon}: "
                        "treat as a bug in training, accounting or the privacy unit")
    if max_auroc is not None and m["auroc"] > max_auroc:
        failures.append(f"auroc {m['auroc']:.4f} > policy max {max_auroc}")
    for k, lim in (max_tpr_at_fpr or {}).items():
        key = _key(k)
        if key not in m["tpr_at_fpr"]:
            raise VeilError(f"policy: max_tpr_at_fpr: FPR {k!r} is not one of {', '.join(m['tpr_at_fpr'])}")
        if m["tpr_at_fpr"][key] > lim:
            failures.append(f"tpr@fpr={key} {m['tpr_at_fpr'][key]:.4f} > policy max {lim}")
    return {
        "auroc": m["auroc"],
        "auroc_std": m["auroc_std"],
        "auroc_ceiling": ceiling,
        "tpr_at_fpr": m["tpr_at_fpr"],
        "users_in": m["users_in"],
        "users_out": m["users_out"],
        "passed": not failures,
        "auroc_ceiling_pld": auroc_ceiling_pld if dp else None,
        "auroc_point": m["auroc_point"],
        "auroc_ci95": m["auroc_ci95"],
        "tpr_at_fpr_std": m["tpr_at_fpr_std"],
        "tpr_at_fpr_ceiling": tpr_ceilings,
        "tpr_at_fpr_resolved": m["tpr_at_fpr_resolved"],
        "fpr_resolution": m["fpr_resolution"],
        "above_ceiling": above,
        "epsilon_lower_bound": eps_lb,
        "epsilon": epsilon if dp else None,
        "delta": delta if dp else None,
        "n_bootstrap": m["n_bootstrap"],
        "bootstrap_seed": m["bootstrap_seed"],
        "failures": failures,
    }


def _key(k) -> str:
    return format(float(k), "g")
