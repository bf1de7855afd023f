"""The demo's worst neighbour pair, re-derived with the planner (issue 11).

Old code: holding out round(0.25 · n_eligible) users in a keyed order meant that removing one person
could move another in or out of training — a pair of neighbouring snapshots whose training sets
differ in two people, for which ε ≈ 11.3 while the certificate said 8.0. Here, on the demo
organisation from catalog/demo.py under policies/demo.yaml, a sample of single-person removals and
additions must change the training set by that person alone, so the certificate's ε (for one unit)
covers every pair the planner can produce.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from components.core.hashing import sha256_bytes
from components.planning.make import bound_contributions, reserve_audit
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
KEY = b"\x07" * 32


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from catalog.demo import write_demo_org

    org = write_demo_org(tmp_path_factory.mktemp("demo"), seed=0)
    rows, seen = [], set()
    for line in org.messages_path.read_text().splitlines():
        m = json.loads(line)
        rid = sha256_bytes(f"{m['user']}\x1f{m['text']}".encode())      # the catalog's content hash
        if rid not in seen:
            seen.add(rid)
            rows.append({"record_id": rid, "user_id": m["user"], "text": m["text"]})
    return load_policy(ROOT / "policies" / "demo.yaml"), pa.Table.from_pylist(rows)


def _train(policy, records) -> Counter:
    spec = policy.spec
    split, _ = reserve_audit(policy, records, key=KEY)
    chosen = bound_contributions(split.train, spec.mechanism, k=spec.contribution.max_records_per_user,
                                 selection=spec.contribution.selection, seed=spec.training.seed, key=KEY)
    return Counter(zip(chosen["user_id"].to_pylist(), chosen["record_id"].to_pylist()))


def test_single_person_removals_and_additions_move_nobody_else(demo):
    policy, records = demo
    assert policy.spec.mechanism == "uls" and policy.spec.audit.holdout_users == 0.25
    users = sorted(set(records["user_id"].to_pylist()))
    full = _train(policy, records)
    worst = 0
    for u in users[::12]:                                              # 20 removals
        without = _train(policy, records.filter(pc.not_equal(records["user_id"], u)))
        changed = (full - without) + (without - full)
        others = {x for x, _ in changed} - {u}
        worst = max(worst, len({x for x, _ in changed}))
        assert not others, f"removing {u} moved {sorted(others)}"
    # additions: a new person (a copy of someone's texts under a new id), and people of every size
    for i, u in enumerate(users[5::40]):
        mine = records.filter(pc.equal(records["user_id"], u))
        new = f"newcomer{i}@acme-corp.example"
        added = pa.table({"record_id": [sha256_bytes(f"{new}\x1f{t}".encode()) for t in mine["text"].to_pylist()],
                          "user_id": [new] * mine.num_rows, "text": mine["text"]})
        grown = _train(policy, pa.concat_tables([records, added]))
        changed = (grown - full) + (full - grown)
        assert {x for x, _ in changed} <= {new}
        worst = max(worst, len({x for x, _ in changed}))
    assert worst <= 1                                                  # the certificate's unit


def test_the_certificate_covers_the_pair(demo):
    """One unit apart, so the plan's (ε_N + ε_DP-SGD) at its q, σ, T is the pair's ε; the old two-person
    pair at the same parameters would need group privacy and is far above the target."""
    from components.accounting import epsilon as account

    policy, _ = demo
    tr, t = policy.spec.training, policy.spec.target
    eps_n = policy.spec.population.epsilon_fraction * t.epsilon
    # demo-scale parameters from the issue (q = 0.0816, T = 120) at the σ the plan calibrates for ε - ε_N
    from components.accounting import calibrate

    q = 0.0816
    sigma = calibrate("uls", epsilon=t.epsilon - eps_n, delta=t.delta, sampling_rate=q, steps=tr.steps,
                      k=1).noise_multiplier
    one = eps_n + account("uls", sampling_rate=q, noise_multiplier=sigma, steps=tr.steps, delta=t.delta).epsilon
    assert one <= t.epsilon + 1e-9
    # two people apart (each Poisson-sampled on their own: the Binomial(2, q) mixture) is far above
    two = eps_n + account("group-tight", sampling_rate=q, noise_multiplier=sigma, steps=tr.steps, delta=t.delta,
                          k=2).epsilon
    assert two > 1.5 * t.epsilon
