"""ELS over records with several owners (a mail: its sender and its To/Cc), `people.ownership:
all-participants`. A policy names `els`; planning runs this variant (`ELS.owners_variant`).

What changes against ELS (derivation: docs/privacy/multi-owner.md):
* **the bound** — `components.bounding.owners.bound_owners`: every person owns at most k selected
  records, counting every record they are on; the choice reads the attribution graph and the key
  alone, so changing the content of one person's records replaces at most k selected records;
* **the relation** — fixed attribution graph, the content of one person's records replaced
  (Ganesh et al. 2025, §2). Add/remove-person has no bound for a hard cap on shared records;
* **the guarantee** — ELS's (ε_k, δ_k) for adding or removing ≤ k records, twice along
  S → S without u's records → S': (2ε_k, (1 + e^{ε_k})·δ_k). σ is calibrated for (ε/2, δ/(1 + e^{ε/2}));
* **the population** — the number of selected records is the same for every neighbour (it is a
  function of the graph), so it is public under the relation: q = B/N exactly, no ε spent on N̂;
* **the ledger** — every owner of a selected record is charged, under the replace relation
  (components.renyi.rdp.replace_rows_rdp).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from components.core.errors import VeilError
from components.mechanisms.base import Bounded, Calibrated, PlanContext, register
from components.mechanisms.els import ELS
from components.mechanisms.gaussian import accounting_section
from components.bounding.owners import bound_owners, owner_set, replace_to_add_remove

if TYPE_CHECKING:      # annotations only (numpy and pyarrow load where a hook computes)
    import numpy as np
    import pyarrow as pa

# components.bounding.owners.RELATION (a test checks they agree; kept here too so that the relation
# a certificate names is readable from the mechanism alone)
RELATION = "replace_owned_records_fixed_graph"

CAVEAT = ("multi-owner records (people.ownership: all-participants): the guarantee is under the fixed-attribution-graph "
          "relation — the content of every record a person is on (sent or received) may be replaced, the graph is "
          "not: who exchanged records with whom and how many, and a person's presence, are not protected; it is "
          "(2ε_k, (1+e^{ε_k})δ_k) from ELS's group-of-k guarantee (pessimistic: no replace-aware accountant)")


def group_target(epsilon: float, delta: float) -> tuple[float, float]:
    """The (ε_k, δ_k) to calibrate ELS's group of k for, so that (2ε_k, (1+e^{ε_k})δ_k) ≤ (ε, δ)."""
    return epsilon / 2.0, delta / (1.0 + math.exp(epsilon / 2.0))


# What the certificate, the policy docs and `veil verify` say is and is not protected (issue 22, case 6):
# the unit is named "owner", not "user", so that nobody reads it as add/remove-person.
COVERAGE = ("owner-level (privacy_unit 'owner', relation replace_owned_records_fixed_graph): protected — the content "
            "of every record a person is on, sent or received, for every fixed planner key; NOT protected — the "
            "person's presence (they appear as an owner of other people's mail) and the attribution graph (who "
            "exchanged records with whom, and how many). This is not add/remove-person DP")


