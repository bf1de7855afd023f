"""What limits a release's utility: the base model or privacy? (issue 26)

On two real corpora a DP fine-tune moved perplexity 534.6 → 501.3 and Veil said nothing about why. Two
different fixes exist and cost different things: a stronger public base (`veil base-model` with more layers,
width, steps and public text) costs no privacy; less noise (the forecast's hints: ε, people, steps, d) does.

Evidence, strongest first:
  1. a non-private reference (`veil evaluate --reference`): what fine-tuning on this base can reach without
     privacy. If DP already closes at least half of the base → reference gap, privacy is not what holds the
     model back: the base is — the reference itself is only that good. Otherwise privacy is.
  2. the plan's utility forecast (public): HOPELESS means the noise drowns any signal; OK means it leaves room,
     so a fine-tune that barely moved perplexity points at the base.
  3. the base's own facts (public: its size, steps and held-out loss on its public text) and its perplexity on
     the evaluation people.

The inputs in 1 and 3 are the evaluation's exact figures, so the diagnosis is the operator's, like them: it is
shown on the operator's terminal and JSON, never logged or published.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

GAP_CLOSED_BASE = 0.5   # DP closes ≥ this share of the base → reference gap: the base limits, not privacy
SMALL_GAIN = 1.25       # DP perplexity within 1/1.25 of the base's: "barely moved"
WEAK_BASE_PPL = 100.0   # a base this perplexed by the evaluation people's text is far from fluent on it

BASE_FIX = ("a stronger public base costs no privacy: `veil base-model CORPUS --layers 4 --width 256 --steps 2000` "
            "(more public text helps most: a directory of it, or `system`)")


def diagnose(evaluation: Mapping[str, Any], forecast: Mapping[str, Any] | None = None,
             base_facts: Mapping[str, Any] | None = None) -> dict:
    """{"limit": "base" | "privacy" | "base and privacy" | "neither" | "unknown", "why", "fix"}."""
    base_ppl, dp_ppl = evaluation.get("base_perplexity"), evaluation.get("perplexity")
    ref_ppl = evaluation.get("reference_perplexity")
    verdict = (forecast or {}).get("verdict")
    if not base_ppl or not dp_ppl or not all(map(math.isfinite, (base_ppl, dp_ppl))):
        return {"limit": "unknown", "why": "no perplexities to compare", "fix": None}
    gain = base_ppl / dp_ppl
    ctx = _base_context(base_facts)
    if ref_ppl is not None and math.isfinite(ref_ppl) and ref_ppl < base_ppl:
        closed = (base_ppl - dp_ppl) / (base_ppl - ref_ppl)
        if closed >= GAP_CLOSED_BASE:
            return {"limit": "base",
                    "why": f"the DP model closes {closed:.0%} of the gap to the non-private reference, which itself "
                           f"only reaches perplexity {ref_ppl:.4g} from the base's {base_ppl:.4g}{ctx}",
                    "fix": BASE_FIX}
        return {"limit": "privacy",
                "why": f"a non-private fine-tune reaches perplexity {ref_ppl:.4g}; the DP model {dp_ppl:.4g} closes "
                       f"only {closed:.0%} of the gap from the base's {base_ppl:.4g}",
                "fix": "the plan's forecast hints (ε, people, steps, a smaller LoRA rank)"}
    if verdict == "hopeless":
        return {"limit": "privacy", "why": "the forecast is HOPELESS: the noise exceeds any signal the data can give",
                "fix": "the plan's forecast hints (ε, people, steps, a smaller LoRA rank)"}
    weak = base_ppl >= WEAK_BASE_PPL
    if gain < SMALL_GAIN and (verdict == "ok" or (verdict == "marginal" and weak)):
        limit = "base" if verdict == "ok" else "base and privacy"
        return {"limit": limit,
                "why": f"fine-tuning moved perplexity only {base_ppl:.4g} → {dp_ppl:.4g} while the forecast is "
                       f"{verdict.upper()}" + (" (the noise leaves room)" if verdict == "ok" else "")
                       + (f"; the base is far from fluent on this text (perplexity {base_ppl:.4g})" if weak else "")
                       + ctx,
                "fix": BASE_FIX + ("" if verdict == "ok" else "; then the forecast's hints")}
    if weak:
        return {"limit": "base", "why": f"the base is far from fluent on this text (perplexity {base_ppl:.4g}); the "
                                        f"DP model reaches {dp_ppl:.4g}{ctx}", "fix": BASE_FIX}
    if gain < SMALL_GAIN:
        return {"limit": "unknown", "why": f"perplexity moved only {base_ppl:.4g} → {dp_ppl:.4g}; without a "
                                           "forecast or a non-private reference (`veil evaluate --reference`) Veil "
                                           "cannot tell whether the base or the noise holds it back", "fix": None}
    return {"limit": "neither", "why": f"perplexity {base_ppl:.4g} → {dp_ppl:.4g}", "fix": None}


def _base_context(facts: Mapping[str, Any] | None) -> str:
    """The base's public facts, when Veil built it: size, steps, and perplexity on its own held-out public text."""
    if not facts:
        return ""
    cfg = facts.get("config") or {}
    parts = []
    if facts.get("n_params"):
        parts.append(f"{facts['n_params'] / 1e6:.2g}M parameters")
    if cfg.get("n_layer") and cfg.get("n_embd"):
        parts.append(f"{cfg['n_layer']}×{cfg['n_embd']}")
    if cfg.get("steps"):
        parts.append(f"{cfg['steps']:,} pretraining steps")
    if facts.get("eval_loss_after") is not None:
        parts.append(f"perplexity {math.exp(facts['eval_loss_after']):.3g} on its own held-out public text")
    return f" (base: {', '.join(parts)})" if parts else ""


def line(d: Mapping[str, Any]) -> str:
    """One line for the run summary and `veil evaluate`."""
    if d["limit"] in ("neither", "unknown") and not d.get("fix"):
        return f"{d['limit']}: {d['why']}"
    return f"{d['limit'].upper()} limits utility: {d['why']}" + (f" · fix: {d['fix']}" if d.get("fix") else "")
