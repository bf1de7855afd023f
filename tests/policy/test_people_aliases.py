"""`people.aliases` under the one identity rule (issue 26): a list of one person's case and spacing
variants is accepted; a refusal names the entry as written and its field, never a placeholder like
`@aliases.0@` — in training policies and in PMixED's prediction policies alike."""
from __future__ import annotations

from pathlib import Path

import pytest

from components.core.errors import VeilError
from components.policy import PolicyError, parse_policy

POLICIES = Path(__file__).resolve().parents[2] / "policies"
DEMO = (POLICIES / "demo.yaml").read_text()
PMIXED = (POLICIES / "demo-pmixed.yaml").read_text()


def _training(people: str):
    return parse_policy(DEMO.rstrip("\n") + "\n  people:\n" + people)


def _prediction(tmp_path, people: str):
    from components.prediction.policy import load_prediction_policy

    p = tmp_path / "p.yaml"
    p.write_text(PMIXED.rstrip("\n") + "\n  people:\n" + people)
    return load_prediction_policy(p)[0]


VARIANTS = "    aliases: [['Jane Doe <Jane.Doe@Example.org>', 'jane.doe@example.org', ' JANE.DOE@example.org ']]\n"


def test_a_merge_of_case_and_spacing_variants_is_accepted_and_planned_as_one_person(tmp_path):
    import pyarrow as pa

    from components.bounding.people import plan_accounts

    pol = _training(VARIANTS)
    assert _prediction(tmp_path, VARIANTS).spec.people.aliases == pol.spec.people.aliases
    recs = pa.table({"user_id": ["jane.doe@example.org", "Jane.Doe@example.org", "jdoe@x.org"],
                     "text": ["a", "b", "c"], "metadata": ["{}"] * 3})
    people = pol.people()
    people["aliases"][0].append("jdoe@x.org")     # and another address of hers
    mapping, report = plan_accounts(recs, people)
    assert set(mapping.values()) == {"jane.doe@example.org"} and report["people"] == 1


@pytest.mark.parametrize("people,field,named", [
    ("    aliases: [[ann@x.example]]\n", "spec.people.aliases[0]", "['ann@x.example']"),
    ("    aliases: [[a@x, b@x], [' B@X', c@x]]\n", "spec.people.aliases[1][0]", "' B@X'"),
    ("    aliases: [[a@x, \"\\u200b\"]]\n", "spec.people.aliases[0][1]", "'\\u200b'"),
])
def test_refusals_name_the_entry_and_its_field(tmp_path, people, field, named):
    with pytest.raises(PolicyError) as e:
        _training(people)
    [problem] = e.value.problems
    assert problem.field == field and named in problem.message and "@" + "aliases" not in problem.message
    with pytest.raises(VeilError) as e2:
        _prediction(tmp_path, people)
    msg = str(e2.value)
    assert field.removeprefix("spec.") in msg and named in msg and "@aliases" not in msg
    if "B@X" in named:
        assert "'b@x'" in msg and "alias list 1" in msg    # which other entry it collides with, as written
