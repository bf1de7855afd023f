"""A release's cost to one person as an RDP curve, and the individual Rényi filter over such curves.

Everything here is a pure function of numbers; the derivations are in docs/privacy/ledger.md.

Cost of one release to one person (add/remove that person's rows, clip norm C, noise σC, T steps):
  * user unit (uls): one clipped mean per sampled user, so the person's step is
    PoissonSampled(q, Gaussian(σ)) — dp-accounting's RDP accountant, composed T times;
  * row units (record, els, group, secret): each of the person's n rows is Poisson-sampled on its
    own (rate p_r). Per step the person moves the noisy sum by a vector of norm ≤ C·#sampled ≤ n·C, and
    by 0 when none of their rows is sampled. Conditioned on "some row sampled" (probability
    q' = 1 − Π(1 − p_r)) the shift is a random vector of norm ≤ nC; since exp((α−1)·D_α) is jointly
    convex, mixing over such shifts costs no more than the worst fixed shift of norm nC, which is the
    Poisson-sampled Gaussian at rate q' and noise multiplier σ/n (in both directions: the mixture is a
    convex combination of the fixed-shift pairs). So each person pays
    PoissonSampled(q', Gaussian(σ/n)) — an exact upper bound for their own row count, tighter than
    RDP group privacy, and computed by the same accountant. dp-accounting's RDP accountant does not
    take a MixtureOfGaussiansDpEvent (0.6.0), which is why the ELS mixture goes through this bound.

The filter (Feldman & Zrnic 2021, one order; several orders by a union bound, see the doc): with a
fixed grid of orders A and a budget (ε, δ), a person takes part in a release only if some α ∈ A has
spend_α + cost_α ≤ B_α, where B_α = ε − pad_α and the pad is the ledger's conversion (stored in its
metadata, like the grid):
    "union-markov"        (ledgers made before issue 26)  pad_α = log(|A|/δ)/(α − 1)
    "union-hockey-stick"  (issue 26's first ledgers)       pad_α = (log(|A|/δ) − log α)/(α − 1) + log(1 − 1/α)
    "weighted-hockey-stick" (new ledgers)                  pad_α = (log(1/(w_α δ)) − log α)/(α − 1) + log(1 − 1/α)
The second is the Balle et al. 2020 / Canonne–Kamath–Steinke 2020 conversion at δ/|A| per order; it is
valid for the filter because it bounds the hockey-stick divergence by the same supermartingales
(docs/privacy/ledger.md, "The tighter conversion"). Its pad is smaller at every order, so a ledger that
was admitted under the first is within budget under the second. The third is the same conversion at
δ·w_α per order, Σ w_α ≤ 1: the same proof with δ/|A| replaced by δ·w_α ("Order weights" in the doc).
The weights are a function of the lifetime budget (ε, δ) alone (`order_weights`, by the ledger's rule:
WEIGHT_RULES), public and fixed before any data; the ledger records them with its budget and refuses a
record that does not match.
"""
from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

import numpy as np

from components.core.errors import VeilError

# Fixed up front and stored with the ledger's metadata; changing it for an existing ledger is refused.
ORDERS: tuple[float, ...] = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0,
                             24.0, 32.0, 48.0, 64.0, 128.0, 256.0)


def _check_orders(orders: Sequence[float]) -> np.ndarray:
    a = np.asarray(orders, dtype=float)
    if a.ndim != 1 or len(a) == 0 or np.any(~np.isfinite(a)) or np.any(a <= 1.0):
        raise VeilError("ledger orders: a non-empty list of finite Rényi orders > 1")
    return a


