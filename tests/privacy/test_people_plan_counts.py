"""What a plan may publish about the policy's `people` section (components.bounding.people).

The public part counts only accounts the policy says are not people (bots, service users): adding or
removing a person — an account no exclusion pattern matches, with all their records, aliases or
not — must leave it unchanged. Counts of persons (accounts, people, merged identities, records with
several owners) go to the annex only, and `assert_public` refuses them in a public plan.
"""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from components.core.errors import VeilError
from components.bounding.people import apply_people, people_sections
from components.planning.plan import assert_public

PEOPLE = {"exclude": ["*[bot]@*", "jenkins@*", "Build Bot*"],
          "aliases": [["ann@corp.example", "ann.lee@gmail.com"], ["cy@corp.example", "cy@home.example"]],
          "ownership": "all-participants"}


def _table(rows):
    return pa.table({"record_id": [f"r{i}" for i in range(len(rows))], "user_id": [u for u, _, _ in rows],
                     "text": ["t"] * len(rows),
                     "metadata": [json.dumps({"from_name": n, "to": to}) for _, n, to in rows]})


def _dataset(rng):
    people = ["ann@corp.example", "ann.lee@gmail.com", "bob@corp.example", "cy@corp.example", "cy@home.example",
              "dee@corp.example", "eve@corp.example"]
    bots = [("49699333+dependabot[bot]@users.noreply.github.com", "dependabot[bot]"),
            ("jenkins@ci.corp.example", "Jenkins"), ("svc@corp.example", "Build Bot 2")]
    rows = []
    for _ in range(60):
        if rng.random() < 0.3:
            u, n = rng.choice(bots)
        else:
            u = rng.choice(people)
            n = u.split("@")[0].title()
        rows.append((u, n, rng.sample(people, rng.randint(0, 3))))
    return rows, people


@pytest.mark.parametrize("seed", range(5))
def test_public_people_section_does_not_move_when_a_person_comes_or_goes(seed):
    rows, people = _dataset(random.Random(seed))
    public, annex = people_sections(apply_people(_table(rows), PEOPLE)[1])
    assert_public({"data": {"people": public}})
    assert public["excluded_accounts"] == 3 and public["excluded_records"] > 0
    groups = [["ann@corp.example", "ann.lee@gmail.com"], ["bob@corp.example"], ["cy@corp.example", "cy@home.example"],
              ["dee@corp.example"], ["eve@corp.example"]]
    for person in groups:      # a person = all their aliases: remove every record they wrote
        rest = [r for r in rows if r[0] not in person]
        pub2, annex2 = people_sections(apply_people(_table(rest), PEOPLE)[1])
        assert pub2 == public
        if len(rest) < len(rows):
            assert annex2 != annex          # the annex does see the person: it must never be published


def test_person_counts_are_refused_in_a_public_plan():
    rows, _ = _dataset(random.Random(9))
    _, annex = people_sections(apply_people(_table(rows), PEOPLE)[1])
    assert annex["n_merged_accounts"] == 2 and annex["n_records_several_owners"] > 0
    for key, value in annex.items():
        with pytest.raises(VeilError, match="private"):
            assert_public({"data": {"people": {key: value}}})


def test_a_recipient_who_writes_too_is_one_owner_whatever_the_case():
    """Dee writes as 'Dee@Corp.example' and receives as 'dee@corp.example': one person, so one
    budget — two owner ids would let her contribute 2k records."""
    rows = [("Dee@Corp.example", "Dee", []), ("bob@corp.example", "Bob", ["DEE@corp.example", "ann.lee@gmail.com"]),
            ("bob@corp.example", "Bob", ["cy@home.example", "new@corp.example"])]
    out, _ = apply_people(_table(rows), PEOPLE)
    owners = out.column("owners").to_pylist()
    # one identity rule (components.core.identity): the person is the rule's form of either spelling
    assert owners[0] == ["dee@corp.example"]
    assert owners[1][0] == "bob@corp.example"   # the sender first, then the recipients
    assert sorted(owners[1][1:]) == ["ann@corp.example", "dee@corp.example"]
    assert owners[2] == ["bob@corp.example", "cy@corp.example", "new@corp.example"]
