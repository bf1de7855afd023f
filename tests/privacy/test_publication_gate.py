"""The publication gate refuses what nobody declared, and the threat model's table is its declarations.

Issue 22: every value that leaves the private area passes `publish(channel, doc)`; a leaf without a
declaration of its kind is refused at run time, at the real exit points (here: writing a plan)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from components.core.errors import VeilError
from components.publication import Field, Kind, declared, publish, recording
from components.publication.gate import table_markdown, with_table

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402


def test_an_undeclared_field_is_refused_naming_channel_and_path():
    with pytest.raises(VeilError, match=r"registry\.tag field 'privacy\.people_trained' is not declared"):
        publish("registry.tag", {"privacy.epsilon": "8.0", "privacy.people_trained": "208"})
    with pytest.raises(VeilError, match="channel 'mystery' is not declared"):
        publish("mystery", {"a": 1})


def test_a_real_exit_point_refuses_an_undeclared_field(tmp_path):
    """A plan with one extra public field (say, a feature that wants to show the exact N) is not written."""
    from components.planning import make_plan, save_plan
    from components.planning.plan import Plan, seal
    from components.policy import load_policy

    plan = make_plan(load_policy(ROOT / "policies" / "demo.yaml"), make_snapshot(40, seed=2),
                     private_dir=tmp_path / "private", created_at="2026-01-01T00:00:00+00:00")
    body = {k: v for k, v in plan.to_dict().items() if k != "sha256"}
    body["data"] = {**body["data"], "n_exact_people": 40}
    with pytest.raises(VeilError, match=r"plan field 'data\.n_exact_people' is not declared"):
        save_plan(Plan(seal(body)), tmp_path / "plans")
    assert not list((tmp_path / "plans").glob("*.json"))
    with recording() as rec:
        save_plan(plan, tmp_path / "plans")
    kinds = {p.path: p.field.kind for p in rec}
    assert kinds["data.population.estimate"] is Kind.DP and kinds["policy.sha256"] is Kind.PUBLIC


def test_declarations_say_their_price():
    with pytest.raises(ValueError, match="names its mechanism"):
        Field("plan", "x", Kind.DP, "a DP value with no charge")
    with pytest.raises(ValueError, match="coarsening"):
        Field("plan", "x", Kind.UNCOVERED, "an uncovered value with no test")
    for f in declared():
        if f.kind is Kind.UNCOVERED:
            assert (ROOT / f.test.split("::")[0]).is_file(), f"{f.channel}:{f.pattern}: its test {f.test} is missing"
        if f.post_processing_of:
            channel, path = f.post_processing_of.split(":", 1)
            from components.publication.gate import field_for
            src = field_for(channel, path)
            assert src is not None and src.kind is Kind.DP, f"{f.channel}:{f.pattern} post-processes {path}"


def test_the_threat_model_table_is_generated_from_the_declarations():
    doc = (ROOT / "docs" / "privacy" / "threat-model.md").read_text()
    assert with_table(doc) == doc, "docs/privacy/threat-model.md is stale: python -m components.publication --write"
    assert "`data.population.estimate`" in table_markdown()


def test_the_recorder_sees_every_leaf_with_its_declaration():
    with recording() as rec:
        publish("registry.metric", {"privacy_epsilon": 7.9}, subject="x")
    assert [(p.channel, p.path, p.value) for p in rec] == [("registry.metric", "privacy_epsilon", 7.9)]
    assert json.dumps(rec[0].field.post_processing_of) == '"plan:data.population.estimate"'
