"""A ledger's RDP → (ε, δ) conversion is fixed when it is made, and a weighted ledger's order weights when its
budget is (issue 26): new ledgers record `weighted-hockey-stick` and its weight rule (`gaussian-centred/v2`)
when made, and with the budget that rule's weights; ledgers made before keep `union-markov` /
`union-hockey-stick`, or `gaussian-centred/v1`, and their numbers; a record that does not match its rule
for the recorded budget is refused, never re-interpreted."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from sqlalchemy import update

from components.core.errors import VeilError
from components.ledger import Budget, Ledger
from components.renyi import rdp as R
from components.ledger import store as st
from components.ledger.release import release_costs

PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 20}
BUDGET = Budget(4.0, 1e-5)
PEOPLE = [f"p{i}" for i in range(3)]


def _reserve(led: Ledger, budget: Budget = BUDGET):
    costs = release_costs(PLAN, {p: 1 for p in PEOPLE}, led.orders)
    return led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, costs=costs, budget=budget)


def _set_meta(led: Ledger, key: str, value: str | None) -> None:
    with led.engine.begin() as conn:
        if value is None:
            conn.execute(st.meta.delete().where(st.meta.c.key == key))
        elif key in st.read_meta(conn):
            conn.execute(update(st.meta).where(st.meta.c.key == key).values(value=value))
        else:
            conn.execute(st.meta.insert().values(key=key, value=value))


def test_new_ledger_records_the_budgets_weights_and_filters_with_them(tmp_path):
    url, key = f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32)
    led = Ledger(url, key)
    assert led.conversion == R.WEIGHTED and led.order_weights is None      # no budget: no weights yet
    assert led.weight_rule == R.WEIGHT_RULE                                # but the rule, from the start
    assert led.filter_spec()[2] == R.WEIGHT_RULE
    _reserve(led)
    with st.read_only(led.engine) as conn:
        m = st.read_meta(conn)
    want = R.order_weights(BUDGET.epsilon, BUDGET.delta, led.orders)
    assert m["order_weights_rule"] == R.WEIGHT_RULE
    assert np.array_equal(np.array(json.loads(m["order_weights"])), want)
    led.dispose()
    led = Ledger(url, key)                                                  # reopened: the same weights
    assert np.array_equal(led.order_weights, want)
    assert np.array_equal(led.rdp_budget(BUDGET), R.rdp_budget(4.0, 1e-5, led.orders, R.WEIGHTED, want))
    one = R.sampled_gaussian_rdp(0.1, 2.0, 20, led.orders)
    rows = led.person_rows()
    assert rows[0]["epsilon"] == pytest.approx(R.epsilon_of_spend(one, 1e-5, led.orders, R.WEIGHTED, want))
    assert led.summary()["order_weights"] == [float(x) for x in want]
    assert led.summary()["order_weights_rule"] == R.WEIGHT_RULE
    # the filter admits exactly as many releases as the weighted thresholds allow
    fits = 0
    while np.any((fits + 1) * one <= led.rdp_budget(BUDGET)):
        fits += 1
    for _ in range(fits - 1):
        assert len(_reserve(led).admitted) == 3
    assert len(_reserve(led).retired) == 3
    led.dispose()


@pytest.mark.parametrize("conversion", [R.MARKOV, R.HOCKEY_STICK])
def test_older_ledgers_keep_their_conversion_and_numbers(tmp_path, conversion):
    url, key = f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32)
    led = Ledger(url, key)
    # a ledger made before issue 26 has no conversion key; one made by its first Veil says union-hockey-stick;
    # neither has a weight rule
    _set_meta(led, "conversion", None if conversion == R.MARKOV else conversion)
    _set_meta(led, "order_weights_rule", None)
    led.dispose()
    led = Ledger(url, key)
    assert led.conversion == conversion
    _reserve(led)
    with st.read_only(led.engine) as conn:
        assert "order_weights" not in st.read_meta(conn)
    assert led.order_weights is None
    assert np.array_equal(led.rdp_budget(BUDGET), R.rdp_budget(4.0, 1e-5, led.orders, conversion))
    one = R.sampled_gaussian_rdp(0.1, 2.0, 20, led.orders)
    assert led.person_rows()[0]["epsilon"] == pytest.approx(R.epsilon_of_spend(one, 1e-5, led.orders, conversion))
    led.dispose()


@pytest.mark.parametrize("tamper,match", [
    (lambda w: ("order_weights", json.dumps(list(np.roll(w, 3)))), "not gaussian-centred"),
    (lambda w: ("order_weights", json.dumps(list(w * 1.01))), "Σ ≤ 1"),
    (lambda w: ("order_weights", json.dumps(list(w[:-1]))), "one share"),
    (lambda w: ("order_weights", "not json"), "refused"),
    (lambda w: ("order_weights_rule", "uniform/v0"), "rule 'uniform/v0'"),
    (lambda w: ("order_weights", None), "one is missing"),
    (lambda w: ("budget_epsilon", repr(5.0)), "not gaussian-centred"),
])
def test_a_record_that_does_not_match_is_refused(tmp_path, tamper, match):
    url, key = f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32)
    led = Ledger(url, key)
    _reserve(led)
    k, v = tamper(led.order_weights)
    _set_meta(led, k, v)
    led.dispose()
    with pytest.raises(VeilError, match=match):
        Ledger(url, key)


def _v1_ledger(tmp_path, *, with_budget: bool):
    """A weighted ledger as issue 26's first weighted Veil made it: no rule key until its budget was fixed,
    then gaussian-centred/v1 and that rule's weights."""
    url, key = f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32)
    led = Ledger(url, key)
    _set_meta(led, "order_weights_rule", None)
    if with_budget:
        with led.engine.begin() as conn:
            conn.execute(st.meta.insert(), [
                {"key": "budget_epsilon", "value": repr(BUDGET.epsilon)},
                {"key": "budget_delta", "value": repr(BUDGET.delta)},
                {"key": "order_weights", "value": json.dumps(
                    [float(x) for x in R.order_weights(BUDGET.epsilon, BUDGET.delta, led.orders, R.WEIGHT_RULE_V1)])},
                {"key": "order_weights_rule", "value": R.WEIGHT_RULE_V1}])
    led.dispose()
    return url, key


