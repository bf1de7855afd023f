"""Reserve audit data before training: held-out users and attacker samples (seed 003 §8.1).

Every decision about one unit depends on that unit alone — the property the neighbour analysis
needs (docs/privacy/threat-model.md, "neighbour stability"):

* **user units** (uls, els, group; and secret units, see below): a user is *eligible* for the audit
  when they have at least m+1 distinct texts (their own data); an eligible user is held out when an
  independent keyed draw PRF(key, "holdout", seed, user) falls below the policy's probability p. Their
  m attacker samples are drawn from their own distinct texts by an RNG keyed on (key, seed, user).
  Adding or removing one user changes nobody else's fate. (The old rule held out round(p·n_eligible)
  users in a keyed order, so one more user could push another in or out: two people differed.)
  A count of users cannot be turned into a probability without N, which is private: the policy
  refuses counts.
* **record units**: a user's holdout draw depends on the user id only (not on how many records they
  have), and each distinct text is reserved for the attacker by its own keyed draw at the public rate
  `attacker_record_rate`. Adding or removing one record therefore adds or removes that record alone
  (an m-per-user choice, or an m+1 eligibility threshold, would move other records of the same user).
* **secret units** (secret-substitution neighbours): the user rules, with every text's tagged secret
  spans masked before it is compared, sorted or hashed, so substituting a secret's value changes no
  decision.

Evaluation people (components.draws.eval_split) are drawn first, by their own keyed draw, and
removed before any of the above: never trained on, never held out, never sampled for the attacker.

Attacker samples are deduplicated by text within each user: a training record identical to an
attacker sample would turn user inference into plain membership inference. Draws are keyed with the
planner's secret key (components.draws.annex): with a public seed anyone holding the roster could
recompute who was held out.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.core.errors import VeilError
from components.draws.columns import as_array, codes, sorted_strings, take, take_rows, texts
from components.draws.eval_split import (EvalReservation, check_fraction, empty_reservation, evaluation_draws,
                                         reservation_of)
from components.draws.streams import floyd_choice
from components.bounding.owners import owner_set
from components.draws.annex import prf, prf_seed, prf_seed_column, prf_uniform, prf_uniform_column


@dataclass(frozen=True)
class AuditSplit:
    held_out_users: list[str]           # never trained on
    attacker: pa.Table                  # record_id, user_id, member (bool)
    train: pa.Table                     # the input rows training may use (attacker texts removed)
    n_eligible: int
    # evaluation people (components.draws.eval_split): drawn first, never trained on nor audited
    evaluation: EvalReservation = field(default_factory=empty_reservation)
    # True when every "member" attacker row's person has a row in `train` (checked, not assumed): then a
    # bound that keeps `train` whole leaves keep_trained_members nothing to drop (make_plan skips it)
    members_trained: bool = False

    @cached_property
    def trained_users(self) -> list[str]:
        """The people with a training row, sorted. Computed on demand: planning never reads it, and at
        10⁷ people the sorted list is ≈ 15 CPU s and half a gigabyte of Python strings (issue 27)."""
        return sorted_strings(pc.unique(self.train.column("user_id")))


ATTACKER_SCHEMA = pa.schema([("record_id", pa.string()), ("user_id", pa.string()), ("member", pa.bool_())])
UNITS = ("user", "record", "secret")

# Stands in for the planner's secret key when a caller (a unit test, a bench) gives none. Planning
# always passes the real key: with this one the draws are public.
PUBLIC_TEST_KEY = b"veil-public-test-key-not-secret!"


def _key(key: bytes | None) -> bytes:
    return PUBLIC_TEST_KEY if key is None else key


def held_out(key: bytes | None, seed: int, user: str, p: float) -> bool:
    """The user's own holdout draw: independent of every other user."""

    return p > 0 and prf_uniform(_key(key), "holdout", int(seed), user) < p


def masked_texts(records: pa.Table, secret_spans: pa.Table | None) -> list[str]:
    """Each record's text with its tagged secret spans replaced by the class name (secret units)."""
    texts = records.column("text").to_pylist()
    if secret_spans is None or secret_spans.num_rows == 0:
        return texts
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for r, s, e, c in zip(secret_spans["record_id"].to_pylist(), secret_spans["start"].to_pylist(),
                          secret_spans["end"].to_pylist(), secret_spans["secret_class"].to_pylist()):
        spans.setdefault(r, []).append((int(s), int(e), str(c)))
    out = []
    for rid, t in zip(records.column("record_id").to_pylist(), texts):
        sp = sorted(spans.get(rid, ()), reverse=True)
        for s, e, c in sp:             # right to left: earlier offsets stay valid
            t = t[:s] + f"\x00{c}\x00" + t[e:]
        out.append(t)
    return out


