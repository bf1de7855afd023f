"""Inputs built to pin a core: a catastrophic-backtracking regex and a YAML alias bomb. Both must be
handled fast — the regex runs on RE2 in linear time, patterns RE2 cannot run are refused, and an
alias bomb is refused before anything walks the expanded document."""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from catalog.tagging import BUILTIN_DETECTORS as CATALOG_DETECTORS, Tagger
from components.policy import BUILTIN_DETECTORS, check_policy
from flows.cli import app

DEMO = Path(__file__).resolve().parents[2] / "policies" / "demo.yaml"


def _with_rule(tmp_path, pattern: str) -> Path:
    text = DEMO.read_text()
    anchor = "          - kind: literal\n            case_sensitive: true\n            patterns: [BLUEHERON"
    assert anchor in text
    rule = f"          - kind: regex\n            patterns: ['{pattern}']\n"
    p = tmp_path / "p.yaml"
    p.write_text(text.replace(anchor, rule + anchor, 1))
    return p


@pytest.mark.timeout(20)
def test_catastrophic_regex_tags_in_linear_time():
    t = Tagger([{"secret_class": "x", "kind": "regex", "patterns": ["(a+)+$", "(x|x)*y"]}])
    texts = pa.array(["a" * 40 + "b", "a" * 100_000 + "!", "x" * 50_000, "aaaa"])
    t0 = time.process_time()   # CPU time: a loaded machine (make test runs files in parallel) must not fail it
    spans = t.tag(texts)
    assert time.process_time() - t0 < 2.0
    assert [(s.row, s.start, s.end) for s in spans] == [(3, 0, 4)]


@pytest.mark.parametrize("pattern,why", [(r"(a)\1", "escape"), (r"(?<!x)key", "perl operator"),
                                          (r"key(?=\d)", "perl operator")])
def test_policy_check_refuses_what_re2_cannot_run(tmp_path, pattern, why):
    p = _with_rule(tmp_path, pattern)
    problems = check_policy(p)
    assert len(problems) == 1 and "cannot run on RE2" in problems[0].message and why in problems[0].message
    res = CliRunner().invoke(app, ["policy", "check", str(p)])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_policy_check_accepts_backtracking_prone_pattern_re2_runs(tmp_path):
    assert check_policy(_with_rule(tmp_path, "(a+)+$")) == []


@pytest.mark.timeout(20)
def test_alias_bomb_is_refused_fast(tmp_path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    bomb = "\n".join(lines) + "\n"
    p = tmp_path / "bomb.yaml"
    p.write_text(DEMO.read_text() + "x-bomb:\n" + "".join("  " + ln + "\n" for ln in bomb.splitlines()))
    assert 500 < len(p.read_bytes()) - len(DEMO.read_bytes()) < 5_000
    t0 = time.process_time()   # CPU time: a loaded machine (make test runs files in parallel) must not fail it
    problems = check_policy(p)
    assert time.process_time() - t0 < 2.0
    assert len(problems) == 1 and "alias bomb" in problems[0].message
    res = CliRunner().invoke(app, ["policy", "check", str(p)])
    assert res.exit_code == 2 and "alias bomb" in res.output


def test_recursive_alias_is_refused(tmp_path):
    p = tmp_path / "rec.yaml"
    p.write_text(DEMO.read_text() + "x-loop: &loop\n  self: *loop\n")
    problems = check_policy(p)
    assert problems and ("recursive" in problems[0].message or "not valid YAML" in problems[0].message)


def test_policy_and_catalog_agree_on_detector_names():
    assert set(BUILTIN_DETECTORS) == set(CATALOG_DETECTORS)
