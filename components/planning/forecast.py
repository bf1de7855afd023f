"""Utility forecast: will this plan's noise let the model learn anything? (issue 16; seed 001 §3.1)

Computed from public plan quantities only — σ, q, C, T, the expected batch B, the DP population
estimate N̂ (never the exact N) and the trainable-parameter count d (a fact of the public base
architecture and the LoRA configuration).

The measure is seed 001's per-coordinate noise variance, eq. (7): the step's update is
(Σ clipped unit gradients + N(0, σ²C² I_d)) / B, so each coordinate carries noise of standard
deviation σC/B, while the largest possible signal — a mean of clipped gradients has norm at most C —
spread over d coordinates is C/√d per coordinate. Equivalently, noise norm σC√d/B against a signal
norm ≤ C:
    per-step ratio   ρ₁ = σ√d / B
    run ratio        ρ_T = ρ₁ / √T

ρ_T compares the run's accumulated noise (norm grows as √T) with the largest signal the run can
accumulate (T steps all pointing the same way at full norm C: T·C). It is the verdict's basis:

* **hopeless**, ρ_T ≥ 1: even in that best case the noise the run adds exceeds everything the data
  could move the weights; nothing is learnt above the noise. (Issue 16's real 44-author repository:
  ρ₁ ≈ 27 at T = 150, ρ_T ≈ 2.2 — its loss ended at the uniform-guess level.)
* **marginal**, 0.3 ≤ ρ_T < 1: learnable only if gradients stay aligned over most of the run at
  close to full clipped norm — real per-unit gradients disagree (a mean of B of them with pairwise
  cosine c has norm ≈ C·√(c + (1−c)/B)) and change direction as the model learns, so expect a small
  gain at best.
* **ok**, ρ_T < 0.3: the best-case signal is more than 3× the noise, leaving room for the signal
  being a fraction of its bound.

The thresholds are a forecast's, not a guarantee's: they bound what can be learnt, not what will be.
When hopeless, the forecast says how far each knob alone must move to bring ρ_T to HINT_TARGET (just
under the hopeless line); when marginal, to OK_TARGET (just under the ok line), so that a MARGINAL plan
also says what would make it OK (issue 26: the real corpora planned MARGINAL and learnt little): ε, the number of training units, steps, or batch — each computed by the
project's accountant (the ε the mechanism spends at the needed σ, or the largest sampling rate /
T / B at which the target ε still affords it), never by a rule of thumb.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from components.mechanisms import get as get_mechanism
from components.renyi.rdp import rows_rdp, sampled_gaussian_rdp

HOPELESS_AT = 1.0       # ρ_T at or above: hopeless
OK_BELOW = 0.3          # ρ_T below: ok; in between: marginal
HINT_TARGET = 0.9       # hints aim a little under the hopeless line (N̂'s noise, σ's calibration tolerance)
OK_TARGET = 0.9 * OK_BELOW  # … and, for a marginal plan, a little under the ok line
MAX_FACTOR = 64         # steps and batch hints look up to 64× the planned value

# Accountant mechanisms whose (ε, δ) the hints can re-run (secret plans target γ per class; the
# filtered mechanism's noise scales with τ, not C).
HINTABLE = ("uls", "els", "group-tight", "record")


def ratios(*, noise_multiplier: float, expected_batch_size: float, steps: int, trainable_parameters: int
           ) -> tuple[float, float]:
    """(ρ₁, ρ_T) = (σ√d / B, σ√d / (B√T))."""
    per_step = float(noise_multiplier) * math.sqrt(int(trainable_parameters)) / float(expected_batch_size)
    return per_step, per_step / math.sqrt(max(int(steps), 1))


def verdict(run_ratio: float) -> str:
    if run_ratio >= HOPELESS_AT:
        return "hopeless"
    return "marginal" if run_ratio >= OK_BELOW else "ok"


def _sigma_for(ratio: float, batch: float, steps: int, d: int) -> float:
    """The σ at which ρ_T equals `ratio`."""
    return ratio * float(batch) * math.sqrt(steps) / math.sqrt(d)


# Orders for the hints' RDP bound: dp-accounting's default grid (fine near 1, where small ε live).
_HINT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


@functools.lru_cache(maxsize=4096)
def _eps(mech: str, *, q: float, sigma: float, steps: int, delta: float, k: int) -> float:
    """An upper bound on the mechanism's ε at δ, by RDP (never below the PLD accountant's ε).

    Hints search over q, T and B and need dozens of ε evaluations at small σ, where a PLD run takes
    seconds to minutes (its grid spans a privacy loss ∝ 1/σ²); the RDP curve takes milliseconds. An
    upper bound keeps every hint sufficient: the ε it names affords the σ, the units/steps/batch it
    names fit the budget; it may ask somewhat more than the tight accountant would (a hint, not a
    certificate — the plan made with it is calibrated by the PLD accountant as always).
      uls, record: one Poisson-sampled Gaussian per step (the accountant's event);
      els, group-tight: k rows each sampled at q — the ledger's row bound (components.renyi.rdp),
      which is never below the certificate's mixture accounting."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc


    q = min(float(q), 1.0)
    if mech in ("els", "group-tight") and int(k) > 1:
        curve = rows_rdp([q] * int(k), float(sigma), int(steps), orders=_HINT_ORDERS)
    else:
        curve = sampled_gaussian_rdp(q, float(sigma), int(steps), orders=_HINT_ORDERS)
    eps, _ = rdp_acc.compute_epsilon(list(_HINT_ORDERS), list(curve), float(delta))
    return float(eps)


def _round_up(x: float, digits: int = 2) -> float:
    """x rounded up to `digits` significant digits (a hint is never below what it must be)."""
    if x <= 0 or not math.isfinite(x):
        return x
    e = math.floor(math.log10(x)) - digits + 1
    return math.ceil(x / 10 ** e - 1e-9) * 10 ** e


def hints(*, mech: str, sigma: float, q: float, steps: int, batch: int, d: int, delta: float, k: int,
          eps_target: float, eps_population: float, n_hat: float | None, unit: str,
          aim: float = HINT_TARGET) -> dict:
    """What alone would bring ρ_T to `aim` (HINT_TARGET, or OK_TARGET for a marginal plan), each knob at a
    time, the others as planned."""
    out: dict[str, Any] = {"aim": f"run ratio ≤ {aim:g}", "each_alone": True}
    share = eps_population / eps_target if eps_target > 0 else 0.0     # ε_N is a fixed share of ε
    budget = eps_target - eps_population                               # what DP-SGD may spend now
    need = _sigma_for(aim, batch, steps, d)
    # ε: what the mechanism spends at the needed σ, plus ε_N's share.
    eps_sgd = _eps(mech, q=q, sigma=need, steps=steps, delta=delta, k=k)
    out["epsilon"] = _round_up(eps_sgd / (1.0 - share))
    # fewer trainable parameters (a smaller LoRA rank, fewer adapted modules): ρ_T ∝ √d at the planned σ, B, T
    run = float(sigma) * math.sqrt(d) / float(batch) / math.sqrt(max(int(steps), 1))
    out["trainable_parameters"] = int(math.floor(d * (aim / run) ** 2)) if run > 0 else None
    # more units: the largest q at which the target ε affords the needed σ; units = B / q.
    if n_hat is not None:
        # bisection on log q between 1e-9·q (feasible or hopeless) and q; 1 % is finer than N̂'s noise
        lo, hi = q * 1e-9, q
        if _eps(mech, q=lo, sigma=need, steps=steps, delta=delta, k=k) > budget:
            out[f"training_{unit}"] = None
        else:
            while hi / lo > 1.01:
                mid = math.sqrt(lo * hi)
                if _eps(mech, q=mid, sigma=need, steps=steps, delta=delta, k=k) <= budget:
                    lo = mid
                else:
                    hi = mid
            out[f"training_{unit}"] = int(math.ceil(batch / lo * 1.02)) if lo > 0 else None  # 2 %: N̂'s noise
    # more steps (σ may grow with T, but ρ_T divides by √T): the first doubling that fits the budget.
    out["steps"] = None
    for f in (2 ** j for j in range(1, int(math.log2(MAX_FACTOR)) + 1)):
        t = steps * f
        if _eps(mech, q=q, sigma=_sigma_for(aim, batch, t, d), steps=t, delta=delta, k=k) <= budget:
            out["steps"] = t
            break
    # larger batch at the same N̂ (q = B/N̂ grows with it).
    out["expected_batch_size"] = None
    if n_hat is not None:
        for f in (2 ** j for j in range(1, int(math.log2(MAX_FACTOR)) + 1)):
            b = batch * f
            if b > n_hat:
                break
            if _eps(mech, q=b / n_hat, sigma=_sigma_for(aim, b, steps, d), steps=steps, delta=delta,
                    k=k) <= budget:
                out["expected_batch_size"] = b
                break
    return out


def plan_forecast(plan: Mapping[str, Any], trainable_parameters: int | None, *, with_hints: bool = True) -> dict:
    """The plan's `utility_forecast` section from its public fields (and d)."""
    base = {"measure": "seed 001 eq. (7): per-coordinate noise std σC/B against the largest per-coordinate "
                       "signal C/√d; run ratio = per-step ratio / √T",
            "thresholds": {"hopeless_at": HOPELESS_AT, "ok_below": OK_BELOW}}
    mechanism = get_mechanism(plan["mechanism"])
    if not mechanism.clipped:
        return {**base, "verdict": "unknown",
                "why": f"{mechanism.name} adds noise that is not scaled to a clip norm C; not forecast"}
    if not trainable_parameters:
        return {**base, "verdict": "unknown",
                "why": "the trainable-parameter count d needs the base model at plan time (veil plan --base-model)"}
    d = int(trainable_parameters)
    sigma, batch, steps = float(plan["noise_multiplier"]), int(plan["expected_batch_size"]), int(plan["steps"])
    c = float(plan["clip_norm"])
    per_step, run = ratios(noise_multiplier=sigma, expected_batch_size=batch, steps=steps, trainable_parameters=d)
    out = {**base, "trainable_parameters": d, "noise_norm_per_step": sigma * c * math.sqrt(d) / batch,
           "signal_norm_bound": c, "per_step_ratio": per_step, "run_ratio": run, "verdict": verdict(run)}
    acc = plan.get("accounting") or {}
    mech = acc.get("mechanism")
    poor = out["verdict"] in ("hopeless", "marginal")
    aim = HINT_TARGET if out["verdict"] == "hopeless" else OK_TARGET
    if poor and mechanism.ledger_relation == "replace":
        # the hints' accountant assumes add/remove; a replace-relation plan pays ε/2 per group of k
        out["hints"] = {"see": "more records per step (a larger batch), more steps or a smaller k: σ is "
                               "calibrated for a group of k at ε/2 under the fixed-graph replace relation"}
    elif poor and with_hints and mech in HINTABLE and plan["target"].get("epsilon"):
        pop = (plan.get("data") or {}).get("population") or {}
        n_hat = pop.get("estimate")                 # the DP estimate N̂: never the exact count
        k = max(1, mechanism.accounting_k(plan.get("records_per_user")))
        out["hints"] = hints(mech=mech, sigma=sigma, q=float(plan["sampling_rate"]), steps=steps, batch=batch, d=d,
                             delta=float(plan["target"]["delta"]), k=k, eps_target=float(plan["target"]["epsilon"]),
                             eps_population=float(acc.get("epsilon_population") or 0.0),
                             n_hat=None if n_hat is None else float(n_hat), unit=str(pop.get("unit", "units")),
                             aim=aim)
    elif poor and not mechanism.has_epsilon:   # secret protection: γ, not ε
        out["hints"] = {"see": "veil plan --sweep-c (retained data against noise for a range of C), more "
                               "records per step, or more steps"}
    return out


def describe(fc: Mapping[str, Any]) -> str:
    """One line for tables: verdict, the ratios, and the hint when hopeless."""
    if fc.get("verdict") == "unknown":
        return f"unknown — {fc.get('why', '')}"
    line = (f"{fc['verdict'].upper()} · noise/signal {fc['per_step_ratio']:.3g}× per step, "
            f"{fc['run_ratio']:.3g}× over the run (d={fc['trainable_parameters']:,}; hopeless ≥ "
            f"{fc['thresholds']['hopeless_at']:g}, ok < {fc['thresholds']['ok_below']:g})")
    h = fc.get("hints") or {}
    if "see" in h:
        return line + f" · try {h['see']}"
    parts = []
    if h.get("epsilon") is not None:
        parts.append(f"ε ≥ {h['epsilon']:g}")
    for key, v in h.items():
        if key.startswith("training_") and v is not None:
            parts.append(f"≈{v:,} training {key[len('training_'):]}")
    if h.get("steps") is not None:
        parts.append(f"T = {h['steps']:,} steps")
    if h.get("trainable_parameters"):
        parts.append(f"d ≤ {h['trainable_parameters']:,} trainable parameters (a smaller LoRA rank)")
    if h.get("expected_batch_size") is not None:
        parts.append(f"batch {h['expected_batch_size']:,}")
    if parts:
        line += (" · would learn with (each alone): " if fc["verdict"] == "hopeless"
                 else " · would be OK with (each alone): ") + ", ".join(parts)
    if h and "see" not in h and h.get("steps") is None and h.get("expected_batch_size") is None:
        line += f" (more steps or a larger batch, up to {MAX_FACTOR}×, do not get there alone)"
    return line
