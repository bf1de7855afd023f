"""The DP evaluation release: what the registry may say about a model's utility on the evaluation people.

Exact evaluation metrics are a near-exact function of every evaluation person's private text (removing
one of the demo's 24 evaluation people moved the logged perplexity in 24/24 cases, issue 22 case 4).
The registry therefore gets them only through this mechanism; the exact figures stay on the operator's
terminal.

Per evaluation person u (their records only, scored exactly as `token_statistics` scores them):

    nll_u = clip(Σ_t −log p(x_t) / tokens_u, 0, C)       C = evaluation.nll_clip (public)
    acc_u = correct_u / tokens_u ∈ [0, 1]

for each evaluated model (the fine-tuned model, its base, an optional reference). The released vector
is, over the counted people P (evaluation people with at least one scored token, not retired by the
ledger's filter),

    S = (Σ_P nll_u^(model) , Σ_P acc_u^(model) , … for each model … , |P|)
    S̃_i = S_i + s_i · z · N(0, 1)      s_i = C for an NLL sum, 1 for an accuracy sum and for the count

Adding or removing one person moves coordinate i by at most s_i, so S/s has L2 sensitivity √k (k
coordinates): S̃ is the Gaussian mechanism with noise multiplier m = z/√k relative to its sensitivity.
z is calibrated from the public (ε, δ) by the analytic Gaussian mechanism (Balle & Wang 2018, Thm 8):

    δ(ε; m) = Φ(1/(2m) − ε m) − e^ε Φ(−1/(2m) − ε m),     m = the smallest with δ(ε; m) ≤ δ

(bisection, rounded up: the release is never claimed below its true ε). Its Rényi curve, charged to
every counted person in the ledger, is α/(2m²) (`private_selection.gaussian_rdp`). What is published is
a post-processing of S̃: mean NLL = S̃_nll / max(ñ, 1) clamped to [0, C], perplexity = exp(that), accuracy
= S̃_acc / max(ñ, 1) clamped to [0, 1]. It is a *person-weighted* mean of clipped per-person figures,
not the operator's token-weighted exact perplexity.

The noise is keyed (HMAC under the planner's key) on the release's parameters, the model and the
counted population: evaluating the same model on the same people gives the same draw (and the caller
republishes the stored value), a different population gets a fresh one — a draw is never reused across
different counted sets, which would let their difference reveal the person who differs.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from components.core.errors import VeilError

MECHANISM = "evaluation"          # the ledger's mechanism name for these releases
DEFINITION = ("person-weighted: mean over the counted evaluation people of each person's own mean NLL "
              "(clipped to [0, nll_clip]) and accuracy, from DP sums over a DP count; perplexity = exp(mean NLL)")


@dataclass(frozen=True)
class PublishedEvaluation:
    """What one evaluation release puts on the model's run: DP metrics and public tags. `counted` (how
    many people the release counted) is exact and private: the operator's terminal only.

    Made by `components.evaluation.release.publish_evaluation`; the only thing
    `components.registry.record_evaluation` logs (it sits here, under both, so neither imports the other)."""
    metrics: dict[str, float]
    tags: dict[str, str]
    release_id: int
    release_name: str
    reused: bool
    counted: int = field(default=0, repr=False)


# --- per-person scoring (shared with private selection's score) -----------------------------------

def person_means(users: Sequence[str], sums: np.ndarray, counts: np.ndarray,
                 correct: np.ndarray | None = None) -> dict[str, tuple[float, float, int]]:
    """person → (mean NLL over their scored tokens, their next-token accuracy, tokens), from per-text
    `token_statistics` (Σ log p, tokens, argmax hits). People without a scored token are absent: a
    person's presence in the result depends on their own texts alone."""
    if not (len(users) == len(sums) == len(counts)) or (correct is not None and len(correct) != len(users)):
        raise VeilError("evaluation: per-text statistics must have one entry per text")
    acc: dict[str, list[float]] = {}
    for i, (u, s, c) in enumerate(zip(users, sums, counts)):
        if c > 0:
            a = acc.setdefault(str(u), [0.0, 0.0, 0])
            a[0] -= float(s)
            a[1] += 0.0 if correct is None else float(correct[i])
            a[2] += int(c)
    return {u: (nll / n, hits / n, n) for u, (nll, hits, n) in acc.items()}


def clip_nll(x: float, clip: float) -> float:
    return min(max(float(x), 0.0), float(clip))


# --- calibration --------------------------------------------------------------------------------------

def analytic_gaussian_delta(epsilon: float, m: float) -> float:
    """δ(ε) of the Gaussian mechanism whose noise is m times its L2 sensitivity (Balle & Wang 2018, Thm 8)."""
    from scipy import special

    e, m = float(epsilon), float(m)
    a, b = 1.0 / (2.0 * m) - e * m, -1.0 / (2.0 * m) - e * m
    # e^ε Φ(b) in log space: Φ(b) underflows long before e^ε overflows
    return max(0.0, float(special.ndtr(a)) - math.exp(e + float(special.log_ndtr(b))))


