"""The audit's verdict: passed only when the data show it, failed only when the data show it.

An audit measures an attack on a finite set of people, so its AUROC is an estimate with an
interval. A point estimate compared with a threshold says PASSED on 8 people in and 3 out whose
95 % interval spans [0.33, 0.90] — that is no evidence either way. The rule here:

    FAILED        the interval's lower end is above the policy threshold, or above the ceiling the
                  certificate implies (the second means the certificate or the code is wrong);
    PASSED        the interval's upper end is below the threshold (below the ceiling when the policy
                  sets none);
    INCONCLUSIVE  otherwise, with the number of people (in and out) the audit would need for the
                  interval's half-width to fall below the distance to the nearest boundary.

The same rule runs at every m of the samples-per-user ablation (a stronger attack at m = 1 than at
m = all must not hide), with one simultaneous confidence level over all of them (Bonferroni).

AUROC interval: the score-type interval of Newcombe (2006, "Confidence intervals for an effect size
measure based on the Mann–Whitney statistic. Part 2", method 5): the Hanley–McNeil variance with
both group sizes replaced by N* = (n_in + n_out)/2, evaluated at the *candidate* value A and inverted,
{A : (A − Â)² ≤ z² V(A)}. Unlike a Wald interval it does not collapse to a point at Â = 1 or 0 and
it stays inside [0, 1]; tests check its coverage by simulation on tiny audits.

Secret exposure: each secret's calibrated rank — its log-likelihood ratio (model over reference)
among its random candidates' ratios — is uniform without memorisation, so the count of a class's
secrets above the policy's limit is binomial at a known chance rate. The class verdict bounds the
fraction exposed beyond chance with Clopper–Pearson (Bonferroni over classes) against the policy's
tolerance; a secret significant on its own (Bonferroni over every secret) fails its class. See
`exposure_verdict`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from components.core.errors import VeilError

PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"
CONFIDENCE = 0.95
MAX_PEOPLE = 1_000_000


def combine(verdicts: Iterable[str | None]) -> str | None:
    """failed beats inconclusive beats passed; None (nothing to gate on) is skipped."""
    vs = [v for v in verdicts if v is not None]
    if not vs:
        return None
    if FAILED in vs:
        return FAILED
    if INCONCLUSIVE in vs:
        return INCONCLUSIVE
    return PASSED


def z_value(confidence: float = CONFIDENCE, tests: int = 1) -> float:
    """Two-sided normal quantile for `tests` simultaneous intervals at family-wise `confidence`."""
    from scipy.stats import norm

    if not 0 < confidence < 1 or tests < 1:
        raise VeilError(f"confidence must be in (0, 1) and tests >= 1; got {confidence}, {tests}")
    return float(norm.ppf(1 - (1 - confidence) / (2 * tests)))


def hm_variance(a: float, n_in: float, n_out: float) -> float:
    """Hanley–McNeil variance of the Mann–Whitney AUROC at A = a, with Newcombe's N* = (n_in+n_out)/2
    in place of both group sizes in the second-order terms:
    V = A(1−A)/(n_in n_out) · [1 + (N*−1)((1−A)/(2−A) + A/(1+A))]."""
    if n_in <= 0 or n_out <= 0:
        raise VeilError(f"AUROC variance needs members and non-members; got {n_in}, {n_out}")
    n_star = (n_in + n_out) / 2.0
    return a * (1 - a) / (n_in * n_out) * (1 + (n_star - 1) * ((1 - a) / (2 - a) + a / (1 + a)))


def auroc_interval(a_hat: float, n_in: int, n_out: int, z: float) -> tuple[float, float]:
    """{A in [0, 1] : (A − Â)² ≤ z² V(A)} (Newcombe's method 5), by bisection on each side of Â."""
    if not 0.0 <= a_hat <= 1.0:
        raise VeilError(f"AUROC must be in [0, 1], got {a_hat}")

    def f(a: float) -> float:
        return (a - a_hat) ** 2 - z * z * hm_variance(a, n_in, n_out)

    def root(inside: float, outside: float) -> float:
        # f(inside) <= 0 < f(outside) (or the end itself is inside): bisect to 1e-10
        if f(outside) <= 0:
            return outside
        for _ in range(80):
            mid = (inside + outside) / 2
            if f(mid) <= 0:
                inside = mid
            else:
                outside = mid
        return inside

    return root(a_hat, 0.0), root(a_hat, 1.0)


def decide(lo: float, hi: float, *, threshold: float | None, ceiling: float | None) -> str | None:
    """The rule above for one interval. `ceiling`: None when the certificate bounds no user-level test."""
    if ceiling is not None and lo > ceiling:
        return FAILED
    if threshold is not None and lo > threshold:
        return FAILED
    bound = threshold if threshold is not None else ceiling
    if bound is None:
        return None
    return PASSED if hi < bound else INCONCLUSIVE


def margin(a_hat: float, *, threshold: float | None, ceiling: float | None) -> float | None:
    """Distance from Â to the boundary whose side would settle the verdict."""
    bound = threshold if threshold is not None else ceiling
    if bound is None:
        return None
    if a_hat < bound:
        return bound - a_hat
    below = [b for b in (threshold, ceiling) if b is not None and b <= a_hat]
    return a_hat - min(below)


def people_needed(a_hat: float, n_in: int, n_out: int, z: float, gap: float | None) -> dict | None:
    """People (in, out; today's ratio kept) for z·sqrt(V(Â)) to fall below `gap`, if Â stays put.
    None when no audit up to a million people would do (Â sits on a boundary)."""
    if gap is None or gap <= 1e-9:
        return None
    a = min(max(a_hat, 1e-6), 1 - 1e-6)  # V(1) = 0: use a hair inside so the estimate stays finite

    def half(s: float) -> float:
        return z * math.sqrt(hm_variance(a, s * n_in, s * n_out))

    if half(1.0) < gap:
        return {"in": int(n_in), "out": int(n_out)}
    hi = MAX_PEOPLE / (n_in + n_out)
    if half(hi) >= gap:
        return None
    lo = 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if half(mid) >= gap else (lo, mid)
    return {"in": int(math.ceil(hi * n_in)), "out": int(math.ceil(hi * n_out))}


def auroc_verdict(curves: Sequence[dict], *, threshold: float | None, ceiling: float | None,
                  confidence: float = CONFIDENCE) -> dict:
    """Verdict over several AUROC estimates of the same audit (the m-ablation; the last is the full
    statistic). Each curve: {"m", "auroc" (point), "users_in", "users_out"}. Returns per-curve
    intervals and verdicts, the overall verdict and the people needed. All private: the public
    section keeps only the verdicts and quantized values."""
    if not curves:
        raise VeilError("audit: no AUROC to decide on")
    z = z_value(confidence, len(curves))
    rows, needs = [], []
    for c in curves:
        a, n1, n0 = float(c["auroc"]), int(c["users_in"]), int(c["users_out"])
        lo, hi = auroc_interval(a, n1, n0, z)
        v = decide(lo, hi, threshold=threshold, ceiling=ceiling)
        row = {"m": c.get("m"), "auroc": a, "interval": [lo, hi], "verdict": v,
               "above_ceiling": bool(ceiling is not None and lo > ceiling)}
        if v == INCONCLUSIVE:
            row["people_needed"] = people_needed(a, n1, n0, z, margin(a, threshold=threshold, ceiling=ceiling))
            needs.append(row["people_needed"])
        rows.append(row)
    need = None
    if needs:
        need = None if any(n is None for n in needs) else {
            "in": max(n["in"] for n in needs), "out": max(n["out"] for n in needs)}
    return {"verdict": combine(r["verdict"] for r in rows), "curves": rows, "z": z, "confidence": confidence,
            "simultaneous_over": len(curves), "people_needed": need,
            "people_needed_unbounded": bool(needs) and need is None,
            "above_ceiling": any(r["above_ceiling"] for r in rows)}


# --- secret exposure ----------------------------------------------------------------------------------

def exposure_interval(k_above: int, n_candidates: int, a: float) -> tuple[float, float]:
    """Clopper–Pearson exposure bounds (bits) with one-sided error `a` at each end; +inf upper end
    when no candidate outscored the secret."""
    from scipy.stats import beta

    k, n = int(k_above), int(n_candidates)
    if n < 1 or not 0 <= k <= n:
        raise VeilError(f"exposure: need 0 <= candidates above <= candidates >= 1; got {k}, {n}")
    p_hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    p_lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    return -math.log2(p_hi), (math.inf if p_lo <= 0 else -math.log2(p_lo))


DEFAULT_EXPOSED_FRACTION = 0.1
MAX_CANDIDATES = 100_000  # past this an audit's cost (secrets × candidates × 2 models) is not worth planning


def chance_rate(n_candidates: int, limit: float) -> float:
    """P(a secret's exposure > `limit` bits) when its rank is uniform on 1..R+1 (no memorisation):
    the ranks r with log2(R+1) − log2(r) > limit, i.e. r < (R+1)·2^−limit."""
    n = int(n_candidates) + 1
    return max(0, math.ceil(n * 2.0 ** -limit) - 1) / n


def resolves(n_candidates: int, limit: float) -> bool:
    """Whether R candidates can show an exposure above `limit` at all: a secret ranked first has
    log2(R+1) bits."""
    return math.log2(int(n_candidates) + 1) > limit


def candidates_for_limit(limit: float) -> int:
    """Candidates per secret the planner asks for: the first ladder value with R + 1 >= 2^(limit+2), so a
    secret ranked first is 2 bits past the limit and the chance rate is within a quarter of 2^−limit."""
    need = 2.0 ** (limit + 2) - 1
    for r in ladder(stop=MAX_CANDIDATES):
        if r >= need:
            return r
    return MAX_CANDIDATES


def _cp(k: int, n: int, a: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds, each with error `a`."""
    from scipy.stats import beta

    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _class_bounds(k: int, n: int, t_lo: float, t_hi: float, a: float) -> tuple[float, float]:
    """Bounds on the fraction of a class's secrets exposed above the limit beyond chance:
    θ = f + (1 − f)·t, so f = (θ − t)/(1 − t); the chance rate t of the class's secrets spans [t_lo, t_hi]."""
    th_lo, th_hi = _cp(k, n, a)
    return (th_lo - t_hi) / (1 - t_hi), (th_hi - t_lo) / (1 - t_lo)


def secrets_to_pass(limit: float, tolerance: float, n_candidates: int, a: float) -> int | None:
    """The fewest secrets in a class (1-2-5 ladder) with which a class that memorised nothing (its
    exceedances at the chance rate, rounded up) passes: upper bound on the exposed fraction < tolerance.
    A function of public values only. None past the ladder's end."""
    t = chance_rate(n_candidates, limit)
    for n in ladder(1):
        k = math.ceil(n * t)
        if k <= n and _class_bounds(k, n, t, t, a)[1] < tolerance:
            return n
    return None


def exposure_verdict(rows: Sequence[dict], *, limit: float | None, confidence: float = CONFIDENCE,
                     max_exposed_fraction: float = DEFAULT_EXPOSED_FRACTION) -> dict:
    """Verdict of the secret-exposure gate over `rows` (from `exposure.secret_exposure`).

    The statistic is each secret's calibrated rank (its model/reference log-likelihood ratio ranked
    among its candidates' ratios; the plain rank when there is no reference). Without memorisation it
    is uniform on 1..R+1, independently across secrets, so:

    - a secret is *significant* when rank/(R+1) <= (1 − confidence)/(2 · number of secrets): an exact
      test of "exchangeable with its candidates", Bonferroni over every secret audited. Any
      significant secret fails its class;
    - per class, the number X of secrets whose exposure exceeds `limit` is Binomial(n, θ) with θ =
      f + (1 − f)·t (t the chance rate, f the fraction exposed beyond chance). One-sided
      Clopper–Pearson bounds on θ at (1 − confidence)/(2 · number of classes) give bounds on f: FAILED
      when f's lower bound exceeds `max_exposed_fraction`, PASSED when its upper bound is below it,
      INCONCLUSIVE otherwise. A single secret above the limit by chance moves X by one — it cannot
      fail a class on its own unless it is significant by itself;
    - a class whose candidates cannot show `limit` bits at all (R + 1 <= 2^limit) is INCONCLUSIVE with
      `candidates_needed`.
    """
    if not rows:
        return {"verdict": None, "secrets": [], "classes": {}, "candidates_needed": None, "secrets_needed": None,
                "calibrated": False}
    calibrated = all("calibrated_rank" in r for r in rows)
    rank_key = "calibrated_rank" if calibrated else "rank"
    n_all = len(rows)
    by_class: dict[str, list[dict]] = {}
    out = []
    for r in rows:
        rank, n_c = int(r[rank_key]), int(r["n_candidates"])
        exposure = math.log2(n_c + 1) - math.log2(rank)
        sv = {"secret_ref": r.get("secret_ref"), "secret_class": r.get("secret_class"), "exposure": exposure,
              "p_value": rank / (n_c + 1), "n_candidates": n_c,
              "exceeds": bool(limit is not None and exposure > limit),
              "significant": bool(rank / (n_c + 1) <= (1 - confidence) / (2 * n_all))}
        out.append(sv)
        by_class.setdefault(str(r.get("secret_class")), []).append(sv)
    a = (1 - confidence) / (2 * len(by_class))   # half for the class tests, half for the per-secret ones
    classes: dict[str, dict] = {}
    need_c, need_s = [], []
    for c, svs in sorted(by_class.items()):
        n, k = len(svs), sum(s["exceeds"] for s in svs)
        rs = [s["n_candidates"] for s in svs]
        row = {"n": n, "exceeding": k, "significant": sum(s["significant"] for s in svs)}
        if row["significant"]:
            row.update(verdict=FAILED, why="significant")
        elif limit is None:
            row.update(verdict=None, why="no limit")
        elif not all(resolves(x, limit) for x in rs):
            row.update(verdict=INCONCLUSIVE, why="candidates")
            need_c.append(candidates_for_limit(limit))
        else:
            ts = [chance_rate(x, limit) for x in rs]
            f_lo, f_hi = _class_bounds(k, n, min(ts), max(ts), a)
            row.update(chance_rate=max(ts), exposed_fraction=[f_lo, f_hi])
            if f_lo > max_exposed_fraction:
                row.update(verdict=FAILED, why="fraction")
            elif f_hi < max_exposed_fraction:
                row.update(verdict=PASSED, why="fraction")
            else:
                row.update(verdict=INCONCLUSIVE, why="secrets")
                need_s.append(secrets_to_pass(limit, max_exposed_fraction, min(rs), a))
        classes[c] = row
        for s_ in svs:
            s_["verdict"] = row["verdict"]
    verdict = combine(r["verdict"] for r in classes.values())
    return {"verdict": verdict, "secrets": out, "classes": classes, "calibrated": calibrated,
            "excess_over_reference": calibrated, "tolerance": max_exposed_fraction, "per_class_error": a,
            "candidates_needed": max(need_c) if need_c else None,
            "secrets_needed": (None if any(x is None for x in need_s) else max(need_s)) if need_s else None}


def ladder(start: int = 10, stop: int = MAX_PEOPLE):
    """10, 20, 50, 100, 200, 500, …: a coarse grid for published counts and needs."""
    x = start
    while x <= stop:
        for f in (1, 2, 5):
            if x * f <= stop:
                yield x * f
        x *= 10


def round_up_ladder(n: int | None) -> int | None:
    """The first ladder value >= n (None when past the ladder's end)."""
    if n is None:
        return None
    for v in ladder():
        if v >= n:
            return v
    return None


# --- the promotion gate -------------------------------------------------------------------------------
GATE_REQUIREMENTS = ("passed", "not_failed")


def gate_decision(verdict: str | None, require: str, reasons: Sequence[str]) -> dict:
    """Whether an audit with this verdict meets the policy's `audit.require`, and why (public: built from
    the verdict and the public reasons only). `passed` needs a passed audit; `not_failed` promotes an
    inconclusive one too (organizations too small for a passing audit), never a failed one."""
    if require not in GATE_REQUIREMENTS:
        raise VeilError(f"audit.require: {require!r} is not one of {', '.join(GATE_REQUIREMENTS)}")
    meets = verdict == PASSED or (require == "not_failed" and verdict == INCONCLUSIVE)
    if verdict == PASSED:
        reason = "audit passed"
    else:
        said = "; ".join(reasons) if reasons else "no gate had anything to decide on"
        reason = f"audit {verdict or 'not run'}: {said}"
    return {"require": require, "meets": bool(meets), "reason": reason}
