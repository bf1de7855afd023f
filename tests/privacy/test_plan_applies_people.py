"""The plan stage applies the policy's `people` section before any per-person decision: a person
listed with two addresses is one unit (else they would get twice the contribution bound), excluded
bots never reach planning (all-participants: tests/privacy/test_multi_owner_*.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.ingest import ingest_source
from flows import stages

DEMO = Path(__file__).resolve().parents[2] / "policies" / "demo.yaml"
PEOPLE = ("\n  people:\n    exclude: ['*[bot]@*']\n"
          "    aliases: [[ann@corp.example, ann.lee@gmail.com]]\n")


class _Seen(Exception):
    pass


def _policy(tmp_path, extra):
    p = tmp_path / "p.yaml"
    p.write_text(DEMO.read_text().replace("mechanism: uls", "mechanism: els").rstrip("\n") + extra)
    return p


def test_plan_sees_people_not_accounts(settings, tmp_path, monkeypatch):
    src = tmp_path / "m.jsonl"
    rows = [("ann@corp.example", "from work"), ("ann.lee@gmail.com", "from home"), ("bob@corp.example", "hi"),
            ("49699333+dependabot[bot]@users.noreply.github.com", "bump deps")]
    src.write_text("".join(json.dumps({"user": u, "text": t}) + "\n" for u, t in rows))
    ingest_source(src, "jsonl", settings=settings)
    seen = {}

    def fake_make_plan(policy, snapshot, **kw):
        seen["records"] = snapshot.records
        raise _Seen

    monkeypatch.setattr(stages, "make_plan", fake_make_plan)
    monkeypatch.setattr(stages, "planning_aids", lambda pol, base: (None, None))
    with pytest.raises(_Seen):
        stages.plan(settings, _policy(tmp_path, PEOPLE))
    got = sorted(zip(seen["records"].column("user_id").to_pylist(), seen["records"].column("text").to_pylist()))
    assert got == [("ann@corp.example", "from home"), ("ann@corp.example", "from work"), ("bob@corp.example", "hi")]
    assert "owners" not in seen["records"].column_names
