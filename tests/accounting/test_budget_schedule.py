"""A budget that lasts the schedule (issue 26): the planner's schedule fit, and the ledger's forecast
against what the next reservation actually does.

* schedule: a policy stating `schedule.releases: n` gets a plan whose σ lets a person with the most rows
  the plan allows take n releases in a row under the lifetime budget's filter, and no σ 1 % smaller does
  (its ε is the largest that fits, to the calibration's tolerance); checked against the ledger's own
  filter, and by charging the plan n times through a real Ledger: nobody is retired until then.
* forecast: `Ledger.forecast` before each reservation says how many the reservation will retire (exactly)
  and how many releases each person has left (the minimum falls by one per release while nobody retires).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from components.ledger import Ledger
from components.renyi import rdp as R
from components.renyi.costs import Budget, PersonCost
from components.ledger.release import fresh_person_cost, release_costs, releases_for_fresh_person, reserve_release
from components.core.settings import load_settings
from components.ledger.report import admin_view, governance_view, ledger_report
from components.planning import Plan, make_plan, save_plan
from components.draws.annex import load_annex
from components.publication import publish
from components.draws.data import train_rows
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"
KEY = b"k" * 32


def _policy(tmp_path, *, releases: int, mechanism: str = "uls") -> object:
    text = (ROOT / "policies" / "demo.yaml").read_text()
    text = re.sub(r"    steps: \d+", "    steps: 30", text)
    text = text.replace("mechanism: uls", f"mechanism: {mechanism}")
    text = text.replace("expected_batch_size: 24", "expected_batch_size: 12")
    text = text.replace("  contribution:\n", f"  schedule:\n    releases: {releases}\n    cadence: weekly\n\n  contribution:\n", 1)
    p = tmp_path / f"{mechanism}-{releases}.yaml"
    p.write_text(text)
    return load_policy(p)


@pytest.mark.parametrize("mechanism", ["uls", "els"])
def test_schedule_fits_and_is_tight(tmp_path, mechanism):
    n = 5
    pol = _policy(tmp_path, releases=n, mechanism=mechanism)
    plan = make_plan(pol, make_snapshot(90, seed=3), private_dir=tmp_path / "private", created_at=WHEN).to_dict()
    sch = plan["schedule"]
    assert sch["releases"] == n and sch["cadence"] == "weekly" and sch["lowered"] is True
    assert plan["accounting"]["epsilon"] < pol.spec.target.epsilon
    assert sch["epsilon_per_release"] == plan["accounting"]["epsilon"]
    budget = Budget.parse(plan["lifetime_budget"])
    # the ledger's own filter, from zero: n releases of the worst-off person fit
    fit = releases_for_fresh_person(plan, budget)
    assert fit >= n and sch["releases_for_a_new_person"] == fit
    cap = R.rdp_budget(budget.epsilon, budget.delta)
    worst = fresh_person_cost(plan)
    assert R.admits((n - 1) * worst, worst, cap)
    # tight: 1 % less noise and the n-th release is refused
    less = {**plan, "noise_multiplier": plan["noise_multiplier"] * 0.99}
    assert releases_for_fresh_person(less, budget) < n
    # and through a real ledger: the plan's people, charged n times, nobody retired; then `veil ledger`'s
    # forecast of this plan against what its next release does
    settings = load_settings(tmp_path / "home").ensure()
    save_plan(Plan(plan), settings.plans_dir)
    (settings.private_dir / "plans").mkdir(parents=True, exist_ok=True)
    for f in (tmp_path / "private" / "plans").iterdir():
        (settings.private_dir / "plans" / f.name).write_bytes(f.read_bytes())
    persons = train_rows(load_annex(settings.private_dir, plan))
    for i in range(n):
        sha = plan["sha256"] if i == n - 1 else f"{i:064x}"       # the last one is the plan itself
        res = reserve_release(settings, {**plan, "sha256": sha}, persons)
        assert not res.retired and res.admitted
    doc = ledger_report(settings, estimate=False)
    fc = doc["forecast"]
    assert fc["plan_sha256"] == plan["sha256"] and fc["public"]["releases_for_a_new_person"] == fit
    people = fc["people"]
    assert people["releases_left_min"] == fit - n
    if fit > n:
        assert people["next_release_retires"] == 0
    elif mechanism == "uls":       # everyone pays the same: the schedule's end retires everyone
        assert people["next_release_retires"] == people["people"]
    else:                          # ELS: those with the most rows are out, people with fewer rows go on
        assert 0 < people["next_release_retires"] <= people["people"]
    res = reserve_release(settings, {**plan, "sha256": "f" * 64}, persons)
    assert len(res.retired) == people["next_release_retires"]
    gov = publish("cli.ledger", governance_view(doc))          # declared, and per-person numbers absent
    assert gov["forecast"]["releases_for_a_new_person"] == fit and "people" not in json.dumps(gov["forecast"])
    assert admin_view(doc)["forecast"]["next_release_retires"] == people["next_release_retires"]


def test_schedule_not_binding_keeps_the_target(tmp_path):
    pol = _policy(tmp_path, releases=1)
    plan = make_plan(pol, make_snapshot(90, seed=3), private_dir=tmp_path / "private", created_at=WHEN).to_dict()
    assert plan["schedule"]["lowered"] is False
    assert plan["schedule"]["releases_for_a_new_person"] >= 1
    assert plan["accounting"]["epsilon"] == pytest.approx(pol.spec.target.epsilon, rel=2e-3)


def test_schedule_needs_a_lifetime_budget(tmp_path):
    from components.core.errors import VeilError

    text = (ROOT / "policies" / "demo.yaml").read_text()
    text = re.sub(r"  lifetime_budget:\n    epsilon: [^\n]+\n    delta: [^\n]+\n", "", text)
    text = text.replace("  contribution:\n", "  schedule: {releases: 4}\n\n  contribution:\n", 1)
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(VeilError, match="schedule"):
        load_policy(p)


def test_forecast_matches_the_next_reservation(tmp_path):
    """People with different costs and a head start; before each release the forecast's retire count is
    what the reservation retires, and releases_left falls by one for everyone it admitted."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", KEY)
    try:
        a = np.asarray(led.orders)
        budget = Budget(6.0, 1e-5)
        base = R.sampled_gaussian_rdp(0.1, 2.0, 40, a)
        costs = {f"p{i}": PersonCost(rows=1 + i % 3, sampling_rate=0.3, rdp=base * (1 + 0.4 * (i % 3)))
                 for i in range(9)}
        # a head start for three of them
        led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=budget,
                    costs={k: costs[k] for k in ("p0", "p4", "p8")}, one_per_plan=False)
        before = led.forecast(mechanism="uls", costs=costs)
        assert before["people"] == 9 and before["releases_left_min"] >= 1
        seen_retire = False
        for _ in range(12):
            fc = led.forecast(mechanism="uls", costs=costs)
            left = R.releases_left(np.array([led.spend([k])[k] for k in costs]),
                                   np.array([costs[k].rdp for k in costs]), led.rdp_budget(budget))
            res = led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=budget,
                              costs=costs, one_per_plan=False)
            assert len(res.retired) == fc["next_release_retires"]
            assert fc["releases_left_min"] == int(left.min())
            after = R.releases_left(np.array([led.spend([k])[k] for k in costs]),
                                    np.array([costs[k].rdp for k in costs]), led.rdp_budget(budget))
            admitted = np.array([k in res.admitted for k in costs])
            assert np.all(after[admitted] == left[admitted] - 1)      # one release used
            assert np.all(after[~admitted] == 0) and np.all(left[~admitted] == 0)
            seen_retire |= bool(res.retired)
            if not res.admitted:
                break
        assert seen_retire                                            # the test reached retirements
        assert led.forecast(mechanism="uls", costs=costs)["next_release_retires"] == 9
    finally:
        led.dispose()


