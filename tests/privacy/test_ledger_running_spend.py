"""The ledger at scale (issue 27): the running spend, its pricing outside the write lock, and the migration
of a v1 ledger — each against an independent computation from the charge rows, the way the v1 code
read them (every charge re-read and summed per mechanism in release order, `effective_spend`)."""
from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
from sqlalchemy import Column, Float, ForeignKey, Integer, MetaData, String, Table, Text, create_engine, select

from components.core.errors import VeilError
from components.ledger import Budget, Ledger, PersonCost
from components.renyi import rdp as R
from components.ledger import store as st
from components.ledger.ledger import effective_spend

BUDGET = Budget(6.0, 1e-5)
ADD, REP = "uls", "els-owners"          # an add/remove and a replace-relation mechanism


@functools.lru_cache(maxsize=4)
def _base(orders: tuple) -> np.ndarray:
    return R.sampled_gaussian_rdp(0.2, 1.3, 20, orders)


def _cost(orders, scale: float) -> np.ndarray:
    return scale * _base(tuple(orders))


def _old_style(led: Ledger, ids: list[str], replace: bool = False, flags: dict | None = None
               ) -> dict[str, np.ndarray]:
    """v1's reader: every charge row of the person (and of keys linked into them) summed per mechanism in
    release order, then `effective_spend` (`flags`, when given, gets whether each is read under replace)."""
    with st.read_only(led.engine) as conn:
        mech = {r.id: r.mechanism for r in conn.execute(select(st.releases.c.id, st.releases.c.mechanism))}
        rows = conn.execute(select(st.charges.c.person_key, st.charges.c.release_id, st.charges.c.rdp)
                            .order_by(st.charges.c.release_id)).all()
        links = st.read_links(conn)
    out = {}
    for i in ids:
        k = led.person_key(i)
        group = {k} | {l for l, ts in links.items() if k in ts}
        by: dict[str, np.ndarray] = {}
        for r in rows:
            if r.person_key in group:
                v = np.frombuffer(r.rdp[1:], dtype="<f8").astype(float)
                by[mech[r.release_id]] = by.get(mech[r.release_id], 0.0) + v
        out[i], rep = effective_spend(by, led.orders, replace=replace)
        if flags is not None:
            flags[i] = REP in by
    return out


def _reserve(led, mech, people: dict[str, float], budget=BUDGET):
    costs = {p: PersonCost(rows=1, sampling_rate=0.2, rdp=_cost(led.orders, s)) for p, s in people.items()}
    return led.reserve(kind="user", mechanism=mech, plan_sha256=None, params={}, costs=costs, budget=budget)


