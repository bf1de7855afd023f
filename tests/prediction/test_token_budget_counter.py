"""The token budget's running sums (issue 27): a charge reads a counter, not every charge so far, and the
counter never disagrees with the append-only rows — rows it has not counted yet (an earlier Veil writing to
the same file) are counted, never skipped; threads and processes sharing one budget never exceed it."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.core.settings import load_settings
from components.prediction.budget import BUDGET_SPENT, QUOTA_SPENT, TokenBudget, key_digest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(tmp_path):
    return load_settings(tmp_path / "home").ensure()


def _rows_sum(con, table: str, where: str = "") -> int:
    return con.execute(f"SELECT COALESCE(SUM(tokens), 0) FROM {table} {where}").fetchone()[0]


def _counters(con) -> dict:
    return {(e, k): (t, i) for e, k, t, i in con.execute(
        "SELECT ensemble_id, key_sha256, tokens, through_id FROM pmixed_spent")}


def test_counter_agrees_with_the_rows_and_counts_rows_it_did_not_write(settings):
    tb = TokenBudget.open(settings)
    tb.create("ens", 30, "refuse")
    assert tb.charge("ens", 4) and tb.grant("ens", 3, key="k", quota=5) == (3, None)
    assert tb.grant("ens", 3, key="k", quota=5) == (2, QUOTA_SPENT)        # the key's quota binds first
    db = settings.private_dir / "pmixed.db"
    con = sqlite3.connect(db, isolation_level=None)
    d = key_digest("k")
    c = _counters(con)
    assert c[("ens", "")][0] == _rows_sum(con, "pmixed_token_charges") == 9
    assert c[("ens", d)][0] == _rows_sum(con, "pmixed_key_charges") == 5
    # an earlier Veil on the same file inserts charge rows and never touches the counter: they still count
    con.execute("INSERT INTO pmixed_token_charges (ensemble_id, tokens, at) VALUES ('ens', 12, 'x')")
    con.execute("INSERT INTO pmixed_key_charges (ensemble_id, key_sha256, tokens, at) VALUES ('ens', ?, 1, 'x')",
                (d,))
    assert tb.spent("ens") == 21 and tb.remaining("ens") == 9
    assert tb.key_remaining("ens", "k", 7) == 1
    assert not tb.charge("ens", 10)                   # 21 + 10 > 30: refused whole, nothing written
    assert tb.grant("ens", 20) == (9, BUDGET_SPENT)   # the rest of the budget, and not one token more
    assert tb.spent("ens") == 30 and not tb.charge("ens", 1)
    c = _counters(con)                                # the grant advanced the counter over the foreign row
    assert c[("ens", "")] == (30, con.execute("SELECT MAX(id) FROM pmixed_token_charges").fetchone()[0])
    assert _rows_sum(con, "pmixed_token_charges") == 30
    con.close()
    tb.dispose()
    assert TokenBudget.open(settings).spent("ens") == 30       # a restart reads the same spend


def test_threads_and_processes_sharing_one_budget_never_exceed_it(settings):
    """Two processes, each with four threads, charge until refused: exactly the budget is spent."""
    tb = TokenBudget.open(settings)
    tb.create("race", 300, "refuse")
    code = ("import sys, threading; from components.core.settings import load_settings; "
            "from components.prediction.budget import TokenBudget; "
            "tb = TokenBudget.open(load_settings(sys.argv[1]).ensure()); got = [];"
            "ts = [threading.Thread(target=lambda: got.append(sum(iter(lambda: tb.grant('race', 2)[0], 0)))) "
            "for _ in range(4)]; [t.start() for t in ts]; [t.join() for t in ts]; print(sum(got))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(settings.home)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    got = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert sum(got) == 300 and tb.spent("race") == 300 and tb.remaining("race") == 0
    tb.dispose()


_KILL_WORKER = r"""
import sys, os
from components.core.settings import load_settings
from components.prediction.budget import TokenBudget
tb = TokenBudget.open(load_settings(sys.argv[1]).ensure())
log = open(sys.argv[2], "a")
while tb.charge("kill", 1):
    log.write("drawn\n"); log.flush(); os.fsync(log.fileno())   # a token is drawn only after its charge commits
"""


def test_sigkill_mid_charge_never_gives_a_token_back(settings, tmp_path):
    """A charger is SIGKILLed at random moments on its persistent connection: every drawn token was charged,
    at most one charged token is lost per kill, and the counter still agrees with the rows."""
    tb = TokenBudget.open(settings)
    tb.create("kill", 10 ** 6, "refuse")
    log = tmp_path / "drawn.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for delay in (0.0, 0.03, 0.11):
        start = len(log.read_text().splitlines()) if log.exists() else 0
        p = subprocess.Popen([sys.executable, "-c", _KILL_WORKER, str(settings.home), str(log)], cwd=ROOT, env=env)
        for _ in range(1200):        # kill while it charges, not while Python imports
            if log.exists() and len(log.read_text().splitlines()) > start:
                break
            time.sleep(0.05)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        drawn = len(log.read_text().splitlines())
        spent = tb.spent("kill")
        assert drawn <= spent <= drawn + 1
    con = sqlite3.connect(settings.private_dir / "pmixed.db")
    assert _counters(con)[("kill", "")][0] == _rows_sum(con, "pmixed_token_charges") == tb.spent("kill")
    con.close()
    tb.dispose()


def test_a_forked_child_charges_on_a_connection_of_its_own(settings):
    tb = TokenBudget.open(settings)
    tb.create("fork", 10, "refuse")
    assert tb.charge("fork", 1)           # the parent's connection is open now
    pid = os.fork()
    if pid == 0:                          # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            code = 0 if tb.charge("fork", 2) and tb.spent("fork") == 3 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tb.charge("fork", 1) and tb.spent("fork") == 4
    tb.dispose()


def test_concurrent_threads_in_one_process(settings):
    tb = TokenBudget.open(settings)
    tb.create("threads", 100, "refuse")
    got = []
    ts = [threading.Thread(target=lambda: got.append(sum(iter(lambda: tb.grant("threads", 3)[0], 0))))
          for _ in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert sum(got) == 100 and tb.spent("threads") == 100
    tb.dispose()


@pytest.mark.timeout(300)
def test_counter_on_postgresql_counts_rows_it_did_not_write():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "privacy"))
    from _ledger_pg import postgres_server
    from sqlalchemy import text

    with postgres_server() as url:
        tb = TokenBudget(url)
        tb.create("ens", 20, "refuse")
        assert tb.charge("ens", 4) and tb.grant("ens", 3, key="k", quota=4) == (3, None)
        with tb.engine.begin() as conn:   # an earlier Veil's rows, the counter untouched
            conn.execute(text("INSERT INTO pmixed_token_charges (ensemble_id, tokens, at) VALUES ('ens', 5, 'x')"))
        assert tb.spent("ens") == 12 and tb.key_remaining("ens", "k", 4) == 1
        assert tb.grant("ens", 5, key="k", quota=4) == (1, QUOTA_SPENT)
        assert tb.grant("ens", 50) == (7, BUDGET_SPENT) and tb.spent("ens") == 20 and not tb.charge("ens", 1)
        with tb.engine.begin() as conn:
            assert conn.execute(text("SELECT tokens FROM pmixed_spent WHERE key_sha256 = ''")).scalar_one() == 20
        tb.dispose()