def test_release_costs_of_a_plan_match_the_fresh_person_for_uls(tmp_path):
    """ULS charges every person the same curve: the public fresh-person cost is everyone's cost."""
    plan = {"mechanism": "uls", "sampling_rate": 0.1, "noise_multiplier": 1.5, "steps": 20, "records_per_user": 2}
    c = release_costs(plan, {"a": 1, "b": 7})
    assert np.allclose(c["a"].rdp, fresh_person_cost(plan)) and np.allclose(c["b"].rdp, fresh_person_cost(plan))


def test_burn_down_plot_integer_releases_from_zero(tmp_path):
    import matplotlib.pyplot as plt

    from components.ledger.report import burn_down_figure, plot_burn_down

    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", KEY)
    try:
        c = R.sampled_gaussian_rdp(0.1, 2.0, 40, np.asarray(led.orders))
        for i in range(3):
            led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=Budget(12.0, 1e-5),
                        costs={f"p{j}": PersonCost(1, 0.1, c * (1 + j)) for j in range(i + 2)}, one_per_plan=False)
        rows = led.burn_down()
        assert [r["min_epsilon"] <= r["median_epsilon"] <= r["max_epsilon"] for r in rows] == [True] * 3
        fig = burn_down_figure(rows, led.budget())
        ax = fig.axes[0]
        assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] > 12.0
        ticks = [t for t in ax.get_xticks() if 0.5 <= t <= 3.5]
        assert ticks == [1.0, 2.0, 3.0]
        labels = [ln.get_label() for ln in ax.get_lines()]
        assert {"max over people", "median over people", "min over people"} <= set(labels)
        assert any(lb.startswith("lifetime budget") for lb in labels)
        plt.close(fig)
        assert plot_burn_down(led, tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    finally:
        led.dispose()
