"""`mechanism: auto` — pick ULS, ELS or group privacy by calibrated noise per unit of signal (seed 001 §3).

Compute budget: B gradients per step (the policy's expected_batch_size under `auto`).
* ULS: M = B/G users per step, each a clipped mean of G records; per-coordinate noise on the averaged
  update σ_ULS(q = M/N)·C_U/M with C_U ≈ L_G, the norm of a user's G-record mean gradient.
* ELS: B records per step from D' (≤ k per user), noise σ_ELS(q = B/|D'|, k)·C_E/B with C_E ≈ L.
* group: as ELS with every user resampled to exactly k records (seed 000's Algorithm 1).
With clip norms at the gradient norms, noise per unit of signal compares as

    ULS / ELS = G · (L_G / L) · σ_ULS / σ_ELS            (seed 001, eq. (7))

L_G / L = f(G) is data-dependent: 1 when a user's records all point the same way, 1/√G when they are
orthogonal. Given an estimate of f (at the public base model), ULS's G is chosen by seed 001's
Estimate-and-Double rule and the lower noise wins. Without one, the choice is made only where it holds
for every f in [1/√G, 1]; in between ULS is taken, as both seeds found it at least as good on LLM
fine-tuning, and the plan says so.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from components.core.errors import VeilError
from components.mechanisms.base import get, names
from components.draws.gradient_diversity import estimate_user_grad_ratio
from components.draws.selection import REDRAWN_PER_VISIT


@dataclass(frozen=True)
class MechanismChoice:
    mechanism: str
    expected_batch_size: int          # users per step for uls, records per step otherwise
    records_per_user: int
    reason: str
    candidates: list[dict] = field(default_factory=list)
    assumption: str = ""

    def to_dict(self) -> dict:
        return {"mechanism": self.mechanism, "reason": self.reason, "assumption": self.assumption,
                "candidates": self.candidates}


def _sigma(mechanism: str, q: float, *, epsilon, delta, steps, k, cache_dir) -> float:
    from components.accounting import calibrate  # startup

    return float(calibrate(mechanism, epsilon=epsilon, delta=delta, sampling_rate=q, steps=steps, k=k,
                           cache_dir=cache_dir).noise_multiplier)


def _powers_of_two(upto: int) -> list[int]:
    out, g = [], 1
    while g <= upto:
        out.append(g)
        g *= 2
    return out


def estimate_and_double(budget: int, n_users: int, g_max: int, f: Callable[[int], float],
                        sigma_uls: Callable[[int], float]) -> int:
    """Seed 001 Algorithm 3: from (G, M) = (1, budget/…) double whichever of G or M shrinks
    f(G)·σ(M)/M more, until G·M reaches the budget. Returns G."""
    G, M = 1, 1
    while G * M * 2 <= budget:
        can_g = 2 * G <= g_max
        can_m = 2 * M <= n_users
        if not (can_g or can_m):
            break
        r_g = f(2 * G) / f(G) if can_g else np.inf
        r_m = sigma_uls(2 * M) / (2 * sigma_uls(M)) if can_m else np.inf
        if r_g < r_m:
            G *= 2
        else:
            M *= 2
    return G


def choose_mechanism(policy, train: pa.Table, *, steps: int, expected_batch_size: int,
                     user_grad_ratio: Callable[[int], float] | None = None,
                     cache_dir: str | Path | None = None) -> MechanismChoice:
    """Compare ULS, ELS and group privacy for this data, budget and target; see the module docstring."""
    spec = policy.spec
    if spec.privacy_unit != "user":
        only = default_for(spec.privacy_unit)
        return MechanismChoice(only.name, expected_batch_size, 1,
                               f"privacy_unit '{spec.privacy_unit}' has one mechanism")
    if spec.target is None:
        raise VeilError("mechanism auto: a user-level choice needs spec.target (epsilon, delta)")
    eps, delta = float(spec.target.epsilon), float(spec.target.delta)
    k = int(spec.contribution.max_records_per_user)
    B = int(expected_batch_size)
    counts = np.array(train.group_by("user_id").aggregate([("record_id", "count")])["record_id_count"].to_pylist())
    N = int(counts.size)
    if N == 0:
        raise VeilError("mechanism auto: no training users")
    d_els = int(np.minimum(counts, k).sum())
    d_group = N * k
    sig_cache: dict[tuple, float] = {}

    def sig(mech: str, q: float, kk: int) -> float:
        key = (mech, round(q, 12), kk)
        if key not in sig_cache:
            sig_cache[key] = _sigma(mech, q, epsilon=eps, delta=delta, steps=steps, k=kk, cache_dir=cache_dir)
        return sig_cache[key]

    candidates: list[dict] = []
    # ELS / group: B records per step, noise per signal σ/B (in units of L)
    for mech, size in (("els", d_els), ("group", d_group)):
        acc = get(mech).accounting_model
        q = B / size
        if q > 1:
            candidates.append({"mechanism": mech, "skipped": f"budget {B} exceeds the {size} bounded records"})
            continue
        s = sig(acc, q, k)
        candidates.append({"mechanism": mech, "sampling_rate": q, "noise_multiplier": s, "expected_batch_size": B,
                           "records_per_user": k, "noise_per_signal": s / B})

    # ULS: G records per user, M = B/G users per step
    def sigma_uls(M: int) -> float:
        return sig(get("uls").accounting_model, min(1.0, M / N), 1)

    if user_grad_ratio is not None:
        G = estimate_and_double(B, N, k, user_grad_ratio, sigma_uls)
        assumption = "L_G/L estimated at the public base model (seed 001 eq. (8), median over users)"
    else:
        G = max(1, min(k, B))
        assumption = ("no gradient estimate: ULS uses the policy's G; its noise per signal is shown for aligned "
                      "(L_G = L) and orthogonal (L_G = L/√G) user gradients")
    M = max(1, B // G)
    uls: dict = {"mechanism": "uls"}
    if M > N:
        uls["skipped"] = f"{M} users per step exceeds the {N} training users"
    else:
        s = sigma_uls(M)
        ratio_hi = 1.0 if user_grad_ratio is None else float(user_grad_ratio(G))
        ratio_lo = 1.0 / np.sqrt(G) if user_grad_ratio is None else ratio_hi
        uls.update({"sampling_rate": M / N, "noise_multiplier": s, "expected_batch_size": M, "records_per_user": G,
                    "noise_per_signal": ratio_hi * s / M, "noise_per_signal_if_diverse": ratio_lo * s / M})
    candidates.insert(0, uls)

    usable = [c for c in candidates if "skipped" not in c]
    if not usable:
        raise VeilError(f"mechanism auto: no mechanism fits a budget of {B} gradients per step with {N} users; "
                        "lower spec.training.expected_batch_size")
    rec_best = min((c for c in usable if c["mechanism"] != "uls"), key=lambda c: c["noise_per_signal"], default=None)
    if "skipped" in uls:
        best, why = rec_best, f"ULS does not fit ({uls['skipped']}); {rec_best['mechanism']} has the least noise"
    elif rec_best is None:
        best, why = uls, "ELS and group privacy do not fit the budget; ULS does"
    else:
        hi, lo, r = uls["noise_per_signal"], uls["noise_per_signal_if_diverse"], rec_best["noise_per_signal"]
        name = rec_best["mechanism"].upper()
        if user_grad_ratio is not None:
            est = f"with the estimated L_G/L = {float(user_grad_ratio(int(uls['records_per_user']))):.3g}"
            best = uls if hi <= r else rec_best
            why = (f"{best['mechanism'].upper()} adds less noise per unit of signal {est} "
                   f"(ULS {hi:.4g} vs {name} {r:.4g}; G={uls['records_per_user']} by Estimate-and-Double)")
        elif hi <= r:
            best, why = uls, (f"ULS adds less noise per unit of signal ({hi:.4g} vs {name} {r:.4g}) even if each "
                              "user's gradients all point the same way")
        elif lo > r:
            best, why = rec_best, (f"{name} adds less noise per unit of signal ({r:.4g}) than ULS even for maximally "
                                   f"diverse users ({lo:.4g})")
        else:
            best, why = uls, (f"ULS noise per signal lies between {lo:.4g} (diverse users) and {hi:.4g} (aligned) "
                              f"around {name}'s {r:.4g}; ULS taken, as seeds 000/001 found it at least as good on "
                              "LLM fine-tuning")
    return MechanismChoice(mechanism=best["mechanism"], expected_batch_size=int(best["expected_batch_size"]),
                           records_per_user=int(best["records_per_user"]), reason=why, candidates=candidates,
                           assumption=assumption)


def default_for(unit: str):
    picks = [get(n) for n in names(unit=unit, plannable=True) if get(n).auto_default]
    if len(picks) != 1:
        raise VeilError(f"mechanism auto: privacy_unit {unit!r} has no single default mechanism")
    return picks[0]


@dataclass
class Resolved:
    """The mechanism a policy runs, with the public decision and its private statistics."""

    mechanism: str
    batch: int
    k: int
    selection: str
    decision: dict
    private_decision: dict | None
    caveats: list[str]


def resolve(policy, train: pa.Table, *, steps: int, batch: int, user_grad_ratio=None, base_model=None,
            cache_dir=None, say=lambda _m: None) -> Resolved:
    """The policy's mechanism, or `auto`'s choice for this data (its reasons quote private statistics:
    they go to the annex, the public decision carries a caveat)."""
    spec = policy.spec
    k, selection = int(spec.contribution.max_records_per_user), spec.contribution.selection
    decision: dict = {"requested": spec.mechanism}
    if spec.people.ownership == "all-participants":
        return _owners_variant(spec, batch, k, decision)
    if spec.mechanism != "auto":
        decision.update({"mechanism": spec.mechanism, "reason": f"the policy names '{spec.mechanism}'"})
        return Resolved(spec.mechanism, batch, k, selection, decision, None, [])
    tr = spec.training
    ratio = user_grad_ratio
    if ratio is None and base_model is not None and spec.privacy_unit == "user":

        say("estimating per-user gradient diversity at the base model")
        g_values = [g for g in (1, 2, 4, 8, 16, 32, 64) if g <= k]
        ratio = estimate_user_grad_ratio(base_model[0], base_model[1], train, g_values=g_values,
                                         seq_len=tr.seq_len, seed=tr.seed)
    private: dict = {}
    if ratio is not None and getattr(ratio, "table", None):
        private["user_grad_ratio"] = {str(g): v for g, v in sorted(ratio.table.items())}
    say("comparing mechanisms for 'auto'")
    choice = choose_mechanism(policy, train, steps=steps, expected_batch_size=batch, user_grad_ratio=ratio,
                              cache_dir=cache_dir)
    mech = get(choice.mechanism)
    # The reasons and candidates quote noise levels at q = B/N and Σ min(n_u, k): private. Publish
    # the decision alone, with its caveat.
    private.update(choice.to_dict())
    caveat = ("mechanism 'auto': the choice used private statistics (users' record counts"
              + (" and gradient norms of their records at the base model" if ratio is not None else "")
              + "), without noise; the choice is not accounted")
    decision.update({"mechanism": mech.name, "caveat": caveat})
    if mech.bounds_records:
        batch, k = choice.expected_batch_size, choice.records_per_user
        decision.update({"expected_batch_size": int(batch), "records_per_user": int(k)})

    if selection in REDRAWN_PER_VISIT and not mech.per_user_clip:
        selection = "random"
    return Resolved(mech.name, int(batch), int(k), selection, decision, private, [caveat])


def _owners_variant(spec, batch: int, k: int, decision: dict) -> Resolved:
    """Records owned by every participant: the named mechanism's multi-owner variant, or for `auto` the
    first user-level mechanism that has one (a choice from the policy alone: no private statistic)."""
    name = spec.mechanism
    if name == "auto":
        name = next((n for n in names(unit=spec.privacy_unit, plannable=True) if get(n).owners_variant), None)
        if name is None:
            raise VeilError("people.ownership 'all-participants': no registered mechanism has a multi-owner variant")
    variant = get(get(name).owners_variant)
    decision.update({"mechanism": variant.name,
                     "reason": f"people.ownership 'all-participants': '{name}' over records owned by every participant"})
    return Resolved(variant.name, int(batch), int(k), spec.contribution.selection, decision, None, [])