def _attacker_table(rid, user, member) -> pa.Table:
    return pa.table([pa.array(rid, pa.string()), pa.array(user, pa.string()), pa.array(member, pa.bool_())],
                    schema=ATTACKER_SCHEMA)


def split_for_audit(records: pa.Table, *, holdout: float, m: int, seed: int, key: bytes | None = None,
                    unit: str = "user", attacker_record_rate: float = 0.0,
                    content: Sequence[str] | None = None, evaluation: float = 0.0,
                    owners: Sequence[Sequence[str] | None] | None = None) -> AuditSplit:
    """Split `records` (record_id, user_id, text) into training rows and audit reservations.

    `holdout` is a probability in [0, 1); `content` (one string per row, default the text) is what
    decisions key on and deduplicate by — pass `masked_texts(...)` for secret units. `evaluation`:
    the probability that a person is reserved for evaluation (eval_split), drawn before anything else.
    `owners` (record units only; one owner list per row): records with several owners — the attacker's
    records are drawn per slot of the attribution graph, never per text (`_owner_slots`).
    """

    if unit not in UNITS:
        raise VeilError(f"audit split: unknown unit {unit!r}")
    if not 0 <= holdout < 1:
        raise VeilError(f"audit.holdout_users: {holdout:g} is not a probability below 1 (each person is held out by "
                        "an independent draw; a count would need the private number of users)")
    k = _key(key)
    n = records.num_rows
    cont = as_array(content) if content is not None else records.column("text")
    if len(cont) != n:
        raise VeilError("audit split: content must have one entry per record")
    own = None
    if owners is not None:
        if unit != "record":
            raise VeilError("audit split: owner lists are for per-record draws (multi-owner records) only")
        own = list(owners)
        if len(own) != n:
            raise VeilError("audit split: owners must have one entry per record")
    # Columns, not per-record objects: who each row belongs to and which of that person's distinct
    # texts it holds, as integer codes; every draw below is still one keyed draw per person (or per
    # person's text), vectorised over people (annex.prf_*_column, streams.floyd_choice).
    person, people = codes(records.column("user_id"))
    pairs = texts(person, cont, records.column("record_id"))
    live = np.ones(len(people), bool)              # people left after the evaluation draw
    reservation = empty_reservation()
    if evaluation > 0:
        drawn = evaluation_draws(k, seed, people, check_fraction(evaluation))
        reservation = reservation_of(drawn, people, pairs, records.column("record_id"))
        live = ~drawn
        if not live.any():
            raise VeilError(f"evaluation.fraction: every one of the {len(reservation.users)} users was drawn into "
                            "evaluation, leaving none to train on; lower the fraction")
    if own is not None:
        rest = np.flatnonzero(live[person])
        sub = take_rows(records, rest) if evaluation > 0 else records
        cont_rest = take(cont, rest).to_pylist()
        return _owner_slots(sub, sub.column("user_id").to_pylist(), sub.column("record_id").to_pylist(), cont_rest,
                            [own[i] for i in rest], holdout=holdout, seed=seed, key=k,
                            rate=attacker_record_rate, reservation=reservation)

    live_codes = np.flatnonzero(live)
    live_pair = live[pairs.person]
    chosen = np.zeros(len(pairs.person), bool)     # per (person, text): reserved for the attacker
    held = np.zeros(len(people), bool)
    if unit == "record":
        # every decision keyed on the user id or on one text alone
        if holdout > 0:
            held[live_codes] = prf_uniform_column(k, "holdout", int(seed), take(people, live_codes)) < holdout
        if attacker_record_rate > 0:
            g = np.flatnonzero(live_pair)
            for a in range(0, len(g), _CHUNK):
                gg = g[a:a + _CHUNK]
                chosen[gg] = prf_uniform_column(k, "attacker-record", int(seed), take(people, pairs.person[gg]),
                                                take(cont, pairs.rep_row[gg])) < attacker_record_rate
        eligible = len(np.unique(pairs.person[chosen]))
    else:
        distinct = np.bincount(pairs.person, minlength=len(people))
        elig = live & (distinct >= m + 1)          # too few texts: always trained, never audited
        elig_codes = np.flatnonzero(elig)
        eligible = len(elig_codes)
        if holdout > 0 and eligible:
            held[elig_codes] = prf_uniform_column(k, "holdout", int(seed), take(people, elig_codes)) < holdout
        if eligible:
            # each eligible person's texts sorted (a stable draw): `pairs` are numbered so already, a
            # person's pairs consecutive; then m of them by the person's own Generator seeded from
            # PRF(key, "attacker", user), which streams replays
            starts = np.concatenate(([0], np.cumsum(distinct)[:-1]))[elig_codes]
            words = prf_seed_column(k, "attacker", take(people, elig_codes))
            picks = floyd_choice(int(seed), words, distinct[elig_codes], int(m))
            chosen[(starts[:, None] + picks).ravel()] = True
    if held.any() and held.sum() == len(live_codes):
        raise VeilError(f"audit.holdout_users: every one of the {len(live_codes)} users was drawn into the held-out "
                        "group, leaving none to train on; lower the probability")

    att = np.flatnonzero(chosen)
    attacker = pa.table([pairs.rep(records.column("record_id"), att), take(people, pairs.person[att]),
                         pa.array(~held[pairs.person[att]], pa.bool_())], schema=ATTACKER_SCHEMA)
    attacker = attacker.sort_by([("user_id", "ascending"), ("record_id", "ascending")])
    keep = np.flatnonzero(live[person] & ~held[person] & ~chosen[pairs.group])
    train = take_rows(records, keep)
    has_train = np.zeros(len(people), bool)
    has_train[person[keep]] = True
    att_person = pairs.person[att]
    return AuditSplit(held_out_users=sorted_strings(take(people, np.flatnonzero(held))),
                      attacker=attacker, train=train, n_eligible=int(eligible), evaluation=reservation,
                      members_trained=bool(has_train[att_person[~held[att_person]]].all()))


