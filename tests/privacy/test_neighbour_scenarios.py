"""Whole scenarios on D and on D without one person (issue 22): every published difference is a
DP release the removed person was charged for, or public only under a relation the release claims.

The harness (`_neighbours.py`) and the scenarios (`_scenarios.py`) are shared with bench/neighbours.py,
which runs them over 20+ removed people and 3 keys; here a small sample keeps `make test` short."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _neighbours as nb  # noqa: E402
import _scenarios as sc  # noqa: E402

PEOPLE, SCENARIOS = sc.make(14)
REMOVED = PEOPLE[3::7]            # 2 people
# evaluation: under KEYS, p008 is an evaluation person (the plan's keyed draw) and p003 a trained one
# evaluation_retired: p003 is a candidate of the second evaluation whom the ledger's filter retires (not
# counted), p008 one it counts
REMOVED_FOR = {"evaluation": [PEOPLE[3], PEOPLE[8]], "private_selection": [PEOPLE[3], PEOPLE[8]],
               "evaluation_retired": [PEOPLE[3], PEOPLE[8]]}
KEYS = [b"\x01" * 32]


def _report(findings) -> str:
    return "\n".join(f"{f.scenario} −{f.person}: {f.channel}:{f.path}: {f.why}" for f in findings[:20])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_publishes_only_what_it_charges(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    findings = nb.check_scenario(name, SCENARIOS[name], tmp_path, PEOPLE, REMOVED_FOR.get(name, REMOVED), KEYS)
    assert not findings, _report(findings)


def test_harness_finds_an_evaluation_person_counted_but_not_charged(tmp_path, monkeypatch):
    """The check can fail: the evaluation release counts p008 (their figures are in the sums) but the
    ledger's reservation is made without them, so they hold no charge for it. The harness must see the
    eval_* metrics move with p008 and find no charge that prices them."""
    from components.ledger.ledger import Ledger

    victim = PEOPLE[8]
    orig = Ledger.reserve

    def reserve(self, *, mechanism, costs, **kw):
        if mechanism != "evaluation" or victim not in costs:
            return orig(self, mechanism=mechanism, costs=costs, **kw)
        res = orig(self, mechanism=mechanism, costs={u: c for u, c in costs.items() if u != victim}, **kw)
        return dataclasses.replace(res, admitted=tuple(sorted({*res.admitted, victim})))

    monkeypatch.setattr(Ledger, "reserve", reserve)
    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    findings = nb.check_scenario("evaluation", SCENARIOS["evaluation"], tmp_path, PEOPLE, [victim], KEYS)
    # (a single coordinate may clamp, e.g. a perplexity at exp(nll_clip): any eval_* metric will do)
    assert any(f.person == victim and f.channel == "registry.metric" for f in findings), _report(findings)
    assert all(f.person == victim and f.path.startswith("eval_") for f in findings), _report(findings)


def test_harness_finds_a_scored_person_not_charged_for_the_selection(tmp_path, monkeypatch):
    """The check can fail: private selection's reservation is made without p008 (an evaluation person),
    who is still scored (only people the filter *retired* are left out of the score). The chosen trial's
    noisy score moves with p008, who holds no charge for the selection's release."""
    from components.ledger.ledger import Ledger

    victim = PEOPLE[8]
    orig = Ledger.reserve

    def reserve(self, *, mechanism, costs, **kw):
        if mechanism == "private-selection":
            costs = {u: c for u, c in costs.items() if u != victim}
        return orig(self, mechanism=mechanism, costs=costs, **kw)

    monkeypatch.setattr(Ledger, "reserve", reserve)
    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    findings = nb.check_scenario("private_selection", SCENARIOS["private_selection"], tmp_path, PEOPLE, [victim],
                                 KEYS)
    bad = {(f.person, f.channel, f.path) for f in findings}
    assert (victim, "selection", "selected_noisy_score") in bad, _report(findings)


def test_harness_finds_a_count_in_the_pmixed_certificate(tmp_path, monkeypatch):
    """The check can fail: a field declared public by mistake (the gate refuses an undeclared one: the PMixED
    certificate is declared field by field) is what the harness catches when it moves with a person — here the
    number of people partitioned, added to the certificate's ensemble section and wrongly declared public."""
    from components.prediction import release as prel
    from components.publication import Field, Kind
    from components.publication import gate

    monkeypatch.setitem(gate._FIELDS, "pmixed.release", [
        *gate._FIELDS["pmixed.release"],
        Field("pmixed.release", "certificate.ensemble.people", Kind.PUBLIC, "a mistaken declaration")])

    orig = prel.make_certificate

    def make_certificate(**kw):
        cert = orig(**kw)
        cert.pop("sha256")
        cert["ensemble"]["people"] = len(set(_people_seen))
        from components.core.hashing import sha256_json

        cert["sha256"] = sha256_json(cert)
        return cert

    _people_seen: list[str] = []
    from components.prediction import partition as part

    real = part.partition

    def spy(key, people, n):
        people = list(people)
        _people_seen[:] = people
        return real(key, people, n)

    monkeypatch.setattr(part, "partition", spy)
    monkeypatch.setattr(prel, "make_certificate", make_certificate)
    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    findings = nb.check_scenario("pmixed_build", SCENARIOS["pmixed_build"], tmp_path, PEOPLE, REMOVED[:1], KEYS)
    assert [(f.channel, f.path) for f in findings] == [("pmixed.release", "certificate.ensemble.people")], \
        _report(findings)
