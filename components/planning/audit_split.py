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

import numpy as np
import pyarrow as pa

from components.core.errors import VeilError
from components.draws.eval_split import EvalReservation, empty_reservation, reserve_evaluation


@dataclass(frozen=True)
class AuditSplit:
    held_out_users: list[str]           # never trained on
    trained_users: list[str]
    attacker: pa.Table                  # record_id, user_id, member (bool)
    train: pa.Table                     # the input rows training may use (attacker texts removed)
    n_eligible: int
    # evaluation people (components.draws.eval_split): drawn first, never trained on nor audited
    evaluation: EvalReservation = field(default_factory=empty_reservation)


ATTACKER_SCHEMA = pa.schema([("record_id", pa.string()), ("user_id", pa.string()), ("member", pa.bool_())])
UNITS = ("user", "record", "secret")

# Stands in for the planner's secret key when a caller (a unit test, a bench) gives none. Planning
# always passes the real key: with this one the draws are public.
PUBLIC_TEST_KEY = b"veil-public-test-key-not-secret!"


def _key(key: bytes | None) -> bytes:
    return PUBLIC_TEST_KEY if key is None else key


def held_out(key: bytes | None, seed: int, user: str, p: float) -> bool:
    """The user's own holdout draw: independent of every other user."""
    from components.draws.annex import prf_uniform

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
    from components.draws.annex import prf_seed, prf_uniform

    if unit not in UNITS:
        raise VeilError(f"audit split: unknown unit {unit!r}")
    if not 0 <= holdout < 1:
        raise VeilError(f"audit.holdout_users: {holdout:g} is not a probability below 1 (each person is held out by "
                        "an independent draw; a count would need the private number of users)")
    k = _key(key)
    users = records.column("user_id").to_pylist()
    rids = records.column("record_id").to_pylist()
    cont = list(content) if content is not None else records.column("text").to_pylist()
    if len(cont) != len(rids):
        raise VeilError("audit split: content must have one entry per record")
    own = None
    if owners is not None:
        if unit != "record":
            raise VeilError("audit split: owner lists are for per-record draws (multi-owner records) only")
        own = list(owners)
        if len(own) != len(rids):
            raise VeilError("audit split: owners must have one entry per record")
    reservation = empty_reservation()
    if evaluation > 0:
        reservation, rest = reserve_evaluation(records, fraction=evaluation, seed=seed, key=k, content=cont)
        records = records.take(pa.array(rest, type=pa.int64()))
        users, rids, cont = [users[i] for i in rest], [rids[i] for i in rest], [cont[i] for i in rest]
        own = None if own is None else [own[i] for i in rest]
        if not users:
            raise VeilError(f"evaluation.fraction: every one of the {len(reservation.users)} users was drawn into "
                            "evaluation, leaving none to train on; lower the fraction")
    if own is not None:
        return _owner_slots(records, users, rids, cont, own, holdout=holdout, seed=seed, key=k,
                            rate=attacker_record_rate, reservation=reservation)

    # user -> content -> smallest record_id holding it (deterministic representative)
    by_user: dict[str, dict[str, str]] = {}
    for u, r, t in zip(users, rids, cont):
        d = by_user.setdefault(u, {})
        if t not in d or r < d[t]:
            d[t] = r

    att_rid, att_user, att_member = [], [], []
    excluded: dict[str, set[str]] = {}
    out_set: set[str] = set()
    eligible = 0
    for u in sorted(by_user):
        d = by_user[u]
        if unit == "record":
            # every decision keyed on the user id or on one text alone
            if held_out(k, seed, u, holdout):
                out_set.add(u)
            chosen = sorted((t for t in d if attacker_record_rate > 0 and
                             prf_uniform(k, "attacker-record", int(seed), u, t) < attacker_record_rate),
                            key=lambda t: d[t])
            if chosen:
                eligible += 1
        else:
            if len(d) < m + 1:
                continue                               # too few texts: always trained, never audited
            eligible += 1
            if held_out(k, seed, u, holdout):
                out_set.add(u)
            distinct = sorted(d)                       # this user's texts, sorted for a stable draw
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), *prf_seed(k, "attacker", u)]))
            pick = rng.choice(len(distinct), size=m, replace=False)
            chosen = sorted((distinct[i] for i in pick), key=lambda t: d[t])
        excluded[u] = set(chosen)
        for t in chosen:
            att_rid.append(d[t])
            att_user.append(u)
            att_member.append(u not in out_set)
    if out_set and len(out_set) == len(by_user):
        raise VeilError(f"audit.holdout_users: every one of the {len(by_user)} users was drawn into the held-out "
                        "group, leaving none to train on; lower the probability")

    keep = [i for i, (u, t) in enumerate(zip(users, cont)) if u not in out_set and t not in excluded.get(u, ())]
    train = records.take(pa.array(keep, type=pa.int64()))
    trained = sorted(set(train.column("user_id").to_pylist()))
    return AuditSplit(held_out_users=sorted(out_set), trained_users=trained,
                      attacker=_attacker_table(att_rid, att_user, att_member), train=train, n_eligible=eligible,
                      evaluation=reservation)


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

    from components.draws.annex import prf_uniform
    from components.bounding.owners import owner_set

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
    return AuditSplit(held_out_users=sorted(out_set), trained_users=sorted(set(train.column("user_id").to_pylist())),
                      attacker=_attacker_table(att_rid, att_user, att_member), train=train,
                      n_eligible=len(set(att_user)), evaluation=reservation)

