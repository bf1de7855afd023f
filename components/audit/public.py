"""What of an audit may be published, and how coarsely.

The audit runs on private data — held-out people, canaries, secrets — after training, so nothing of
it is covered by the certificate's guarantee. Its public section (certificate, MLflow tags and
metrics, CLI output, the public plot) therefore carries only:

- verdicts (passed / failed / inconclusive), overall, per gate and per m of the ablation;
- counts on a grid of 10: [lo, lo + 10);
- AUROC (point and interval) on grids chosen from {0.05, 0.1, 0.25, 0.5}. Adding, removing or
  replacing one person (trained or held out) moves the Mann–Whitney AUROC by at most Δ = 1/(n − 1)
  (n: the lower end of the smaller group's published count) and an end of its Newcombe interval by at
  most INTERVAL_SPREAD·Δ (~1.8 Δ measured: the ends' slope in Â reaches 2 near Â = 1, and the width
  changes with the group sizes). The point sits on the finest grid w with Δ/w ≤ 10 % (`auroc_grid`),
  the interval, rounded outwards so it never looks tighter, on the finest with INTERVAL_SPREAD·Δ/w ≤
  10 % (`interval_grid`): if the statistic sits anywhere in its bucket with roughly even odds, one
  person moves a published bucket with probability at most 10 %. When no grid qualifies (the smaller
  group under 30 people for the point, under 50 for the interval: count buckets' lower ends below 21
  and 41) the value is not published — null, and a
  reason says so — never put on a grid one person moves more often; the verdicts stay;
- people needed (inconclusive only) on the 1-2-5 ladder, computed from published values only — the
  AUROC bucket's midpoint (1/2 when none is published), the count buckets' lower ends, the policy's
  threshold and the certificate's ceiling — so it moves only when they do (`people_needed_basis`);
- per secret class, the mean exposure on a grid from {0.5, 1, 2} bits by the same rule with
  Δ = log2(R + 1)/(n − 1) (one secret moves a class mean of n exposures by at most that); a class
  with too few secrets for even a 2-bit grid publishes its verdict and count only;
- public inputs: the certificate's ceilings, the policy's thresholds, the number of candidates.

Never: a per-person or per-secret row, a secret's rank, exposure or extrapolated exposure (those are
invertible functions of log p(secret | context): one was inverted to find a planted phone number),
TPRs at low FPR, the empirical ε bound's value, bootstrap spreads. Those stay in the private report
under `settings.private_dir / "audit"`.
"""
from __future__ import annotations

import math

from components.audit.verdict import margin, people_needed, round_up_ladder

SECTION_SCHEMA = "veil.audit/v2"
COUNT_GRID = 10
MOVE_PROBABILITY = 0.10
AUROC_GRIDS = (0.05, 0.1, 0.25, 0.5)
EXPOSURE_GRIDS = (0.5, 1.0, 2.0)
# How many Δ = 1/(n − 1) one person moves an end of the Newcombe interval of the AUROC: the point moves by
# at most Δ, the ends by up to ~1.8 Δ (their slope in Â reaches 2 near Â = 1, and the width changes with
# the group sizes), at every z up to 8 simultaneous estimates. Checked on a sweep by
# tests/privacy/test_echo_public_leak.py and tests/privacy/test_audit_public_neighbours.py.
INTERVAL_SPREAD = 2.0
COVERAGE_NOTE = ("Not covered by the certificate: measured after training on private held-out people, "
                 "canaries and secrets; published only as verdicts and coarsely quantized class-level "
                 "aggregates (one person or secret moves a published value with probability <= 10 %).")


