"""Fallback for `components.ledger.store` (issue 13) until it is merged: the same SQLite engine settings and
the same retrying serializable transaction, SQLite only. Deleted once the ledger package is on main
(`budget.py` imports the ledger's own helpers first)."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Callable, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from components.core.errors import VeilError

T = TypeVar("T")


def make_engine(url: str) -> Engine:
    if not url.startswith("sqlite:///"):
        raise VeilError("pmixed budget: without the ledger package only sqlite:/// databases are supported")
    path = Path(url[len("sqlite:///"):])
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
    engine = create_engine(url, connect_args={"timeout": 300, "isolation_level": None})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _rec):
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=300000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def transact(engine: Engine, work: Callable[[Connection], T]) -> T:
    delay = 0.005
    for attempt in range(200):
        try:
            with engine.begin() as conn:
                return work(conn)
        except (DBAPIError, IntegrityError) as e:
            if not (isinstance(e, IntegrityError) or "database is locked" in str(e)) or attempt == 199:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)
    raise AssertionError("unreachable")
