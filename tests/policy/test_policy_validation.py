"""Policy files: valid examples load; every kind of mistake is named with its file, line and field."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from components.core.errors import VeilError
from components.core.hashing import sha256_file
from components.policy import PolicyError, check_policy, load_policy, parse_policy
from components.policy.schema import DEFAULT_PATH, schema_text

POLICIES = Path(__file__).resolve().parents[2] / "policies"
# Training policies (kind: PrivacyPolicy). PMixED's `kind: PredictionPolicy` files have their own loader
# (components/policy/prediction.py) and are checked in tests/prediction.
TRAINING = sorted(p for p in POLICIES.glob("*.yaml") if "kind: PredictionPolicy" not in p.read_text())

MINIMAL = """\
apiVersion: veil.dev/v1
kind: PrivacyPolicy
metadata:
  name: tiny
  owner: me@example.org
spec:
  privacy_unit: user
  mechanism: uls
  target:
    epsilon: 4
    delta: 1e-6
  secrets:
    tiers:
      critical: {kappa: 0.001, gamma: 0.01}
    classes:
      - name: codename
        tier: critical
        rules:
          - kind: literal
            patterns: [KESTREL]
"""


def _problems(tmp_path, text: str):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p, check_policy(p)


def _only(tmp_path, text):
    path, probs = _problems(tmp_path, text)
    assert len(probs) == 1, [str(p) for p in probs]
    assert probs[0].file == str(path)
    return probs[0]


@pytest.mark.parametrize("name", [p.name for p in TRAINING])
def test_shipped_policies_are_valid(name):
    pol = load_policy(POLICIES / name)
    assert pol.sha256 == sha256_file(POLICIES / name)
    assert pol.path.endswith(name)


def test_at_least_three_example_policies_cover_user_and_secret_units():
    units = {load_policy(p).spec.privacy_unit for p in TRAINING}
    assert len(TRAINING) >= 3
    assert {"user", "secret"} <= units


def test_demo_policy_promises_user_level_uls():
    pol = load_policy(POLICIES / "demo.yaml")
    s = pol.spec
    assert (s.privacy_unit, s.mechanism) == ("user", "uls")
    assert 0 < s.target.delta < 1 / 240
    assert {c.name for c in s.secrets.classes} == {"codename", "credential", "email", "phone"}
    # Sized for a quick demo on CPU.
    assert s.training.steps <= 300 and s.training.seq_len <= 128


def test_minimal_policy_gets_defaults_and_tagging_rules():
    pol = parse_policy(MINIMAL)
    assert pol.spec.training.steps > 0 and pol.spec.training.lora is not None
    assert pol.tagging_rules() == [{"secret_class": "codename", "kind": "literal", "patterns": ["KESTREL"],
                                    "case_sensitive": True}]
    # 1e-6 (YAML 1.2 float without a dot) is a number, not text
    assert pol.spec.target.delta == 1e-6
    prot = pol.secret_protection()["codename"]
    # ρ = d_KL(γ‖κ) computed independently
    g, k = 0.01, 0.001
    assert prot.rho == pytest.approx(g * math.log(g / k) + (1 - g) * math.log((1 - g) / (1 - k)), rel=1e-12)


def test_tagging_rules_of_demo_match_contract_format():
    rules = load_policy(POLICIES / "demo.yaml").tagging_rules()
    assert rules and all(set(r) == {"secret_class", "kind", "patterns", "case_sensitive"} for r in rules)
    kinds = {r["kind"] for r in rules}
    assert kinds <= {"literal", "regex", "path_glob", "detector"}
    detectors = {p for r in rules if r["kind"] == "detector" for p in r["patterns"]}
    assert detectors == {"credentials", "email", "phone"}
    assert json.loads(json.dumps(rules)) == rules


def test_policy_is_frozen():
    pol = parse_policy(MINIMAL)
    with pytest.raises(Exception):
        pol.spec.target.epsilon = 100.0  # type: ignore[misc]


def test_negative_epsilon_names_line_and_field(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("epsilon: 4", "epsilon: -4"))
    assert (p.line, p.field) == (10, "spec.target.epsilon")
    assert "greater than 0" in p.message and "-4" in p.message


def test_delta_at_least_one(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("delta: 1e-6", "delta: 1"))
    assert (p.line, p.field) == (11, "spec.target.delta")
    assert "less than 1" in p.message


def test_unknown_key_suggests_the_right_one(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("  mechanism: uls", "  mechanism: uls\n  mechansim: els"))
    assert (p.line, p.field) == (9, "spec.mechansim")
    assert "unknown key 'mechansim'" in p.message and "did you mean 'mechanism'" in p.message


def test_list_instead_of_mapping(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("  target:\n    epsilon: 4\n    delta: 1e-6",
                                        "  target:\n    - epsilon: 4\n    - delta: 1e-6"))
    assert (p.line, p.field) == (9, "spec.target")
    assert "expected a mapping" in p.message and "list" in p.message


def test_wrong_type(tmp_path):
    text = MINIMAL.replace("  target:", "  contribution:\n    max_records_per_user: four\n  target:")
    p = _only(tmp_path, text)
    assert (p.line, p.field) == (10, "spec.contribution.max_records_per_user")
    assert "whole number" in p.message and "'four'" in p.message


def test_gamma_below_kappa_points_at_gamma(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("{kappa: 0.001, gamma: 0.01}", "{kappa: 0.01, gamma: 0.001}"))
    assert (p.line, p.field) == (14, "spec.secrets.tiers.critical.gamma")
    assert "below kappa" in p.message


def test_gamma_below_kappa_in_block_style_names_its_own_line(tmp_path):
    text = MINIMAL.replace("      critical: {kappa: 0.001, gamma: 0.01}",
                           "      critical:\n        kappa: 0.5\n        gamma: 0.1")
    p = _only(tmp_path, text)
    assert (p.line, p.field) == (16, "spec.secrets.tiers.critical.gamma")


def test_bad_literal_value(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("privacy_unit: user", "privacy_unit: team"))
    assert (p.line, p.field) == (7, "spec.privacy_unit")
    assert "user" in p.message and "record" in p.message and "secret" in p.message


def test_mechanism_that_cannot_protect_the_unit(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("mechanism: uls", "mechanism: record"))
    assert (p.line, p.field) == (8, "spec.mechanism")
    assert "cannot protect" in p.message


def test_missing_required_field(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("  owner: me@example.org\n", ""))
    assert (p.line, p.field) == (3, "metadata.owner")
    assert "required" in p.message


def test_unknown_tier_and_bad_regex_and_detector(tmp_path):
    text = MINIMAL.replace("tier: critical", "tier: secret-ish").replace(
        "          - kind: literal\n            patterns: [KESTREL]",
        "          - kind: regex\n            patterns: ['AKIA[0-9']\n          - kind: detector\n"
        "            patterns: [ssn]")
    path, probs = _problems(tmp_path, text)
    by_field = {p.field: p for p in probs}
    assert by_field["spec.secrets.classes[0].rules[0].patterns"].line == 20
    assert "does not compile" in by_field["spec.secrets.classes[0].rules[0].patterns"].message
    assert by_field["spec.secrets.classes[0].rules[1].patterns"].line == 22
    assert "unknown detector 'ssn'" in by_field["spec.secrets.classes[0].rules[1].patterns"].message


def test_unknown_tier(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("tier: critical", "tier: severe"))
    assert (p.line, p.field) == (17, "spec.secrets.classes[0].tier")
    assert "severe" in p.message and "critical" in p.message


def test_several_problems_are_all_reported_in_line_order(tmp_path):
    text = MINIMAL.replace("epsilon: 4", "epsilon: -1").replace("delta: 1e-6", "delta: 2").replace(
        "kind: PrivacyPolicy", "kind: Policy")
    path, probs = _problems(tmp_path, text)
    assert [(p.line, p.field) for p in probs] == [(2, "kind"), (10, "spec.target.epsilon"), (11, "spec.target.delta")]
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert isinstance(e.value, VeilError)
    assert str(e.value).startswith(f"{path}:2: kind:") and "2 more" in str(e.value)
    assert "\n" not in str(e.value)


def test_duplicate_key(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("    delta: 1e-6", "    delta: 1e-6\n    epsilon: 2"))
    assert (p.line, p.field) == (12, "spec.target.epsilon")
    assert "twice" in p.message and "line 10" in p.message


def test_yaml_syntax_error_and_empty_and_non_mapping(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("  target:\n", "  target: [\n"))
    assert "not valid YAML" in p.message and p.line >= 9
    assert "empty" in _only(tmp_path, "").message
    p = _only(tmp_path, "- a\n- b\n")
    assert "top level" in p.message and p.line == 1


def test_infinite_and_lifetime_rules(tmp_path):
    p = _only(tmp_path, MINIMAL.replace("epsilon: 4", "epsilon: .inf"))
    assert p.field == "spec.target.epsilon" and "finite" in p.message
    p = _only(tmp_path, MINIMAL.replace("  target:", "  lifetime_budget: {epsilon: 1, delta: 1e-5}\n  target:"))
    assert p.field == "spec.lifetime_budget.epsilon" and p.line == 9


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(VeilError, match="no such policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_schema_file_is_up_to_date():
    assert DEFAULT_PATH.read_text() == schema_text(), \
        "policies/schema.json is stale: run `python -m components.policy.schema`"


def test_schema_rejects_unknown_keys_everywhere():
    schema = json.loads(DEFAULT_PATH.read_text())
    objects = [d for d in schema["$defs"].values() if d.get("type") == "object"]
    assert objects and all(d.get("additionalProperties") is False for d in objects)
    assert schema.get("additionalProperties") is False


def test_no_silent_coercion_and_non_text_keys(tmp_path):
    text = MINIMAL.replace("  owner: me@example.org\n", "  owner: me@example.org\n  1: x\n").replace(
        "  secrets:", "  training:\n    seed: true\n  secrets:")
    path, probs = _problems(tmp_path, text)
    by_field = {p.field: p for p in probs}
    assert by_field["metadata[1]"].line == 6 and "not a name" in by_field["metadata[1]"].message
    assert by_field["spec.training.seed"].line == 14 and "boolean" in by_field["spec.training.seed"].message
    p = _only(tmp_path, MINIMAL.replace("epsilon: 4", "epsilon: '4'"))
    assert p.field == "spec.target.epsilon" and "expected a number" in p.message


def test_filtered_uls_needs_its_filter_and_only_it_takes_one():
    from components.policy.model import Spec

    base = {"privacy_unit": "user", "target": {"epsilon": 8.0, "delta": 1e-5}}
    with pytest.raises(ValueError, match="needs filter.tau"):
        Spec.model_validate({**base, "mechanism": "uls-filtered"})
    with pytest.raises(ValueError, match="needs 'uls-filtered'"):
        Spec.model_validate({**base, "mechanism": "uls", "filter": {"tau": 0.5}})
    assert Spec.model_validate({**base, "mechanism": "uls-filtered", "filter": {"tau": 0.5}}).filter.tau == 0.5
