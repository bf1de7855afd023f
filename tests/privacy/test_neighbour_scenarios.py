"""Whole scenarios on D and on D without one person (issue 22): every published difference is a
DP release the removed person was charged for, or public only under a relation the release claims.

The harness (`_neighbours.py`) and the scenarios (`_scenarios.py`) are shared with bench/neighbours.py,
which runs them over 20+ removed people and 3 keys; here a small sample keeps `make test` short."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _neighbours as nb  # noqa: E402
import _scenarios as sc  # noqa: E402

PEOPLE, SCENARIOS = sc.make(14)
REMOVED = PEOPLE[3::7]            # 2 people
KEYS = [b"\x01" * 32]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_publishes_only_what_it_charges(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "unused"))
    findings = nb.check_scenario(name, SCENARIOS[name], tmp_path, PEOPLE, REMOVED, KEYS)
    assert not findings, "\n".join(f"{f.scenario} −{f.person}: {f.channel}:{f.path}: {f.why}" for f in findings[:20])