def test_running_spend_equals_the_v1_sum_and_decides_the_same(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32))
    everyone = [f"p{i}" for i in range(40)]
    rng = np.random.default_rng(7)
    seen_admitted = seen_retired = 0
    for t in range(9):
        people = {p: float(rng.uniform(0.05, 0.4)) for p in everyone if rng.random() < 0.8}
        mech = REP if t == 4 else ADD
        if t == 6:      # a linked pseudonym: its charges count for p0 from now on
            led.link_identities({"p0": ["p39"]})
        has_rep: dict = {}
        before = _old_style(led, list(people), replace=mech == REP, flags=has_rep)
        cap = led.rdp_budget(BUDGET)
        r = _reserve(led, mech, people)
        # the filter's decision, re-made from the v1 reading of the charges before this release
        seen_admitted, seen_retired = seen_admitted + len(r.admitted), seen_retired + len(r.retired)
        for p, s in people.items():
            c = _cost(led.orders, s)
            charged = R.replace_of_add_remove(c, led.orders) if (has_rep[p] and mech == ADD) else c
            assert (p in r.admitted) == bool(np.any(before[p] + charged <= cap)), (t, p)
        new = led.spend(everyone)
        old = _old_style(led, everyone)
        for p in everyone:
            np.testing.assert_allclose(new[p], old[p], rtol=1e-12, atol=0)
    assert seen_admitted > 150 and seen_retired > 30      # the filter both admits and binds: decisions tested
    # the views read the running spend: the same numbers as the v1 reading
    rows = {r["person_key"]: r for r in led.person_rows()}
    old = _old_style(led, everyone)
    w = led.order_weights
    for p in everyone:
        k = led.person_key(p)
        if k in rows:
            e = R.epsilon_of_spend(old[p], BUDGET.delta, led.orders, led.conversion, w)
            assert rows[k]["epsilon"] == pytest.approx(e, rel=1e-12)
    s = led.summary()
    assert s["releases"] == 9 and s["people"] == len(rows)
    # the running spend is the sum of the charge rows, row for row
    with st.read_only(led.engine) as conn:
        ks, ms, mat, cnt = st.spend_rows(conn, None, len(led.orders))
        mech = {r.id: r.mechanism for r in conn.execute(select(st.releases.c.id, st.releases.c.mechanism))}
        ch = conn.execute(select(st.charges.c.person_key, st.charges.c.release_id, st.charges.c.rdp)
                          .order_by(st.charges.c.release_id)).all()
    sums: dict = {}
    for c in ch:
        key = (c.person_key, mech[c.release_id])
        v = st.decode_curves([c.rdp], len(led.orders))[0]
        sums[key] = (sums.get(key, (0.0, 0))[0] + v, sums.get(key, (0.0, 0))[1] + 1)
    assert len(sums) == len(ks)
    for k, m, v, n in zip(ks, ms, mat, cnt):
        assert np.array_equal(sums[(k, m)][0], v) and sums[(k, m)][1] == n
    led.dispose()


def test_a_reservation_priced_before_another_commits_is_repriced_inside_the_lock(tmp_path, monkeypatch):
    """The snapshot is taken, then another reservation spends the same people's last budget before the
    first one's write transaction: the first must see it (refresh) and retire them, not overspend."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", os.urandom(32))
    cap = led.rdp_budget(BUDGET)
    one = _cost(led.orders, 1.0)
    fits = 0
    while np.any((fits + 1) * one <= cap):
        fits += 1
    people = {f"p{i}": 1.0 for i in range(5)}
    for _ in range(fits - 1):
        _reserve(led, ADD, people)
    other = Ledger(led.url, led._key)
    real = Ledger._snapshot
    raced = []

    def snapshot_then_race(self, *a, **k):
        pr = real(self, *a, **k)
        if not raced:
            raced.append(None)
            raced[0] = _reserve(other, ADD, {"p0": 1.0, "p1": 1.0})   # spends p0's and p1's last room
        return pr

    monkeypatch.setattr(Ledger, "_snapshot", snapshot_then_race)
    r = _reserve(led, ADD, people)
    assert set(raced[0].admitted) == {"p0", "p1"}
    assert set(r.retired) == {"p0", "p1"} and set(r.admitted) == {"p2", "p3", "p4"}
    spend = led.spend(list(people))
    for p in people:
        assert np.allclose(spend[p], fits * one) and np.any(spend[p] <= cap)
    # a link added between snapshot and write re-prices everyone (the closure changed)
    raced.clear()

    def snapshot_then_link(self, *a, **k):
        pr = real(self, *a, **k)
        if not raced:
            raced.append(None)
            raced[0] = other.link_identities({"q0": ["p2"]})
        return pr

    monkeypatch.setattr(Ledger, "_snapshot", snapshot_then_link)
    r2 = _reserve(led, ADD, {"q0": 1.0})
    assert raced == [1] and r2.retired == ("q0",)        # p2's full spend counts for q0 now
    led.dispose()
    other.dispose()


# --- migration of a v1 ledger -------------------------------------------------------------------------

def _v1_ledger(path, key: bytes, orders) -> dict[str, np.ndarray]:
    """A ledger as the v1 code wrote it: its tables (JSON curves in `ledger_charges`, no running spend, no
    seq row), its meta, two releases. Returns each person's spend as v1 read it."""
    md = MetaData()
    for t in st.metadata.sorted_tables:
        if t.name not in ("ledger_charges_v2", "ledger_spend", "ledger_state"):
            t.to_metadata(md)
    Table("ledger_charges", md,
          Column("person_key", String(64), ForeignKey("ledger_people.person_key"), primary_key=True),
          Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True),
          Column("rdp", Text, nullable=False), Column("rows", Integer, nullable=False),
          Column("sampling_rate", Float, nullable=False))
    eng = create_engine(f"sqlite:///{path}")
    from components.ledger.keys import key_fingerprint, person_key
    want: dict[str, np.ndarray] = {}
    with eng.begin() as conn:
        md.create_all(conn)
        w = R.order_weights(BUDGET.epsilon, BUDGET.delta, orders)
        conn.execute(md.tables["ledger_meta"].insert(), [
            {"key": "schema", "value": "veil.ledger/v1"}, {"key": "orders", "value": json.dumps(list(orders))},
            {"key": "key_fingerprint", "value": key_fingerprint(key)}, {"key": "created_at", "value": "x"},
            {"key": "conversion", "value": R.WEIGHTED}, {"key": "budget_epsilon", "value": repr(BUDGET.epsilon)},
            {"key": "budget_delta", "value": repr(BUDGET.delta)},
            {"key": "order_weights", "value": json.dumps([float(x) for x in w])},
            {"key": "order_weights_rule", "value": R.WEIGHT_RULE}])
        for rid, (mech, scale) in enumerate([(ADD, 1.0), ("population-laplace", 0.37), (ADD, 0.7)], start=1):
            conn.execute(md.tables["ledger_releases"].insert().values(
                id=rid, kind="user", mechanism=mech, plan_sha256=None, params="{}", admitted=3, retired=0,
                created_at="x"))
            for i in range(3):
                pk = person_key(key, f"p{i}")
                if rid == 1:
                    conn.execute(md.tables["ledger_people"].insert().values(person_key=pk, first_release_id=1,
                                                                            created_at="x"))
                v = _cost(orders, scale * (1 + i / 3))
                conn.execute(md.tables["ledger_charges"].insert().values(
                    person_key=pk, release_id=rid, rdp=json.dumps([float(x) for x in v]), rows=1,
                    sampling_rate=0.2))
                want[f"p{i}"] = want.get(f"p{i}", 0.0) + v
    eng.dispose()
    return want


