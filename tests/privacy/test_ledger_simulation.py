"""20 scheduled releases over a population where people join and leave (issue 13, item 8).

Nobody is ever above budget, retraining goes on, retired people are left out of the release they were
retired from, and people who join later are trained."""
from __future__ import annotations

import numpy as np

from components.core.settings import load_settings
from components.ledger import Ledger, reserve_release

PLANS = [
    {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.5, "steps": 30},
    {"mechanism": "els", "privacy_unit": "user", "sampling_rate": 0.05, "noise_multiplier": 8.0, "steps": 30},
    {"mechanism": "record", "privacy_unit": "record", "sampling_rate": 0.05, "noise_multiplier": 10.0, "steps": 30},
]


def test_twenty_releases_with_joins_and_leaves(tmp_path):
    rng = np.random.default_rng(7)
    settings = load_settings(tmp_path / "home").ensure()
    led = Ledger.open(settings)
    # binds for some within the 20 releases under a new ledger's conversion (weighted-hockey-stick)
    budget = {"epsilon": 3.5, "delta": 1e-5}
    present = {f"person-{i}": int(rng.integers(1, 5)) for i in range(30)}
    next_id, ever_retired, trained_late = 30, set(), set()
    joined_at: dict[str, int] = {p: 0 for p in present}
    per_release = []
    for t in range(20):
        for p in list(present):                       # some leave
            if rng.random() < 0.05:
                del present[p]
        for _ in range(int(rng.integers(1, 4))):       # some join
            p = f"person-{next_id}"
            present[p], joined_at[p] = int(rng.integers(1, 5)), t
            next_id += 1
        plan = {**PLANS[t % 3], "sha256": f"{t:064x}", "lifetime_budget": budget}
        r = reserve_release(settings, plan, dict(present), ledger=led)
        assert set(r.admitted) | set(r.retired) == set(present) and not set(r.admitted) & set(r.retired)
        # retired people are excluded: nothing was charged to them for this release
        spend = led.spend(list(present))
        rdp_budget = led.rdp_budget(r.budget)
        for p in present:                               # nobody above budget, at any point
            assert np.any(spend[p] <= rdp_budget), p
        if t:
            before = {p: s for p, s in prev_spend.items() if p in r.retired}
            for p, s in before.items():
                assert np.array_equal(spend[p], s), "a retired person was charged"
        prev_spend = spend
        ever_retired |= set(r.retired)
        trained_late |= {p for p in r.admitted if joined_at[p] >= 10}
        per_release.append(len(r.admitted))
        led.record(r.release_id, "trained")
    # retraining continues to the end, on new people too; the budget did bind for some
    assert all(n > 0 for n in per_release[-5:])
    assert ever_retired and trained_late
    s = led.summary()
    assert s["releases"] == 20 and s["retired"] == len(ever_retired)
    assert s["spend"]["max_epsilon"] <= budget["epsilon"]
    assert s["spend"]["min_epsilon"] <= s["spend"]["median_epsilon"] <= s["spend"]["max_epsilon"]
    burn = led.burn_down()
    assert len(burn) == 20 and all(b["max_epsilon"] <= budget["epsilon"] for b in burn)
    assert [b["max_epsilon"] for b in burn] == sorted(b["max_epsilon"] for b in burn)  # charges only grow
    led.dispose()
