"""Serving never waits for a reservation (issue 27): PMixED's token budget lives apart from the ledger's
write lock, and a budget an earlier Veil kept in ledger.db moves out once, losing no token."""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from components.core.settings import load_settings
from components.ledger import Ledger
from components.ledger import store as st
from components.prediction.budget import DB_NAME, MOVED, TokenBudget


@pytest.fixture
def settings(tmp_path):
    return load_settings(tmp_path / "home").ensure()


def _hold_ledger_write_lock(led: Ledger):
    """A thread inside a ledger write transaction (what a big reservation holds for its writes), until
    released. Returns (release, thread)."""
    inside, release = threading.Event(), threading.Event()

    def work(conn):
        st.bump_state(conn)            # a reservation's first write: the lock is really taken
        inside.set()
        release.wait(60)   # a charge or read that waited for this lock would take ~60 s: the tests' 20 s
        # limits tell waiting from not waiting with room for a loaded CI machine (idle: ~20 ms)

    t = threading.Thread(target=lambda: st.transact(led.engine, work), daemon=True)
    t.start()
    assert inside.wait(30)
    return release, t


def _charge_while_locked(led: Ledger, tb: TokenBudget, locked_probe) -> float:
    tb.create("ens", 100, "refuse")
    release, t = _hold_ledger_write_lock(led)
    try:
        assert locked_probe(), "the ledger's write lock is not held: the test would prove nothing"
        t0 = time.perf_counter()
        assert tb.charge("ens", 1)
        took = time.perf_counter() - t0
    finally:
        release.set()
        t.join(30)
    assert tb.spent("ens") == 1
    return took


def test_a_token_charge_does_not_wait_for_a_reservation_sqlite(settings):
    led = Ledger.open(settings)
    tb = TokenBudget.open(settings)
    assert tb.url.endswith("/" + DB_NAME)

    def locked() -> bool:
        con = sqlite3.connect(settings.private_dir / "ledger.db", timeout=0.05, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            return "locked" in str(e)
        finally:
            con.close()
        return False

    took = _charge_while_locked(led, tb, locked)
    assert took < 20.0, f"a token charge took {took:.2f} s while the ledger was locked"   # idle: ~20 ms
    # the ledger's own reads do not wait either (`read_only`: a snapshot, no lock)
    release, t = _hold_ledger_write_lock(led)
    try:
        t0 = time.perf_counter()
        led.summary()
        assert time.perf_counter() - t0 < 20.0
    finally:
        release.set()
        t.join(30)
    tb.dispose()
    led.dispose()


@pytest.mark.timeout(300)
def test_a_token_charge_does_not_wait_for_a_reservation_postgresql(tmp_path):
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "privacy"))
    from _ledger_pg import postgres_server

    with postgres_server() as url:
        led = Ledger(url, os.urandom(32))
        tb = TokenBudget(url)

        def locked() -> bool:
            from sqlalchemy import text
            with led.engine.connect() as conn:
                conn.execute(text("SET lock_timeout = '50ms'"))
                try:
                    conn.execute(text("SELECT seq FROM ledger_state WHERE id = 1 FOR UPDATE"))
                except Exception as e:   # the holder's row lock: 55P03 lock_not_available
                    return "lock" in str(e).lower()
                return False

        took = _charge_while_locked(led, tb, locked)
        assert took < 20.0, f"a token charge took {took:.2f} s while a reservation held its locks"
        tb.dispose()
        led.dispose()


def test_a_budget_kept_in_ledger_db_moves_out_once_losing_nothing(settings):
    Ledger.open(settings).dispose()
    old_url = f"sqlite:///{(settings.private_dir / 'ledger.db').resolve()}"
    old = TokenBudget(old_url)                    # where an earlier Veil kept it
    old.create("ens", 50, "refuse")
    assert old.charge("ens", 7) and old.grant("ens", 3, key="k", quota=5) == (3, None)
    api_key = old.create_key()
    old.dispose()

    tb = TokenBudget.open(settings)
    assert (settings.private_dir / DB_NAME).exists()
    assert tb.spent("ens") == 10 and tb.remaining("ens") == 40 and tb.key_ok(api_key)
    assert tb.key_remaining("ens", "k", 5) == 2
    con = sqlite3.connect(settings.private_dir / "ledger.db")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert "pmixed_token_charges" not in names and MOVED + "pmixed_token_charges" in names   # kept, renamed
    assert tb.charge("ens", 5)
    tb.dispose()
    again = TokenBudget.open(settings)            # opened again: nothing is copied twice
    assert again.spent("ens") == 15
    again.dispose()
    # an earlier Veil still holding the old tables finds none: it refuses tokens, it never draws unrecorded
    with pytest.raises(Exception):
        TokenBudget(old_url).charge("ens", 1)