def test_a_v1_ledger_is_migrated_once_atomically_and_prices_the_same(tmp_path, monkeypatch):
    path, key = tmp_path / "l.db", os.urandom(32)
    want = _v1_ledger(path, key, R.ORDERS)
    url = f"sqlite:///{path}"
    # a migration that dies half-way leaves the v1 ledger exactly as it was
    real = st.encode_curves
    calls = []

    def dies(mat):
        calls.append(1)
        if len(calls) == 2:      # after the charges were re-written, before the running spend
            raise RuntimeError("killed")
        return real(mat)

    monkeypatch.setattr(st, "encode_curves", dies)
    with pytest.raises(RuntimeError, match="killed"):
        Ledger(url, key)
    monkeypatch.setattr(st, "encode_curves", real)
    import sqlite3
    con = sqlite3.connect(path)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "ledger_charges" in names and con.execute("SELECT count(*) FROM ledger_charges").fetchone()[0] == 9
    assert con.execute("SELECT value FROM ledger_meta WHERE key='schema'").fetchone()[0] == "veil.ledger/v1"
    con.close()

    led = Ledger(url, key)
    got = led.spend(["p0", "p1", "p2"])
    for p, v in want.items():
        np.testing.assert_allclose(got[p], v, rtol=1e-12, atol=0)
    with st.read_only(led.engine) as conn:
        assert st.read_meta(conn)["schema"] == st.SCHEMA_VERSION and not st.legacy_charges_present(conn)
        assert conn.execute(select(st.charges.c.rdp)).first().rdp[:1] == bytes([st.CURVE_TAG])
        n_spend = len(st.spend_rows(conn, None, len(led.orders))[0])
    assert n_spend == 6                                    # 3 people × 2 mechanisms
    assert led.summary()["releases"] == 3 and led.summary()["people"] == 3
    # opening again migrates nothing; a v1 Veil would refuse the ledger (its schema check)
    led2 = Ledger(url, key)
    assert all(np.array_equal(led2.spend(["p0"])["p0"], got["p0"]) for _ in (0,))
    r = _reserve(led2, ADD, {"p0": 1.0, "new": 1.0})
    assert set(r.admitted) | set(r.retired) == {"p0", "new"}
    np.testing.assert_allclose(led2.spend(["p0"])["p0"], want["p0"] + (_cost(led2.orders, 1.0) if "p0" in r.admitted
                                                                       else 0.0), rtol=1e-12)
    # charges an older Veil wrote beside the running spend after the migration are refused, never ignored
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE ledger_charges (person_key TEXT, release_id INT, rdp TEXT, rows INT, "
                "sampling_rate REAL)")
    con.execute("INSERT INTO ledger_charges VALUES ('x', 1, '[]', 1, 0.1)")
    con.commit()
    con.close()
    with pytest.raises(VeilError, match="older Veil"):
        Ledger(url, key)
    led.dispose()
    led2.dispose()


