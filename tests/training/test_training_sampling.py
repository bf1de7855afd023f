"""The sampler is true Poisson sampling at the plan's rates (statistical checks, no model)."""
from __future__ import annotations

import numpy as np
from scipy import stats

from components.dpsgd.sampling import PoissonSampler


def test_uniform_rate_and_poisson_batch_size_distribution():
    N, q, T = 500, 0.04, 3000
    s = PoissonSampler.uniform(N, q, private_seed=11)
    sizes = np.array([len(s.sample(t)[0]) for t in range(T)])
    # realised rate: total inclusions ~ Binomial(N·T, q); 5-sigma band
    total = sizes.sum()
    assert abs(total - N * T * q) < 5 * np.sqrt(N * T * q * (1 - q))
    # batch sizes vary like Binomial(N, q) — a fixed-size (shuffled) batch would have variance 0
    var = sizes.var(ddof=1)
    assert 0.85 * N * q * (1 - q) < var < 1.15 * N * q * (1 - q)
    # every unit is included at rate q: chi-square over per-unit counts
    counts = np.zeros(N)
    for t in range(T):
        counts[s.sample(t)[0]] += 1
    chi2 = ((counts - T * q) ** 2 / (T * q * (1 - q))).sum()
    assert stats.chi2(N - 1).sf(chi2) > 1e-4


def test_per_unit_rates_are_respected():
    rates = np.array([0.0, 0.01, 0.1, 0.5, 0.9, 1.0] * 20)
    s = PoissonSampler(rates, private_seed=5)
    T = 4000
    counts = np.zeros(len(rates))
    for t in range(T):
        counts[s.sample(t)[0]] += 1
    freq = counts / T
    sd = np.sqrt(rates * (1 - rates) / T)
    assert np.all(np.abs(freq - rates) <= 5 * sd + 1e-12)
    assert counts[rates == 0].sum() == 0 and np.all(counts[rates == 1] == T)
    assert s.expected_batch_size == rates.sum()


def test_steps_are_independent_and_reproducible():
    s = PoissonSampler.uniform(200, 0.3, private_seed=3)
    a, b = s.sample(7)[0], s.sample(7)[0]
    assert np.array_equal(a, b)  # a replayed step (after a crash) draws the same batch
    # consecutive steps: inclusion indicators uncorrelated
    x = np.zeros((400, 200), dtype=bool)
    for t in range(400):
        x[t, s.sample(t)[0]] = True
    r = np.corrcoef(x[:-1].ravel(), x[1:].ravel())[0, 1]
    assert abs(r) < 5 / np.sqrt(x[1:].size)
    other = PoissonSampler.uniform(200, 0.3, private_seed=4)
    assert not np.array_equal(s.sample(0)[0], other.sample(0)[0])
