"""`veil ledger` at 10⁶ people (issue 27): the per-release record of a release's curves
(`ledger_release_curves`), the burn-down in groups of equal history, ε converted once per distinct spend
and the private rows written without csv.writer — each checked against what it replaces: the scan of the
charge rows, the row-per-person burn-down, and the figures today's code printed (GOLDEN, made by the code
before this change on the same ledger, in ledger_report_golden.json: `PYTHONPATH=<that tree> python
tests/privacy/test_ledger_report_scale.py` prints them)."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select, text

from components.core.settings import load_settings
from components.ledger import Budget, Ledger, PersonCost
from components.ledger import store as st
from components.renyi import rdp as R

ADD, REP = "uls", "els-owners"          # an add/remove and a replace-relation mechanism
BIG = Budget(60.0, 1e-5)
KEY = bytes(range(32))                  # a fixed ledger key: the same pseudonyms before and after


def _cost(orders, scale: float) -> np.ndarray:
    return scale * R.sampled_gaussian_rdp(0.2, 1.3, 20, orders)


def _reserve(led, mech, people: dict[str, float], plan: str | None = None, budget=BIG):
    costs = {p: PersonCost(rows=1 + i % 2, sampling_rate=0.2, rdp=_cost(led.orders, s))
             for i, (p, s) in enumerate(people.items())}
    return led.reserve(kind="user", mechanism=mech, plan_sha256=plan, params={"noise_multiplier": 1.3, "steps": 20},
                       costs=costs, budget=budget)


def scenario(home: Path, links: bool) -> Ledger:
    """A ledger with every kind of release the burn-down meets: one curve to everyone, one curve with a
    retirement, several curves, a new person, the replace relation, one curve to some, a population
    charge, a post-processing release, a plan released once (its retry refused) and, with `links`, an
    identity link. Only the public API: it runs on the code before this change too (GOLDEN)."""
    s = load_settings(home).ensure()
    s.private_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(s.private_dir / "ledger.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(KEY)
    led = Ledger.open(s)
    a, b, c, d, e = (f"{x}@x.org" for x in "abcde")
    _reserve(led, ADD, {a: 1.0, b: 1.0, c: 1.0}, plan="1" * 64)             # one curve, everyone
    try:
        _reserve(led, ADD, {a: 1.0, b: 1.0, c: 1.0}, plan="1" * 64)         # the plan's retry: refused
    except Exception as x:                                                  # noqa: BLE001
        assert type(x).__name__ == "PlanAlreadyReleased"
    _reserve(led, ADD, {a: 1.0, b: 1.0, c: 500.0})                         # c retired; one curve charged
    if links:
        _reserve(led, ADD, {"a.old@x.org": 2.0})
        led.link_identities({a: ["a.old@x.org"]})
    _reserve(led, ADD, {a: 0.5, b: 1.5, c: 1.0, d: 1.0})                   # several curves; d is new
    _reserve(led, REP, {a: 1.0, b: 1.0, c: 1.0, d: 1.0})                   # replace relation, one curve
    _reserve(led, ADD, {a: 1.0})                                           # one curve, not everyone known
    costs = {p: PersonCost(rows=1, sampling_rate=0.2, rdp=_cost(led.orders, 0.25)) for p in (a, b, e)}
    led.charge_population(release_key="n" * 16, mechanism="population", costs=costs, budget=BIG, params={})
    led.record_post_processing(kind="synthetic", release_key="s1", of_release=1, params={"n": 3})
    _reserve(led, ADD, {p: 1.0 for p in (a, b, c, d, e)})                  # one curve to everyone
    _reserve(led, ADD, {a: 1.0, b: 1.0, c: 1.0, d: 1.0, e: 90.0})          # e retired, the rest one curve
    return led


def figures(led: Ledger, private_dir: Path) -> dict:
    """What `veil ledger --json` prints about spend, the burn-down, and the private rows' bytes."""
    from components.ledger.report import write_private_rows

    doc = led.summary()
    csv_bytes = write_private_rows(led, private_dir).read_bytes()
    return {"spend": doc["spend"], "people": doc["people"], "retired": doc["retired"], "releases": doc["releases"],
            "burn_down": led.burn_down(), "rows": led.person_rows(),
            "csv_sha256": hashlib.sha256(csv_bytes).hexdigest()}


