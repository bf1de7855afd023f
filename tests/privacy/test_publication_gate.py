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


def _pmixed_certificate(**over):
    from components.prediction import mechanism as mech
    from components.prediction.release import make_certificate, manifest_of

    params = mech.MechanismParams(shards=3, q=0.5, radius=mech.calibrate_radius(epsilon=4.0, delta=1e-5, tokens=6,
                                                                                 q=0.5), tokens=6, delta=1e-5)
    kw = dict(params=params, target={"epsilon": 4.0, "delta": 1e-5}, policy_name="p", policy_sha256="01" * 32,
              snapshot_commitment="ab" * 32, base_sha256="cd" * 32, commitments=["ef" * 32] * 3,
              when_exhausted="public_only", ledger={"ledger_release_id": 3, "budget": {"epsilon": 16.0, "delta": 1e-4}},
              ensemble_id="12" * 16,
              people={"ownership": "author", "excluded_accounts": 1, "excluded_accounts_by_pattern": {"bot-*": 1},
                      "excluded_records": 4, "not_published": "…"})
    kw.update(over)
    return make_certificate(**kw), {**manifest_of(params, "cd" * 32), "max_tokens_per_request": 8,
                                    "key_quota_tokens": None}


def test_the_pmixed_certificate_is_declared_field_by_field():
    """Issue 22: no catch-all for the PMixED certificate or manifest: every field the build writes is declared on
    its own, and one a feature adds (here the number of people partitioned) is refused until someone declares it."""
    assert not [f.pattern for f in declared("pmixed.release") if "**" in f.pattern]
    for ledger in ({"ledger_release_id": 3, "budget": {"epsilon": 16.0, "delta": 1e-4}},
                   {"ledger_release_id": 3, "budget": None}, None):
        cert, manifest = _pmixed_certificate(ledger=ledger)
        publish("pmixed.release", {"certificate": cert, "manifest": manifest})
    cert, manifest = _pmixed_certificate(people=None)
    publish("pmixed.release", {"certificate": cert, "manifest": manifest})
    cert["ensemble"]["people"] = 12
    with pytest.raises(VeilError, match=r"pmixed\.release field 'certificate\.ensemble\.people' is not declared"):
        publish("pmixed.release", {"certificate": cert, "manifest": manifest})
    with pytest.raises(VeilError, match=r"field 'manifest\.shard_sizes' is not declared"):
        publish("pmixed.release", {"certificate": _pmixed_certificate()[0], "manifest": {**manifest,
                                                                                       "shard_sizes": [4, 4, 4]}})
