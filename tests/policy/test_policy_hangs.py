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


# -- issue 28: control bytes, and policies too large to check ----------------------------------------

def _cli_one_line(path: Path) -> str:
    """`veil policy check` through the real entry point: exit 2, one line, no traceback."""
    import subprocess
    import sys

    code = "import sys; from flows.cli import main; sys.argv = ['veil', 'policy', 'check', sys.argv[1]]; main()"
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2 and "Traceback" not in out and len(out.splitlines()) == 1, out
    return out


@pytest.mark.parametrize("bad,name", [("\x00", "U+0000 (NUL)"), ("\x07", "U+0007"), ("\x1b", "U+001B (ESC)"),
                                      ("\x7f", "U+007F (DEL)")])
def test_control_bytes_in_a_policy_are_one_line(tmp_path, bad, name):
    p = tmp_path / "p.yaml"
    text = DEMO.read_text()
    at = text.index("acme-assistant-demo")
    p.write_text(text[:at] + bad + text[at:])
    line = text.count("\n", 0, at) + 1
    [problem] = check_policy(p)
    assert problem.line == line and name in problem.message
    if bad == "\x00":
        out = _cli_one_line(p)
        assert out.startswith(f"{p}:{line}: not a policy: control character U+0000 (NUL)")


def _big(tmp_path, kind: str, n: int, fmt: str) -> Path:
    text = DEMO.read_text()
    anchor = "          - kind: literal\n            case_sensitive: true\n            patterns: [BLUEHERON"
    pats = ",".join(fmt % i for i in range(n))
    p = tmp_path / f"{kind}-{n}.yaml"
    p.write_text(text.replace(anchor, f"          - kind: {kind}\n            patterns: [{pats}]\n" + anchor, 1))
    return p


@pytest.mark.timeout(60)
def test_a_policy_past_the_stated_limits_is_refused_fast(tmp_path):
    from components.policy.loader import MAX_NODES, MAX_POLICY_BYTES, MAX_REGEX_PATTERNS

    cases = [(_big(tmp_path, "literal", 10 ** 6, "LIT%07d"), f"over the {MAX_POLICY_BYTES:,}-byte limit"),
             (_big(tmp_path, "regex", 10 ** 5, "'k%d[a-z]+\\\\d{2,4}'"), f"more than {MAX_NODES:,} YAML values"),
             (_big(tmp_path, "regex", MAX_REGEX_PATTERNS + 1, "'k%d[a-z]+'"),
              f"more than {MAX_REGEX_PATTERNS:,} regex patterns")]
    for p, why in cases:
        t0 = time.process_time()   # CPU time: a loaded machine must not fail it
        problems = check_policy(p)
        assert time.process_time() - t0 < 3.0, p   # was > 120 s (issue 28)
        assert len(problems) == 1 and why in problems[0].message, problems
    assert cases[2][0].stat().st_size < MAX_POLICY_BYTES
    assert check_policy(cases[2][0])[0].field == "spec.secrets.classes[0].rules[0].patterns"
    res = CliRunner().invoke(app, ["policy", "check", str(cases[1][0])])   # (the real entry: the NUL test)
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert f"more than {MAX_NODES:,} YAML values" in res.output
