"""The per-person privacy ledger: reserve a release's cost before training, record what happened after.

    Ledger.open(settings)                 the ledger at settings.ledger_url or private_dir/ledger.db
    ledger.reserve(...)  -> Reservation   one serializable transaction: the filter's decision per person,
                                          the release row, its 'reserved' event and every charge
    ledger.record(release_id, status)     an appended status event (trained/registered/refused/crashed/…)
    ledger.summary() / burn_down()        aggregates only (safe to print)
    ledger.person_rows()                  per-person spend: private, for the private area only

Charges are never decremented: whatever becomes of the release (crash, refusal, deletion, failed audit),
its reservation stays and keeps counting.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from components.core import identity as _identity
from components.core.errors import VeilError
from components.ledger import keys as _keys, store as st
from components.renyi import rdp as _rdp
from components.renyi.costs import Budget, PersonCost, SecretCost
from components.mechanisms import get as get_mechanism


# Releases that post-process an earlier release and charge nobody (record_post_processing).
POST_PROCESSING_KINDS = ("synthetic",)


def default_url(settings) -> str:
    url = getattr(settings, "ledger_url", None)
    return url or f"sqlite:///{Path(settings.private_dir).resolve() / 'ledger.db'}"


class PlanAlreadyReleased(VeilError):
    """A plan's one release exists already (components.ledger.store.plan_releases): a second would
    charge the same people again for the same data."""

    def __init__(self, plan_sha256: str, release_id: int, status: str | None):
        self.plan_sha256, self.release_id, self.status = plan_sha256, int(release_id), status
        super().__init__(f"ledger: plan {plan_sha256[:12]} already has release {release_id} ({status or 'no status'}); "
                         "a plan is released once")


@dataclass(frozen=True)
class Reservation:
    """The filter's decision for one release. `admitted`/`retired` hold the caller's own person ids:
    they name people, so they stay in memory and in the private area, never in a public artifact."""
    release_id: int
    admitted: tuple[str, ...]
    retired: tuple[str, ...]
    budget: Budget | None
    orders: tuple[float, ...]
    # per secret (secret-protection releases): the caller's secret ids; they carry values, so private
    secrets_charged: tuple[str, ...] = ()
    secrets_dropped: tuple[str, ...] = ()

    def public(self) -> dict:
        """What may go on a plan, certificate or tag: the release id and the budget. Never ids, and not
        the admitted/retired counts either: those are exact private counts (the number of people)."""
        return {"ledger_release_id": self.release_id,
                "budget": None if self.budget is None else {"epsilon": self.budget.epsilon,
                                                            "delta": self.budget.delta}}


@dataclass(frozen=True)
class PopulationCharge:
    """A population estimate's charge: its ledger release (None when refused), whether this call wrote
    it (False: the same N̂ was charged before), and the people who could not afford it (private ids)."""
    release_id: int | None
    new: bool
    refused: tuple[str, ...] = ()


class Ledger:
    def __init__(self, url: str, key: bytes, *, orders=_rdp.ORDERS):
        self.url = url
        self._key = key
        self._keyer = None
        self.engine = st.make_engine(url)
        st.create(self.engine)
        fp = _keys.key_fingerprint(key)

        def init(conn: Connection) -> dict:
            if "schema" not in st.read_meta(conn) and \
                    conn.execute(select(func.count()).select_from(st.releases)).scalar_one():
                # releases without the ledger's own record (its order grid, key, budget): not made by
                # this code, or damaged; re-stamping it would re-price and re-key every charge
                raise VeilError(f"ledger {self._where()} holds releases but no ledger metadata (schema, orders, key): "
                                f"damaged; {st.RESTORE}")
            fresh = "schema" not in st.read_meta(conn)
            st.insert_ignore(conn, st.meta, [
                {"key": "schema", "value": st.SCHEMA_VERSION},
                {"key": "orders", "value": json.dumps([float(a) for a in orders])},
                {"key": "key_fingerprint", "value": fp},
                {"key": "created_at", "value": st.now()}])
            if fresh:   # a ledger made before issue 26 has no conversion key and keeps union-markov
                st.insert_ignore(conn, st.meta, [{"key": "conversion", "value": _rdp.CONVERSION}])
                # and its weight rule, recorded now so that the budget (fixed later) gets this rule's
                # shares: a weighted ledger without the key was made by the v1 Veil and keeps v1
                if _rdp.CONVERSION == _rdp.WEIGHTED:
                    st.insert_ignore(conn, st.meta, [{"key": "order_weights_rule", "value": _rdp.WEIGHT_RULE}])
            return st.read_meta(conn)

        m = st.transact(self.engine, init)
        if m.get("schema") != st.SCHEMA_VERSION:
            raise VeilError(f"ledger {self._where()}: schema {m.get('schema')!r}, this Veil reads {st.SCHEMA_VERSION}")
        if m.get("key_fingerprint") != fp:
            raise VeilError(f"ledger {self._where()}: kept with another ledger key; pseudonyms would not match and "
                            f"everyone would start at zero. Use the team's key (${_keys.ENV_KEY_FILE})")
        # The grid is the ledger's, fixed when it was created; a newer default never re-prices old charges.
        self.orders = tuple(float(a) for a in json.loads(m["orders"]))
        # So is its RDP → (ε, δ) conversion (docs/privacy/ledger.md): an old ledger's thresholds never move.
        self.conversion = m.get("conversion", _rdp.MARKOV)
        if self.conversion not in _rdp.CONVERSIONS:
            raise VeilError(f"ledger {self._where()}: conversion {self.conversion!r} is not one this Veil knows "
                            f"({', '.join(_rdp.CONVERSIONS)}); use the Veil that made it")
        self.weight_rule = _rule_of(m, self.conversion, self._where())
        self._weights = _weights_of(m, self.conversion, self.orders, self._where())

    def _filter_weights(self, m: Mapping[str, str], budget: Budget) -> np.ndarray | None:
        """The order weights the filter uses with `budget`: the recorded ones (checked at open and when
        read here), else — a weighted ledger whose budget is being fixed now — the rule's for it."""
        if self.conversion != _rdp.WEIGHTED:
            return None
        w = _weights_of(m, self.conversion, self.orders, self._where())
        return w if w is not None else _rdp.order_weights(budget.epsilon, budget.delta, self.orders,
                                                          self.weight_rule)

    def _fix_budget(self, conn: Connection, asked: Budget) -> None:
        """Record the lifetime budget and, under the weighted conversion, the order weights it fixes (a
        function of the budget alone, by the ledger's rule), in the caller's transaction."""
        rows = [{"key": "budget_epsilon", "value": repr(asked.epsilon)},
                {"key": "budget_delta", "value": repr(asked.delta)}]
        if self.conversion == _rdp.WEIGHTED:
            w = _rdp.order_weights(asked.epsilon, asked.delta, self.orders, self.weight_rule)
            rows += [{"key": "order_weights", "value": json.dumps([float(x) for x in w])},
                     {"key": "order_weights_rule", "value": self.weight_rule}]
        st.insert_ignore(conn, st.meta, rows)

    @classmethod
    def open(cls, settings) -> "Ledger":
        settings.private_dir.mkdir(parents=True, exist_ok=True)
        return cls(default_url(settings), _keys.load_or_create_key(settings.private_dir))

    def _where(self) -> str:
        return self.url.split("@")[-1] if "@" in self.url else self.url  # never print a password

    def dispose(self) -> None:
        self.engine.dispose()

    # --- keys and costs -------------------------------------------------------------------------------

    def person_key(self, person_id: str) -> str:
        if self._keyer is None:
            self._keyer = _keys.person_keyer(self._key)
        return self._keyer(person_id)

    def secret_key(self, secret_id: str) -> str:
        return _keys.secret_key(self._key, secret_id)

    def link_identities(self, accounts: Mapping[str, Iterable[str]]) -> int:
        """Record, before any charge, that each person id's accounts are that person (issue 26).

        `accounts`: person id (as the planner passes it to `reserve`) → the account ids it merges (the
        catalog's user ids and `metadata.account` forms, its `people.aliases` entries). Each account's
        pseudonym under the ledger's earlier identity rule (keys.legacy_person_key) and under today's
        rule, when it differs from the person's and the ledger has charged it, is linked to the person:
        its charges count for the person from then on (store.person_links). So an identity rule that
        merges more, or an alias added to a policy, never gives anyone a fresh budget. Returns the
        number of links added (a count of persons: private)."""
        want: dict[str, set[str]] = {}
        for pid, accts in accounts.items():
            pk = self.person_key(pid)
            for a in {pid, *accts}:
                for c in (_keys.legacy_person_key(self._key, a), _maybe_key(self._key, a)):
                    if c is not None and c != pk:
                        want.setdefault(c, set()).add(pk)
        if not want:
            return 0

        def work(conn: Connection) -> int:
            cands = sorted(want)
            known: set[str] = set()
            for i in range(0, len(cands), st._CHUNK):
                known |= {r.person_key for r in conn.execute(select(st.people.c.person_key).where(
                    st.people.c.person_key.in_(cands[i:i + st._CHUNK])))}
            have = {(r.linked_key, r.person_key) for r in conn.execute(select(
                st.person_links.c.linked_key, st.person_links.c.person_key))} if known else set()
            at = st.now()
            rows = [{"linked_key": c, "person_key": pk, "created_at": at}
                    for c in sorted(known) for pk in sorted(want[c]) if (c, pk) not in have]
            st.insert_ignore(conn, st.person_links, rows)
            if rows:     # closures changed: a reservation priced before this re-prices everyone (_Pricing)
                st.bump_state(conn, links=True)
            return len(rows)

        return st.transact(self.engine, work)

    def budget(self) -> Budget | None:
        with st.read_only(self.engine) as conn:
            return _budget_of(st.read_meta(conn))

    @property
    def order_weights(self) -> np.ndarray | None:
        """The weighted conversion's recorded δ shares (None: another conversion, or no budget yet)."""
        if self.conversion == _rdp.WEIGHTED and self._weights is None:
            with st.read_only(self.engine) as conn:
                self._weights = _weights_of(st.read_meta(conn), self.conversion, self.orders, self._where())
        return self._weights

    def filter_spec(self) -> tuple:
        """(orders, conversion, weights): what a schedule is fitted under (public constants of the ledger;
        until a weighted ledger's budget is fixed, its rule's name: that rule's shares for the policy's
        budget, what the ledger will record)."""
        w = self.order_weights
        if w is None:
            return tuple(self.orders), self.conversion, self.weight_rule
        return tuple(self.orders), self.conversion, tuple(float(x) for x in w)

    def rdp_budget(self, budget: Budget) -> np.ndarray:
        w = self.order_weights
        return _rdp.rdp_budget(budget.epsilon, budget.delta, self.orders, self.conversion,
                               self.weight_rule if w is None else w)

    # --- the one write that matters ---------------------------------------------------------------------

    def reserve(self, *, kind: str, mechanism: str, plan_sha256: str | None, params: Mapping,
                costs: Mapping[str, PersonCost], budget: Budget | None,
                secrets: Sequence[SecretCost] | None = None, one_per_plan: bool | None = None) -> Reservation:
        """Charge every admitted person and record who was retired, atomically, before training.

        A person is admitted iff some order α has spend_α + cost_α ≤ B_α (module rdp); the decision reads
        only the ledger and that person's own cost. Without any budget (neither the ledger nor the release
        has one) everyone is admitted and charged.

        `secrets` (secret-protection releases): in the same transaction, each secret is charged its KL iff
        its lifetime KL with this release stays within its class' budget d_KL(γ‖κ) (Lemma 3.2); otherwise
        it is dropped: the caller must train on none of the records holding it (docs/privacy/ledger.md).

        `one_per_plan` (default: the mechanism is a certified DP-SGD one, `_one_per_plan`): the plan's
        sha256 may have one release only. A second reservation of it — a concurrent trainer, or a rerun
        that lost its run folder's cache — raises PlanAlreadyReleased naming the first, inside the same
        serialized transaction, so nothing is charged twice. (PMixED builds and private selections key
        their releases on a policy or parameters that may legitimately be released again.)"""
        if one_per_plan is None:
            one_per_plan = _one_per_plan(mechanism)
        unique = bool(one_per_plan and plan_sha256)
        ids = list(costs)
        pkeys = [self.person_key(i) for i in ids]
        _one_key_each(ids, pkeys, "this release")
        cost_mat, curves = self._cost_matrix(costs, ids, "a cost curve")
        asked = Budget.parse(budget)
        sec = _check_secrets(secrets or ())
        skeys = [self.secret_key(c.secret_id) for c in sec]
        if len(set(skeys)) != len(skeys):
            raise VeilError("ledger: a secret is listed twice in this release (after canonicalisation)")
        new_replace = relation_of(mechanism) == "replace"
        # Priced outside the write lock (issue 27): the people's spend, their cost under it and the rows the
        # reservation will write; inside, only what changed since is re-read and re-priced (`_Pricing`).
        pr = self._snapshot(pkeys, cost_mat, mechanism, new_replace, curves)
        del cost_mat, curves
        rows_of, rate_of = _rows_and_rates(costs, ids)
        params_json = json.dumps(dict(params), sort_keys=True, default=float)

        def work(conn: Connection) -> tuple[int, np.ndarray, Budget | None, np.ndarray]:
            if unique:
                first = _plan_release(conn, str(plan_sha256))
                if first is not None:
                    raise PlanAlreadyReleased(str(plan_sha256), *first)
            m = st.read_meta(conn)
            have = _budget_of(m)
            if have is None and asked is not None:
                self._fix_budget(conn, asked)
                have = asked
            elif have is not None and asked is not None and have != asked:
                raise VeilError(f"ledger: its lifetime budget is ε={have.epsilon:g}, δ={have.delta:g} (fixed when "
                                f"it was first set); this release asks ε={asked.epsilon:g}, δ={asked.delta:g}. A "
                                "filter's budget cannot change: make the policy's lifetime_budget match")
            pr.refresh(conn)
            if have is None:
                ok = np.ones(len(pkeys), dtype=bool)
            else:
                cap = _rdp.rdp_budget(have.epsilon, have.delta, self.orders, self.conversion,
                                      self._filter_weights(m, have))
                ok = _rdp.admits_many(pr.spent, pr.charged, cap)
            at = st.now()
            rid = int(conn.execute(st.releases.insert().values(
                kind=kind, mechanism=mechanism, plan_sha256=plan_sha256, params=params_json,
                admitted=int(ok.sum()), retired=int((~ok).sum()), created_at=at)).inserted_primary_key[0])
            if unique:   # the database's own guard: a second row for this plan cannot commit
                conn.execute(st.plan_releases.insert().values(plan_sha256=str(plan_sha256), release_id=rid))
            sok = _reserve_secrets(conn, rid, sec, skeys)
            detail = {"admitted": int(ok.sum()), "retired": int((~ok).sum())}
            if sec:
                detail.update(secrets_charged=int(sok.sum()), secrets_dropped=int((~sok).sum()))
            conn.execute(st.events.insert().values(release_id=rid, status="reserved", at=at,
                                                   detail=json.dumps(detail)))
            pr.write(conn, rid, at, ok, rows_of, rate_of)
            return rid, ok, have, sok

        rid, ok, have, sok = st.transact(self.engine, work)
        return Reservation(release_id=rid, admitted=tuple(i for i, a in zip(ids, ok) if a),
                           retired=tuple(i for i, a in zip(ids, ok) if not a), budget=have, orders=self.orders,
                           secrets_charged=tuple(c.secret_id for c, a in zip(sec, sok) if a),
                           secrets_dropped=tuple(c.secret_id for c, a in zip(sec, sok) if not a))

    def _cost_matrix(self, costs: Mapping[str, PersonCost], ids: list[str], what: str
                     ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """The (people × orders) cost matrix, checked whole: one non-negative curve per person on the grid;
        and (distinct curves, each person's row in them). Pricing gives people with the same rates the
        same curve object (renyi.costs), so the curves are read once per distinct object, not per person."""
        n = len(self.orders)
        if not ids:
            return np.zeros((0, n)), (np.zeros((0, n)), np.zeros(0, dtype=np.int64))
        seen: dict[int, int] = {}
        objs: list = []

        def slot(c) -> int:
            r = c.rdp
            u = seen.get(id(r))
            if u is None:
                u = seen[id(r)] = len(objs)
                objs.append(r)      # held here: its id stays its own while `seen` is in use
            return u
        inv = np.fromiter((slot(costs[i]) for i in ids), dtype=np.int64, count=len(ids))
        try:
            uniq = np.array([np.asarray(r, dtype=float) for r in objs], dtype=float).reshape(len(objs), -1)
        except ValueError:
            uniq = None
        if uniq is None or uniq.shape != (len(objs), n) or np.any(np.isnan(uniq)) or np.any(uniq < 0):
            raise VeilError(f"ledger: {what} is not a non-negative curve on the ledger's orders")
        return uniq[inv], (uniq, inv)

    def _snapshot(self, pkeys: list[str], cost_mat: np.ndarray, mechanism: str, new_replace: bool,
                  curves: tuple[np.ndarray, np.ndarray] | None = None) -> "_Pricing":
        with st.read_only(self.engine) as conn:
            return _Pricing(self.orders, pkeys, cost_mat, mechanism, new_replace, conn, curves)

    def forecast(self, *, mechanism: str, costs: Mapping[str, PersonCost], budget: Budget | None = None) -> dict | None:
        """What the filter would do with releases costing `costs` (a plan's people), read now: per person
        how many such releases in a row they are admitted to, and how many the next one would retire.
        Priced and filtered exactly as `reserve` does (same spend, same replace conversion, same budget
        and conversion), so the next release's retirements are the count it reports. PRIVATE (counts and
        a spread over people): administrators only. None without a budget."""
        have = self.budget() or Budget.parse(budget)
        if have is None:
            return None
        ids = list(costs)
        pkeys = [self.person_key(i) for i in ids]
        n = len(self.orders)
        cost_mat = np.array([np.asarray(costs[i].rdp, dtype=float) for i in ids]).reshape(len(ids), n)
        pr = self._snapshot(pkeys, cost_mat, mechanism, relation_of(mechanism) == "replace")
        spent, charged = pr.spent, pr.charged
        cap = _rdp.rdp_budget(have.epsilon, have.delta, self.orders, self.conversion,
                              self.order_weights if self.budget() is not None else self.weight_rule)
        left = _rdp.releases_left(spent, charged, cap) if len(ids) else np.zeros(0)
        retire = int((~_rdp.admits_many(spent, charged, cap)).sum()) if len(ids) else 0

        def num(x: float) -> int | None:          # ∞ (a release that costs nothing) as None
            return None if not math.isfinite(x) else int(x)

        return {"budget": {"epsilon": have.epsilon, "delta": have.delta}, "people": len(ids),
                "releases_left_min": num(float(np.min(left))) if len(left) else None,
                "releases_left_median": (None if not len(left) or not math.isfinite(float(np.median(left)))
                                         else float(np.median(left))),
                "next_release_retires": retire}

    def charge_population(self, *, release_key: str, mechanism: str, costs: Mapping[str, PersonCost],
                          budget: Budget | None, params: Mapping) -> "PopulationCharge":
        """Charge a population estimate N̂ to everyone it counts, once per distinct N̂ (issue 22, cases 1, 2).

        N̂ is published with the plan, before any reservation, and counts every unit the plan trains on —
        including people the training reservation will later retire. So it is a release of its own (kind
        `population`), charged when it is first published: `release_key` names it (the planner's keyed
        digest of the counted population and the estimate's parameters, draws.annex); a second plan
        drawing the same N̂ publishes nothing new and is charged nothing. All or nothing: when someone
        counted cannot afford it under the filter, nothing is written and they are named
        (`refused`): the caller plans again without them, which draws fresh noise, before anything is
        published."""
        ids = list(costs)
        pkeys = [self.person_key(i) for i in ids]
        _one_key_each(ids, pkeys, "this population estimate")
        cost_mat, curves = self._cost_matrix(costs, ids, "a population cost curve")
        asked = Budget.parse(budget)
        key = f"population:{release_key}"[:64]
        pr = self._snapshot(pkeys, cost_mat, mechanism, False, curves)
        del cost_mat, curves
        rows_of, rate_of = _rows_and_rates(costs, ids)

        def work(conn: Connection) -> tuple[int | None, bool, np.ndarray]:
            old = conn.execute(select(st.releases.c.id).where(st.releases.c.kind == "population",
                                                              st.releases.c.plan_sha256 == key)).first()
            if old is not None:
                return int(old.id), False, np.ones(len(ids), dtype=bool)
            m = st.read_meta(conn)
            have = _budget_of(m)
            if have is None and asked is not None:
                self._fix_budget(conn, asked)
                have = asked
            elif have is not None and asked is not None and have != asked:
                raise VeilError(f"ledger: its lifetime budget is ε={have.epsilon:g}, δ={have.delta:g} (fixed when "
                                f"it was first set); this plan asks ε={asked.epsilon:g}, δ={asked.delta:g}. A "
                                "filter's budget cannot change: make the policy's lifetime_budget match")
            ok = np.ones(len(ids), dtype=bool)
            if have is not None:
                pr.refresh(conn)
                cap = _rdp.rdp_budget(have.epsilon, have.delta, self.orders, self.conversion,
                                      self._filter_weights(m, have))
                ok = _rdp.admits_many(pr.spent, pr.charged, cap)
                if not ok.all():
                    return None, False, ok
            else:
                pr.refresh(conn)
            at = st.now()
            rid = int(conn.execute(st.releases.insert().values(
                kind="population", mechanism=mechanism, plan_sha256=key,
                params=json.dumps(dict(params), sort_keys=True, default=float),
                admitted=len(ids), retired=0, created_at=at)).inserted_primary_key[0])
            conn.execute(st.events.insert().values(release_id=rid, status="reserved", at=at,
                                                   detail=json.dumps({"population": True, "admitted": len(ids)})))
            pr.write(conn, rid, at, ok, rows_of, rate_of)
            return rid, True, ok

        rid, new, ok = st.transact(self.engine, work)
        return PopulationCharge(release_id=rid, new=new, refused=tuple(i for i, a in zip(ids, ok) if not a))

    def record_post_processing(self, *, kind: str, release_key: str, of_release: int | None, params: Mapping,
                               detail: Mapping | None = None) -> int:
        """Record a release that is post-processing of an earlier one (a synthetic corpus sampled from a
        registered model: kind 'synthetic'). It charges nobody — no charge rows, admitted = retired = 0 —
        and is shown by `veil ledger` (`post_processing_releases`) with the release it post-processes, so
        the ledger lists every artifact that left, not only the ones that cost budget. Append-only like
        everything here: one release row and its `registered` event, in one transaction."""
        if kind not in POST_PROCESSING_KINDS:
            raise VeilError(f"ledger: {kind!r} is not a post-processing release kind "
                            f"({', '.join(POST_PROCESSING_KINDS)})")
        key = f"{kind}:{release_key}"[:64]

        def work(conn: Connection) -> int:
            if of_release is not None and conn.execute(select(st.releases.c.id).where(
                    st.releases.c.id == int(of_release))).first() is None:
                raise VeilError(f"ledger: no release {of_release} to post-process")
            at = st.now()
            rid = conn.execute(st.releases.insert().values(
                kind=kind, mechanism=kind, plan_sha256=key,
                params=json.dumps({**dict(params), "of_release": of_release}, sort_keys=True, default=str),
                admitted=0, retired=0, created_at=at)).inserted_primary_key[0]
            conn.execute(st.events.insert().values(release_id=rid, status="registered", at=at,
                                                   detail=json.dumps(dict(detail or {}), sort_keys=True,
                                                                     default=str)))
            st.record_release_curves(conn, rid, 0, set())
            return int(rid)
        return st.transact(self.engine, work)

    def post_processing_releases(self) -> list[dict]:
        """Every post-processing release (kind in POST_PROCESSING_KINDS) with its public parameters, oldest
        first. Names no person: what was released, from which release, when."""
        with st.read_only(self.engine) as conn:
            rows = conn.execute(select(st.releases).where(st.releases.c.kind.in_(POST_PROCESSING_KINDS))
                                .order_by(st.releases.c.id)).all()
        return [{"release_id": int(r.id), "kind": r.kind, "created_at": r.created_at, **json.loads(r.params)}
                for r in rows]

    def population_release(self, release_key: str) -> int | None:
        """The ledger release of this population estimate, if it was charged."""
        key = f"population:{release_key}"[:64]
        with st.read_only(self.engine) as conn:
            r = conn.execute(select(st.releases.c.id).where(st.releases.c.kind == "population",
                                                            st.releases.c.plan_sha256 == key)).first()
        return None if r is None else int(r.id)

    def record(self, release_id: int, status: str, **detail) -> None:
        """Append a status event; the charge is untouched whatever the status."""
        if status not in st.STATUSES:
            raise VeilError(f"ledger: status {status!r} is not one of {', '.join(st.STATUSES)}")

        def work(conn: Connection) -> None:
            if conn.execute(select(st.releases.c.id).where(st.releases.c.id == int(release_id))).first() is None:
                raise VeilError(f"ledger: no release {release_id}")
            conn.execute(st.events.insert().values(release_id=int(release_id), status=status, at=st.now(),
                                                   detail=json.dumps(detail, sort_keys=True, default=str)))
        st.transact(self.engine, work)

    def status(self, release_id: int) -> str | None:
        with st.read_only(self.engine) as conn:
            r = conn.execute(select(st.events.c.status).where(st.events.c.release_id == int(release_id))
                             .order_by(st.events.c.id.desc()).limit(1)).first()
        return None if r is None else r.status

    def events(self, release_id: int) -> list[dict]:
        with st.read_only(self.engine) as conn:
            rows = conn.execute(select(st.events).where(st.events.c.release_id == int(release_id))
                                .order_by(st.events.c.id)).all()
        return [{"status": r.status, "at": r.at, **json.loads(r.detail)} for r in rows]

    def plan_release(self, plan_sha256: str) -> tuple[int, str | None] | None:
        """(release id, its status) of the plan's release — the first, for ledgers that hold several
        from before one release per plan was enforced — or None."""
        with st.read_only(self.engine) as conn:
            return _plan_release(conn, plan_sha256)

    def reservation_of(self, release_id: int, person_ids: Sequence[str],
                       secret_ids: Sequence[str] = ()) -> tuple[list[str], list[str]]:
        """(retired person ids, dropped secret ids) of a release, among the ids given: what a reserving
        process knew when it committed, rebuilt from the ledger (a crash after the commit loses the
        run folder's copy, never the ledger's). Private: ids."""
        pk = {self.person_key(i): i for i in person_ids}
        sk = {self.secret_key(i): i for i in secret_ids}
        with st.read_only(self.engine) as conn:
            ret = {r.person_key for r in conn.execute(select(st.exclusions.c.person_key)
                                                       .where(st.exclusions.c.release_id == int(release_id)))}
            drop = {r.secret_key for r in conn.execute(select(st.secret_drops.c.secret_key)
                                                        .where(st.secret_drops.c.release_id == int(release_id)))}
        return sorted(pk[k] for k in ret if k in pk), sorted(sk[k] for k in drop if k in sk)

    def releases_for_plan(self, plan_sha256: str) -> list[int]:
        with st.read_only(self.engine) as conn:
            return [r.id for r in conn.execute(select(st.releases.c.id).where(
                st.releases.c.plan_sha256 == plan_sha256).order_by(st.releases.c.id))]

    # --- reading spend ----------------------------------------------------------------------------------

    def spend(self, person_ids: list[str]) -> dict[str, np.ndarray]:
        """RDP spend per person id under the relation their releases need (`effective_spend`; zeros for
        someone never charged). Private."""
        keys = [self.person_key(i) for i in person_ids]
        pr = self._snapshot(keys, np.zeros((len(keys), len(self.orders))), "", False)
        return {i: pr.spent[j].copy() for j, i in enumerate(person_ids)}

    def _read_weights(self, m: Mapping[str, str]) -> np.ndarray | None:
        return _weights_of(m, self.conversion, self.orders, self._where())

    def _people(self, conn: Connection | None = None) -> "_People":
        """Every person's effective spend, charges and retirements (linked pseudonyms folded in), from the
        running spend and two GROUP BYs; cached until the ledger's seq moves (every write that changes any
        of them moves it). `conn`: read in that connection's snapshot (the caller reads more in it)."""
        if conn is None:
            with st.read_only(self.engine) as own:
                return self._people(own)
        seq = st.read_state(conn)[0]
        got = getattr(self, "_people_cache", None)
        if got is not None and got.seq == seq:
            return got
        with st.no_gc():
            got = _People.read(conn, self.orders, seq)
        self._people_cache = got
        return got

    def person_table(self) -> tuple[list[str], np.ndarray | None, np.ndarray, np.ndarray]:
        """`person_rows` as columns (pseudonyms; ε(δ) or None without a budget; releases charged; times
        retired), without a Python object per person. PRIVATE."""
        with st.read_only(self.engine) as conn:
            m = st.read_meta(conn)
        ps = self._people()
        b = _budget_of(m)
        delta = b.delta if b else None
        eps = (ps.epsilon(delta, self.orders, self.conversion, self._read_weights(m))
               if (delta and len(ps.keys)) else None)
        return ps.keys, eps, ps.charges, ps.retired

    def person_rows(self) -> list[dict]:
        """Per person: pseudonym, RDP spend as ε(δ), releases charged, times retired. PRIVATE — write it
        only under the private area."""
        keys, eps, charges, retired = self.person_table()
        el = [None] * len(keys) if eps is None else eps.tolist()
        return [{"person_key": k, "epsilon": e, "releases_charged": c, "times_retired": t}
                for k, e, c, t in zip(keys, el, charges.tolist(), retired.tolist())]

    def secret_spend(self, secret_ids: list[str]) -> dict[str, float]:
        """Lifetime KL per secret id (0 for a secret never charged). Private: the ids carry values."""
        keys = [self.secret_key(i) for i in secret_ids]
        with st.read_only(self.engine) as conn:
            s = st.secret_spend_of(conn, keys)
        return {i: s.get(k, 0.0) for i, k in zip(secret_ids, keys)}

    def secret_rows(self) -> list[dict]:
        """Per secret: pseudonym, class, lifetime KL and γ(κ, KL), releases charged, times dropped.
        PRIVATE (a pseudonym's history) — write it only under the private area."""
        from components.accounting.secrets import gamma_from_kl  # startup

        with st.read_only(self.engine) as conn:
            classes = {r.secret_class: (float(r.kappa), float(r.gamma)) for r in conn.execute(select(st.secret_classes))}
            ch = conn.execute(select(st.secret_charges.c.secret_key, st.secret_charges.c.secret_class,
                                     st.secret_charges.c.kl)).all()
            dr = conn.execute(select(st.secret_drops.c.secret_key, st.secret_drops.c.secret_class)).all()
        rows: dict[str, dict] = {}
        for r in ch:
            d = rows.setdefault(r.secret_key, {"secret_key": r.secret_key, "secret_class": r.secret_class,
                                               "lifetime_kl": 0.0, "releases_charged": 0, "times_dropped": 0})
            d["lifetime_kl"] += float(r.kl)
            d["releases_charged"] += 1
        for r in dr:
            rows.setdefault(r.secret_key, {"secret_key": r.secret_key, "secret_class": r.secret_class,
                                           "lifetime_kl": 0.0, "releases_charged": 0,
                                           "times_dropped": 0})["times_dropped"] += 1
        for d in rows.values():
            d["lifetime_gamma"] = gamma_from_kl(d["lifetime_kl"], classes[d["secret_class"]][0])
        return [rows[k] for k in sorted(rows)]

    def secret_summary(self) -> dict:
        """Per class: κ, γ target, its KL budget, secrets charged, max lifetime KL and γ, secrets dropped
        at least once. Aggregates only."""
        from components.accounting.secrets import gamma_from_kl, kl_budget  # startup

        with st.read_only(self.engine) as conn:
            classes = {r.secret_class: (float(r.kappa), float(r.gamma)) for r in conn.execute(select(st.secret_classes))}
        rows = self.secret_rows()
        out = {}
        for cls in sorted(classes):
            kappa, gamma = classes[cls]
            mine = [r for r in rows if r["secret_class"] == cls]
            charged = [r for r in mine if r["releases_charged"]]
            max_kl = max((r["lifetime_kl"] for r in charged), default=0.0)
            out[cls] = {"kappa": kappa, "gamma_target": gamma, "kl_budget": kl_budget(kappa, gamma),
                        "secrets_charged": len(charged), "secrets_dropped": sum(1 for r in mine if r["times_dropped"]),
                        "max_lifetime_kl": max_kl, "max_lifetime_gamma": gamma_from_kl(max_kl, kappa)}
        return out

    def summary(self) -> dict:
        """Aggregates only: safe to print."""
        with st.read_only(self.engine) as conn:
            m = st.read_meta(conn)
            by_mech = conn.execute(select(st.releases.c.mechanism, func.count())
                                   .group_by(st.releases.c.mechanism)).all()
        ps = self._people()
        b = _budget_of(m)
        spend = {"max_epsilon": None, "median_epsilon": None, "min_epsilon": None}
        if b is not None and len(ps.keys):
            eps = ps.epsilon(b.delta, self.orders, self.conversion, self._read_weights(m))
            spend = {"max_epsilon": float(eps.max()), "median_epsilon": float(np.median(eps)),
                     "min_epsilon": float(eps.min())}
        uncovered = sum(int(c) for mech, c in by_mech if not _person_claim(mech))
        return {"budget": None if b is None else {"epsilon": b.epsilon, "delta": b.delta},
                "people": len(ps.keys), "retired": int((ps.retired > 0).sum()),
                "releases": sum(int(c) for _, c in by_mech),
                "persons_not_covered": {
                    "releases": uncovered,
                    "statement": ("every release is charged to the people it trained on" if not uncovered else
                                  f"{uncovered} release(s) (secret protection) make no person-level claim: they "
                                  "charge nobody, and the per-person spend and budget here do not bound what they "
                                  "reveal about the people they trained on (their secrets are bounded per secret, "
                                  "below)")},
                "spend": spend, "orders": list(self.orders), "conversion": self.conversion,
                "order_weights": None if (w := self._read_weights(m)) is None else [float(x) for x in w],
                "order_weights_rule": self.weight_rule,
                "secrets": self.secret_summary(),
                "spend_definition": "per person, min over the ledger's orders α of RDP spend_α + pad_α (its conversion: "
                                    "union-markov log(|A|/δ)/(α−1); union-hockey-stick (log(|A|/δ) − log α)/(α−1) + "
                                    "log(1 − 1/α); weighted-hockey-stick (log(1/(w_α δ)) − log α)/(α−1) + "
                                    "log(1 − 1/α), the order weights w fixed by the budget): "
                                    "the smallest budget ε whose Rényi filter this spend meets (the guarantee is the "
                                    "budget itself)",
                "secrets_definition": "per secret class: lifetime KL of a secret = sum of its KL over the releases "
                                      "that trained on its records (chain rule); γ = Lemma 3.2's posterior bound "
                                      "for the class' prior κ. The guarantee is the class' γ target"}

    def burn_down(self) -> list[dict]:
        """After each release: max, median and min ε(δ) over the people known so far. Aggregates only.

        Without identity links, people are kept in groups of equal history (`_burn_down_groups`), so a
        release costs O(its rows), and nothing per person when it is one curve to everyone known less
        those it retired (`ledger_release_curves` says so in O(1); a release without that record is
        scanned: `store.one_curve_release`) — the spends and ε are computed once per group. With links,
        every person's spend is a row (`_burn_down_rows`). Both add the same curves in the same order to
        the same starting rows, so their figures are the same floats."""
        with st.read_only(self.engine) as conn:
            m = st.read_meta(conn)
            b = _budget_of(m)
            rel = conn.execute(select(st.releases.c.id, st.releases.c.mechanism).order_by(st.releases.c.id)).all()
            if b is None or not rel:
                return []
            ps = self._people(conn)      # the same snapshot as the releases' rows read below
            retired_by = dict(conn.execute(select(st.exclusions.c.release_id, func.count())
                                           .group_by(st.exclusions.c.release_id)).all())
            recorded = st.release_curves_of(conn)
            weights = self._read_weights(m)
            if ps.owner is None:
                return self._burn_down_groups(conn, rel, ps, b, weights, retired_by, recorded)
            return self._burn_down_rows(conn, rel, ps, b, weights, retired_by)

    def _one_curve(self, conn: Connection, rid: int, ps: "_People", known_count: int, retired_by: Mapping,
                   recorded: Mapping) -> tuple[np.ndarray, list[int]] | None:
        """(the curve, the retired people's indices) when release `rid` charged exactly the people known
        by then less those it retired, all the same curve (their counts say so: each charged or retired
        person has a people row from that release or before, and no one is both); None otherwise."""
        one = st.one_curve_release(conn, rid, len(self.orders), recorded)
        if one is None:
            return None
        ret = st.retired_keys(conn, rid) if retired_by.get(rid) else []
        if one[0] + len(ret) != known_count or any(k not in ps.idx for k in ret):
            return None
        return (one[1] if one[0] else None), [ps.idx[k] for k in ret]

    def _burn_down_groups(self, conn: Connection, rel, ps: "_People", b: Budget, weights, retired_by: Mapping,
                          recorded: Mapping) -> list[dict]:
        """burn_down without links: people in groups of equal history (first release; then, per release,
        charged with which curve or not), one spend row per group. A one-curve release moves no one
        between groups (its retired people are split off first); any other release regroups the people
        it charged by (group, curve). ε and the max/median/min are computed per group, weighted by size."""
        n = len(self.orders)
        firsts, gid = np.unique(ps.first, return_inverse=True)
        gid = np.asarray(gid, dtype=np.int64).reshape(-1)
        g_first = firsts.astype(np.int64)
        ar, rep = np.zeros((len(firsts), n)), np.zeros((len(firsts), n))
        has_rep = np.zeros(len(firsts), dtype=bool)

        def grow(src: np.ndarray) -> np.ndarray:      # new groups copying groups `src`; their ids
            nonlocal ar, rep, has_rep, g_first
            base = len(g_first)
            ar, rep = np.concatenate([ar, ar[src]]), np.concatenate([rep, rep[src]])
            has_rep, g_first = np.concatenate([has_rep, has_rep[src]]), np.concatenate([g_first, g_first[src]])
            return base + np.arange(len(src), dtype=np.int64)

        out = []
        for r in rel:
            replace = relation_of(r.mechanism) == "replace"
            size = np.bincount(gid, minlength=len(g_first))
            known_count = int(size[g_first <= r.id].sum())
            one = self._one_curve(conn, r.id, ps, known_count, retired_by, recorded)
            if one is not None:
                curve, ret = one
                skip = np.zeros(len(g_first), dtype=bool)
                if ret:                     # the retired leave their groups for copies that are not charged
                    ri = np.array(ret, dtype=np.int64)
                    src, inv = np.unique(gid[ri], return_inverse=True)
                    new = grow(src)
                    gid[ri] = new[np.asarray(inv).reshape(-1)]
                    skip = np.concatenate([skip, np.ones(len(new), dtype=bool)])
                if curve is not None:
                    charged = (g_first <= r.id) & ~skip
                    into = rep if replace else ar
                    into[charged] += curve
                    if replace:
                        has_rep[charged] = True
            else:
                ck, cid, uniq = st.charge_curve_ids(conn, r.id, n)
                if ck:
                    tj = np.fromiter(map(ps.idx.__getitem__, ck), dtype=np.int64, count=len(ck))
                    del ck
                    pair = gid[tj] * len(uniq) + cid
                    up, inv = np.unique(pair, return_inverse=True)
                    new = grow(up // len(uniq))
                    into = rep if replace else ar
                    into[new] += uniq[up % len(uniq)]
                    if replace:
                        has_rep[new] = True
                    gid[tj] = new[np.asarray(inv).reshape(-1)]
                    del tj, pair, inv
            size = np.bincount(gid, minlength=len(g_first))
            live = np.flatnonzero((g_first <= r.id) & (size > 0))
            spend = ar[live]
            hr = has_rep[live]
            if hr.any():
                spend[hr] = rep[live][hr] + _rdp.replace_of_add_remove(ar[live][hr], self.orders)
            e = (np.asarray(_rdp.epsilon_of_spend(spend, b.delta, self.orders, self.conversion, weights),
                            dtype=float).reshape(-1) if len(live) else np.zeros(0))
            w = size[live]
            people = int(w.sum())
            out.append({"release_id": r.id, "mechanism": r.mechanism, "people": people,
                        "retired": int(retired_by.get(r.id, 0)),
                        "max_epsilon": float(np.max(e)) if len(e) else 0.0,
                        "median_epsilon": _weighted_median(e, w) if len(e) else 0.0,
                        "min_epsilon": float(np.min(e)) if len(e) else 0.0})
            if len(g_first) > 4 * max(1, len(live)) + 64:   # drop empty groups now and then
                keep, gid = np.unique(gid, return_inverse=True)
                gid = np.asarray(gid, dtype=np.int64).reshape(-1)
                ar, rep, has_rep, g_first = ar[keep], rep[keep], has_rep[keep], g_first[keep]
        return out

    def _burn_down_rows(self, conn: Connection, rel, ps: "_People", b: Budget, weights,
                        retired_by: Mapping) -> list[dict]:
        """burn_down with identity links: a spend row per listed person; each release's rows are read and
        added to every person they count for (`_People.targets`: a linked key counts for several)."""
        n = len(self.orders)
        ar, rep = np.zeros((len(ps.keys), n)), None
        has_rep = np.zeros(len(ps.keys), dtype=bool)
        out = []
        for r in rel:
            replace = relation_of(r.mechanism) == "replace"
            if replace and rep is None:
                rep = np.zeros_like(ar)
            into = rep if replace else ar
            known = ps.first <= r.id
            # with links, a retired or charged key may count for several people: read the rows
            ck, mat = st.charge_rows(conn, r.id, n)
            if ck:
                tj, ri = ps.targets(ck)
                del ck
                np.add.at(into, tj, mat[ri])
                if replace:
                    has_rep[tj] = True
            del mat
            if has_rep.any():
                spend = ar.copy()
                spend[has_rep] = rep[has_rep] + _rdp.replace_of_add_remove(ar[has_rep], self.orders)
                spend = spend[known]
            else:
                spend = ar if known.all() else ar[known]
            e = (_rdp.epsilon_of_spend(spend, b.delta, self.orders, self.conversion, weights)
                 if known.any() else np.zeros(0))
            del spend
            out.append({"release_id": r.id, "mechanism": r.mechanism, "people": int(known.sum()),
                        "retired": int(retired_by.get(r.id, 0)),
                        "max_epsilon": float(np.max(e)) if len(e) else 0.0,
                        "median_epsilon": float(np.median(e)) if len(e) else 0.0,
                        "min_epsilon": float(np.min(e)) if len(e) else 0.0})
        return out


def _weighted_median(e: np.ndarray, w: np.ndarray) -> float:
    """np.median of the values `e` each repeated `w` times (w ≥ 1), without repeating them: the middle
    one or the mean of the middle two of the sorted values, as np.median takes them (NaN if any is)."""
    if np.isnan(e).any():
        return float("nan")
    order = np.argsort(e, kind="stable")
    cum = np.cumsum(w[order])
    total = int(cum[-1])

    def at(i: int) -> float:         # the i-th (0-based) of the sorted repeated values
        return e[order[int(np.searchsorted(cum, i, side="right"))]]
    mid = np.array([at(total // 2)] if total % 2 else [at(total // 2 - 1), at(total // 2)], dtype=float)
    return float(np.mean(mid))


def _maybe_key(key: bytes, person_id) -> str | None:
    try:
        return _keys.person_key(key, person_id)
    except VeilError:       # an id that is nothing under the rule names nobody
        return None


def _one_key_each(ids: list[str], pkeys: list[str], what: str) -> None:
    """Refuse ids that are one person under the identity rule: charging each would charge one
    person twice in one release, and the release's per-person bound would not hold for them. The
    planner applies the same rule (components.core.identity), so only a caller that bypassed it gets
    here. The ids go to the operator's terminal only (`operator_detail`), never to a log."""
    seen: dict[str, str] = {}
    pairs = []
    for i, k in zip(ids, pkeys):
        if k in seen:
            pairs.append((seen[k], i))
        else:
            seen[k] = i
    if not pairs:
        return
    shown = "; ".join(f"{a!r} and {b!r}" for a, b in pairs[:5]) + (f"; and {len(pairs) - 5} more" if len(pairs) > 5
                                                                     else "")
    raise VeilError(f"ledger: {len(pairs)} pair(s) of person ids in {what} are one person under the identity rule "
                    f"({_identity.RULE}: case, spacing, Unicode form, e-mail address form); nothing was charged. "
                    "Plan again with this Veil (`veil plan`, `veil pmixed build`), whose planner merges them; ids "
                    "that come from elsewhere: merge their rows, or list them as one person under the policy's "
                    "spec.people.aliases and plan again",
                    operator_detail=f"the same person: {shown}. Policy fix: spec.people.aliases: "
                                    f"[[{pairs[0][0]!r}, {pairs[0][1]!r}]]")


def _fold_links(people: list[str], first: dict, links: dict[str, set[str]]):
    """The views' people with linked pseudonyms folded in: each listed person's charges and retirements
    include those of every key linked into it (transitively; a key linked into two people counts for
    both, as in `reserve`). A key linked into another is not a person of its own — unless its links
    lead only back into a cycle, whose smallest key then stands for it. Returns (listed people, key →
    the listed people its rows count for, listed person → first release)."""
    pset = set(people)
    into: dict[str, set[str]] = {}
    for linked, targets in links.items():
        for t in targets:
            into.setdefault(t, set()).add(linked)

    def reach(k: str, edges) -> set[str]:
        got, stack = {k}, [k]
        while stack:
            for x in edges.get(stack.pop(), ()):
                if x not in got:
                    got.add(x)
                    stack.append(x)
        return got

    listed = [k for k in people if k not in links]
    lset = set(listed)
    for k in sorted(pset - lset):
        ahead = reach(k, links)
        if not ahead & lset:
            head = min(x for x in ahead if x in pset)
            if head not in lset:
                listed.append(head)
                lset.add(head)
    listed.sort()
    members = {k: {x for x in reach(k, into) if x in pset or x == k} for k in listed}
    owner: dict[str, list[str]] = {}
    for k, ms in members.items():
        for x in ms:
            owner.setdefault(x, []).append(k)
    first2 = {k: min(first[x] for x in members[k] if x in first) for k in listed}
    return listed, owner, first2


@dataclass
class _People:
    """Every listed person (linked pseudonyms folded in: `_fold_links`) with their effective spend, number of
    charges and of retirements, and first release: what `veil ledger`'s views read. From the running spend
    (one row per pseudonym and mechanism), not from the charges. The spends are kept as distinct rows `u`
    and each person's row in them `g` (people charged alike share one: 10⁶ people, a few rows), so ε is
    converted once per distinct spend (`epsilon`)."""
    seq: int
    keys: list
    u: np.ndarray
    g: np.ndarray
    charges: np.ndarray
    retired: np.ndarray
    first: np.ndarray
    idx: dict
    owner: dict | None

    @property
    def spend(self) -> np.ndarray:
        """The (people × orders) spend matrix."""
        return self.u[self.g]

    def epsilon(self, delta: float, orders, conversion: str, weights) -> np.ndarray:
        """Each person's ε(δ) (rdp.epsilon_of_spend, row by row: the same floats as on the whole matrix),
        cached for these arguments."""
        key = (float(delta), tuple(orders), conversion, None if weights is None else np.asarray(weights).tobytes())
        got = getattr(self, "_eps", None)
        if got is None or got[0] != key:
            e = np.asarray(_rdp.epsilon_of_spend(self.u, delta, orders, conversion, weights), dtype=float).reshape(-1)
            got = self._eps = (key, e[self.g])
        return got[1]

    def targets(self, row_keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(listed person index, row index) pairs for rows keyed by pseudonym: one per row, or, with links,
        one per person the row's key counts for."""
        tj, ri = [], []
        if self.owner is None:
            return (np.fromiter(map(self.idx.__getitem__, row_keys), dtype=np.int64, count=len(row_keys)),
                    np.arange(len(row_keys)))
        for i, k in enumerate(row_keys):
            for o in self.owner.get(k, ()):
                tj.append(self.idx[o])
                ri.append(i)
        return np.array(tj, dtype=np.int64), np.array(ri, dtype=np.int64)

    @classmethod
    def read(cls, conn: Connection, orders, seq: int) -> "_People":
        n = len(orders)
        keys, firsts = st.people_columns(conn)
        links = st.read_links(conn)
        if links:
            keys, owner, first = _fold_links(keys, dict(zip(keys, firsts)), links)
            firsts = [first[k] for k in keys]
        else:
            owner = None
        p = len(keys)
        idx = dict(zip(keys, range(p)))
        out = cls(seq, keys, np.zeros((1, n)), np.zeros(p, dtype=np.int64), np.zeros(p, dtype=np.int64),
                  np.zeros(p, dtype=np.int64), np.array(firsts, dtype=np.int64), idx, owner)
        del firsts
        ks, mid, mechs, uniq, gid, cnt = st.spend_table(conn, n)
        tj, ri = out.targets(ks)
        del ks
        rep_of = np.array([relation_of(mm) == "replace" for mm in mechs], dtype=bool)
        rep_row = rep_of[mid] if len(mid) else np.zeros(0, dtype=bool)
        np.add.at(out.charges, tj, cnt[ri])
        if owner is None and (not len(tj) or np.bincount(tj, minlength=p).max() <= 1):
            # one running-spend row per person at most: their spend is a function of (curve, relation)
            # alone; each distinct pair is computed once, as the row-by-row sum below would compute it
            pair, inv = np.unique(gid * 2 + rep_row, return_inverse=True)
            c, rp = pair // 2, (pair % 2).astype(bool)
            ar, rep = np.zeros((len(pair) + 1, n)), np.zeros((len(pair) + 1, n))
            ar[:-1][~rp] += uniq[c[~rp]]
            rep[:-1][rp] += uniq[c[rp]]
            u = ar
            hr = np.concatenate([rp, [False]])
            if hr.any():
                u[hr] = rep[hr] + _rdp.replace_of_add_remove(ar[hr], orders)
            out.u = u                               # the last row: nobody charged (all retired): zero
            out.g = np.full(p, len(pair), dtype=np.int64)
            out.g[tj] = np.asarray(inv, dtype=np.int64).reshape(-1)
        else:
            mat = uniq[gid]
            del gid
            ar, rep = np.zeros((p, n)), np.zeros((p, n))
            has_rep = np.zeros(p, dtype=bool)
            sel = rep_row[ri]
            np.add.at(ar, tj[~sel], mat[ri[~sel]])
            np.add.at(rep, tj[sel], mat[ri[sel]])
            has_rep[tj[sel]] = True
            del mat
            if has_rep.any():
                ar[has_rep] = rep[has_rep] + _rdp.replace_of_add_remove(ar[has_rep], orders)
            out.u, out.g = ar, np.arange(p, dtype=np.int64)
        ret = conn.execute(select(st.exclusions.c.person_key, func.count()).group_by(st.exclusions.c.person_key)).all()
        if ret:
            rj, rri = out.targets([r[0] for r in ret])
            np.add.at(out.retired, rj, np.array([int(r[1]) for r in ret], dtype=np.int64)[rri])
        return out


class _Pricing:
    """One release's pricing, computed outside the write lock and checked inside it (issue 27).

    Made from a read: the ledger's seq FIRST, then the identity links, then the running-spend rows of the
    release's people and of every pseudonym linked into them. Whatever a writer commits after that seq
    read carries a larger seq (`ledger_spend.seq`, `ledger_state.links_seq`), so `refresh`, inside the
    reserving transaction, re-reads exactly what may have moved: nothing when the seq is unchanged (O(1)),
    every person whose own or linked rows moved, or everyone when links were added. The decision
    itself (`admits_many`, against the budget read inside the transaction) and the writes happen there.

    Per person j: `spent` (effective spend, `effective_spend`), `charged` (the cost under it: converted
    by `replace_of_add_remove` for people read under the replace relation when this release is
    add/remove), `prev_count` and the new running-spend row of (their own key, this mechanism): what it held plus this
    release's cost, `known`
    (their key has a running-spend row, so `ledger_people` holds it already)."""

    def __init__(self, orders, pkeys: list[str], cost: np.ndarray, mechanism: str, new_replace: bool,
                 conn: Connection, curves: tuple[np.ndarray, np.ndarray] | None = None):
        self.orders, self.pkeys, self.cost, self.mechanism = orders, pkeys, cost, mechanism
        self.new_replace = new_replace
        # `curves`: (distinct cost curves, each person's row in them) when the caller has them (_cost_matrix):
        # the charge rows then share one encoded curve per distinct curve instead of one bytes per person
        self.curves = curves
        n, k = len(pkeys), len(orders)
        self.idx = {key: j for j, key in enumerate(pkeys)}
        # rows are written in key order: each B-tree keyed by pseudonym then fills page by page instead of
        # at random places (pseudonyms are uniform hashes), which SQLite's page cache rewards
        self.order = np.array(sorted(range(n), key=pkeys.__getitem__), dtype=np.int64)
        self.seq, _ = st.read_state(conn)
        self.spent = np.zeros((n, k))
        self.charged = cost
        self.prev_count = np.zeros(n, dtype=np.int64)
        self.known = np.zeros(n, dtype=bool)
        self.new_spend = np.zeros((n, k))   # each person's (own key, this mechanism) running spend after it
        self._price(conn, None)

    def _closures(self, conn: Connection) -> None:
        """owners: pseudonym linked into one of our people → their indices (transitively: `linked_closure`)."""
        into: dict[str, set[str]] = {}
        for linked, targets in st.read_links(conn).items():
            for t in targets:
                into.setdefault(t, set()).add(linked)
        self.owners: dict[str, list[int]] = {}
        for t in into:
            j = self.idx.get(t)
            if j is None:
                continue
            got, stack = {t}, [t]
            while stack:
                for x in into.get(stack.pop(), ()):
                    if x not in got:
                        got.add(x)
                        stack.append(x)
            for x in got - {t}:
                self.owners.setdefault(x, []).append(j)

    def _price(self, conn: Connection, sel: np.ndarray | None) -> None:
        """(Re)compute the people `sel` (indices; None: everyone, links re-read too) from the rows now.
        Per spend row, not per person, in Python: one dict lookup; the rest is array arithmetic."""
        n, k = len(self.pkeys), len(self.orders)
        full = sel is None
        if full:
            self._closures(conn)
            sel = np.arange(n)
            wanted = (self.idx.keys() | self.owners.keys()) if self.owners else self.idx.keys()
        else:
            selset = set(sel.tolist())
            wanted = {self.pkeys[j] for j in selset}
            wanted.update(x for x, js in self.owners.items() if any(j in selset for j in js))
        m = len(sel)
        loc = np.full(n, -1, dtype=np.int64)
        loc[sel] = np.arange(m)
        ks, ms, mat, cnt = st.spend_rows(conn, wanted, k)
        idx = self.idx
        own = np.fromiter((idx.get(x, -1) for x in ks), dtype=np.int64, count=len(ks))
        hit = own >= 0
        hit[hit] = loc[own[hit]] >= 0
        ri = np.flatnonzero(hit)                   # rows of our people's own keys, and where they go
        tl = loc[own[ri]]
        kn = np.zeros(m, dtype=bool)
        kn[tl] = True
        rel = {mm: relation_of(mm) == "replace" for mm in set(ms)}
        row_rep = np.fromiter((rel[mm] for mm in ms), dtype=bool, count=len(ms))
        row_mine = np.fromiter((mm == self.mechanism for mm in ms), dtype=bool, count=len(ms))
        same = ri[row_mine[ri]]                    # (own key, this mechanism): one row per person at most
        pc = np.zeros(m, dtype=np.int64)
        pc[loc[own[same]]] = cnt[same]
        new_spend = self.cost[sel]                 # a copy (fancy index); + what the row held
        new_spend[loc[own[same]]] += mat[same]
        if self.owners:                            # linked keys count for their owners too, in row order
            et, er = [], []
            for i, key in enumerate(ks):
                for o in self.owners.get(key, ()):
                    if loc[o] >= 0:
                        et.append(int(loc[o]))
                        er.append(i)
            tl = np.concatenate([tl, np.array(et, dtype=np.int64)])
            ri = np.concatenate([ri, np.array(er, dtype=np.int64)])
            perm = np.argsort(ri, kind="stable")   # each row's own target before its owners, rows in order
            tl, ri = tl[perm], ri[perm]
        rep_row = row_rep[ri]
        ar = np.zeros((m, k))
        np.add.at(ar, tl[~rep_row], mat[ri[~rep_row]])
        has_rep = np.zeros(m, dtype=bool)
        if rep_row.any():
            rep = np.zeros((m, k))
            np.add.at(rep, tl[rep_row], mat[ri[rep_row]])
            has_rep[tl[rep_row]] = True
        del mat
        flag = has_rep | self.new_replace
        spent = ar
        if flag.any():
            spent[flag] = (rep[flag] if has_rep.any() else 0.0) + _rdp.replace_of_add_remove(ar[flag], self.orders)
        if full:
            self.spent = spent
        else:
            self.spent[sel] = spent
        conv = has_rep & (not self.new_replace)
        if conv.any():
            if self.charged is self.cost:
                self.charged = self.cost.copy()
            self.charged[sel[conv]] = _rdp.replace_of_add_remove(self.cost[sel[conv]], self.orders)
        if self.charged is not self.cost:
            keep = sel[~conv]
            self.charged[keep] = self.cost[keep]
        self.prev_count[sel], self.known[sel] = pc, kn
        if full:
            self.new_spend = new_spend
        else:
            self.new_spend[sel] = new_spend

    def refresh(self, conn: Connection) -> None:
        """Inside the reserving transaction: re-price whoever's rows moved since the snapshot."""
        seq, links_seq = st.read_state(conn)
        if seq == self.seq:
            return
        if links_seq > self.seq:
            self.seq = seq
            self._price(conn, None)
            return
        moved = [r.person_key for r in conn.execute(select(st.spend.c.person_key).where(st.spend.c.seq > self.seq))]
        self.seq = seq
        hit: set[int] = set()
        for key in moved:
            j = self.idx.get(key)
            if j is not None:
                hit.add(j)
            hit.update(self.owners.get(key, ()))
        if hit:
            self._price(conn, np.array(sorted(hit), dtype=np.int64))

    def _charge_blobs(self, part: np.ndarray) -> list[bytes]:
        if self.curves is None:
            return st.encode_curves(self.cost[part])
        uniq, inv = self.curves
        if not hasattr(self, "_curve_blobs"):
            self._curve_blobs = st.encode_curves(uniq)
        cb = self._curve_blobs
        return [cb[i] for i in inv[part].tolist()]

    def write(self, conn: Connection, rid: int, at: str, ok: np.ndarray, rows_of: np.ndarray,
              rate_of: np.ndarray) -> None:
        """The release's people, charges, running spends and retirements, in bulk (store.bulk), in
        chunks of people (each chunk's rows built as columns, encoded, written and dropped)."""
        seq = st.bump_state(conn)
        pk, o = self.pkeys, self.order
        new = o[~self.known[o]].tolist()
        st.bulk(conn, st.people, ("person_key", "first_release_id", "created_at"),
                zip([pk[j] for j in new], repeat(rid), repeat(at)), conflict="ON CONFLICT DO NOTHING")
        del new
        yes = o[ok[o]]
        seen: set[bytes] = set()    # the distinct curves inserted (two: several), for ledger_release_curves
        for s in range(0, len(yes), st.WRITE_CHUNK):
            part = yes[s:s + st.WRITE_CHUNK]
            keys = [pk[j] for j in part.tolist()]
            blobs = self._charge_blobs(part)
            if len(seen) < 2:
                seen.update(blobs)
            st.bulk(conn, st.charges, ("person_key", "release_id", "rdp", "rows", "sampling_rate"),
                    zip(keys, repeat(rid), blobs, rows_of[part].tolist(),
                        rate_of[part].astype(float).tolist()))
            del blobs
            st.bulk(conn, st.spend, ("person_key", "mechanism", "rdp", "charges", "seq"),
                    zip(keys, repeat(self.mechanism), st.encode_curves(self.new_spend[part]),
                        (self.prev_count[part] + 1).tolist(), repeat(seq)), conflict=st.SPEND_UPSERT)
        st.bulk(conn, st.exclusions, ("person_key", "release_id"),
                zip([pk[j] for j in o[~ok[o]].tolist()], repeat(rid)))
        st.record_release_curves(conn, rid, len(yes), seen)


def _rows_and_rates(costs: Mapping[str, PersonCost], ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each person's rows and sampling rate, as arrays in `ids`' order."""
    rows = np.fromiter((int(costs[i].rows) for i in ids), dtype=np.int64, count=len(ids))
    rates = np.fromiter((float(costs[i].sampling_rate) for i in ids), dtype=float, count=len(ids))
    return rows, rates


def _plan_release(conn: Connection, plan_sha256: str) -> tuple[int, str | None] | None:
    row = conn.execute(select(st.releases.c.id).where(st.releases.c.plan_sha256 == plan_sha256)
                       .order_by(st.releases.c.id).limit(1)).first()
    if row is None:
        return None
    last = conn.execute(select(st.events.c.status).where(st.events.c.release_id == row.id)
                        .order_by(st.events.c.id.desc()).limit(1)).first()
    return int(row.id), (None if last is None else last.status)


def _one_per_plan(mechanism: str) -> bool:
    """A DP-SGD plan's release (a registered mechanism that is certified from its plan) is unique per plan.
    Releases of other kinds (PMixED's builds, private selections) key theirs on a policy or parameters
    that may be released again on purpose."""

    try:
        return bool(get_mechanism(mechanism).certifiable)
    except VeilError:
        return False


def relation_of(mechanism: str) -> str:
    """The relation a release's charges are under: its mechanism's `ledger_relation` (a mechanism this
    build does not know is read as add/remove, what every mechanism before multi-owner records was)."""

    try:
        return get_mechanism(mechanism).ledger_relation
    except VeilError:
        return "add_remove"


def _person_claim(mechanism: str) -> bool:
    """Whether a release of this mechanism is charged to persons. Releases under names the mechanism
    registry does not hold (private selection, population estimates) charge persons a curve of their own."""

    try:
        return get_mechanism(mechanism).ledger_person_claim
    except VeilError:
        return True


def effective_spend(by_mechanism: Mapping[str, np.ndarray], orders, *, replace: bool = False
                    ) -> tuple[np.ndarray, bool]:
    """A person's spend, and whether it is read under the replace relation.

    While every charge is under add/remove (and the new release is too: `replace` False), the spend is
    their sum — the filter's add/remove guarantee. Once a person is on a release under the fixed-graph
    replace relation (multi-owner records, docs/privacy/multi-owner.md), no add/remove statement exists
    for them; their guarantee is under the replace relation, where each add/remove release costs at
    most its weak-triangle conversion (`rdp.replace_of_add_remove`, linear in the spend, so it applies
    to the sum): spend = Σ replace charges + convert(Σ add/remove charges)."""
    n = len(orders)
    ar, rep, has_rep = np.zeros(n), np.zeros(n), False
    for m, v in by_mechanism.items():
        if relation_of(m) == "replace":
            rep, has_rep = rep + np.asarray(v, dtype=float), True
        else:
            ar = ar + np.asarray(v, dtype=float)
    if not (has_rep or replace):
        return ar, False
    return rep + _rdp.replace_of_add_remove(ar, orders), True


def _check_secrets(secrets: Sequence[SecretCost]) -> list[SecretCost]:
    from components.accounting.secrets import kl_budget  # startup

    out = []
    for c in secrets:
        if not isinstance(c, SecretCost):
            raise VeilError("ledger: secret costs must be SecretCost")
        cls = _keys.canonical_secret_id(c.secret_id).split(":", 1)[0]
        if cls != c.secret_class:
            raise VeilError(f"ledger: a secret of class {c.secret_class!r} is named under class {cls!r}")
        kl = float(c.kl)
        if math.isnan(kl) or kl < 0 or math.isinf(kl):
            raise VeilError(f"ledger: a secret's KL must be a finite number ≥ 0 (class {c.secret_class})")
        kl_budget(c.kappa, c.gamma)  # validates κ ∈ (0, 1), γ ∈ [κ, 1]
        out.append(c)
    return out


def _reserve_secrets(conn: Connection, rid: int, sec: list[SecretCost], skeys: list[str]) -> np.ndarray:
    """The per-secret KL filter, inside the reservation's transaction (docs/privacy/ledger.md).

    A class' (κ, γ) is fixed the first time the ledger charges it; a release stating others is refused
    (a filter's budget cannot move, and γ is only meaningful for the prior it was computed with). A
    secret is charged iff lifetime KL + this release's KL ≤ d_KL(γ‖κ); the decision reads only the
    ledger and that secret's own KL (a function of its public tagging and the release's parameters)."""
    from components.accounting.secrets import kl_budget  # startup

    if not sec:
        return np.zeros(0, dtype=bool)
    fixed = {r.secret_class: (float(r.kappa), float(r.gamma)) for r in conn.execute(select(st.secret_classes))}
    new_classes = {}
    for c in sec:
        want = (float(c.kappa), float(c.gamma))
        have = fixed.get(c.secret_class, new_classes.get(c.secret_class))
        if have is None:
            new_classes[c.secret_class] = want
        elif have != want:
            raise VeilError(f"ledger: secret class {c.secret_class!r} is kept at κ={have[0]:g}, γ={have[1]:g} "
                            f"(fixed when first charged); this release asks κ={want[0]:g}, γ={want[1]:g}. A "
                            "secret's lifetime budget cannot change: make the policy's class match")
    if new_classes:
        st.insert_ignore(conn, st.secret_classes, [{"secret_class": k, "kappa": v[0], "gamma": v[1],
                                                    "first_release_id": rid} for k, v in new_classes.items()])
    spent = st.secret_spend_of(conn, skeys)
    ok = np.array([spent.get(k, 0.0) + float(c.kl) <= kl_budget(c.kappa, c.gamma) for c, k in zip(sec, skeys)],
                  dtype=bool)
    rows = [{"secret_key": k, "release_id": rid, "secret_class": c.secret_class, "kl": float(c.kl),
             "records": int(c.records)} for c, k, a in zip(sec, skeys, ok) if a]
    for i in range(0, len(rows), st._CHUNK):
        conn.execute(st.secret_charges.insert(), rows[i:i + st._CHUNK])
    drops = [{"secret_key": k, "release_id": rid, "secret_class": c.secret_class}
             for c, k, a in zip(sec, skeys, ok) if not a]
    for i in range(0, len(drops), st._CHUNK):
        conn.execute(st.secret_drops.insert(), drops[i:i + st._CHUNK])
    return ok


def _weights_of(m: Mapping[str, str], conversion: str, orders, where: str) -> np.ndarray | None:
    """A weighted ledger's recorded order weights, checked (rdp.check_weights: Σ ≤ 1 and this Veil's rule
    for the recorded budget); None before its budget is fixed, or under another conversion. A record that
    does not match is refused in one line, never re-interpreted."""
    has = "order_weights" in m
    if conversion != _rdp.WEIGHTED:
        if has:
            raise VeilError(f"ledger {where}: order weights recorded under conversion {conversion!r}, which has "
                            f"none: damaged; {st.RESTORE}")
        return None
    b = _budget_of(m)
    if b is None and not has:
        return None
    if b is None or not has:
        raise VeilError(f"ledger {where}: a weighted ledger keeps its budget and its order weights together; "
                        f"one is missing: damaged; {st.RESTORE}")
    rule = _rule_of(m, conversion, where)
    try:
        w = json.loads(m["order_weights"])
        return _rdp.check_weights(w, orders, b.epsilon, b.delta, rule)
    except (ValueError, TypeError, VeilError) as e:
        raise VeilError(f"ledger {where}: its recorded order weights are refused ({e}); use the Veil that made it, "
                        f"or {st.RESTORE}") from None


def _rule_of(m: Mapping[str, str], conversion: str, where: str) -> str | None:
    """A weighted ledger's order-weight rule: the recorded one (fixed when the ledger was made, or by the v1
    Veil with its budget); a weighted ledger without the key was made by the v1 Veil before any budget,
    and keeps v1. None under another conversion. A rule this Veil does not know is refused."""
    if conversion != _rdp.WEIGHTED:
        if "order_weights_rule" in m:
            raise VeilError(f"ledger {where}: an order-weight rule recorded under conversion {conversion!r}, which "
                            f"has none: damaged; {st.RESTORE}")
        return None
    rule = m.get("order_weights_rule", _rdp.WEIGHT_RULE_V1)
    if rule not in _rdp.WEIGHT_RULES:
        raise VeilError(f"ledger {where}: order weights made by rule {rule!r}; this Veil knows "
                        f"{', '.join(repr(r) for r in _rdp.WEIGHT_RULES)}: use the Veil that made it")
    return rule


def _budget_of(m: Mapping[str, str]) -> Budget | None:
    if "budget_epsilon" not in m:
        return None
    return Budget(float(m["budget_epsilon"]), float(m["budget_delta"]))


def total_releases(ledger: Ledger) -> int:
    with st.read_only(ledger.engine) as conn:
        return int(conn.execute(select(func.count()).select_from(st.releases)).scalar_one())


__all__ = ["Ledger", "Budget", "PersonCost", "Reservation", "SecretCost", "default_url"]


def pld_estimate_max(ledger: Ledger) -> dict | None:
    """The PLD composition of the most-charged person's releases, read at the budget's δ.

    LABELLED AN ESTIMATE: composing PLDs and stopping at a budget (the 'natural filter') is not valid when
    later releases were chosen after earlier ones were seen (Tran et al. 2026); it is shown beside the
    Rényi-filter spend only to say how loose RDP is, never as the guarantee. Per release the person's
    event is the same dominating PoissonSampled(q', Gaussian(σ/n)) the RDP charge uses."""
    import dp_accounting

    with st.read_only(ledger.engine) as conn:
        b = _budget_of(st.read_meta(conn))
        any_charge = conn.execute(select(st.charges.c.person_key).limit(1)).first() is not None
    if b is None or not any_charge:
        return None
    keys, eps, _, _ = ledger.person_table()
    top = keys[int(np.argmax(eps))]          # the first most-charged person, as max() over the rows was
    with st.read_only(ledger.engine) as conn:
        params = {r.id: json.loads(r.params) for r in conn.execute(select(st.releases.c.id, st.releases.c.params))}
        group = sorted(st.linked_closure(conn, [top])[top])
        mine = conn.execute(select(st.charges.c.release_id, st.charges.c.rows, st.charges.c.sampling_rate)
                            .where(st.charges.c.person_key.in_(group))).all()
        mech = {r.id: r.mechanism for r in conn.execute(select(st.releases.c.id, st.releases.c.mechanism))}
    other = sorted({mech[c.release_id] for c in mine
                    if not {"noise_multiplier", "steps"} <= set(params[c.release_id])})
    if other:
        # PMixED and private selection charge Rényi curves that are no sampled-Gaussian event
        return {"max_epsilon": None, "delta": b.delta,
                "label": f"no PLD estimate: the most-charged person has releases ({', '.join(other)}) that are not a "
                         "sampled Gaussian; the guarantee is the Rényi filter's budget"}
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    for c in mine:
        p = params[c.release_id]
        n = _group_size(mech[c.release_id], int(c.rows))
        acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            min(1.0, float(c.sampling_rate)), dp_accounting.GaussianDpEvent(float(p["noise_multiplier"]) / n)),
            int(p["steps"])))
    e = float(acc.get_epsilon(b.delta))
    return {"max_epsilon": e if math.isfinite(e) else None, "delta": b.delta,
            "label": "non-adaptive estimate (PLD composition of the most-charged person's releases); not a "
                     "guarantee under adaptive releases — the guarantee is the Rényi filter's budget"}


def _group_size(mechanism: str, rows: int) -> int:
    """How many unit Gaussians one person's charged rows are, for the non-adaptive estimate: the
    release's mechanism says (a user-sampled release is one, whatever the rows)."""

    try:
        return get_mechanism(mechanism).ledger_group_size(rows)
    except VeilError:      # a mechanism this build does not know: the worst case, every row
        return max(1, rows)