def keep_trained_members(attacker: pa.Table, trained_people: set[str]) -> pa.Table:
    """The attacker table without the "member" rows of people who own no trained record.

    The split labels a person a member when they were not held out, but the mechanism's bound runs
    after it: multi-owner records (els-owners) drop a mail when any co-owner is reserved and keep at
    most k records per owner, so a writer who was not held out can end with nothing trained (1 of 38
    "members" in issue 22, case 7). A member is a person at least one record they own was trained on;
    a person neither trained nor held out is neither member nor (randomly drawn) non-member, so their
    samples leave the audit. `trained_people`: every owner of a trained record (writers included)."""
    if attacker.num_rows == 0:
        return attacker
    users = attacker.column("user_id").to_pylist()
    member = attacker.column("member").to_pylist()
    keep = [i for i, (u, m) in enumerate(zip(users, member)) if not m or u in trained_people]
    if len(keep) == attacker.num_rows:
        return attacker
    return attacker.take(pa.array(keep, type=pa.int64()))


def split_canaries(records: pa.Table, *, m: int, seed: int, key: bytes | None = None) -> AuditSplit:
    """Synthetic canary users: exactly half held out (keyed order over canary ids only, so it depends
    on no real person), m attacker samples each. (A fixed-size split is not the independent draws the
    one-run ε bound needs: `audit.run._one_run` leaves canaries out of it.)"""
    from components.draws.annex import prf

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
    from components.draws.annex import prf_seed

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
    return AuditSplit(held_out_users=sorted(out), trained_users=sorted(set(ids) - out),
                      attacker=_attacker_table(att_rid, att_user, att_member), train=train, n_eligible=len(ids))


# --- sizing the audit from public quantities ------------------------------------------------------------
#
# The audit decides only when its intervals clear the policy's limits, and how narrow they get depends on
# how many people, canaries and secrets it has. The planner knows three public quantities before
# training: the policy, N̂ (the DP estimate of the people trained on) and the certified ε at the plan's
# σ. From them it sizes what the policy leaves to it (candidates per secret) and says, in the plan and on
# `veil plan`, whether each gate can pass at this size and what it would need — so "inconclusive, rerun
# with more" is known before a release is spent, and the governance team can choose `require:
# not_failed` for an organization too small for a passing audit.
#
# Design point: a model that leaks nothing (AUROC 0.5; exceedances at the chance rate). That is the
# best case for passing, so "cannot pass" is a firm statement; "can pass" means "would, if the model
# leaks nothing measurable".

HOLDOUT_LADDER = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)


def sweep_size(m: int) -> int:
    """How many AUROC curves the user-inference verdict is simultaneous over (components.audit.run's
    m-sweep: 1, 2, 4, 8, 16 below m, and m)."""
    return len([x for x in (1, 2, 4, 8, 16) if x < m]) + 1


def _ui_settles(n_in: float, n_out: float, bound: float, z: float) -> bool:
    from components.audit.verdict import auroc_interval

    if n_in < 1 or n_out < 1:
        return False
    return auroc_interval(0.5, max(1, int(n_in)), max(1, int(n_out)), z)[1] < bound


