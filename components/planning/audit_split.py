"""Reserve audit data before training: held-out users and per-user attacker samples (seed 003 §8.1).

Users are assigned in/out by a seeded keyed-hash order, independent of what they wrote; the only
data-dependent rule is eligibility (a user needs m+1 distinct texts so that m can go to the attacker
and at least one to training), applied identically to both groups so the in/out comparison stays fair.
Attacker samples are deduplicated by text within each user: a training record identical to an
attacker sample would turn user inference into plain membership inference.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from components.core.errors import VeilError
from components.planning.selection import keyed_order, user_rng


@dataclass(frozen=True)
class AuditSplit:
    held_out_users: list[str]           # never trained on
    trained_users: list[str]
    attacker: pa.Table                  # record_id, user_id, member (bool)
    train: pa.Table                     # the input rows training may use (attacker texts removed)
    n_eligible: int


ATTACKER_SCHEMA = pa.schema([("record_id", pa.string()), ("user_id", pa.string()), ("member", pa.bool_())])


def holdout_count(holdout: float, n_eligible: int) -> int:
    if holdout <= 0 or n_eligible == 0:
        return 0
    n = round(holdout * n_eligible) if holdout < 1 else int(holdout)
    return min(n, n_eligible)


def split_for_audit(records: pa.Table, *, holdout: float, m: int, seed: int) -> AuditSplit:
    """Split `records` (record_id, user_id, text) into training rows and audit reservations."""
    users = records.column("user_id").to_pylist()
    rids = records.column("record_id").to_pylist()
    texts = records.column("text").to_pylist()

    # user -> text -> smallest record_id holding it (deterministic representative)
    by_user: dict[str, dict[str, str]] = {}
    for u, r, t in zip(users, rids, texts):
        d = by_user.setdefault(u, {})
        if t not in d or r < d[t]:
            d[t] = r
    eligible = sorted(u for u, d in by_user.items() if len(d) >= m + 1)
    n_out = holdout_count(holdout, len(eligible))
    if n_out and n_out >= len(by_user):
        raise VeilError(f"audit.holdout_users: holding out {n_out} users leaves none to train on "
                        f"({len(by_user)} users in the snapshot)")
    if holdout >= 1 and int(holdout) >= len(eligible) > 0:
        raise VeilError(f"audit.holdout_users: {int(holdout)} held-out users would be every one of the "
                        f"{len(eligible)} users with at least {m + 1} distinct records, leaving no trained user "
                        "to audit; hold out fewer (or a fraction)")
    held_out = sorted(keyed_order(seed, "holdout", eligible)[:n_out])
    out_set = set(held_out)

    att_rid, att_user, att_member = [], [], []
    excluded_texts: dict[str, set[str]] = {}
    for u in eligible:
        d = by_user[u]
        distinct = sorted(d)                           # texts, sorted for a stable draw
        pick = user_rng(seed, "attacker", u).choice(len(distinct), size=m, replace=False)
        chosen = sorted((distinct[i] for i in pick), key=lambda t: d[t])
        excluded_texts[u] = set(chosen)
        for t in chosen:
            att_rid.append(d[t])
            att_user.append(u)
            att_member.append(u not in out_set)
    attacker = pa.table([pa.array(att_rid, pa.string()), pa.array(att_user, pa.string()),
                         pa.array(att_member, pa.bool_())], schema=ATTACKER_SCHEMA)

    keep = [i for i, (u, t) in enumerate(zip(users, texts))
            if u not in out_set and t not in excluded_texts.get(u, ())]
    train = records.take(pa.array(keep, type=pa.int64()))
    trained = sorted(set(train.column("user_id").to_pylist()))
    return AuditSplit(held_out_users=held_out, trained_users=trained, attacker=attacker, train=train,
                      n_eligible=len(eligible))