def _scan(led: Ledger) -> dict:
    with st.read_only(led.engine) as conn:
        ids = list(conn.execute(select(st.releases.c.id).order_by(st.releases.c.id)).scalars())
        return {i: st.scan_release_curves(conn, i) for i in ids}


def _recorded(led: Ledger) -> dict:
    with st.read_only(led.engine) as conn:
        return st.release_curves_of(conn)


def _distinct_by_rows(led: Ledger) -> dict:
    """Independently of the SQL aggregates: each release's charge rows read one by one."""
    with st.read_only(led.engine) as conn:
        ids = list(conn.execute(select(st.releases.c.id)).scalars())
        rows = conn.execute(select(st.charges.c.release_id, st.charges.c.rdp)).all()
    out = {i: (0, set()) for i in ids}
    for r in rows:
        n, s = out[r.release_id]
        out[r.release_id] = (n + 1, s | {bytes(r.rdp)})
    return {i: (n, min(len(s), 2), next(iter(s)) if len(s) == 1 else None) for i, (n, s) in out.items()}


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory):
    """The scenario without and with links, built once for the tests that only read them."""
    root = tmp_path_factory.mktemp("ledgers")
    out = {links: scenario(root / str(links) / "home", links) for links in (False, True)}
    yield out
    for led in out.values():
        led.dispose()


@pytest.mark.parametrize("links", [False, True])
def test_the_report_prints_what_it_printed_before(ledgers, tmp_path, links):
    """Same ledger, same key: the figures and the private rows' bytes are those of the code before this
    change (GOLDEN), float for float — through the groups (no links) and the row-per-person burn-down."""
    got = json.loads(json.dumps(figures(ledgers[links], tmp_path)))
    assert got == GOLDEN[str(links)]


def test_the_record_of_each_release_is_what_its_rows_are(ledgers, monkeypatch):
    """Written with the charges, never wrong: for every release (two curves, retirements, links, a
    population charge, post-processing, a refused retry) the record equals the scan and the rows; a
    reservation that fails half-way leaves neither a record nor a release."""
    led = ledgers[True]
    rec, by_rows = _recorded(led), _distinct_by_rows(led)
    assert rec == _scan(led) == by_rows
    # (charges, distinct curves) per release; the plan's refused retry wrote no release
    assert {i: v[:2] for i, v in rec.items()} == {1: (3, 1), 2: (2, 1), 3: (1, 1), 4: (4, 2), 5: (4, 1),
                                                   6: (1, 1), 7: (3, 1), 8: (0, 0), 9: (5, 1), 10: (4, 1)}
    n = len(rec)
    real = st.bulk

    def crash(conn, table, *a, **k):
        if table is st.exclusions:         # after the charges and spends of the release were written
            raise RuntimeError("power cut")
        return real(conn, table, *a, **k)
    monkeypatch.setattr(st, "bulk", crash)
    with pytest.raises(RuntimeError):
        _reserve(led, ADD, {"a@x.org": 1.0, "z@x.org": 1.0})
    monkeypatch.setattr(st, "bulk", real)
    assert len(_recorded(led)) == n and len(_scan(led)) == n


