"""Privacy numbers of Asi & Liu's filtered user-level DP-SGD (seed 000, Alg. 3), opt-in.

The seed gives the algorithm but not its analysis, and the formula it quotes for the noise,
sqrt(8 log(e^ε T/δ))·τ·σ/N, comes from a paper (Asi & Liu 2024) we could not check. So two variants:

- "veil" (certifiable): our own bound, pessimistic. Neighbouring = replace one user, N public.
  One sparse vector (AboveThreshold, Dwork & Roth 2014 Thm 3.23) for the whole run spends ε/2: the
  concentration score s = (1/N)·#{(i,i'): ‖g_i − g_i'‖ ≤ τ} moves by < 2 when a user is replaced
  (Δ = 2), threshold noise Lap(2Δ/(ε/2)) = Lap(8/ε) drawn once, query noise Lap(16/ε) per step;
  training halts at the first step with s_t + ν_t < 0.8N + ρ. The update is the deterministic
  weighted mean Σ p_i g_i / Σ p_i (p_i: Alg. 3's keep probability). With
      δ1 = δ/(4e^ε),  α = 32 log((T+1)/δ1)/ε,  L = 0.8N − α − 2,  W_min = 3L − 2N − 7,
  every step that passes while s_t < L has total probability ≤ δ1/2; on steps with s_t ≥ L at least
  3L − 2N users have p_i = 1, every kept gradient (in D and in any neighbour D′) is within 4τ of
  one core user's, each other p_i moves by ≤ 6/N and Σp by ≤ 7, so the weighted mean moves by at
  most Δ_G = 4τ·15/W_min = 60τ/W_min. Gaussian noise N(0, (Δ_G σ)²) with σ calibrated so that T
  full-batch steps are (ε/2, δ/2)-DP. Total: (ε, δ/2 + e^ε δ1) = (ε, ≤ δ). Needs W_min ≥ 2,
  i.e. N ≥ 7.5α + 37.5 (hundreds to thousands of users); below that there is no certificate.
  The derivation is ours (written out in docs/privacy/filtered-uls.md), not the paper's.
- "seed": the paper's App. A as printed — random B_t, mean over |B_t|, std
  sqrt(8 log(e^ε T/δ))·τ·σ/N. For reproducing the paper's noise comparison only: no certificate.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from components.core.errors import VeilError
from components.accounting.accountant import calibrate, epsilon as gaussian_epsilon

VARIANTS = ("veil", "seed")
SVT_SENSITIVITY = 2.0          # of s^conc under replace-one, N public: 2(N−1)/N < 2
THRESHOLD_FRACTION = 0.8       # the test's threshold 4N/5


@dataclass(frozen=True)
class FilteredNoise:
    variant: str
    threshold: float           # 0.8 N
    threshold_scale: float     # Laplace scale of ρ (once per run)
    query_scale: float         # Laplace scale of ν_t (per step)
    std: float                 # per-coordinate Gaussian std on the step's (weighted) mean
    sensitivity: float | None  # Δ_G of the weighted mean (veil); None for the seed's formula
    w_min: float | None        # guaranteed kept weight on steps that can pass (veil)
    delta1: float | None       # failure probability budget of the test (veil)

    def to_dict(self) -> dict:
        return asdict(self)


def _check(epsilon: float, delta: float, steps: int, n_users: int, tau: float) -> None:
    if not epsilon > 0 or math.isinf(epsilon):
        raise VeilError(f"filter: epsilon: must be a finite number > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise VeilError(f"filter: delta: must be in (0, 1), got {delta}")
    if int(steps) < 1:
        raise VeilError(f"filter: steps: must be ≥ 1, got {steps}")
    if int(n_users) < 2:
        raise VeilError(f"filter: needs at least 2 users, got {n_users}")
    if not tau > 0:
        raise VeilError(f"filter: tau: must be > 0, got {tau}")


def test_margin(epsilon: float, delta: float, steps: int) -> tuple[float, float]:
    """(δ1, α): with probability ≥ 1 − δ1/2 no Laplace draw of the run exceeds α/2 in size."""
    delta1 = delta / (4.0 * math.exp(epsilon)) if epsilon < 700 else 0.0
    if delta1 <= 0:
        raise VeilError(f"filter: epsilon {epsilon} is too large for the test's failure budget")
    return delta1, 32.0 * math.log((int(steps) + 1) / delta1) / epsilon


def min_users(epsilon: float, delta: float, steps: int) -> int:
    """Smallest N for which the veil variant can be certified (W_min ≥ 2)."""
    _, alpha = test_margin(epsilon, delta, steps)
    return int(math.floor(7.5 * alpha + 37.5)) + 1


def filtered_noise(*, epsilon: float, delta: float, steps: int, n_users: int, tau: float,
                   noise_multiplier: float, variant: str = "veil") -> FilteredNoise:
    """The test's and the noise's parameters for a run of `steps` steps over `n_users` users.
    `noise_multiplier` is σ for (ε/2, δ/2) over `steps` full-batch Gaussian steps (`calibrate_filtered`)."""
    _check(epsilon, delta, steps, n_users, tau)
    if variant not in VARIANTS:
        raise VeilError(f"filter: variant: {variant!r} is not one of {', '.join(VARIANTS)}")
    N = int(n_users)
    eps_svt = epsilon / 2.0
    common = dict(threshold=THRESHOLD_FRACTION * N, threshold_scale=2 * SVT_SENSITIVITY / eps_svt,
                  query_scale=4 * SVT_SENSITIVITY / eps_svt)
    if variant == "seed":
        std = math.sqrt(8.0 * (epsilon + math.log(int(steps) / delta))) * tau * noise_multiplier / N
        return FilteredNoise(variant="seed", std=std, sensitivity=None, w_min=None, delta1=None, **common)
    delta1, alpha = test_margin(epsilon, delta, steps)
    L = THRESHOLD_FRACTION * N - alpha - 2.0
    w_min = 3.0 * L - 2.0 * N - 7.0
    if w_min < 2.0:
        raise VeilError(f"filter: {N} users are too few for a certified filtered run at ε={epsilon:g}, "
                        f"δ={delta:g}, T={steps}: needs at least {min_users(epsilon, delta, steps)}")
    sens = 60.0 * tau / w_min
    return FilteredNoise(variant="veil", std=sens * noise_multiplier, sensitivity=sens, w_min=w_min,
                         delta1=delta1, **common)


def calibrate_filtered(*, epsilon: float, delta: float, steps: int):
    """σ such that `steps` full-batch (q = 1) Gaussian steps are (ε/2, δ/2)-DP."""

    return calibrate("record", epsilon=epsilon / 2.0, delta=delta / 2.0, sampling_rate=1.0, steps=int(steps))


def filtered_epsilon(*, epsilon: float, delta: float, noise_multiplier: float, steps_run: int) -> dict:
    """The (ε, δ) of a veil-variant run that made `steps_run` noisy updates (and may have halted):
    ε/2 for the sparse vector (whatever it answered) + the Gaussian steps' ε at δ/2."""

    delta1, _ = test_margin(epsilon, delta, max(1, steps_run))
    eps_g = 0.0 if steps_run == 0 else gaussian_epsilon(
        "record", sampling_rate=1.0, noise_multiplier=noise_multiplier, steps=int(steps_run),
        delta=delta / 2.0).epsilon
    return {"epsilon": epsilon / 2.0 + eps_g, "delta": delta / 2.0 + math.exp(epsilon) * delta1,
            "epsilon_sparse_vector": epsilon / 2.0, "epsilon_gaussian": eps_g, "delta_gaussian": delta / 2.0,
            "delta_test": math.exp(epsilon) * delta1, "neighbouring": "replace_one_user (N public)"}