_CHUNK = 1 << 20       # (person, text) pairs drawn per batch for record units (bounds the message copies)


def _owner_slots(records: pa.Table, users: list, rids: list, cont: list, owners: list, *, holdout: float,
                 seed: int, key: bytes, rate: float, reservation) -> AuditSplit:
    """The per-record split for records with several owners, made a function of the attribution graph.

    Under the fixed-graph relation (docs/privacy/multi-owner.md §2) u's content may change, not the graph:
    every record keeps its writer and owner set. A draw keyed on a record's text (or id) would let u's
    content decide whether a record u is on trains, hence the owner-set counts the greedy bound sees,
    hence — along a chain — records u is not on. So, as the bound does with its slots:

    1. group the records by (writer, owner set) G; a group of c records has slots 0..c−1;
    2. slot j of G is reserved for the attacker when PRF(key, "attacker-slot", seed, writer, owners, j) <
       rate — a function of the graph and the key alone, so how many of G's records are reserved is too;
    3. the reserved slots take G's records in a keyed order of their ids. Content decides only which of
       G's records fill them, and every record of G is owned by every member of G's owner set: when u's
       content changes, only groups u is in can change, and only among u's records.

    Held-out writers (their own keyed draw, as every unit's) train nothing. An attacker record whose text
    is also trained for its writer (possible only with --keep-duplicates) is left out of the attacker's
    table — never out of training, which would make training depend on content again."""
    import hashlib
    import hmac


    out_set = {u for u in set(users) if held_out(key, seed, u, holdout)}
    if out_set and len(out_set) == len(set(users)):
        raise VeilError(f"audit.holdout_users: every one of the {len(out_set)} users was drawn into the held-out "
                        "group, leaving none to train on; lower the probability")
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, (u, o) in enumerate(zip(users, owners)):
        groups.setdefault((u, owner_set([u, *(o or ())])), []).append(i)
    reserved: set[int] = set()
    for (u, t), idx in groups.items():
        tag = "\x1e".join(t)
        n = sum(1 for j in range(len(idx)) if rate > 0 and prf_uniform(key, "attacker-slot", int(seed), u, tag, j) < rate)
        if n:
            fill = sorted(idx, key=lambda i: (hmac.new(key, f"attacker-fill\x1f{u}\x1f{tag}\x1f{rids[i]}".encode(
                "utf-8", "surrogatepass"), hashlib.sha256).digest(), i))
            reserved.update(fill[:n])
    keep = [i for i, u in enumerate(users) if u not in out_set and i not in reserved]
    trained_texts: dict[str, set[str]] = {}
    for i in keep:
        trained_texts.setdefault(users[i], set()).add(cont[i])
    att_rid, att_user, att_member, seen = [], [], [], set()
    for i in sorted(reserved, key=lambda i: (users[i], rids[i])):
        u = users[i]
        if cont[i] in trained_texts.get(u, ()) or (u, cont[i]) in seen:
            continue
        seen.add((u, cont[i]))
        att_rid.append(rids[i])
        att_user.append(u)
        att_member.append(u not in out_set)
    train = records.take(pa.array(keep, type=pa.int64()))
    return AuditSplit(held_out_users=sorted(out_set),
                      attacker=_attacker_table(att_rid, att_user, att_member), train=train,
                      n_eligible=len(set(att_user)), evaluation=reservation)