def sampled_gaussian_rdp(q: float, noise_multiplier: float, steps: int,
                         orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP at each order of T steps of PoissonSampled(q, Gaussian(σ)), by dp-accounting's accountant."""
    q, s, T = float(q), float(noise_multiplier), int(steps)
    if not 0.0 <= q <= 1.0 or math.isnan(q):
        raise VeilError(f"ledger: sampling rate {q} must be in [0, 1]")
    if not (s > 0 and math.isfinite(s)):
        raise VeilError(f"ledger: noise multiplier {s} must be a finite number > 0")
    if T < 0:
        raise VeilError(f"ledger: steps {T} must be ≥ 0")
    a = _check_orders(orders)
    if q == 0.0 or T == 0:
        return np.zeros(len(a))
    # dp-accounting here, not at module top: the mechanisms import this module, and a command that only
    # lists them (veil policy check) should not pay for loading it
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(orders=list(a))
    # dp-accounting logs (and returns +inf, pessimistic) for fractional orders whose series does not
    # converge; the +inf only makes that order unusable, which the filter handles.
    quiet = logging.getLogger("absl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        acc.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), T))
    finally:
        quiet.setLevel(level)
    return np.array(acc._rdp, dtype=float)  # noqa: SLF001 - the curve itself; dp-accounting 0.6.0 is pinned


def rows_rdp(rates: Sequence[float], noise_multiplier: float, steps: int,
             orders: Sequence[float] = ORDERS) -> np.ndarray:
    """A person's cost when each of their rows is Poisson-sampled at its own rate (module docstring):
    at each order the smaller of two upper bounds — the worst fixed shift (PoissonSampled(q', σ/n)),
    and the aligned mixture of Gaussians itself (`mixture_rdp`), which is what the certificate's ELS
    accounting assumes and is far tighter when a person has many rows."""
    p = np.asarray(list(rates), dtype=float)
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise VeilError("ledger: every row's sampling rate must be in [0, 1]")
    p = p[p > 0]
    n = len(p)
    if n == 0:
        return np.zeros(len(_check_orders(orders)))
    with np.errstate(divide="ignore"):
        log_none = float(np.log1p(-p).sum())      # log Pr[none of the rows sampled]
    q_any = 1.0 if log_none == -math.inf else -math.expm1(log_none)
    shift = sampled_gaussian_rdp(min(1.0, q_any), float(noise_multiplier) / n, steps, orders)
    if n == 1 or int(steps) == 0 or n > _MIXTURE_MAX_ROWS or np.any(p != p[0]):
        # one row: the two bounds are the same event. The quadrature costs ~0.1 s for 30 rows: it is
        # run for equal rates (ELS, group, record: a few distinct row counts, cached by the caller)
        # and at most _MIXTURE_MAX_ROWS rows, never per person for secret plans' per-row LP rates.
        return shift
    return np.minimum(shift, int(steps) * mixture_rdp(p, float(noise_multiplier), orders))


# Quadrature of the mixture's Rényi integrals: z in units of σ, step H; an integrand narrower than
# MAX_SPAN (in σ units) is evaluated, a wider one is left to the shift bound (there the RDP is large
# anyway). SAFETY inflates every result: the trapezoid rule on these Gaussian-smooth integrands is
# accurate to far below it (tests compare with closed forms), and the ledger may only over-charge.
_H, _MAX_SPAN, _SAFETY = 0.01, 400.0, 1e-6
_MIXTURE_MAX_ROWS = 64


def mixture_rdp(rates: Sequence[float], noise_multiplier: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """One step's RDP at each order of the aligned mixture P = N(0, σ²), Q = Σ_j w_j N(j, σ²), w_j the
    probability that exactly j of the person's rows are sampled (Poisson-binomial over `rates`): the
    larger of D_α(Q‖P) (remove) and D_α(P‖Q) (add), by quadrature in log space. This is the model
    the ELS/group certificate accounts (dp-accounting's MixtureOfGaussiansDpEvent, sensitivities
    0..n): the person's sampled rows aligned, each of norm C. +∞ where the integral is too wide to
    evaluate (the caller then keeps the other bound)."""
    a = _check_orders(orders)
    sigma = float(noise_multiplier)
    if not (sigma > 0 and math.isfinite(sigma)):
        raise VeilError(f"ledger: noise multiplier {sigma} must be a finite number > 0")
    w = np.array([1.0])
    for r in np.asarray(list(rates), dtype=float):          # Poisson-binomial by convolution
        w = np.convolve(w, [1.0 - r, r])
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    mu = np.arange(len(w)) / sigma                           # shifts in σ units
    out = np.full(len(a), np.inf)
    for i, alpha in enumerate(a):
        lo, hi = -(alpha - 1.0) * mu[-1] - 40.0, alpha * mu[-1] + 40.0
        if hi - lo > _MAX_SPAN:
            continue
        z = np.arange(lo, hi + _H, _H)
        log_p = -0.5 * z * z
        log_q = _logsumexp(logw[:, None] - 0.5 * (z[None, :] - mu[:, None]) ** 2, axis=0)
        # ∫ Q^α P^{1−α} and ∫ P^α Q^{1−α}, with the common 1/√(2π) of the densities and the step H
        const = math.log(_H) - 0.5 * math.log(2.0 * math.pi)
        remove = (_logsumexp(alpha * log_q + (1.0 - alpha) * log_p) + const) / (alpha - 1.0)
        add = (_logsumexp(alpha * log_p + (1.0 - alpha) * log_q) + const) / (alpha - 1.0)
        out[i] = max(remove, add, 0.0) * (1.0 + _SAFETY) + 1e-12
    return out


def _logsumexp(x: np.ndarray, axis=None) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis) if axis is not None else float(out.reshape(()))


def replace_rows_rdp(rates: Sequence[float], noise_multiplier: float, steps: int,
                     orders: Sequence[float] = ORDERS) -> np.ndarray:
    """A person's cost when the *content* of their rows is replaced (the rows stay, same rates): the
    multi-owner relation (docs/privacy/multi-owner.md). By the weak triangle inequality of Rényi
    divergence (Mironov 2017, Prop. 11 with p = 2), through Q = the release without the person's rows,
        D_α(P‖R) ≤ (α − ½)/(α − 1) · D_{2α}(P‖Q) + D_{2α−1}(Q‖R),
    and both terms are add/remove costs of the rows (`rows_rdp`, valid in both directions), evaluated
    at the exact orders 2α and 2α − 1."""
    a = _check_orders(orders)
    return (a - 0.5) / (a - 1.0) * rows_rdp(rates, noise_multiplier, steps, 2.0 * a) \
        + rows_rdp(rates, noise_multiplier, steps, 2.0 * a - 1.0)


def replace_of_add_remove(spend: np.ndarray, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """An upper bound on the replace-relation RDP of releases whose add/remove spend is `spend` (one
    curve or a people × orders matrix on the grid): the same weak triangle inequality, with D at 2α and
    2α − 1 bounded by the spend at the next grid order up (a Rényi divergence does not decrease with
    its order; the composed divergence is below the composed spend at every grid order). Beyond the
    grid's largest order nothing is known: +∞ there (that order is unusable), unless the spend is 0."""
    a = _check_orders(orders)
    if np.any(np.diff(a) <= 0):
        raise VeilError("ledger orders: the grid must be increasing")
    s = np.asarray(spend, dtype=float)

    def at(b: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(a, b - 1e-12, side="left")
        inside = idx < len(a)
        vals = np.take(s, np.minimum(idx, len(a) - 1), axis=-1)
        return np.where(inside, vals, np.inf)

    out = (a - 0.5) / (a - 1.0) * at(2.0 * a) + at(2.0 * a - 1.0)
    zero = np.all(s == 0, axis=-1, keepdims=True)
    return np.where(zero, 0.0, out)


# The RDP → (ε, δ) conversions a ledger can be kept under (ledger_meta "conversion"). A ledger without
# the key was made before issue 26 and keeps the first; one made with the second keeps it: its
# thresholds never move under it.
MARKOV = "union-markov"
HOCKEY_STICK = "union-hockey-stick"
WEIGHTED = "weighted-hockey-stick"
CONVERSIONS = (MARKOV, HOCKEY_STICK, WEIGHTED)
CONVERSION = WEIGHTED              # what a new ledger is created with

# The weighted conversion's rules (one is recorded with the weights; a ledger whose record names a rule this
# Veil does not know, or whose weights are not its rule's for its budget, is refused). The weights put δ's
# shares on the orders where a spend that exhausts the budget is cheapest: for a Gaussian-like spend (RDP
# ρ·α, which n sampled-Gaussian releases approach as n grows) with ε(δ) equal to the budget's ε, the best
# order α* solves min_α ρα + pad¹_α = ε, pad¹ the single-order conversion at δ. A sampled Gaussian's RDP
# grows faster than linearly in α, so its best order lies below the Gaussian's: the centre is α*·e^{SHIFT}.
# Shares fall as a Gaussian in log α around it (width BELOW under the centre, ABOVE over it: a release
# composed many times is Gaussian-like and binds above the centre, one or two releases of a sampled
# Gaussian with a large q at or below it), and FLOOR of δ is spread uniformly so that
# no order of the grid becomes unusable (a release far from the expected shape pays at most
# log(|A|/FLOOR)/(α−1) instead of log|A|/(α−1)). Nothing here reads data: only ε, δ, the grid and the rule.
#   v1 (issue 26's first weighted ledgers): SHIFT −0.15, BELOW = ABOVE = 0.15. Its shares straddle two
#      or three orders of the grid (≈ 0.5 on the best one), which costs log 2/(α−1) where the budget binds.
#   v2 (new ledgers): SHIFT −0.14, BELOW 0.06, ABOVE 0.14 — δ mostly on the order at or just above the
#      centre. Chosen on bench/filter_price.py's 21 settings (every one ≤ 1.15× its PLD ε; v1: 1.164× at
#      worst) and the shipped policies' schedules (each better than under v1), then checked on held-out
#      settings (docs/privacy/ledger.md, "Order weights"). A finer grid did not help: the shares are spread
#      over the same uncertainty in the best order whatever the grid's spacing.
# Which rule a ledger uses is fixed when it is made (ledger_meta order_weights_rule; a weighted ledger
# without the key was made by the v1 Veil and keeps v1), so no ledger is ever re-priced.
WEIGHT_RULE_V1 = "gaussian-centred/v1"
WEIGHT_RULE = "gaussian-centred/v2"                # what a new weighted ledger records
WEIGHT_RULES: dict[str, tuple[float, float, float, float]] = {   # rule → (SHIFT, BELOW, ABOVE, FLOOR)
    WEIGHT_RULE_V1: (-0.15, 0.15, 0.15, 0.02),
    WEIGHT_RULE: (-0.14, 0.06, 0.14, 0.02),
}
_W_TOL = 1e-9          # a recorded weight may differ from today's computation by float noise only


def check_rule(rule: str) -> str:
    if rule not in WEIGHT_RULES:
        raise VeilError(f"ledger order weights: rule {rule!r} is not one this Veil knows "
                        f"({', '.join(WEIGHT_RULES)}); use the Veil that made the ledger")
    return rule


def _single_order_pad(delta: float, a: np.ndarray) -> np.ndarray:
    return (-math.log(delta) - np.log(a)) / (a - 1.0) + np.log1p(-1.0 / a)


def gaussian_best_order(epsilon: float, delta: float) -> float:
    """α* of the Gaussian-like spend ρ·α whose best single-order ε at δ is `epsilon` (module comment)."""
    a = np.exp(np.linspace(math.log(1.001), math.log(1e4), 20001))
    pad1 = _single_order_pad(delta, a)
    lo, hi = 1e-12, 1e4          # ε(ρ) = min_α ρα + pad¹_α increases with ρ: bisection on log ρ
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if float(np.min(mid * a + pad1)) < epsilon else (lo, mid)
    return float(a[int(np.argmin(hi * a + pad1))])


def order_weights(epsilon: float, delta: float, orders: Sequence[float] = ORDERS,
                  rule: str = WEIGHT_RULE) -> np.ndarray:
    """The weighted conversion's δ shares on the grid (Σ < 1, every share > 0): `rule` (a new ledger's:
    WEIGHT_RULE) for the budget (ε, δ). Public: a function of the lifetime budget, the grid and the rule."""
    e, d = float(epsilon), float(delta)
    if not (e > 0 and math.isfinite(e)):
        raise VeilError(f"ledger budget: epsilon {epsilon} must be a finite number > 0")
    if not 0 < d < 1:
        raise VeilError(f"ledger budget: delta {delta} must be in (0, 1)")
    return np.array(_order_weights(e, d, tuple(float(x) for x in _check_orders(orders)), check_rule(rule)))


@functools.lru_cache(maxsize=256)
def _order_weights(e: float, d: float, orders: tuple[float, ...], rule: str) -> tuple[float, ...]:
    a = np.asarray(orders)
    shift, below, above, floor = WEIGHT_RULES[rule]
    x = np.log(a) - (math.log(gaussian_best_order(e, d)) + shift)
    log_k = -(x ** 2) / (2.0 * np.where(x > 0, above, below) ** 2)
    # scaled by the largest term: a centre far outside the grid (a tiny ε at a tiny δ) would otherwise
    # underflow every term to 0 and the shares to 0/0; the scale cancels in k/Σk
    k = np.exp(log_k - np.max(log_k))
    w = (1.0 - floor) * k / math.fsum(k) + floor / len(a)
    # Σ w ≤ 1 exactly, whatever the rounding: the proof needs Σ δ·w_α ≤ δ (1e-12 of δ is given away)
    return tuple(float(x) for x in w * (1.0 - 1e-12) / math.fsum(w))


def check_weights(weights, orders: Sequence[float], epsilon: float, delta: float,
                  rule: str = WEIGHT_RULE) -> np.ndarray:
    """A ledger's recorded weights, checked: one finite share ≥ 0 per order, Σ ≤ 1, and the recorded rule's
    (one this Veil knows) for the ledger's budget (to float noise). Anything else is refused, never
    re-interpreted."""
    w = np.asarray(weights, dtype=float)
    a = _check_orders(orders)
    if w.shape != a.shape or np.any(~np.isfinite(w)) or np.any(w < 0) or math.fsum(w) > 1.0:
        raise VeilError("ledger order weights: not one share ≥ 0 per order with Σ ≤ 1")
    want = order_weights(epsilon, delta, a, rule)
    if np.max(np.abs(w - want)) > _W_TOL:
        raise VeilError(f"ledger order weights: they are not {rule}'s for the ledger's budget "
                        f"ε={epsilon:g}, δ={delta:g}")
    return w


def conversion_pad(delta: float, orders: Sequence[float] = ORDERS, conversion: str = CONVERSION,
                   weights=None) -> np.ndarray:
    """pad_α = ε − B_α at each order: what the filter keeps back at order α for δ shared over the grid.

    union-markov:          log(|A|/δ)/(α−1)                         (Markov on each order's supermartingale)
    union-hockey-stick:    (log(|A|/δ) − log α)/(α−1) + log(1 − 1/α) (the hockey-stick bound, doc)
    weighted-hockey-stick: (log(1/(w_α δ)) − log α)/(α−1) + log(1 − 1/α), Σ w_α ≤ 1 (`weights`, required;
                           a share of 0 makes its order unusable: pad +∞)"""
    d = float(delta)
    if not 0 < d < 1:
        raise VeilError(f"ledger budget: delta {delta} must be in (0, 1)")
    a = _check_orders(orders)
    if conversion == MARKOV:
        return math.log(len(a) / d) / (a - 1.0)
    if conversion == HOCKEY_STICK:
        return (math.log(len(a) / d) - np.log(a)) / (a - 1.0) + np.log1p(-1.0 / a)
    if conversion == WEIGHTED:
        if weights is None:
            raise VeilError("ledger: the weighted conversion needs the ledger's order weights")
        w = np.asarray(weights, dtype=float)
        if w.shape != a.shape or np.any(~np.isfinite(w)) or np.any(w < 0) or math.fsum(w) > 1.0:
            raise VeilError("ledger order weights: not one share ≥ 0 per order with Σ ≤ 1")
        with np.errstate(divide="ignore"):
            return (-np.log(w * d) - np.log(a)) / (a - 1.0) + np.log1p(-1.0 / a)
    raise VeilError(f"ledger: unknown RDP conversion {conversion!r}; this Veil knows {', '.join(CONVERSIONS)}")


def rdp_budget(epsilon: float, delta: float, orders: Sequence[float] = ORDERS,
               conversion: str = CONVERSION, weights=None) -> np.ndarray:
    """B_α = ε − pad_α: the per-order budget of the filter (negative: order unusable). Under the weighted
    conversion `weights` may be the shares, a rule's name (that rule's shares for this budget: what a
    ledger kept under that rule fixes with it), or None (WEIGHT_RULE's: what a new ledger fixes)."""
    e = float(epsilon)
    if not (e > 0 and math.isfinite(e)):
        raise VeilError(f"ledger budget: epsilon {epsilon} must be a finite number > 0")
    if conversion == WEIGHTED and (weights is None or isinstance(weights, str)):
        weights = order_weights(e, delta, orders, WEIGHT_RULE if weights is None else weights)
    return e - conversion_pad(delta, orders, conversion, weights)


def epsilon_of_spend(spend: np.ndarray, delta: float, orders: Sequence[float] = ORDERS,
                     conversion: str = CONVERSION, weights=None) -> np.ndarray | float:
    """min_α S_α + pad_α: the smallest budget ε whose filter condition this spend meets (under the
    weighted conversion: at the ledger's weights, which its budget fixed).

    The guarantee is the filter's budget; this number says how much of it a person has used. Of one
    release's cost curve it is the filter's price of that release. Works on one curve (→ float) or a
    (people × orders) matrix (→ one value per row)."""
    s = np.asarray(spend, dtype=float)
    out = np.min(s + conversion_pad(delta, orders, conversion, weights), axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def filter_price(spend: np.ndarray, delta: float, orders: Sequence[float] = ORDERS,
                 conversion: str = CONVERSION, rule: str = WEIGHT_RULE) -> float:
    """The smallest lifetime budget ε (at δ) whose filter admits this spend from zero — the filter's price
    of a composition, for benches and tests. Under a fixed-pad conversion it is `epsilon_of_spend`; under
    the weighted one (weights by `rule`) the weights move with the budget, so it is found by a scan upward from the
    single-order bound (weights ≤ 1 never beat it): 1 % steps, then 0.02 % steps in the bracket — the
    smallest admitted budget on the scan (possibly above the true smallest by < 0.02 %: never below)."""
    s = np.asarray(spend, dtype=float)
    a = _check_orders(orders)
    if conversion != WEIGHTED:
        return float(epsilon_of_spend(s, delta, orders, conversion))
    lo = float(np.min(s + _single_order_pad(float(delta), a)))
    if not math.isfinite(lo):
        return math.inf

    def ok(e: float) -> bool:
        return e > 0 and bool(np.any(s <= rdp_budget(e, delta, a, WEIGHTED, check_rule(rule))))

    e = max(lo, 1e-6)
    while not ok(e):
        e *= 1.01
        if e > 100.0 * max(lo, 1e-6):
            return math.inf
    f = e / 1.01
    while f < e and not ok(f):
        f *= 1.0002
    return min(f, e)


def admits(spend: np.ndarray, cost: np.ndarray, budget: np.ndarray) -> bool:
    """The filter: is there an order at which this person's spend plus the cost stays within budget?"""
    total = np.asarray(spend, dtype=float) + np.asarray(cost, dtype=float)
    return bool(np.any(total <= np.asarray(budget, dtype=float)))


def admits_many(spend: np.ndarray, cost: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """`admits` for a (people × orders) spend matrix and cost matrix (or one cost row)."""
    total = np.asarray(spend, dtype=float) + np.asarray(cost, dtype=float)
    return np.any(total <= np.asarray(budget, dtype=float)[None, :], axis=1)


def releases_left(spend: np.ndarray, cost: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """How many more releases of cost `cost` each person (rows of `spend`) is admitted to, one after the
    other: the j-th is admitted iff some α has S_α + j·c_α ≤ B_α, and since admissions only add cost,
    that is max_α ⌊(B_α − S_α)/c_α⌋ (∞ where an order within budget costs nothing; 0 when none fits).
    A refused release charges nothing, so the count is exactly what the filter will do."""
    s = np.atleast_2d(np.asarray(spend, dtype=float))
    c = np.broadcast_to(np.asarray(cost, dtype=float), s.shape)
    room = np.asarray(budget, dtype=float)[None, :] - s
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(c > 0, np.floor(room / np.where(c > 0, c, 1.0)), np.where(room >= 0, np.inf, -1.0))
    out = np.maximum(np.max(np.where(room >= 0, k, -1.0), axis=1), 0.0)
    # the next release is decided exactly as the filter decides it (S + c ≤ B), not through a division
    nxt = admits_many(s, c, budget)
    return np.where(nxt, np.maximum(out, 1.0), 0.0)