def count_bucket(n: int) -> list[int]:
    lo = COUNT_GRID * (int(n) // COUNT_GRID)
    return [lo, lo + COUNT_GRID]


def _grid(delta: float | None, grids) -> float | None:
    if delta is None:
        return None
    for w in grids:
        if delta / w <= MOVE_PROBABILITY + 1e-12:
            return w
    return None


def strict_auroc_grid(n_in: int, n_out: int, spread: float = 1.0) -> float | None:
    """The finest AUROC grid w with spread·Δ/w ≤ 10 % (Δ = 1/(n − 1), n the smaller group's public lower
    end), or None when even the coarsest grid breaks the rule: then the value is not published.
    `spread` bounds how many Δ one person moves the published quantity (1 for a Mann–Whitney AUROC or a
    group mean in [0, 1]; INTERVAL_SPREAD for an interval's ends, whose width also depends on the group
    sizes). The model audit (`public_auroc`) and the echo audit (components/audit/echo.py) publish nothing
    rather than a value one person moves more often than the rule allows."""
    n = min(count_bucket(n_in)[0], count_bucket(n_out)[0])
    return _grid(spread / (n - 1) if n >= 2 else None, AUROC_GRIDS)


def exposure_grid(n_secrets: int, n_candidates: int, *, excess: bool = False) -> float | None:
    """Exposure lies in [0, log2(R+1)] (excess over a reference: twice that span), so one secret moves
    a class mean of n by at most span/(n − 1)."""
    n = count_bucket(n_secrets)[0]
    span = math.log2(n_candidates + 1) * (2 if excess else 1)
    return _grid(span / (n - 1) if n >= 2 else None, EXPOSURE_GRIDS)


def _r(x: float) -> float:
    return float(round(x, 10))


def bucket(x: float, w: float, lo: float = 0.0, hi: float = 1.0) -> list[float]:
    """[k·w, (k+1)·w) holding x, clipped to [lo, hi] (x = hi falls in the last bucket)."""
    k = min(math.floor(x / w + 1e-12), math.ceil(hi / w - 1e-12) - 1)
    return [_r(max(lo, k * w)), _r(min(hi, (k + 1) * w))]


def outward(interval, w: float, lo: float = 0.0, hi: float = 1.0) -> list[float]:
    a, b = interval
    return [_r(max(lo, math.floor(a / w + 1e-12) * w)),
            _r(min(hi, math.ceil(b / w - 1e-12) * w)) if math.isfinite(b) else None]


def public_auroc(point: float, interval, n_in: int, n_out: int) -> dict:
    """The point on its grid and the interval on its own (None, each, when no grid holds the rule)."""
    w = strict_auroc_grid(n_in, n_out)
    wi = strict_auroc_grid(n_in, n_out, INTERVAL_SPREAD)
    return {"auroc": None if w is None else bucket(point, w),
            "auroc_interval": None if wi is None else outward(interval, wi), "auroc_grid": w, "interval_grid": wi,
            "users_in": count_bucket(n_in), "users_out": count_bucket(n_out)}


def published_people_needed(auroc_bucket, users_in, users_out, z: float, *, threshold: float | None,
                            ceiling: float | None) -> tuple[dict | str | None, str]:
    """People needed (on the ladder) and what it was computed from: published values only — the AUROC
    bucket's midpoint (1/2, an audit that finds nothing, when no bucket is published), the count buckets'
    lower ends, z (from the public number of simultaneous estimates), the policy's threshold and the
    certificate's ceiling — never the exact Â or group sizes, which one person moves across a ladder step."""
    a = 0.5 if auroc_bucket is None else (auroc_bucket[0] + auroc_bucket[1]) / 2
    need = people_needed(a, max(1, users_in[0]), max(1, users_out[0]), z, margin(a, threshold=threshold,
                                                                                 ceiling=ceiling))
    basis = (("the AUROC bucket's midpoint" if auroc_bucket is not None else "an audit that finds nothing (AUROC 1/2)")
             + " and the count buckets' lower ends")
    return public_people_needed(need, need is None), basis


def public_people_needed(need: dict | None, unbounded: bool) -> dict | str | None:
    """People needed, rounded up on the 1-2-5 ladder (10, 20, 50, …): a coarse public figure."""
    if unbounded:
        return "more than 1000000 (the estimate sits on a decision boundary)"
    if not need:
        return None
    out = {k: round_up_ladder(v) for k, v in need.items()}
    return out if None not in out.values() else "more than 1000000"


def public_exposure_class(rows: list[dict], verdict: str | None, n_candidates: int) -> dict:
    """One secret class: its verdict, its count bucket and (if the class is large enough) its mean
    exposure (excess over the reference when there is one) on the grid above."""
    n = len(rows)
    key = "excess_exposure" if rows and all("excess_exposure" in r for r in rows) else "exposure"
    w = exposure_grid(n, n_candidates, excess=key == "excess_exposure")
    out = {"n_secrets": count_bucket(n), "verdict": verdict, "statistic": key.replace("_", " ")}
    if w is not None and n:
        mean = sum(float(r[key]) for r in rows) / n
        lo = -math.log2(n_candidates + 1) if key == "excess_exposure" else 0.0
        out.update({"mean_bits": bucket(mean, w, lo=lo, hi=math.log2(n_candidates + 1)), "grid_bits": w})
    else:
        out["mean_bits"] = None
    return out


ONE_RUN_GRID = 0.5


def public_one_run(one_run: dict, certified: float | None) -> dict:
    """The one-run ε lower bound, rounded *down* to a 0.5 grid (a lower bound stays one), its confidence
    and the certified ε beside it. Not the counts of guesses or people behind it."""
    out = {"computed": bool(one_run.get("computed")), "confidence": one_run.get("confidence"),
           "certified_epsilon": certified, "grid": ONE_RUN_GRID,
           "method": "Steinke, Nasr & Jagielski 2023 (one training run), Theorem 5.2 with the certificate's δ; "
                     "top/bottom guesses on a fixed grid, Bonferroni over it"}
    if not out["computed"]:
        out.update(epsilon_at_least=None, exceeds_certified=False, why=one_run.get("why"))
        return out
    lb = float(one_run["epsilon_lower_bound"])
    out.update(epsilon_at_least=_r(math.floor(lb / ONE_RUN_GRID + 1e-12) * ONE_RUN_GRID),
               exceeds_certified=bool(one_run.get("exceeds_certified")))
    return out


VERDICT_CODE = {"passed": 1.0, "inconclusive": 0.0, "failed": -1.0}


def public_metrics(section) -> dict[str, float]:
    """The MLflow metrics of an audit: public values only (bucket edges, ceilings, verdict code)."""
    out: dict[str, float] = {}
    if section.get("verdict") in VERDICT_CODE:
        out["audit_verdict"] = VERDICT_CODE[section["verdict"]]
    for name, key in (("auroc_bucket", "auroc"), ("auroc_interval", "auroc_interval")):
        v = section.get(key)
        if isinstance(v, (list, tuple)) and len(v) == 2:
            for side, x in zip(("lo", "hi"), v):
                if isinstance(x, (int, float)):
                    out[f"audit_{name}_{side}"] = float(x)
    for key in ("auroc_ceiling", "auroc_ceiling_pld"):
        if isinstance(section.get(key), (int, float)):
            out[f"audit_{key}"] = float(section[key])
    return out


TAG_LIMIT = 4000  # MLflow's tag values hold 5000 characters; leave room


def public_tags(section) -> dict[str, str]:
    """Tags beside `privacy_tags`' audit.* ones: the verdict, the coverage statement, and — from the
    public section alone — what the gate requires, whether the audit meets it and why."""
    out = {"audit.verdict": str(section.get("verdict")),
           "audit.covered_by_certificate": str(bool(section.get("covered_by_certificate"))).lower()}
    gate = section.get("gate")
    if isinstance(gate, dict):
        reason = str(gate.get("reason", ""))
        out.update({"audit.require": str(gate.get("require")), "audit.meets_requirement": str(bool(gate.get("meets"))).lower(),
                    "audit.reason": reason if len(reason) <= TAG_LIMIT else reason[:TAG_LIMIT - 1] + "…"})
    one = section.get("one_run")
    if isinstance(one, dict) and one.get("epsilon_at_least") is not None:
        out["audit.one_run_epsilon_at_least"] = f"{one['epsilon_at_least']:g}"
    return out