def calibrate_multiplier(epsilon: float, delta: float) -> float:
    """The smallest noise multiplier m (noise std / L2 sensitivity) of an (ε, δ)-DP Gaussian mechanism,
    rounded up (the returned m satisfies δ(ε; m) ≤ δ)."""
    e, d = float(epsilon), float(delta)
    if not (e > 0 and math.isfinite(e)) or not 0 < d < 1:
        raise VeilError(f"evaluation: (epsilon, delta) = ({epsilon!r}, {delta!r}) must have epsilon > 0 and 0 < delta < 1")
    lo, hi = 1e-3, 1.0
    while analytic_gaussian_delta(e, hi) > d:
        hi *= 2.0
        if hi > 1e6:
            raise VeilError(f"evaluation: no Gaussian noise reaches (ε, δ) = ({e:g}, {d:g})")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if analytic_gaussian_delta(e, mid) > d:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return hi


@dataclass(frozen=True)
class EvaluationMechanism:
    """The release's public parameters: ε, δ, C, which models are scored, and the noise they imply."""
    epsilon: float
    delta: float
    nll_clip: float
    models: tuple[str, ...]           # e.g. ("model", "base") or ("model", "base", "reference")

    def __post_init__(self):
        if not self.models or len(set(self.models)) != len(self.models):
            raise VeilError("evaluation: name each evaluated model once")
        if not (float(self.nll_clip) > 0 and math.isfinite(float(self.nll_clip))):
            raise VeilError(f"evaluation.nll_clip: {self.nll_clip!r} must be a finite number > 0")

    @property
    def coordinates(self) -> int:
        """k: an NLL sum and an accuracy sum per model, and the count."""
        return 2 * len(self.models) + 1

    @property
    def multiplier(self) -> float:
        """m: noise std over the L2 sensitivity √k of the range-scaled vector."""
        return calibrate_multiplier(self.epsilon, self.delta)

    @property
    def noise_multiplier(self) -> float:
        """z = m·√k: each coordinate's noise std in units of its own range s_i."""
        return self.multiplier * math.sqrt(self.coordinates)

    def scales(self) -> np.ndarray:
        """s_i per coordinate, in release order: (nll, acc) per model, then the count."""
        return np.array([s for _ in self.models for s in (float(self.nll_clip), 1.0)] + [1.0])

    def sigmas(self) -> np.ndarray:
        """Each coordinate's noise standard deviation: s_i · z."""
        return self.scales() * self.noise_multiplier

    def rdp(self, orders) -> np.ndarray:
        """Each counted person's Rényi curve: the Gaussian mechanism at multiplier m, α/(2m²)."""
        from components.accounting.private_selection import gaussian_rdp  # startup

        return gaussian_rdp(orders, self.multiplier)

    def public(self) -> dict:
        return {"mechanism": "gaussian (analytic calibration, Balle & Wang 2018)", "epsilon": float(self.epsilon),
                "delta": float(self.delta), "nll_clip": float(self.nll_clip), "models": list(self.models),
                "coordinates": self.coordinates, "noise_multiplier": self.noise_multiplier,
                "sensitivity": "add/remove one evaluation person: ≤ nll_clip per NLL sum, ≤ 1 per accuracy sum, "
                               "1 on the count (L2 √k over the range-scaled vector)"}


# --- the release -------------------------------------------------------------------------------------

def exact_sums(mech: EvaluationMechanism, per_model: Mapping[str, Mapping[str, tuple[float, float, int]]],
               people: Sequence[str]) -> np.ndarray:
    """S over `people` (each must have a scored token under every model): the private vector."""
    out = np.zeros(mech.coordinates)
    for j, name in enumerate(mech.models):
        stats = per_model[name]
        for u in people:
            nll, acc, _ = stats[u]
            out[2 * j] += clip_nll(nll, mech.nll_clip)
            out[2 * j + 1] += min(max(float(acc), 0.0), 1.0)
    out[-1] = float(len(people))
    return out


def standard_normals(seed_words: Sequence[int], k: int) -> np.ndarray:
    """k N(0, 1) draws from a keyed seed (numpy's PCG64 under a SeedSequence of the HMAC words)."""
    return np.random.default_rng(np.random.SeedSequence([int(w) for w in seed_words])).standard_normal(k)


def release(mech: EvaluationMechanism, sums: np.ndarray, normals: np.ndarray) -> dict[str, float]:
    """The published metrics from S and k standard normal draws: S̃ = S + s·z·normals, then
    post-processing only (module doc)."""
    noisy = np.asarray(sums, dtype=float) + mech.sigmas() * np.asarray(normals, dtype=float)
    n = max(float(noisy[-1]), 1.0)
    out: dict[str, float] = {}
    for j, name in enumerate(mech.models):
        prefix = "eval" if name == "model" else f"eval_{name}"
        mean_nll = min(max(noisy[2 * j] / n, 0.0), float(mech.nll_clip))
        out[f"{prefix}_perplexity"] = math.exp(mean_nll)
        out[f"{prefix}_next_token_accuracy"] = min(max(noisy[2 * j + 1] / n, 0.0), 1.0)
    return out
