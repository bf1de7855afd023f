"""A plan refused because N̂ < B is an output of the N̂ release: it is charged, and the neighbour harness
allows it only then (issue 22).

The refusal reads only the DP estimate N̂ and the public batch B (components.mechanisms.gaussian), so it
is a post-processing of the Laplace release — but it is seen: no plan, no model, N̂ in the message. Old
code raised before the charge, so a population that fell under the batch by noise released a bit about
everyone it counted and charged nobody (the full-size bench found D and D − p015 taking different
courses this way: one planned and released, the other refused). Now the planner charges that N̂ exactly
as a published one, and the harness classifies such a divergence as a DP outcome when, and only when,
the removed person holds that charge; any other refusal that differs between D and D − u is a finding.
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _neighbours as nb  # noqa: E402

ROWS = nb.organization(8, seed=3)
PEOPLE = sorted({r["user_id"] for r in ROWS})
KEY = b"\x05" * 32


def test_a_refusal_on_n_hat_is_charged_to_everyone_it_counted(tmp_path):
    from components.core.errors import VeilError
    from components.ledger import Ledger
    from components.renyi.costs import person_rates
    from components.mechanisms.gaussian import PopulationRefusal
    from flows import stages

    home = nb.Home(tmp_path / "home", KEY)
    pol = nb.policy(tmp_path, "big-batch", batch=500)          # N̂ ≈ 6 ± Laplace(2): always under 500
    with pytest.raises(PopulationRefusal) as err:
        stages.plan_snapshot(home.settings, pol, nb.snapshot(ROWS))
    e = err.value
    counted = set(person_rates(e.persons, 0.0))
    assert counted and counted < set(PEOPLE)        # some people are held out or evaluated: not counted
    led = Ledger.open(home.settings)
    try:
        rid = led.population_release(e.release_key)
    finally:
        led.dispose()
    assert rid is not None, "the N̂ the plan refused on holds no ledger release (old code: charged nobody)"
    for u in PEOPLE:
        assert (rid in nb.person_charges(home.settings, u)) == (u in counted), u
    # the same population planned again draws the same N̂: nothing new is released, nothing charged again
    with pytest.raises(PopulationRefusal):
        stages.plan_snapshot(home.settings, pol, nb.snapshot(ROWS))
    assert all(nb.person_charges(home.settings, u) == ({rid} if u in counted else set()) for u in PEOPLE)
    # what a Prefect state or a process pool keeps of it: the message, never the counted people
    copy = pickle.loads(pickle.dumps(e))
    assert type(copy) is VeilError and str(copy) == str(e) and not hasattr(copy, "persons")
    assert not any(u in str(e) for u in PEOPLE)


def _one_release(home, policies: Path, without):
    snap = nb.snapshot(ROWS, without=without)
    home.release(home.plan(nb.policy(policies, "one"), snap), snap)


@pytest.fixture()
def noise(monkeypatch):
    """N̂'s Laplace draw replaced by a function of the counted population (as the keyed draw is): 0 for the
    first population planned (the run on D), −100 for any other, or the reverse."""
    import components.draws.annex as annex
    import components.mechanisms.gaussian as gaussian

    def install(refuse_on_d: bool):
        seen: list[str] = []

        def draw(key, scale, *parts):
            if parts[1] not in seen:
                seen.append(parts[1])
            first = seen.index(parts[1]) == 0
            return -100.0 if first == refuse_on_d else 0.0

        # where it is defined and where the population estimate calls it (imported at module top there)
        monkeypatch.setattr(annex, "laplace_noise", draw)
        monkeypatch.setattr(gaussian, "laplace_noise", draw)
    return install


def _counted_people(tmp_path) -> list[str]:
    """The people N̂ counts on D under KEY (a throwaway home: the harness' own runs start afresh)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    home = nb.Home(probe / "home", KEY)
    home.plan(nb.policy(probe, "one"), nb.snapshot(ROWS))
    return sorted(nb.person_rates_of(home.annexes[-1]))


@pytest.mark.parametrize("refuse_on_d", [False, True], ids=["refused-without-u", "refused-with-u"])
def test_harness_allows_a_divergence_decided_by_a_charged_n_hat(tmp_path, monkeypatch, noise, refuse_on_d):
    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    u = _counted_people(tmp_path)[0]
    noise(refuse_on_d)
    notes: list = []
    findings = nb.check_scenario("one", _one_release, tmp_path, PEOPLE, [u], [KEY], notes)
    assert not findings, [f.__dict__ for f in findings]
    assert [n.person for n in notes] == [u] and "refusal reads only N̂" in notes[0].why, notes


def test_harness_finds_a_refusal_on_n_hat_left_uncharged(tmp_path, monkeypatch, noise):
    """Old code's behaviour (the refused N̂ charged to nobody): D refuses, D − u plans; u holds no charge
    for the N̂ that decided it."""
    from flows import stages

    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    u = _counted_people(tmp_path)[0]
    noise(True)
    monkeypatch.setattr(stages, "charge_refused_population", lambda settings, e: ())
    findings = nb.check_scenario("one", _one_release, tmp_path, PEOPLE, [u], [KEY])
    whys = [f.why for f in findings if f.person == u]
    assert any("holds no charge for the N̂ that decided it" in w for w in whys), whys
    assert any("counted in an N̂ a plan refused on" in w for w in whys), whys


def test_harness_finds_a_refusal_that_reads_exact_data(tmp_path, monkeypatch):
    """A refusal not on N̂ alone (here: a planner that refuses when one person is missing — a decision on
    exact data) that differs between D and D − u is a finding, not a DP outcome."""
    import flows.stages as planning    # make_plan is bound there (module top) for plan_snapshot
    from components.core.errors import VeilError

    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    u = _counted_people(tmp_path)[0]
    real = planning.make_plan

    def make_plan(policy, snapshot, **kw):
        if u not in set(snapshot.records.column("user_id").to_pylist()):
            raise VeilError("plan: too few training records")
        return real(policy, snapshot, **kw)

    monkeypatch.setattr(planning, "make_plan", make_plan)
    findings = nb.check_scenario("one", _one_release, tmp_path, PEOPLE, [u], [KEY])
    assert any("not a refusal on the DP estimate N̂ alone" in f.why for f in findings), [f.why for f in findings]


def test_harness_allows_a_release_only_the_removed_person_could_afford(tmp_path, monkeypatch):
    """The training filter retires each person on their own spend: when, without u, it admits no one, D's
    release (which admitted and charged u) and D − u's nothing differ by a release u is charged for."""
    from flows import stages

    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    u = _counted_people(tmp_path)[0]
    real = stages.reserve

    def reserve(settings, plan, annex, out, *a, **k):
        if u not in nb.person_rates_of(annex):
            raise stages.VeilError("ledger: every trained person of this plan has spent their lifetime budget")
        return real(settings, plan, annex, out, *a, **k)

    monkeypatch.setattr(stages, "reserve", reserve)
    notes: list = []
    findings = nb.check_scenario("one", _one_release, tmp_path, PEOPLE, [u], [KEY], notes)
    assert not findings, [f.__dict__ for f in findings]
    assert [n.person for n in notes] == [u] and "everyone retired without this person" in notes[0].why, notes
