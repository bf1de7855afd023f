"""Retraining plans only with people who have budget left: people the policy's release could not
admit (not even its population-estimate share) are left out before planning — keyed per person,
each decision reading only that person's ledger row — and counted in `people_retired`, which is
returned to the operator and never published in the registry."""
from __future__ import annotations

import json

import numpy as np
import pytest

from components.core.settings import load_settings
from flows import stages

from conftest import tiny_policy

pytestmark = pytest.mark.slow


def _users(org):
    return sorted({json.loads(l)["user"] for l in open(org["source"])})


def _exhaust(settings, pol, people, eps=None):
    """Charge `people` in one ledger release: a pure-DP ε, or (default) exactly what their filter
    still admits — the budget's whole Rényi curve, nothing left for any later release."""
    from components.ledger import Ledger
    from components.renyi.costs import Budget, PersonCost
    from components.renyi.costs import pure_dp_rdp

    budget = Budget.parse(pol.spec.lifetime_budget.model_dump())
    led = Ledger.open(settings)
    try:
        curve = (pure_dp_rdp(eps, led.orders) if eps is not None
                 else np.maximum(led.rdp_budget(budget), 0.0))
        led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=budget,
                    costs={u: PersonCost(rows=1, sampling_rate=1.0, rdp=np.asarray(curve)) for u in people})
    finally:
        led.dispose()


def test_exhausted_people_is_a_per_person_decision(settings, tmp_path, org):
    from components.policy import load_policy

    pol = load_policy(tiny_policy(tmp_path))
    users = _users(org)
    assert stages.exhausted_people(settings, pol, users) == set()  # nobody charged yet
    spent, some, fresh = users[:5], users[5:10], users[10:]
    _exhaust(settings, pol, spent)              # their whole lifetime budget
    _exhaust(settings, pol, some, eps=1.0)      # a little: they can still be trained
    got = stages.exhausted_people(settings, pol, users)
    assert got == set(spent)
    # each person's answer is the same asked alone: it reads only their own ledger row
    for u in spent[:2] + some[:2] + fresh[:2]:
        assert stages.exhausted_people(settings, pol, [u]) == ({u} & set(spent))
    # the plan leaves them out: nobody exhausted among its training rows, the rest all there
    ing = stages.ingest(settings, org["source"], "jsonl", id_field="id", time_field="ts")
    full = stages.plan(settings, tiny_policy(tmp_path), snapshot_id=ing["snapshot_id"], base_dir=org["base"])
    less = stages.plan(settings, tiny_policy(tmp_path), snapshot_id=ing["snapshot_id"], base_dir=org["base"],
                       exclude_people=sorted(got))
    from components.draws.annex import load_annex
    from components.draws.data import train_rows

    # Without the exclusion the planner still never publishes an N̂ counting someone who cannot pay for
    # it: the population charge refuses them and the plan is drawn again without them (issue 22).
    assert less["excluded_people"] == 5 and 0 < full["excluded_people"] <= 5
    counted = {str(r["user_id"]) for r in train_rows(load_annex(settings.private_dir, full["plan"])).to_pylist()}
    assert not counted & set(spent)

    trained = {str(r["user_id"]) for r in train_rows(load_annex(settings.private_dir, less["plan"])).to_pylist()}
    assert trained and not trained & set(spent)
    held = set(load_annex(settings.private_dir, less["plan"]).get("held_out_users") or [])
    assert not held & set(spent)  # not audited as "out" either: they are not in the population at all


def test_retrain_reports_people_left_out_and_publishes_no_count(api, veil_home, tmp_path, org, settings):
    from components.policy import load_policy
    from components.registry.mlflow_registry import _client
    from flows.retrain import retrain_flow

    policy = tiny_policy(tmp_path)
    pol = load_policy(policy)
    spent = _users(org)[:7]
    _exhaust(settings, pol, spent)
    res = retrain_flow(str(policy), str(org["source"]), "jsonl", home=str(veil_home), base_model_dir=str(org["base"]),
                       model_name="budget", mapping=stages.DEMO_MAPPING)
    assert res["action"] == "trained" and res["people_retired"] == 7, res
    client = _client(load_settings(veil_home))
    mv = client.get_model_version("budget", "1")
    run = client.get_run(mv.run_id)
    published = {**mv.tags, **run.data.tags, **{k: str(v) for k, v in run.data.metrics.items()}}
    assert not [k for k in published if "retired" in k.lower() or "admitted" in k.lower()], sorted(published)


def test_policies_without_a_population_estimate_exclude_no_one_before_planning(settings):
    """Secret protection has no (ε, δ) target and filtered ULS no Laplace N̂: nothing to price, no crash."""
    from pathlib import Path

    from components.policy import load_policy

    root = Path(__file__).resolve().parents[2]
    for name in ("code-team-secrets.yaml", "filtered-research.yaml"):
        assert stages.exhausted_people(settings, load_policy(root / "policies" / name), ["a@x", "b@x"]) == set()
