"""The planner leaves the text out of the training rows when nothing after the audit split reads it
(issue 27: the planner's memory at 10⁷ people). A plan made that way must be byte-identical — the public
plan and its private annex, hence every file the annex names — to one made with the text carried along."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import components.planning.make as make
from components.draws.annex import load_annex
from components.draws.selection import STRATEGIES
from components.planning import make_plan
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

WHEN = "2026-01-01T00:00:00+00:00"
DEMO = (ROOT / "policies" / "demo.yaml").read_text().replace(
    re.search(r"    steps: \d+", (ROOT / "policies" / "demo.yaml").read_text()).group(0), "    steps: 20")


def _variants() -> dict[str, str]:
    batch = re.search(r"expected_batch_size: \d+", DEMO).group(0)
    secrets = (ROOT / "policies" / "code-team-secrets.yaml").read_text()
    return {
        "uls": DEMO,
        "uls-canaries": DEMO.replace("    canaries:\n      users: 0", "    canaries:\n      users: 4"),
        "record": DEMO.replace("privacy_unit: user", "privacy_unit: record").replace("mechanism: uls",
                                                                                    "mechanism: record"),
        "auto": DEMO.replace("mechanism: uls", "mechanism: auto").replace(batch, "expected_batch_size: 16"),
        "secret": re.sub(r"expected_batch_size: \d+", "expected_batch_size: 16",
                         re.sub(r"    steps: \d+", "    steps: 20", secrets)),
    }


def _plan(policy, snap, private: Path) -> tuple[str, dict]:
    """The plan's sha256 and its annex (which names every private file by its sha256)."""
    plan = make_plan(policy, snap, private_dir=private, created_at=WHEN)
    annex = {k: v for k, v in load_annex(private, plan.to_dict()).items() if k != "_dir"}   # _dir: where, not what
    return plan.sha256, json.loads(json.dumps(annex, sort_keys=True))


@pytest.mark.parametrize("name", list(_variants()))
def test_a_plan_without_the_training_text_is_byte_identical(name, tmp_path, monkeypatch):
    assert "canaries:\n      users: 0" in DEMO          # the canary variant really changes the policy
    path = tmp_path / f"{name}.yaml"
    path.write_text(_variants()[name])
    policy = load_policy(path)
    snap = make_snapshot(60, seed=1, secrets_per_record=2 if name == "secret" else 0)

    seen = []
    real = make.reserve_audit

    def spy(*a, **kw):
        split, canaries = real(*a, **kw)
        seen.append("text" in split.train.column_names)
        return split, canaries
    monkeypatch.setattr(make, "reserve_audit", spy)
    lean = _plan(policy, snap, tmp_path / "lean")
    monkeypatch.setattr(make, "_reads_train_text", lambda *_: True)
    full = _plan(policy, snap, tmp_path / "full")
    assert seen == [False, True], seen                 # the two runs really differ in what they carried
    assert lean == full


def _policy(mechanism: str, selection: str):
    return SimpleNamespace(spec=SimpleNamespace(mechanism=mechanism, privacy_unit="user",
                                                contribution=SimpleNamespace(selection=selection)))


def test_what_reads_the_training_text():
    for sel, reads in (("random", False), ("random-chunk", False), ("longest", True), ("shortest", True),
                       ("ppl-high", True), ("ppl-low", True)):
        assert make._reads_train_text(_policy("uls", sel), make.Compute()) is reads, sel
    assert set(make._TEXT_SELECTIONS) | {"random", "random-chunk"} == set(STRATEGIES)
    # `auto` estimating gradient diversity at the base model reads the texts; with a given ratio it does not
    assert make._reads_train_text(_policy("auto", "random"), make.Compute(base_model=("model", "tok"))) is True
    assert make._reads_train_text(_policy("auto", "random"), make.Compute(base_model=("m", "t"),
                                                                         user_grad_ratio=lambda g: 1.0)) is False
    assert make._reads_train_text(_policy("auto", "random"), make.Compute()) is False