def test_a_ledger_from_before_the_record_is_filled_once_and_a_release_without_one_is_scanned(tmp_path):
    """A ledger made before `ledger_release_curves` gets it, filled from a scan of each release, when first
    opened; a release written later by a Veil without the table (no record) is scanned when read. The
    burn-down is the same either way, and the same as the row-by-row one."""
    home = tmp_path / "home"
    led = scenario(home, links=False)
    want = figures(led, home / "private")
    rows = led._burn_down_rows
    with st.read_only(led.engine) as conn:
        ps = led._people()
        rel = conn.execute(select(st.releases.c.id, st.releases.c.mechanism).order_by(st.releases.c.id)).all()
        retired = {i: n for i, n in conn.execute(text("SELECT release_id, count(*) FROM ledger_retirements "
                                                      "GROUP BY release_id")).all()}
        dense = rows(conn, rel, ps, led.budget(), led.order_weights, retired)
    assert dense == want["burn_down"]            # groups and rows: the same floats
    url = led.url
    with led.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE ledger_release_curves")
    led.dispose()
    again = Ledger(url, KEY)
    try:
        assert _recorded(again) == _scan(again)
        with again.engine.begin() as conn:      # an older Veil's release: no record
            conn.execute(st.release_curves.delete().where(st.release_curves.c.release_id == 2))
        assert 2 not in _recorded(again)
        again._people_cache = None
        assert figures(again, home / "private") == want
    finally:
        again.dispose()


def test_the_record_on_postgresql():
    """The same record, scan, backfill and burn-down on a real PostgreSQL server (skipped without its
    binaries)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _ledger_pg import postgres_server

    with postgres_server() as url:
        led = Ledger(url, KEY)
        try:
            _reserve(led, ADD, {"a@x.org": 1.0, "b@x.org": 1.0})
            _reserve(led, ADD, {"a@x.org": 1.0, "b@x.org": 2.0, "c@x.org": 1.0})
            _reserve(led, ADD, {"a@x.org": 1.0, "b@x.org": 1.0, "c@x.org": 400.0})
            rec = _recorded(led)
            assert rec == _scan(led) == _distinct_by_rows(led)
            assert [rec[i][1] for i in sorted(rec)] == [1, 2, 1]
            fast = led.burn_down()
            with led.engine.begin() as conn:     # no record: the scan (count distinct on PostgreSQL)
                conn.execute(st.release_curves.delete())
            assert led.burn_down() == fast and fast[-1]["retired"] == 1
            with led.engine.begin() as conn:     # a ledger from before the table: filled when opened
                conn.exec_driver_sql("DROP TABLE ledger_release_curves")
        finally:
            led.dispose()
        led = Ledger(url, KEY)
        try:
            assert _recorded(led) == rec and led.burn_down() == fast
        finally:
            led.dispose()


def test_private_rows_are_the_bytes_csv_writer_writes(ledgers, tmp_path, monkeypatch):
    """The fast writer against csv.writer on person_rows, and a field that needs quoting falls back to it."""
    from components.ledger import report

    led = ledgers[False]

    def by_csv() -> bytes:
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(["person_key", "epsilon", "releases_charged", "times_retired"])
        w.writerows([(r["person_key"], r["epsilon"], r["releases_charged"], r["times_retired"])
                     for r in led.person_rows()])
        return buf.getvalue().encode()
    assert report.write_private_rows(led, tmp_path).read_bytes() == by_csv()
    keys, eps, ch, ret = led.person_table()
    odd = (['x,"y"'] + keys[1:], eps, ch, ret)
    monkeypatch.setattr(led, "person_table", lambda: odd)
    monkeypatch.setattr(led, "person_rows", lambda: [
        {"person_key": k, "epsilon": e, "releases_charged": c, "times_retired": t}
        for k, e, c, t in zip(odd[0], eps.tolist(), ch.tolist(), ret.tolist())])
    assert report.write_private_rows(led, tmp_path).read_bytes() == by_csv()


# made by the code before this change (abeba3c): see the module docstring
GOLDEN = json.loads((Path(__file__).parent / "ledger_report_golden.json").read_text())


if __name__ == "__main__":       # print GOLDEN from the code on PYTHONPATH (the code before the change)
    import tempfile

    out = {}
    for links in (False, True):
        with tempfile.TemporaryDirectory() as d:
            led = scenario(Path(d) / "home", links)
            out[str(links)] = json.loads(json.dumps(figures(led, Path(d) / "home" / "private")))
            led.dispose()
    print(json.dumps(out, indent=1))