class ELSOwners(ELS):
    name = "els-owners"
    # not "user": the relation replaces one owner's content on a fixed graph; adding or removing a person
    # is not covered (docs/privacy/multi-owner.md §3), and a "user" certificate reads as if it were
    privacy_unit = "owner"
    description = ("ELS over records owned by every participant (sender and recipients): ≤ k records per owner, "
                   "fixed-graph replace relation")
    neighbouring = RELATION
    plannable = False               # a policy names 'els' with people.ownership: all-participants
    multi_owner = True
    population_estimate = False     # N is a function of the attribution graph: public under the relation
    ledger_relation = "replace"
    auto_default = False
    contribution_kind = "records per owner (every participant of a record owns it), fixed attribution graph"

    # --- policy → plan ---------------------------------------------------------------------------
    def plan_selection(self, selection: str) -> str | None:
        return None         # the per-owner greedy decides (the plan's `ownership` section says its order)

    def bound(self, ctx: PlanContext, train: pa.Table) -> Bounded:
        import pyarrow as pa

        from components.draws.audit_split import held_out  # startup
        from components.draws.eval_split import is_evaluation_person  # startup

        spec = ctx.spec
        owners = _owners_of(train, ctx.owners)
        # A record trains only if none of its owners is reserved (evaluation or audit holdout). The
        # decision reads each owner's own keyed draw — never a count or a text — so it is a function
        # of the graph: a reserved recipient's mail is not trained, whoever wrote it.
        seed, p_hold, p_eval = int(spec.training.seed), float(spec.audit.holdout_users), float(spec.evaluation.fraction)
        reserved: dict[str, bool] = {}

        def is_reserved(o: str) -> bool:
            if o not in reserved:
                reserved[o] = held_out(ctx.key, seed, o, p_hold) or is_evaluation_person(ctx.key, seed, o, p_eval)
            return reserved[o]

        # The writer's own reservation is the audit split's (it left only trained writers' rows, and its
        # canaries follow their own rule); the draw decides for the other owners.
        writers = train.column("user_id").to_pylist()
        keep = [i for i, t in enumerate(owners) if t and not any(is_reserved(o) for o in t if o != writers[i])]
        train, owners = train.take(pa.array(keep, pa.int64())), [owners[i] for i in keep]
        order = spec.people.multi_owner_order
        sel = bound_owners(owners, train.column("record_id").to_pylist(), int(ctx.k), key=ctx.key, order=order)
        rows = pa.array(sel.rows, pa.int64())
        chosen = train.take(rows)
        owner_col = pa.array([list(owners[i]) for i in sel.rows], pa.list_(pa.string()))
        return Bounded(chosen=chosen, n_units=chosen.num_rows, records_per_user=int(ctx.k),
                       extra={"ownership": {"ownership": "all-participants", **sel.public()}},
                       caveats=[CAVEAT], owners=owner_col)

    def calibrate(self, ctx: PlanContext, bounded: Bounded) -> Calibrated:
        from components.accounting import calibrate as calibrate_sigma  # startup

        spec = ctx.spec
        target = {"epsilon": float(spec.target.epsilon), "delta": float(spec.target.delta)}
        n = int(bounded.n_units)
        batch = int(ctx.batch)
        if n < batch:
            raise VeilError(f"spec.training.expected_batch_size: {batch} records per step but only {n} records "
                            "can be trained on after the per-owner bound; lower it")
        q = batch / n
        eps_k, delta_k = group_target(target["epsilon"], target["delta"])
        ctx.say(f"calibrating σ (els, group of {ctx.k}, q={q:.4g}, T={ctx.steps}, ε_k={eps_k:.4g}, δ_k={delta_k:.3g}; "
                "replace relation: ε = 2ε_k)")
        cal = calibrate_sigma("els", epsilon=eps_k, delta=delta_k, sampling_rate=q, steps=ctx.steps,
                              k=self.accounting_k(ctx.k), cache_dir=ctx.cache_dir)
        accounting = accounting_section(cal, "els")

        eps, delta = replace_to_add_remove(accounting["epsilon"], delta_k)
        accounting.update(_replace_section(accounting["epsilon"], delta_k, eps, delta, int(ctx.k)))
        if eps > target["epsilon"] * (1 + 1e-9) or delta > target["delta"] * (1 + 1e-9):
            raise VeilError(f"accounting: calibrated σ={cal.noise_multiplier:g} gives (ε, δ)=({eps:g}, {delta:g}) above "
                            f"the target ({target['epsilon']:g}, {target['delta']:g}); refusing to plan")
        population = {"unit": "records", "exact": n, "mechanism": "none", "epsilon": 0.0,
                      "delta": 0.0, "why": "fixed-graph neighbours select the same number of records (the counts "
                                           "per owner set are a function of the graph), so N is public under this "
                                           "relation"}
        return Calibrated(sampling_rate=q, expected_batch_size=batch, noise_multiplier=float(cal.noise_multiplier),
                          target=target, accounting=accounting, population=population,
                          population_private={"unit": "records", "exact": n})

    # --- certificate ----------------------------------------------------------------------------
    def certify(self, plan: Mapping, train_result: Mapping, *, steps: int, caveats: list[str], **inputs) -> dict:
        delta_k = float(plan["accounting"]["delta_group"])
        eps_k, event, meta = _group_epsilon(plan, steps, delta_k, self.accounting_k(plan.get("records_per_user")))
        eps, delta = replace_to_add_remove(eps_k, delta_k)
        target = dict(plan["target"])
        caveats.append(CAVEAT)
        return {
            "privacy_unit": self.privacy_unit,
            "neighbouring": self.neighbouring,
            "mechanism": self.name,
            "epsilon": eps,
            "delta": delta,
            "target": target,
            "within_target": eps <= float(target["epsilon"]) + 1e-12 and delta <= float(target["delta"]) * (1 + 1e-12),
            "accountant": {"name": "dp_accounting.pld.PLDAccountant", "mechanism": "els", "library": "dp-accounting",
                           **meta},
            "dp_event": event,
            "group_guarantee": _replace_section(eps_k, delta_k, eps, delta, int(plan.get("records_per_user") or 0)),
            "ownership": dict(plan.get("ownership") or {}),
            "coverage": COVERAGE,
            "contribution_bound": {"records_per_user": plan.get("records_per_user"), "selection": plan.get("selection"),
                                   "kind": self.contribution_kind},
        }

    def recompute_epsilon(self, doc: Mapping) -> float:
        stated = (doc.get("accountant") or {}).get("mechanism")
        if stated != "els":
            raise VeilError(f"certificate: mechanism {self.name!r} is accounted as 'els', but the certificate's "
                            f"accountant says {stated!r}")
        g = doc["group_guarantee"]
        delta_k = float(g["delta_group"])
        eps_k, _, _ = _group_epsilon(doc, int(doc["steps"]), delta_k,
                                     self.accounting_k((doc.get("contribution_bound") or {}).get("records_per_user")))
        eps, delta = replace_to_add_remove(eps_k, delta_k)
        if abs(float(doc["delta"]) - delta) > 1e-9 * delta + 1e-300:
            raise VeilError(f"certificate says δ={doc['delta']} but its group guarantee (δ_k={delta_k:g}, "
                            f"ε_k={eps_k:.6g}) gives δ=(1+e^ε_k)δ_k={delta:.6g}")
        return eps

    def within_target(self, doc: Mapping, epsilon: float) -> bool | None:
        t = doc.get("target") or {}
        if t.get("epsilon") is None:
            return None
        return float(epsilon) <= float(t["epsilon"]) + 1e-12 and float(doc["delta"]) <= float(t["delta"]) * (1 + 1e-12)

    def describe(self, doc: Mapping) -> str:
        return (f"owner-level ε={doc['epsilon']:.4f}, δ={doc['delta']:.3g} under the fixed-graph replace relation "
                f"(multi-owner records: 2 × ELS's group-of-{(doc.get('contribution_bound') or {}).get('records_per_user')} "
                "ε; a person's presence and the attribution graph are not protected)")

    def coverage(self, doc: Mapping) -> str | None:
        return COVERAGE

    # --- audit ----------------------------------------------------------------------------------
    def user_pld(self, certificate: Mapping, discretization: float = 1e-3):
        return None         # the audit's add/remove-user ceiling does not exist under this relation

    # --- ledger ---------------------------------------------------------------------------------
    def rows_curve(self, rates, sigma: float, steps: int, orders) -> np.ndarray:
        """Every owner of a trained record is charged (renyi.costs.person_rates expands `owners`), under the
        replace relation (components.renyi.rdp.replace_rows_rdp)."""
        from components.renyi import rdp as _rdp  # startup

        return _rdp.replace_rows_rdp(rates, sigma, steps, orders)

    def ledger_group_size(self, rows: int) -> int:
        return 2 * max(1, int(rows))     # replacing n rows moves the sum by up to 2n·C