def keep_trained_members(attacker: pa.Table, trained_people) -> pa.Table:
    """The attacker table without the "member" rows of people who own no trained record.

    The split labels a person a member when they were not held out, but the mechanism's bound runs
    after it: multi-owner records (els-owners) drop a mail when any co-owner is reserved and keep at
    most k records per owner, so a writer who was not held out can end with nothing trained (1 of 38
    "members" in issue 22, case 7). A member is a person at least one record they own was trained on;
    a person neither trained nor held out is neither member nor (randomly drawn) non-member, so their
    samples leave the audit. `trained_people`: every owner of a trained record (writers included), as
    a collection of ids or an Arrow string column (repeats allowed)."""
    if attacker.num_rows == 0:
        return attacker
    if isinstance(trained_people, (pa.Array, pa.ChunkedArray)):
        people = pc.unique(trained_people)
    else:
        people = pa.array(sorted({str(p) for p in trained_people}), pa.string())
    if isinstance(people, pa.ChunkedArray):
        people = people.combine_chunks()
    users = attacker.column("user_id")
    keep = pc.or_(pc.invert(attacker.column("member")), pc.is_in(users, value_set=people.cast(users.type)))
    if pc.all(keep).as_py():
        return attacker
    return attacker.filter(keep)


def split_canaries(records: pa.Table, *, m: int, seed: int, key: bytes | None = None) -> AuditSplit:
    """Synthetic canary users: exactly half held out (keyed order over canary ids only, so it depends
    on no real person), m attacker samples each. (A fixed-size split is not the independent draws the
    one-run ε bound needs: `audit.run._one_run` leaves canaries out of it.)"""

    k = _key(key)
    ids = sorted(set(records.column("user_id").to_pylist()))
    order = sorted(ids, key=lambda u: prf(k, "canary-holdout", int(seed), u))
    out = set(order[:len(ids) // 2])
    users, rids, texts = (records.column(c).to_pylist() for c in ("user_id", "record_id", "text"))
    by_user: dict[str, dict[str, str]] = {}
    for u, r, t in zip(users, rids, texts):
        d = by_user.setdefault(u, {})
        if t not in d or r < d[t]:
            d[t] = r
    att_rid, att_user, att_member, excluded = [], [], [], {}

    for u in ids:
        d = by_user[u]
        if len(d) < m + 1:
            raise VeilError(f"audit.canaries.records_per_user: a canary needs at least {m + 1} distinct records "
                            f"(m = {m} for the attacker and one to train on)")
        distinct = sorted(d)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), *prf_seed(k, "canary-attacker", u)]))
        chosen = sorted((distinct[i] for i in rng.choice(len(distinct), size=m, replace=False)), key=lambda t: d[t])
        excluded[u] = set(chosen)
        for t in chosen:
            att_rid.append(d[t])
            att_user.append(u)
            att_member.append(u not in out)
    keep = [i for i, (u, t) in enumerate(zip(users, texts)) if u not in out and t not in excluded[u]]
    train = records.take(pa.array(keep, type=pa.int64()))
    return AuditSplit(held_out_users=sorted(out),
                      attacker=_attacker_table(att_rid, att_user, att_member), train=train, n_eligible=len(ids))
