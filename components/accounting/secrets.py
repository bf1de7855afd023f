"""Secret protection (seed 004): per-secret KL of the training run → posterior reconstruction bound γ.

Definition 3.1 protects the *content* of a secret s: the records holding s may change arbitrarily
(which records hold s is public). Lemma 3.2 (KL case): if KL(A(D) ‖ A(D')) ≤ ρ for all D ~_s D' and
the attacker's prior on the secret's value is at most κ, then no attacker reconstructs it with
probability above the largest γ ∈ [κ, 1] with d_KL(γ ‖ κ) ≤ ρ, where d_KL is the KL divergence of
Bernoulli(γ) from Bernoulli(κ).

Per-step mechanism for one secret s (Poisson sampling with per-record rates p_i, i ∈ D_s): K_s, the
number of s-records in a batch, is Poisson-binomial({p_i}); the pair we account is

    P = N(0, σ²)    vs    Q = Σ_j Pr[K_s = j] · N(j·Δ, σ²)         (Δ = sensitivity, clip-norm units)

with KL taken in both directions (max) and multiplied by T (KL adds up under adaptive composition).

Sensitivity. A record that changes arbitrarily moves its clipped gradient by up to 2C, hence the
default Δ = 2 per record. Δ = 1 would only be right for "replace by a null record" semantics, which
Definition 3.1 with arbitrary transformations does not give. That the add/remove-style mixture with
Δ = 2 bounds the substitution pair is checked numerically (tests), not proved; every result says so.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import special

from components.core.errors import VeilError
from components.core.canonical import EPSILON_DIGITS, ceil_sig, epsilon_up, sigma_up

DEFAULT_SENSITIVITY = 2.0
SENSITIVITY_REASON = (
    "records holding a secret may change arbitrarily (Definition 3.1, any transformation), so a sampled "
    "record moves the clipped gradient sum by up to 2·C: sensitivity 2 per record")
DOMINANCE_NOTE = (
    "the per-step pair N(0,σ²) vs Poisson-binomial mixture of N(j·Δ,σ²) is taken to dominate the substitution "
    "pair; checked numerically for Δ=2 (tests/accounting), not proved")


@functools.cache
def _gauss_hermite() -> tuple[np.ndarray, np.ndarray]:
    """200-point Gauss–Hermite nodes and weights, computed once when first needed (~0.2 s: not paid by
    `veil verify`, which imports this module for gamma_from_kl only)."""
    return np.polynomial.hermite.hermgauss(200)


# Components of the count distribution whose weight·(jΔ)²/(2σ²) is this small are dropped and their
# whole worst-case contribution added back (convexity bound), so trimming never lowers the KL.
_TRIM = 1e-14


# --- Lemma 3.2, KL case --------------------------------------------------------------------------

def _check_kappa(kappa: float) -> float:
    try:
        k = float(kappa)
    except (TypeError, ValueError):
        raise VeilError(f"kappa: {kappa!r} is not a number") from None
    if not 0.0 < k < 1.0:
        raise VeilError(f"kappa: {kappa} must be in (0, 1)")
    return k


def _d_kl(gamma: float, kappa: float) -> float:
    """d_KL(Bernoulli(γ) ‖ Bernoulli(κ))."""
    first = gamma * math.log(gamma / kappa) if gamma > 0 else 0.0
    second = (1.0 - gamma) * math.log((1.0 - gamma) / (1.0 - kappa)) if gamma < 1 else 0.0
    return first + second


def kl_budget(kappa: float, gamma: float) -> float:
    """ρ = d_KL(γ ‖ κ): the KL a run may spend so that the posterior bound stays ≤ γ for prior κ."""
    k = _check_kappa(kappa)
    try:
        g = float(gamma)
    except (TypeError, ValueError):
        raise VeilError(f"gamma: {gamma!r} is not a number") from None
    if not k <= g <= 1.0:
        raise VeilError(f"gamma: {gamma} must be in [kappa={k:g}, 1]; below kappa no mechanism can help")
    return _d_kl(g, k)


def gamma_from_kl(kl: float, kappa: float) -> float:
    """Largest γ ∈ [κ, 1] with d_KL(γ ‖ κ) ≤ kl (the posterior bound), rounded up (bisection)."""
    k = _check_kappa(kappa)
    kl = float(kl)
    if math.isnan(kl) or kl < 0:
        raise VeilError(f"kl: {kl} must be ≥ 0")
    if kl == 0:
        return k
    if kl >= -math.log(k):  # d_KL(1 ‖ κ) = ln(1/κ): no protection left
        return 1.0
    lo, hi = k, 1.0        # d(lo) ≤ kl < d(hi); d increases on [κ, 1]
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _d_kl(mid, k) <= kl:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * max(1e-300, hi) or hi - lo < 1e-300:
            break
    return hi


def published_bounds(kl: float, steps: int, kappa: float) -> tuple[float, float, float]:
    """(KL per step, KL, γ) of a secret (class) as plans and certificates publish them
    (components.core.canonical: machine-independent, never below the computed values): the per-step KL
    rounded up, the run's KL = steps × that (so a verifier recomputes it exactly from the per-step
    figure), γ from that KL rounded up."""

    T, raw = int(steps), float(kl)
    if T <= 0 or raw <= 0.0:
        return 0.0, 0.0, float(kappa)
    step = epsilon_up(raw / T)
    while T * step < raw:   # the float product may land below the exact one: never publish less
        step = ceil_sig(math.nextafter(step, math.inf), EPSILON_DIGITS)
    total = T * step
    return step, total, min(1.0, epsilon_up(gamma_from_kl(total, kappa)))


# --- the per-secret mixture -----------------------------------------------------------------------

def _binom_pmf(n: int, p: float) -> np.ndarray:
    if p >= 1.0:
        out = np.zeros(n + 1)
        out[n] = 1.0
        return out
    j = np.arange(n + 1)
    log_pmf = (special.gammaln(n + 1) - special.gammaln(j + 1) - special.gammaln(n - j + 1)
               + j * math.log(p) + (n - j) * math.log1p(-p))
    return np.exp(log_pmf)


def count_pmf(rates: Sequence[float]) -> np.ndarray:
    """Poisson-binomial pmf of how many of these records land in one Poisson batch.

    Identical rates are grouped into binomials (the LP gives few distinct rates), then convolved.
    """
    p = np.asarray(list(rates), dtype=float)
    if p.ndim != 1:
        raise VeilError("rates: must be a flat sequence of per-record sampling rates")
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise VeilError("rates: every per-record rate must be in [0, 1]")
    p = p[p > 0]
    pmf = np.array([1.0])
    values, counts = np.unique(p, return_counts=True)
    for v, n in zip(values, counts):
        pmf = np.convolve(pmf, _binom_pmf(int(n), float(v)))
    pmf = np.clip(pmf, 0.0, None)
    return pmf / pmf.sum()


def _expect_gauss(f, mean: np.ndarray, sigma: float) -> np.ndarray:
    """E[f(X)], X ~ N(mean_j, σ²) for each mean_j, by Gauss–Hermite quadrature (200 nodes)."""
    nodes, weights = _gauss_hermite()
    x = mean[:, None] + math.sqrt(2.0) * sigma * nodes[None, :]
    return (f(x) * weights[None, :]).sum(axis=1) / math.sqrt(math.pi)


def mixture_kl(pmf: np.ndarray, noise_multiplier: float, sensitivity: float) -> tuple[float, float]:
    """(KL(Q‖P), KL(P‖Q)) for one step: P = N(0,σ²), Q = Σ_j pmf_j N(j·Δ, σ²)."""
    s = float(noise_multiplier)
    mu_all = np.arange(len(pmf)) * float(sensitivity)
    w_all = np.asarray(pmf, dtype=float)
    cost = w_all * mu_all ** 2 / (2 * s * s)  # component j's worst case: KL(N(μ_j)‖N(0)) = μ_j²/2σ²
    # Drop the cheapest components while their total worst-case cost stays ≤ _TRIM; add it back below.
    # (The zero count costs nothing but dropping it would inflate the rest: it always stays.)
    order = 1 + np.argsort(cost[1:], kind="stable")
    drop = np.zeros(len(w_all), dtype=bool)
    drop[order[np.cumsum(cost[order]) <= _TRIM]] = True
    drop[int(np.argmax(w_all))] = False
    drop |= w_all == 0.0
    drop[0] = drop[0] and w_all[0] == 0.0
    added = float(cost[drop].sum())
    w, mu = w_all[~drop], mu_all[~drop]
    w = w / w.sum()
    if len(w) == 1 and mu[0] == 0.0:  # nothing but the zero count is left
        return added, added
    logw = np.log(w)
    inv_var = 1.0 / (s * s)

    const = logw - 0.5 * mu ** 2 * inv_var
    slope = mu * inv_var

    def loss(x: np.ndarray) -> np.ndarray:  # log dQ/dP(x) = LSE_j(log w_j + (μ_j x − μ_j²/2)/σ²)
        flat = x.reshape(-1)
        out = np.empty_like(flat)
        step = max(1, 4_000_000 // len(mu))
        for i in range(0, len(flat), step):
            z = const[None, :] + np.multiply.outer(flat[i:i + step], slope)
            m = z.max(axis=1)
            out[i:i + step] = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
        return out.reshape(x.shape)

    # one quadrature pass: rows 0..J−1 for E_Q (component means), last row for E_P (mean 0)
    both = _expect_gauss(loss, np.concatenate([mu, [0.0]]), s)
    kl_qp = float((w * both[:-1]).sum())
    kl_pq = float(-both[-1])
    # KL is jointly convex: Q = (1−τ)·Q_kept + τ·Q_dropped gives KL ≤ KL(kept) + Σ_dropped w_j μ_j²/2σ²
    # in both directions (KL ≥ 0, so (1−τ)·KL(kept) ≤ KL(kept)).
    return max(kl_qp, 0.0) + added, max(kl_pq, 0.0) + added


@dataclass(frozen=True)
class SecretKL:
    kl: float                       # T × max(per-step KL in either direction)
    kl_per_step_remove: float       # KL(Q‖P)
    kl_per_step_add: float          # KL(P‖Q)
    steps: int
    noise_multiplier: float
    sensitivity: float
    n_records: int                  # records holding the secret with a positive rate
    expected_sampled: float         # Σ p_i: expected s-records per batch
    sensitivity_reason: str = SENSITIVITY_REASON
    dominance: str = DOMINANCE_NOTE

    def to_dict(self) -> dict:
        return asdict(self)


def _validate_sigma_steps(noise_multiplier: float, steps: int, sensitivity: float) -> None:
    if not (float(noise_multiplier) > 0 and math.isfinite(float(noise_multiplier))):
        raise VeilError(f"noise_multiplier: {noise_multiplier} must be a finite number > 0")
    if isinstance(steps, bool) or int(steps) != steps or int(steps) < 1:
        raise VeilError(f"steps: {steps!r} must be an integer ≥ 1")
    if not (float(sensitivity) > 0 and math.isfinite(float(sensitivity))):
        raise VeilError(f"sensitivity: {sensitivity} must be a finite number > 0")


def secret_kl(rates: Sequence[float], noise_multiplier: float, steps: int,
              sensitivity: float = DEFAULT_SENSITIVITY) -> SecretKL:
    """KL spent on one secret by T steps of Poisson-sampled DP-SGD (σ in clip-norm units)."""
    _validate_sigma_steps(noise_multiplier, steps, sensitivity)
    rates = [float(r) for r in rates]
    pmf = count_pmf(rates)
    per_remove, per_add = mixture_kl(pmf, noise_multiplier, sensitivity)
    T = int(steps)
    return SecretKL(kl=T * max(per_remove, per_add), kl_per_step_remove=per_remove, kl_per_step_add=per_add,
                    steps=T, noise_multiplier=float(noise_multiplier), sensitivity=float(sensitivity),
                    n_records=int(sum(1 for r in rates if r > 0)), expected_sampled=float(sum(rates)))


# --- many secrets: report and calibrate ------------------------------------------------------------

@dataclass(frozen=True)
class SecretTarget:
    """One secret: the sampling rates of the records holding it, its prior κ and allowed posterior γ."""
    secret_id: str
    rates: tuple[float, ...]
    kappa: float
    gamma: float

    @classmethod
    def make(cls, secret_id: str, rates: Iterable[float], kappa: float, gamma: float) -> "SecretTarget":
        kl_budget(kappa, gamma)  # validates κ, γ
        return cls(str(secret_id), tuple(float(r) for r in rates), float(kappa), float(gamma))


@dataclass(frozen=True)
class SecretReport:
    secret_id: str
    kl: float
    gamma: float                    # achieved posterior bound (≤ gamma_target when calibrated)
    kappa: float
    gamma_target: float | None
    kl_budget: float | None
    n_records: int
    expected_sampled: float
    meets_target: bool | None

    def to_dict(self) -> dict:
        return asdict(self)


def secret_report(target: SecretTarget, noise_multiplier: float, steps: int,
                  sensitivity: float = DEFAULT_SENSITIVITY) -> SecretReport:
    r = secret_kl(target.rates, noise_multiplier, steps, sensitivity)
    g = gamma_from_kl(r.kl, target.kappa)
    return SecretReport(secret_id=target.secret_id, kl=r.kl, gamma=g, kappa=target.kappa,
                        gamma_target=target.gamma, kl_budget=kl_budget(target.kappa, target.gamma),
                        n_records=r.n_records, expected_sampled=r.expected_sampled,
                        meets_target=r.kl <= kl_budget(target.kappa, target.gamma))


def report_secrets(targets: Iterable[SecretTarget], noise_multiplier: float, steps: int,
                   sensitivity: float = DEFAULT_SENSITIVITY) -> list[SecretReport]:
    """Per-secret KL and γ at σ, worst first (largest γ/γ_target, then largest KL)."""
    cache: dict[tuple, SecretKL] = {}
    out = []
    for t in targets:
        key = tuple(sorted(t.rates))
        if key not in cache:
            cache[key] = secret_kl(t.rates, noise_multiplier, steps, sensitivity)
        r = cache[key]
        g = gamma_from_kl(r.kl, t.kappa)
        out.append(SecretReport(secret_id=t.secret_id, kl=r.kl, gamma=g, kappa=t.kappa, gamma_target=t.gamma,
                                kl_budget=kl_budget(t.kappa, t.gamma), n_records=r.n_records,
                                expected_sampled=r.expected_sampled, meets_target=g <= t.gamma))
    out.sort(key=lambda r: (-(r.gamma / r.gamma_target if r.gamma_target else r.gamma), -r.kl, r.secret_id))
    return out


@dataclass(frozen=True)
class SecretsCalibration:
    noise_multiplier: float
    steps: int
    sensitivity: float
    binding_secret: str | None
    secrets: list[SecretReport] = field(default_factory=list)  # worst first
    tolerance: float = 1e-3
    accountant: str = "kl (seed 004 Lemma 3.2), Gauss–Hermite quadrature of the per-step mixture"
    sensitivity_reason: str = SENSITIVITY_REASON
    dominance: str = DOMINANCE_NOTE

    def to_dict(self) -> dict:
        d = asdict(self)
        d["secrets"] = [s.to_dict() for s in self.secrets]
        return d


def _sigma_for(pmf: np.ndarray, budget: float, steps: int, sensitivity: float, tol: float,
               start: float) -> float:
    """Smallest σ (within tol, rounded up) with T·max-direction KL ≤ budget; KL falls as σ grows."""
    def ok(s: float) -> bool:
        return steps * max(mixture_kl(pmf, s, sensitivity)) <= budget

    hi = max(start, 1e-3)
    while not ok(hi):
        hi *= 2.0
        if hi > 1e6:
            raise VeilError(f"secret budget ρ={budget:g} needs noise_multiplier > 1e6; loosen gamma or drop records")
    lo = hi / 2.0
    while ok(lo):
        hi, lo = lo, lo / 2.0
        if lo < 1e-4:
            return hi
    while hi / lo - 1.0 > tol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_secrets(targets: Iterable[SecretTarget], *, steps: int, sensitivity: float = DEFAULT_SENSITIVITY,
                      tolerance: float = 1e-3) -> SecretsCalibration:
    """Smallest σ meeting every secret's γ (seed 004 §4): σ* = max over secrets of each one's own σ*.

    Secrets are screened with the convexity bound KL ≤ T·E[K²]·Δ²/(2σ²): a secret whose bound already
    holds at the current σ* cannot raise it and is not bisected.
    """
    targets = list(targets)
    if isinstance(steps, bool) or int(steps) != steps or int(steps) < 1:
        raise VeilError(f"steps: {steps!r} must be an integer ≥ 1")
    T = int(steps)
    groups: dict[tuple, list[SecretTarget]] = {}
    for t in targets:
        groups.setdefault(tuple(sorted(r for r in t.rates if r > 0)), []).append(t)
    # per distinct rate multiset, only the tightest budget matters
    items = []
    for rates, ts in groups.items():
        tight = min(ts, key=lambda t: kl_budget(t.kappa, t.gamma))
        budget = kl_budget(tight.kappa, tight.gamma)
        pmf = count_pmf(rates)
        ek2 = float((pmf * np.arange(len(pmf)) ** 2).sum())
        if budget <= 0 and ek2 > 0:
            raise VeilError(f"secret {tight.secret_id}: gamma equals kappa (no KL budget) but {len(rates)} "
                            "record(s) holding it are sampled; give them rate 0 or raise gamma")
        bound_sigma = math.inf if budget <= 0 else sensitivity * math.sqrt(T * ek2 / (2 * budget))
        items.append((bound_sigma, pmf, budget, tight.secret_id))
    items.sort(key=lambda x: -x[0])
    sigma, binding = 0.0, None
    for bound_sigma, pmf, budget, sid in items:
        if bound_sigma <= sigma or len(pmf) == 1:
            continue  # screened: already met at the current σ*
        if sigma > 0 and T * max(mixture_kl(pmf, sigma, sensitivity)) <= budget:
            continue
        s_star = _sigma_for(pmf, budget, T, sensitivity, tolerance, start=max(sigma, bound_sigma / 4))
        if s_star > sigma:
            sigma, binding = s_star, sid
    if sigma == 0.0:
        raise VeilError("secrets: no secret is ever sampled (all rates 0); nothing to calibrate")
    # σ as published (rounded up: more noise), and the per-secret bounds at it as published (rounded
    # up): step σ up until every published γ still meets its target (components.core.canonical)

    sigma = sigma_up(sigma)
    for _ in range(20):
        reports = report_secrets(targets, sigma, T, sensitivity)
        if all(r.gamma_target is None or published_bounds(r.kl, T, r.kappa)[2] <= r.gamma_target for r in reports):
            break
        sigma = sigma_up(sigma * (1.0 + tolerance))
    bad = [r.secret_id for r in reports if not r.meets_target]
    if bad:  # pragma: no cover - guarded by construction; never certify a miss
        raise VeilError(f"secrets: calibrated σ={sigma:g} misses the target for {', '.join(bad[:5])}")
    return SecretsCalibration(noise_multiplier=sigma, steps=T, sensitivity=float(sensitivity), binding_secret=binding,
                              secrets=reports, tolerance=tolerance)


# --- from a plan's tables ----------------------------------------------------------------------------

def secret_rates(train_records, secret_spans, *, sampling_rate: float, per_user: bool = False
                 ) -> dict[str, tuple[str, list[float]]]:
    """secret_id → (secret_class, rates of the sampling units that hold it).

    `train_records`: the plan's train_records_file table (record_id, user_id[, rate]); one row is one
    training example (a record listed twice is two examples). Rows without a `rate` column are sampled at
    `sampling_rate`. `per_user` (ULS): the unit is the user — a user's clipped mean gradient moves by at
    most 2C whatever their records hold — so each distinct user holding s counts once, at `sampling_rate`.
    `secret_spans`: the snapshot's (record_id, secret_id, secret_class, …) table.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    for col in ("record_id", "user_id"):
        if col not in train_records.column_names:
            raise VeilError(f"train records: no '{col}' column")
    for col in ("record_id", "secret_id", "secret_class"):
        if col not in secret_spans.column_names:
            raise VeilError(f"secret spans: no '{col}' column")
    has_rate = "rate" in train_records.column_names and not per_user
    train = train_records.select(["record_id", "user_id"] + (["rate"] if has_rate else []))
    train = train.append_column("_row", pa.array(range(train.num_rows), pa.int64()))
    spans = secret_spans.select(["record_id", "secret_id", "secret_class"]).group_by(
        ["record_id", "secret_id", "secret_class"]).aggregate([])  # a record holds a secret once
    joined = train.join(spans, "record_id", join_type="inner")
    if joined.num_rows and has_rate:
        rates = joined.column("rate")
        if pc.any(pc.or_(pc.less(rates, 0), pc.greater(rates, 1))).as_py():
            raise VeilError("train records: column 'rate' has values outside [0, 1]")
    out: dict[str, tuple[str, list[float]]] = {}
    sids = joined.column("secret_id").to_pylist()
    classes = joined.column("secret_class").to_pylist()
    if per_user:
        users = joined.column("user_id").to_pylist()
        seen: dict[str, set] = {}
        for sid, cls, u in zip(sids, classes, users):
            if u not in seen.setdefault(sid, set()):
                seen[sid].add(u)
                out.setdefault(sid, (cls, []))[1].append(float(sampling_rate))
    else:
        rate_list = joined.column("rate").to_pylist() if has_rate else [float(sampling_rate)] * joined.num_rows
        for sid, cls, r in zip(sids, classes, rate_list):
            out.setdefault(sid, (cls, []))[1].append(float(r))
    return out


def secret_targets(train_records, secret_spans, protection: dict) -> list[SecretTarget]:
    """One target per secret held by the training rows, with its class' (κ, γ).

    `protection`: secret class → object or mapping with `kappa` and `gamma`; classes not in it are
    left out. Rates come from the rows' `rate` column (secret-protection plans)."""
    def get(p, key):
        return p[key] if isinstance(p, dict) else getattr(p, key)

    per = secret_rates(train_records, secret_spans, sampling_rate=0.0)
    return [SecretTarget.make(sid, rates, get(protection[cls], "kappa"), get(protection[cls], "gamma"))
            for sid, (cls, rates) in sorted(per.items()) if cls in protection]
