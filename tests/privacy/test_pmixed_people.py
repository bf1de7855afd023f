"""PMixED puts one person in one shard: the prediction policy's `people` section (aliases merged,
bots out) is applied before partitioning. Attack pinned: a person writing from two addresses landed
in two shards — two ensemble members trained on them, twice the influence the certificate's
replace-one-member bound assumes, and two ledger budgets."""
from __future__ import annotations

import json

import pytest

from catalog.ingest import ingest_source
from components.core.errors import VeilError

POLICY = """apiVersion: veil.dev/v1
kind: PredictionPolicy
metadata: {name: tiny-pmixed-people, owner: tests}
spec:
  target: {epsilon: 4.0, delta: 1.0e-5}
  shards: 16
  subsample_rate: 0.5
  token_budget: 6
  training: {epochs: 1, learning_rate: 1.0e-2, seq_len: 32, batch_size: 4, lora: {r: 2, alpha: 8.0}, seed: 0}
PEOPLE"""
PEOPLE = """  people:
    exclude: ['*[bot]@*']
    aliases: [[ann@corp.example, ann.lee@gmail.com, a.lee@old.example]]
"""


class _Seen(Exception):
    pass


def _shards(settings, tmp_path, monkeypatch, people: str):
    from flows import pmixed, stages

    src = tmp_path / "m.jsonl"
    rows = [("ann@corp.example", "ann at work"), ("ann.lee@gmail.com", "ann at home"),
            ("a.lee@old.example", "ann long ago"), ("bob@corp.example", "bob writes"),
            ("carol@corp.example", "carol writes"), ("1+dependabot[bot]@users.noreply.github.com", "bump deps")]
    src.write_text("".join(json.dumps({"user": u, "text": t}) + "\n" for u, t in rows))
    ingest_source(src, "jsonl", settings=settings)
    pol = tmp_path / "p.yaml"
    pol.write_text(POLICY.replace("PEOPLE", people))
    seen = {}

    def fake_train(base_dir, shard_texts, cfg, outs, **kw):
        seen["shards"] = shard_texts
        raise _Seen

    from components.prediction import partition as part

    real = part.partition

    def spy(key, people, n):
        seen["people"] = sorted(people)
        return real(key, people, n)

    monkeypatch.setattr(part, "partition", spy)
    monkeypatch.setattr(pmixed, "train_shards", fake_train)
    monkeypatch.setattr(stages, "base_model", lambda settings, **kw: tmp_path)
    monkeypatch.setattr(pmixed, "dir_sha256", lambda d: "0" * 64, raising=False)
    with pytest.raises(_Seen):
        pmixed.build(settings, pol, base_dir=tmp_path, use_prefect=False)
    return seen


def test_a_person_with_three_addresses_is_one_shard_and_bots_are_none(settings, tmp_path, monkeypatch):
    seen = _shards(settings, tmp_path, monkeypatch, PEOPLE)
    shards = seen["shards"]
    assert seen["people"] == ["ann@corp.example", "bob@corp.example", "carol@corp.example"]
    holding = [i for i, s in enumerate(shards) if any(t.startswith("ann") for t in s)]
    assert len(holding) == 1 and sorted(t for t in shards[holding[0]] if t.startswith("ann")) == \
        ["ann at home", "ann at work", "ann long ago"]
    assert not any("bump deps" in s for s in shards)


def test_without_aliases_each_address_is_partitioned_on_its_own(settings, tmp_path, monkeypatch):
    """The baseline the people section fixes: partitioned by account, Ann is three independent draws."""
    seen = _shards(settings, tmp_path, monkeypatch, "")
    assert {"ann@corp.example", "ann.lee@gmail.com", "a.lee@old.example"} <= set(seen["people"])


def test_prediction_policy_refuses_all_participants(tmp_path):
    from components.policy import load_prediction_policy

    p = tmp_path / "p.yaml"
    p.write_text(POLICY.replace("PEOPLE", "  people: {ownership: all-participants}\n"))
    with pytest.raises(VeilError, match="ownership"):
        load_prediction_policy(p)
