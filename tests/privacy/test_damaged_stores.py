"""A ledger (or MLflow store) that exists but is empty, truncated or garbled is refused in one line with
what to restore — never re-initialised (issue 28: a zero-length `ledger.db` became a fresh ledger,
`veil ledger --json` exit 0 with 0 releases: everyone's lifetime spend reset)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.core.errors import VeilError
from components.ledger import Ledger
from components.ledger.release import release_costs

ROOT = Path(__file__).resolve().parents[2]
PLAN = {"mechanism": "uls", "privacy_unit": "user", "sampling_rate": 0.1, "noise_multiplier": 2.0, "steps": 20}


def _veil(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VEIL_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def ledger_bytes(settings) -> bytes:
    """A real ledger with one release of 300 people (many pages), closed (WAL checkpointed)."""
    led = Ledger.open(settings)
    try:
        led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=None,
                    costs=release_costs(PLAN, {f"p{i}": 1 for i in range(300)}, led.orders))
    finally:
        led.dispose()
    path = settings.private_dir / "ledger.db"
    assert not list(path.parent.glob("ledger.db-wal")) or path.with_name("ledger.db-wal").stat().st_size == 0
    return path.read_bytes()


def _damage(data: bytes, how: str) -> bytes:
    if how == "empty":
        return b""
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "random":
        return os.urandom(len(data))
    return data[:8192] + os.urandom(len(data) - 8192)     # header intact, pages garbled


@pytest.mark.parametrize("how", ["empty", "truncated", "random", "garbled-pages"])
def test_a_damaged_ledger_is_refused_in_one_line_and_left_as_it_is(settings, veil_home, ledger_bytes, how):
    path = settings.private_dir / "ledger.db"
    bad = _damage(ledger_bytes, how)
    path.write_bytes(bad)
    for side in path.parent.glob("ledger.db-*"):
        side.unlink()
    with pytest.raises(VeilError) as e:
        led = Ledger.open(settings)
        try:
            led.summary()      # damage inside the pages shows when they are read
        finally:
            led.dispose()
    msg = str(e.value)
    assert str(path) in msg and "restore it from a backup" in msg and "\n" not in msg
    assert path.read_bytes() == bad, "the damaged ledger was modified (re-initialised?)"
    res = _veil(veil_home, "ledger", "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "restore it from a backup" in lines[0] and "Traceback" not in res.stderr
    assert res.stdout.strip() == ""
    assert path.read_bytes() == bad


def test_a_database_without_the_ledgers_tables_is_not_made_a_ledger(settings):
    import sqlite3

    path = settings.private_dir / "ledger.db"
    con = sqlite3.connect(path)                 # a sound SQLite file, but someone else's (or emptied)
    con.execute("CREATE TABLE notes (x TEXT)")
    con.commit()
    con.close()
    with pytest.raises(VeilError, match="without the ledger's tables"):
        Ledger.open(settings)


def test_a_ledger_whose_creation_dies_leaves_no_empty_file_behind(settings, monkeypatch):
    """Today's code created the file empty, then the schema in it: a process killed in between left a
    zero-length ledger.db, which the next open silently turned into a fresh ledger. The file is now made
    aside and linked into place whole."""
    from components.ledger import store

    path = settings.private_dir / "ledger.db"

    def killed(*_a, **_k):
        raise SystemExit("killed while creating the schema")

    with monkeypatch.context() as m:
        m.setattr(store.metadata, "create_all", killed)
        with pytest.raises(SystemExit):
            Ledger.open(settings)
    assert not path.exists(), f"a {path.stat().st_size}-byte ledger.db was left at its path"
    Ledger.open(settings).dispose()          # the next open creates it, whole and private
    assert path.stat().st_size > 0 and (path.stat().st_mode & 0o777) == 0o600
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".new")], "a creation temp file was left"
    with open(path, "rb") as f:
        assert f.read(16) == b"SQLite format 3\x00"


def test_an_empty_mlflow_store_is_refused_in_one_line(veil_home, settings):
    store = veil_home / "mlflow.db"
    store.write_bytes(b"")
    res = _veil(veil_home, "models", "--json")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "mlflow.db is empty" in lines[0] and "restore it from a backup" in lines[0]
    assert store.read_bytes() == b""