def _replace_section(eps_k: float, delta_k: float, eps: float, delta: float, k: int) -> dict:
    return {"epsilon_group": float(eps_k), "delta_group": float(delta_k), "group_size": int(k),
            "epsilon": float(eps), "delta": float(delta),
            "conversion": "replace ≤ k records = remove ≤ k then add ≤ k: (2ε_k, (1 + e^{ε_k})δ_k) by group privacy"}


def _group_epsilon(doc: Mapping, steps: int, delta_k: float, k: int) -> tuple[float, dict, dict]:
    """ELS's ε_k at δ_k for adding/removing ≤ k records, at the document's q, σ and `steps`."""
    from components.accounting import epsilon as account  # startup

    if steps == 0:
        return 0.0, {"name": "NoOpDpEvent"}, {}
    res = account("els", sampling_rate=float(doc["sampling_rate"]), noise_multiplier=float(doc["noise_multiplier"]),
                  steps=int(steps), delta=float(delta_k), k=int(k))
    if not math.isfinite(float(res.epsilon)):
        raise VeilError(f"no finite ε reaches δ_k={delta_k:g} for this run: not certifiable")
    return float(res.epsilon), res.dp_event, {"library_version": res.library_version, "pessimistic": res.pessimistic,
                                              "discretization": res.discretization, "notes": list(res.notes)}


def _owners_of(train: pa.Table, owners: pa.Table | None) -> list[tuple[str, ...]]:
    """Each training row's owner set: the row's own `owners` column where the audit split kept it (by
    position: a record id names content, and under the relation u's content may become a copy of a
    record u is not on — joined on the id, that record would take u's owners); else the people rules'
    `owners` table joined on record_id; the writer alone for rows that have none (canary users)."""

    lookup: dict[str, list] = {}
    if owners is not None and "owners" not in train.column_names:
        for rid, o in zip(owners.column("record_id").to_pylist(), owners.column("owners").to_pylist()):
            lookup[rid] = o
    own = train.column("owners").to_pylist() if "owners" in train.column_names else None
    out = []
    for i, (rid, u) in enumerate(zip(train.column("record_id").to_pylist(), train.column("user_id").to_pylist())):
        t = owner_set((own[i] if own is not None else lookup.get(rid)) or [u])
        out.append(t if u in t else owner_set([u, *t]))    # the writer always owns their record
    return out


register(ELSOwners)
