"""Contribution bounding for records with several owners (a mail: its sender and its To/Cc).

    sel = bound_owners(owners, record_ids, k, key=plan_key)
    train = records.take(sel.rows)

Each person may own at most `k` of the selected records, counting every record they are an owner of
(sent or received). The derivation is in `docs/privacy/multi-owner.md`; in short:

* **What is protected** — the *fixed-attribution-graph* relation of Ganesh et al. 2025 ("It's My Data
  Too", §2; jax_privacy's multi-owner setting): two datasets are neighbours when they have the same
  attribution graph (the same persons, and for every record the same list of owners) and differ in
  the *content* of the records one person owns. Who exchanged records with whom, and how many, is
  not protected by this relation; the content of everything a person is on is.
* **Why not add/remove-person** — no hard per-person cap can be both useful and stable under removing
  a person: removing one person frees capacity at each of their co-owners, which admits other
  records, which take capacity elsewhere (greedy: chains as long as the data; intersections of
  per-person choices: one freed slot at every co-owner). `tests/planning/test_planning_owners.py`
  exhibits both; the certificate therefore never claims an add/remove-person bound for multi-owner
  data.
* **How the selection is made graph-only** — which records are selected is computed from the owner
  lists and the plan's key alone: records are grouped by their owner set T, every group is cut into
  slots (T, 0), (T, 1), …, the slots are visited in a keyed order (fewest owners first by default, so
  a mail to fifty people does not use up fifty budgets before a two-person thread is seen), and a
  slot is taken when every owner in T still has budget (the greedy baseline of Ganesh et al., §4).
  Only then are the s_T slots taken for T filled with T's records, in a keyed order of their ids.
  Content (text, record ids) therefore decides only *which* of T's records fill T's slots, and every
  one of those is owned by each member of T.
* **The bound** — changing the content of person u's records leaves every count s_T unchanged and the
  selected records of every T ∌ u identical; the selected records that differ are all owned by u, so
  at most k of them are replaced (≤ k out, ≤ k in). With Poisson sampling of records this is DP-SGD
  under replace-≤k-records: by the path D → D without u's ≤ k selected records → D', ε = 2·ε_k at
  δ = (1 + e^{ε_k})·δ_k, where (ε_k, δ_k) is the ELS/group mechanism's guarantee for a group of k.

Per-person selected counts are private (they say who owns how much); `OwnerSelection.public()` keeps
only what the plan may publish.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field

from components.core.errors import VeilError

ORDERS = ("fewest-owners", "random")
RELATION = "replace_owned_records_fixed_graph"


@dataclass(frozen=True)
class OwnerSelection:
    rows: list[int]                      # selected row indices, ascending
    k: int
    order: str
    per_owner: dict[str, int] = field(repr=False)   # private: selected records per person
    slots_per_group: dict[tuple[str, ...], int] = field(repr=False)  # private: s_T

    def public(self) -> dict:
        """What a public plan/certificate may say: the rule, never a count of the data."""
        return {"bound": "per_owner", "k": self.k, "order": self.order, "neighbouring_relation": RELATION,
                "replaced_records_bound": self.k,
                "group_size_add_remove": 2 * self.k,
                "graph_protected": False}


def owner_set(owners) -> tuple[str, ...]:
    """A record's owners as a canonical tuple (sorted, distinct, non-empty ids)."""
    if owners is None:
        return ()
    out = sorted({str(o) for o in owners if o is not None and str(o) != ""})
    return tuple(out)


def _h(key: bytes, *parts: str) -> bytes:
    return hmac.new(key, "\x1f".join(parts).encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def bound_owners(owners: Sequence[Sequence[str] | None], record_ids: Sequence[str], k: int, *, key: bytes,
                 order: str = "fewest-owners") -> OwnerSelection:
    """Rows to train on so that every person owns at most `k` of them (see the module docstring).

    `owners[i]` lists row i's owners (the `owners` column that `people.apply_people` adds: the writer
    first, then recipients); rows without an owner are never selected. `record_ids[i]` names row i's
    content; it only orders the rows inside one owner set. `key` is the planner's secret key (so no one
    can recompute the choice); the result is a pure function of (owner sets, record ids, k, key, order).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise VeilError(f"contribution: k must be an integer ≥ 1 (records per owner), got {k!r}")
    if order not in ORDERS:
        raise VeilError(f"contribution: unknown multi-owner order {order!r}; use one of {', '.join(ORDERS)}")
    if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
        raise VeilError("contribution: the multi-owner selection needs the planner's key (≥ 16 bytes)")
    if len(owners) != len(record_ids):
        raise VeilError(f"contribution: {len(owners)} owner lists for {len(record_ids)} records")
    key = bytes(key)

    groups: dict[tuple[str, ...], list[int]] = {}
    for i, o in enumerate(owners):
        t = owner_set(o)
        if t:
            groups.setdefault(t, []).append(i)

    # 1. Slots and their order: a function of the owner sets alone (the attribution graph) and the key.
    slots: list[tuple[int, bytes, tuple[str, ...]]] = []
    for t, rows in groups.items():
        tag = "\x1e".join(t)
        for j in range(len(rows)):
            size = len(t) if order == "fewest-owners" else 0
            slots.append((size, _h(key, "owner-slot", tag, str(j)), t))
    slots.sort(key=lambda s: (s[0], s[1], s[2]))

    # 2. Greedy: take a slot when every owner still has budget.
    left: dict[str, int] = {}
    taken: dict[tuple[str, ...], int] = {}
    for _, _, t in slots:
        if all(left.get(o, k) > 0 for o in t):
            for o in t:
                left[o] = left.get(o, k) - 1
            taken[t] = taken.get(t, 0) + 1

    # 3. Fill each owner set's slots with its rows in a keyed order of their ids (content matters
    #    only here, and only among rows every member of t owns).
    chosen: list[int] = []
    for t, s in taken.items():
        tag = "\x1e".join(t)
        rows = sorted(groups[t], key=lambda i: (_h(key, "owner-fill", tag, str(record_ids[i])), i))
        chosen.extend(rows[:s])
    chosen.sort()
    per_owner = {o: k - v for o, v in left.items() if k - v > 0}
    return OwnerSelection(rows=chosen, k=k, order=order, per_owner=per_owner, slots_per_group=taken)


def replaced_records_bound(k: int) -> int:
    """Selected records that can differ (each side) between fixed-graph neighbours: k."""
    return int(k)


def replace_to_add_remove(epsilon_k: float, delta_k: float) -> tuple[float, float]:
    """(ε, δ) for replacing ≤ k records from the mechanism's (ε_k, δ_k) for adding/removing a group of
    ≤ k records: group privacy along D → D − (u's selected records) → D' gives (2ε_k, (1 + e^{ε_k})δ_k)."""
    import math

    if not (epsilon_k >= 0 and math.isfinite(epsilon_k)) or not 0 <= delta_k < 1:
        raise VeilError(f"multi-owner: (ε_k, δ_k) = ({epsilon_k}, {delta_k}) is not a finite guarantee")
    return 2.0 * epsilon_k, (1.0 + math.exp(epsilon_k)) * delta_k