def size_audit(audit, *, people: float | None, epsilon: float | None, delta: float | None,
               secret_classes: int = 0) -> dict:
    """The plan's `audit.sizing` section. `audit`: the policy's spec.audit; `people`: the public count of
    people trained on (N̂, or N where the release's relation makes it public; None when unknown);
    `epsilon`, `delta`: the plan's certified (ε, δ) when user-level, else None; `secret_classes`: the
    policy's tagged classes (0: unknown, taken as 1). Public values and N̂'s post-processings only."""
    from components.audit.ceiling import auroc_ceiling
    from components.audit.verdict import (CONFIDENCE, candidates_for_limit, people_needed, round_up_ladder,
                                          secrets_to_pass, z_value)

    limit = float(audit.max_secret_exposure)
    r = candidates_for_limit(limit) if audit.candidates_per_secret == "auto" else int(audit.candidates_per_secret)
    out: dict = {"require": audit.require, "confidence": CONFIDENCE, "design_point": (
        "a model that leaks nothing measurable (AUROC 0.5, exceedances at the chance rate): the best case for "
        "passing, so a gate that cannot pass here cannot pass at all"),
        "candidates_per_secret": r,
        "candidates_source": "policy" if audit.candidates_per_secret != "auto" else
        f"auto: first of 10, 20, 50, … with R + 1 >= 2^(max_secret_exposure + 2) = 2^{limit + 2:g}",
        "secrets_per_class": int(audit.secrets_per_class), "max_exposed_fraction": float(audit.max_exposed_fraction)}
    cannot: list[str] = []

    # --- user inference: members ≈ the people trained on, non-members ≈ N̂·p/(1 − p) -----------------------
    p, m = float(audit.holdout_users), int(audit.attacker_samples_per_user)
    bound = float(audit.max_user_inference_auroc)
    z = z_value(CONFIDENCE, sweep_size(m))
    ui: dict = {"bound": bound, "simultaneous_over": sweep_size(m)}
    if people is None:
        ui.update(settles=None, why="the number of people trained on is not public for this plan")
    elif p <= 0:
        ui.update(settles=False, why="audit.holdout_users is 0: nobody is held out, so user inference cannot run")
        cannot.append("user inference: nobody is held out (audit.holdout_users: 0)")
    else:
        n_in, n_out = float(people), float(people) * p / (1 - p)
        ui.update(expected_in=round_up_ladder(max(1, int(n_in))), expected_out=round_up_ladder(max(1, int(n_out))))
        if _ui_settles(n_in, n_out, bound, z):
            ui.update(settles=True, why=f"at about {int(n_in)} in and {int(n_out)} out a model at AUROC 0.5 shows an "
                                        f"interval below the policy's {bound:g} (if every person has the {m + 1} "
                                        "distinct texts an audited person needs; `veil plan` shows administrators "
                                        "how many do)")
        else:
            total = n_in / (1 - p)
            better = next((q for q in HOLDOUT_LADDER if q > p and _ui_settles(total * (1 - q), total * q, bound, z)),
                          None)
            need = people_needed(0.5, max(1, int(n_in)), max(1, int(n_out)), z, bound - 0.5)
            ui.update(settles=False, holdout_needed=better,
                      people_needed={k: round_up_ladder(v) for k, v in need.items()} if need else None)
            if better is not None:
                ui["why"] = (f"at about {int(n_in)} in and {int(n_out)} out even a model at AUROC 0.5 has an interval "
                             f"reaching the policy's {bound:g}; audit.holdout_users: {better:g} would settle it")
            else:
                ui["why"] = (f"at about {int(total)} people no holdout up to 0.5 narrows the interval below the "
                             f"policy's {bound:g}: too small for a passing user-inference audit")
            cannot.append(f"user inference: {ui['why']}")
    out["user_inference"] = ui

    # --- canaries: exactly the synthetic users the policy asks for, half trained, against the ceiling -----
    cu = int(audit.canaries.users)
    if cu:
        ceiling = auroc_ceiling(epsilon, delta) if epsilon is not None and delta is not None else None
        cz = z_value(CONFIDENCE, 1)
        can: dict = {"users": cu, "bound": ceiling}
        if ceiling is None:
            can.update(settles=None, why="no user-level ε: canaries have no ceiling to be compared with")
        elif _ui_settles(cu / 2, cu / 2, ceiling, cz):
            can.update(settles=True, why=f"{cu} canaries (about half trained) settle against the ceiling {ceiling:.3f} "
                                          "of the certified ε")
        else:
            need = people_needed(0.5, max(1, cu // 2), max(1, cu // 2), cz, ceiling - 0.5)
            can.update(settles=False, users_needed=round_up_ladder(2 * max(need.values())) if need else None)
            can["why"] = (f"{cu} canaries cannot settle against the ceiling {ceiling:.3f}: audit.canaries.users: "
                          f"{can['users_needed'] or 'more than 1000000'} would")
            cannot.append(f"canaries: {can['why']}")
        out["canaries"] = can

    # --- secret exposure: a class passes only with enough secrets --------------------------------------------
    k = max(1, int(secret_classes))
    need_s = secrets_to_pass(limit, float(audit.max_exposed_fraction), r, (1 - CONFIDENCE) / (2 * k))
    se = {"candidates_per_secret": r, "secrets_needed_per_class": need_s, "classes_assumed": k}
    if not secret_classes:
        se.update(settles=None, why=f"the policy tags no secret classes; secrets found anyway are audited with {r} "
                                    f"candidates each, and a class needs about {need_s} of them to pass")
    elif need_s is None or need_s > int(audit.secrets_per_class):
        se.update(settles=False, why=f"a class needs about {need_s or 'more than 1000000'} audited secrets to pass at "
                                      f"max_exposed_fraction {float(audit.max_exposed_fraction):g}, and "
                                      f"audit.secrets_per_class caps it at {int(audit.secrets_per_class)}")
        cannot.append(f"secret exposure: {se['why']}")
    else:
        se.update(settles=True, why=f"a class with at least {need_s} secrets can pass (fewer: at best not failed)")
    out["secret_exposure"] = se
    out["can_pass"] = not cannot
    out["cannot_pass"] = cannot
    if cannot and audit.require == "passed":
        out["statement"] = ("this audit cannot pass at this size, and the policy requires 'passed': the release will "
                            "not be promoted. Fix the policy as said, or set audit.require: not_failed")
    elif cannot:
        out["statement"] = "this audit cannot pass at this size; the policy promotes on 'not failed'"
    else:
        out["statement"] = f"the audit can settle at this size; the gate requires '{audit.require}'"
    return out


def audited_sizing(audit, counts: dict) -> dict | None:
    """PRIVATE (exact counts: the operator's terminal only, `veil plan`): user inference with the people
    the plan's split actually audits. The public sizing above can only assume that every person trained
    on is audited (N̂ in); only people with m + 1 distinct texts are (issue 26: 181 in and 48 out on the
    Debian changelogs, not the ~300 and ~75 N̂ implied). `counts`: the annex's counts. Says whether a
    model at AUROC 0.5 settles, and the largest AUROC a model may show and still pass (the interval's
    upper end below the policy's bound). None for record units or when nobody is held out."""
    from components.audit.verdict import CONFIDENCE, auroc_interval, people_needed, z_value

    out = counts.get("n_held_out_users")
    eligible = counts.get("n_audit_eligible_users")
    if not out or eligible is None or float(audit.holdout_users) <= 0:
        return None
    n_in, n_out = max(0, int(eligible) - int(out)), int(out)
    m, bound = int(audit.attacker_samples_per_user), float(audit.max_user_inference_auroc)
    z = z_value(CONFIDENCE, sweep_size(m))
    doc = {"people_in": n_in, "people_out": n_out, "min_texts": m + 1, "bound": bound, "require": audit.require}
    if n_in < 1:
        return {**doc, "settles": False, "passes_below_auroc": None, "people_needed": None,
                "why": "nobody trained on is audited"}
    settles = _ui_settles(n_in, n_out, bound, z)
    lo, hi = 0.5, bound          # the largest AUROC whose interval still ends below the bound (bisection)
    if not settles:
        hi = 0.5
    else:
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if auroc_interval(mid, n_in, n_out, z)[1] < bound else (lo, mid)
    need = None if settles else people_needed(0.5, n_in, n_out, z, bound - 0.5)
    return {**doc, "settles": settles, "passes_below_auroc": round(lo, 3) if settles else None,
            "people_needed": need,
            "why": (f"{n_in} in and {n_out} out are audited (people with {m + 1}+ distinct texts): a model passes "
                    f"only if its attack AUROC is below about {lo:.3f} (the interval must end below {bound:g})")
            if settles else
            (f"{n_in} in and {n_out} out are audited (people with {m + 1}+ distinct texts): even a model at AUROC "
             f"0.5 has an interval reaching {bound:g}" + (f"; about {need['in']} in and {need['out']} out would "
                                                           "settle it" if need else ""))}
