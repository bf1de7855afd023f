"""Behaviour pinned across the mechanisms refactor (issue 12): for fixed inputs, every mechanism's plan
and certificate are byte-for-byte what the code before the refactor produced (golden.json).

Regenerate only when a change of output is intended and reviewed:
    VEIL_WRITE_GOLDEN=1 pytest tests/mechanisms/test_golden.py
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from components.accounting.secrets import secret_targets
from components.certificate import build_certificate
from components.planning import make_plan
from components.draws.annex import load_annex
from components.draws.data import train_rows
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden.json")
POLICIES = Path("/tmp/veil-golden-policies")
WHEN = "2026-01-01T00:00:00+00:00"
sys.path.insert(0, str(ROOT / "tests" / "planning"))
from _planning_fixtures import make_snapshot  # noqa: E402

_spec = importlib.util.spec_from_file_location("bound_run", ROOT / "tests" / "bound_run.py")
bound_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bound_run)

DEMO = (ROOT / "policies" / "demo.yaml").read_text()
STEPS = re.search(r"    steps: \d+", DEMO).group(0).strip()
BATCH = re.search(r"expected_batch_size: \d+", DEMO).group(0)


def _variant(mech: str) -> str:
    text = DEMO.replace(STEPS, "steps: 20")
    if mech in ("els", "group"):
        return text.replace("mechanism: uls", f"mechanism: {mech}").replace(BATCH, "expected_batch_size: 16")
    if mech == "record":
        return text.replace("privacy_unit: user", "privacy_unit: record").replace("mechanism: uls", "mechanism: record")
    if mech == "auto":
        return text.replace("mechanism: uls", "mechanism: auto").replace(BATCH, "expected_batch_size: 16")
    if mech == "secret":
        return re.sub(r"expected_batch_size: \d+", "expected_batch_size: 16",
                      re.sub(r"    steps: \d+", "    steps: 20", (ROOT / "policies" / "code-team-secrets.yaml").read_text()))
    if mech == "uls-filtered":
        return (ROOT / "policies" / "filtered-research.yaml").read_text()
    return text


CASES = ("uls", "els", "group", "record", "auto", "secret", "uls-filtered")


def _outputs(tmp: Path) -> dict:
    snap = make_snapshot(60, seed=1, secrets_per_record=2)
    crowd = make_snapshot(1150, seed=2)                   # filtered ULS needs hundreds of users
    out = {}
    for mech in CASES:
        # a fixed path: the plan records the policy's path, and its sha256 covers it
        POLICIES.mkdir(parents=True, exist_ok=True)
        p = POLICIES / f"{mech}.yaml"
        p.write_text(_variant(mech))
        policy = load_policy(p)
        private = tmp / mech
        plan = make_plan(policy, crowd if mech == "uls-filtered" else snap, private_dir=private, created_at=WHEN).to_dict()
        result = {"steps_run": plan["steps"], "steps_attempted": plan["steps"], "mechanism": plan["mechanism"],
                  "noise_multiplier": plan["noise_multiplier"], "sampling_rate": plan["sampling_rate"],
                  "clip_norm": plan["clip_norm"], "private_seed_source": "os_entropy",
                  **bound_run.binding(plan, weights_dir=tmp / f"w-{mech}")}
        if plan["mechanism"] == "uls-filtered":
            result["extra"]["filter"] = dict(plan["filter"])
        kw = {}
        if plan["mechanism"] == "secret":
            rows = train_rows(load_annex(private, plan))
            kw["secret_targets"] = secret_targets(rows, snap.secret_spans, plan["target"]["secrets"])
            kw["untagged_rate"] = 0.01
        cert = build_certificate(plan, result, created_at=WHEN, version="veil golden", **kw).to_dict()
        cert["run"]["weights"]["files"] = {}
        out[mech] = {"plan": plan, "certificate": {k: v for k, v in cert.items() if k not in ("sha256",)}}
    return json.loads(json.dumps(out))


def test_every_mechanism_plans_and_certifies_as_before(tmp_path):
    got = _outputs(tmp_path)
    if os.environ.get("VEIL_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        pytest.skip("golden outputs written")
    want = json.loads(GOLDEN.read_text())
    for mech in CASES:
        for part in ("plan", "certificate"):
            assert got[mech][part] == want[mech][part], f"{mech} {part} changed"