def test_burn_down_without_a_row_per_person_is_the_charges_summed(tmp_path, monkeypatch):
    """burn_down adds a one-curve release that charged everyone known less its retirements as that curve,
    without reading its rows (issue 27: 10⁶ people × 10 releases); every other release row by row. Both
    against an independent sum of each person's charges up to each release, and the one-curve path
    against the row-by-row path exactly."""
    from components.core.settings import load_settings

    led = Ledger.open(load_settings(tmp_path / "home").ensure())
    a, b, c, d = "a@x.org", "b@x.org", "c@x.org", "d@x.org"
    big = Budget(60.0, BUDGET.delta)
    _reserve(led, ADD, {a: 1.0, b: 1.0, c: 1.0}, big)            # one curve, everyone
    _reserve(led, ADD, {a: 1.0, b: 1.0, c: 500.0}, big)          # c is retired: one curve charged
    _reserve(led, ADD, {a: 0.5, b: 1.5, c: 1.0, d: 1.0}, big)    # several curves; d is new
    _reserve(led, REP, {a: 1.0, b: 1.0, c: 1.0, d: 1.0}, big)    # replace relation, one curve
    _reserve(led, ADD, {a: 1.0}, big)                            # one curve, but not everyone known
    with st.read_only(led.engine) as conn:
        rows = conn.execute(select(st.charges.c.person_key, st.charges.c.release_id, st.charges.c.rdp)).all()
        mech = {r.id: r.mechanism for r in conn.execute(select(st.releases.c.id, st.releases.c.mechanism))}
        first = {r.person_key: r.first_release_id for r in conn.execute(select(st.people))}
    fast = led.burn_down()
    assert [r["retired"] for r in fast] == [0, 1, 0, 0, 0] and [r["people"] for r in fast] == [3, 3, 4, 4, 4]
    for got in fast:
        rid = got["release_id"]
        eps = []
        for k, f in first.items():
            if f > rid:
                continue
            by: dict[str, np.ndarray] = {}
            for r in rows:
                if r.person_key == k and r.release_id <= rid:
                    v = np.frombuffer(r.rdp[1:], dtype="<f8").astype(float)
                    by[mech[r.release_id]] = by.get(mech[r.release_id], 0.0) + v
            s, _ = effective_spend(by, led.orders)
            eps.append(R.epsilon_of_spend(s, BUDGET.delta, led.orders, led.conversion, led.order_weights))
        assert np.allclose([got["max_epsilon"], got["median_epsilon"], got["min_epsilon"]],
                           [max(eps), float(np.median(eps)), min(eps)], rtol=1e-12, atol=0)
    calls = []
    real = st.one_curve_release
    monkeypatch.setattr(st, "one_curve_release", lambda *x: calls.append(real(*x)) or None)
    assert led.burn_down() == fast
    assert sum(c is not None for c in calls) >= 3        # releases 1, 2, 4 took the one-curve path