@pytest.mark.parametrize("with_budget", [True, False])
def test_a_v1_ledger_keeps_v1(tmp_path, with_budget):
    """Existing weighted ledgers are never re-priced: one whose budget (and v1 weights) are recorded filters
    and reports with them; one made by the v1 Veil before any budget fixes v1's weights when it gets one."""
    url, key = _v1_ledger(tmp_path, with_budget=with_budget)
    led = Ledger(url, key)
    v1 = R.order_weights(BUDGET.epsilon, BUDGET.delta, led.orders, R.WEIGHT_RULE_V1)
    assert led.weight_rule == R.WEIGHT_RULE_V1
    assert not np.allclose(v1, R.order_weights(BUDGET.epsilon, BUDGET.delta, led.orders))   # the rules differ
    assert np.array_equal(led.rdp_budget(BUDGET), R.rdp_budget(4.0, 1e-5, led.orders, R.WEIGHTED, v1))
    _reserve(led)
    led.dispose()
    led = Ledger(url, key)
    with st.read_only(led.engine) as conn:
        m = st.read_meta(conn)
    assert m["order_weights_rule"] == R.WEIGHT_RULE_V1
    assert np.array_equal(np.array(json.loads(m["order_weights"])), v1)
    one = R.sampled_gaussian_rdp(0.1, 2.0, 20, led.orders)
    assert led.person_rows()[0]["epsilon"] == pytest.approx(R.epsilon_of_spend(one, 1e-5, led.orders, R.WEIGHTED, v1))
    assert led.summary()["order_weights_rule"] == R.WEIGHT_RULE_V1
    led.dispose()


def test_v1_weights_under_the_v2_rule_are_refused(tmp_path):
    url, key = _v1_ledger(tmp_path, with_budget=True)
    led = Ledger(url, key)
    _set_meta(led, "order_weights_rule", R.WEIGHT_RULE)
    led.dispose()
    with pytest.raises(VeilError, match="not gaussian-centred/v2"):
        Ledger(url, key)


def test_a_rule_under_another_conversion_is_refused(tmp_path):
    url, key = f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32)
    led = Ledger(url, key)
    _set_meta(led, "conversion", R.HOCKEY_STICK)
    led.dispose()
    with pytest.raises(VeilError, match="damaged"):
        Ledger(url, key)


def test_weights_under_another_conversion_are_refused(tmp_path):
    url, key = f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32)
    led = Ledger(url, key)
    _set_meta(led, "conversion", R.HOCKEY_STICK)
    _set_meta(led, "order_weights_rule", None)
    led.dispose()
    led = Ledger(url, key)
    _reserve(led)
    _set_meta(led, "order_weights", json.dumps(list(R.order_weights(4.0, 1e-5))))
    led.dispose()
    with pytest.raises(VeilError, match="damaged"):
        Ledger(url, key)
