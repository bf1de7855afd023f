"""Multi-owner records: for ONE fixed key, changing the content of one owner's records moves only that
owner's trained records (issue 22, case 6).

The attack this file pins: the audit's per-record attacker draw was keyed on the record's text, so
rewriting the mails u is on changed which of them were reserved for the attacker, hence the owner-set
counts the greedy bound sees, hence — along a chain — records u is not on (the certificate's lemma
held only "on average over the key"); and the bound joined each row to its owners by record id, so a
rewrite of u's mail into a copy of a mail u is not on (same writer, same text, same id) gave that
other mail u's owners. Here every person of a 200-edge chain, with several rewrites each (the last a
copy), is a neighbour pair under one fixed key; the trained records that differ must all be owned by
the person whose content changed, at most k on each side, and the number trained (N, published) must
not move. The planner's real code runs: `reserve_audit` (evaluation, holdout, attacker reservation)
then the `els-owners` bound.
"""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from components.core.hashing import sha256_bytes
from components.mechanisms import get
from components.mechanisms.base import PlanContext
from components.planning.make import reserve_audit
from components.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
DEMO = (ROOT / "policies" / "demo.yaml").read_text()
EDGES = 200
KEY = bytes(range(32))            # one fixed planner key for every pair
SCHEMA = pa.schema([("record_id", pa.string()), ("user_id", pa.string()), ("text", pa.string()),
                    ("owners", pa.list_(pa.string()))])


def _policy(tmp_path: Path, k: int):
    text = DEMO.replace(re.search(r"max_records_per_user: \d+", DEMO).group(0), f"max_records_per_user: {k}")
    text = text.replace("mechanism: uls", "mechanism: els").rstrip("\n")
    text += "\n  people:\n    ownership: all-participants\n  evaluation:\n    fraction: 0.1\n"
    p = tmp_path / f"owners-k{k}.yaml"
    p.write_text(text)
    return load_policy(p)


def _person(i: int) -> str:
    return f"p{i:03d}@corp.example"


def _chain(change: str | None = None, variant: int = 0) -> tuple[pa.Table, list[int]]:
    """Mails along a chain p000 → p001 → … → p200: three per edge, every fourth edge's third mail Cc'ing
    the next person too. `change`: rewrite the text of every mail that person is on (sender or
    recipient), in one of several ways — the graph (who wrote to whom, how often) is unchanged.
    Returns the table and each row's position (the record's identity across the pair)."""
    rows, pos = [], []
    for i in range(EDGES):
        for j in range(3):
            w = _person(i)
            to = [_person(i + 1)] + ([_person(i + 2)] if j == 2 and i % 4 == 0 and i + 2 <= EDGES else [])
            text = f"mail {i}.{j} from {w}: the {['budget', 'launch', 'review'][j]} notes"
            if change is not None and change in (w, *to):
                if variant == 3 and change not in (w, _person(i + 1)):
                    # u is only Cc'd here: u's mail becomes a copy of the writer's mail i.0, which u is not
                    # on — same writer, same text, so the same record id (the graph still differs)
                    text = f"mail {i}.0 from {w}: the budget notes"
                else:
                    text = f"rewritten ({variant}) " + text[::-1] + " " + "x" * variant
            rows.append({"record_id": sha256_bytes(f"{w}\x1f{text}".encode()), "user_id": w, "text": text,
                         "owners": [w, *to]})
            pos.append(len(pos))
    return pa.Table.from_pylist(rows, schema=SCHEMA), pos


def _trained(pol, records: pa.Table) -> set:
    """The records the plan trains on (the planner's own audit split and owner bound), each named by its
    position — found by its id and owner set, which name one row even when two rows share an id (a
    copy). A trained row whose owners are not its own row's is named ('misattributed', id)."""
    split, _ = reserve_audit(pol, records, key=KEY, per_record=True)
    ctx = PlanContext(policy=pol, snapshot=None, key=KEY, steps=0, batch=0,
                      k=int(pol.spec.contribution.max_records_per_user), selection="random",
                      seed=int(pol.spec.training.seed), owners=records.select(["record_id", "owners"]))
    b = get("els-owners").bound(ctx, split.train)
    where: dict[tuple, list[int]] = {}
    for i, (r, o) in enumerate(zip(records.column("record_id").to_pylist(), records.column("owners").to_pylist())):
        where.setdefault((r, frozenset(o)), []).append(i)
    out: set = set()
    for r, o in zip(b.chosen.column("record_id").to_pylist(), b.owners.to_pylist()):
        rows = [i for i in where.get((r, frozenset(o)), ()) if i not in out]
        out.add(rows[0] if rows else ("misattributed", r))
    return out


@pytest.mark.parametrize("k,variants", [(1, (0, 1, 2, 3)), (2, (0, 3))])
def test_for_a_fixed_key_one_owners_content_moves_only_their_records(tmp_path, k, variants):
    pol = _policy(tmp_path, k)
    base, _ = _chain()
    owners = [set(o) for o in base.column("owners").to_pylist()]
    s0 = _trained(pol, base)
    assert s0, "the fixture trains on something"
    bad, pairs = [], 0
    for i in range(EDGES + 1):
        u = _person(i)
        for variant in variants:
            s1 = _trained(pol, _chain(u, variant)[0])
            pairs += 1
            moved = s0 ^ s1
            outside = sorted(str(p) for p in moved if not isinstance(p, int) or u not in owners[p])
            if outside or len(s0 - s1) > k or len(s1 - s0) > k or len(s0) != len(s1):
                bad.append((u, variant, outside, len(s0), len(s1)))
    assert pairs == len(variants) * (EDGES + 1)
    assert not bad, (f"{len(bad)} of {pairs} neighbour pairs (one fixed key) move records the changed person is "
                     f"not on, or N; first: {bad[:3]}")
