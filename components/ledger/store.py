"""The ledger's tables and its one write transaction (SQLAlchemy 2 Core; SQLite or PostgreSQL).

Append-only by construction: this module has no UPDATE and no DELETE. A DP-SGD plan has at most one
release (`ledger_plan_releases`, checked in the reserving transaction). A release's status is the last
of its events; a person's spend is the sum of their charges, and a secret's lifetime KL the sum of its
KL charges, which are only ever inserted.

Serialization. A reservation reads the people's spend and inserts the release and its charges in one
transaction that no other reservation can interleave with:
  * SQLite: `BEGIN IMMEDIATE` takes the database's write lock before the first read;
  * PostgreSQL: SERIALIZABLE isolation; a serialization failure (SQLSTATE 40001, deadlock 40P01, or a
    unique-key race) rolls back and the whole transaction is retried from its first read.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import random
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import numpy as np
from sqlalchemy import (Column, Float, ForeignKey, Integer, MetaData, String, Table, Text, create_engine, event,
                        select, text)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from components.core.errors import VeilError

SCHEMA_VERSION = "veil.ledger/v1"
STATUSES = ("reserved", "trained", "registered", "refused", "crashed", "deleted", "audit_failed")

metadata = MetaData()

meta = Table("ledger_meta", metadata,
             Column("key", String(64), primary_key=True),
             Column("value", Text, nullable=False))

people = Table("ledger_people", metadata,
               Column("person_key", String(64), primary_key=True),       # HMAC pseudonym, never a name
               Column("first_release_id", Integer, nullable=False),
               Column("created_at", String(40), nullable=False))

releases = Table("ledger_releases", metadata,
                 Column("id", Integer, primary_key=True, autoincrement=True),
                 Column("kind", String(16), nullable=False),             # privacy unit: user/record/secret
                 Column("mechanism", String(32), nullable=False),
                 Column("plan_sha256", String(64)),
                 Column("params", Text, nullable=False),                 # q, σ, T, ... as JSON
                 Column("admitted", Integer, nullable=False),
                 Column("retired", Integer, nullable=False),
                 Column("created_at", String(40), nullable=False))

events = Table("ledger_release_events", metadata,
               Column("id", Integer, primary_key=True, autoincrement=True),
               Column("release_id", Integer, ForeignKey("ledger_releases.id"), nullable=False, index=True),
               Column("status", String(16), nullable=False),
               Column("detail", Text, nullable=False),                  # JSON: certificate sha256, reason, ...
               Column("at", String(40), nullable=False))

charges = Table("ledger_charges", metadata,
                Column("person_key", String(64), ForeignKey("ledger_people.person_key"), primary_key=True),
                Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True),
                Column("rdp", Text, nullable=False),                    # JSON list on the ledger's orders
                Column("rows", Integer, nullable=False),                 # the person's rows in this release
                Column("sampling_rate", Float, nullable=False))          # their q' (module rdp)

exclusions = Table("ledger_retirements", metadata,
                   Column("person_key", String(64), ForeignKey("ledger_people.person_key"), primary_key=True),
                   Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True))

# --- per secret (secret-protection releases; docs/privacy/ledger.md "Per secret") --------------------
# A secret is named only by its HMAC pseudonym: the secret's value never enters the database.
secret_classes = Table("ledger_secret_classes", metadata,
                       Column("secret_class", String(128), primary_key=True),
                       Column("kappa", Float, nullable=False),              # the attacker's prior, fixed
                       Column("gamma", Float, nullable=False),              # the lifetime posterior target
                       Column("first_release_id", Integer, ForeignKey("ledger_releases.id"), nullable=False))

secret_charges = Table("ledger_secret_charges", metadata,
                       Column("secret_key", String(64), primary_key=True),   # HMAC of "class:value"
                       Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True),
                       Column("secret_class", String(128), ForeignKey("ledger_secret_classes.secret_class"),
                              nullable=False, index=True),
                       Column("kl", Float, nullable=False),                  # this release's KL for the secret
                       Column("records", Integer, nullable=False))           # its records with a positive rate

secret_drops = Table("ledger_secret_drops", metadata,
                     Column("secret_key", String(64), primary_key=True),
                     Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True),
                     Column("secret_class", String(128), ForeignKey("ledger_secret_classes.secret_class"),
                            nullable=False))

# One release per plan (issue 28): a DP-SGD plan's release is unique by its plan's sha256. The reserving
# transaction checks `ledger_releases` under the write lock (SQLite) / SERIALIZABLE (PostgreSQL), and
# this primary key makes a second insert fail in the database itself whatever the isolation; a table
# of its own so that `create_all` adds it to ledgers made before it (their older releases are found
# by the check on `ledger_releases`).
plan_releases = Table("ledger_plan_releases", metadata,
                      Column("plan_sha256", String(64), primary_key=True),
                      Column("release_id", Integer, ForeignKey("ledger_releases.id"), nullable=False))

# Identities that are one person (issue 26): `linked_key` is a pseudonym charged before — under the
# ledger's earlier identity rule (keys.legacy_person_key), or an account id that `people.aliases` now
# merges into another person — and its charges count for `person_key` from then on, in every decision
# and view (`linked_closure`). Only ever inserted: a link never lowers anyone's spend. A table of its own
# so that `create_all` adds it to ledgers made before it.
person_links = Table("ledger_person_links", metadata,
                     Column("linked_key", String(64), primary_key=True),
                     Column("person_key", String(64), primary_key=True, index=True),
                     Column("created_at", String(40), nullable=False))

RETRY_SQLSTATES = ("40001", "40P01")
MAX_ATTEMPTS = 200
_CHUNK = 500  # IN-list size (SQLite allows 32766 variables; keep statements small)

T = TypeVar("T")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


RESTORE = ("restore it from a backup (it holds every person's lifetime spend: a new, empty ledger would reset "
           "everyone's budget), or point VEIL_LEDGER_URL at the team's ledger")


def _create_aside(path: Path) -> None:
    """Create an SQLite ledger's file once, atomically: the schema is written to a private file beside
    it, which is then hard-linked into place (never over an existing file: a concurrent creator's wins).
    So `path` never exists empty or half-made, and an empty or garbled file found there later is damage
    to refuse, not a ledger to re-initialise (components.core.sqlite_files)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{random.randrange(1 << 30)}.new")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))   # private: per-person rows
    try:
        eng = create_engine(f"sqlite:///{tmp}")
        try:
            with eng.begin() as conn:
                metadata.create_all(conn)
        finally:
            eng.dispose()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


def make_engine(url: str) -> Engine:
    """An engine whose `begin()` is serializable for the ledger's purposes (module docstring)."""
    if url.startswith("sqlite"):
        from components.core.sqlite_files import check_existing

        path = _sqlite_path(url)
        if path is None or str(path) in ("", ":memory:"):
            raise VeilError(f"ledger url {url!r}: an SQLite ledger must be a file (sqlite:////absolute/path.db)")
        path.parent.mkdir(parents=True, exist_ok=True)
        check_existing(path, "ledger", RESTORE)
        if not path.exists():
            _create_aside(path)
        engine = create_engine(url, connect_args={"timeout": 300, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _rec):  # pragma: no cover - exercised by every test
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")   # durable: a reservation survives a power cut
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=300000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # pragma: no cover - exercised by every test
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith(("postgresql", "postgres")):
        if url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://"):]
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        try:
            return create_engine(url, isolation_level="SERIALIZABLE", pool_pre_ping=True)
        except ModuleNotFoundError:
            raise VeilError("ledger url: PostgreSQL needs the psycopg driver (pip install 'psycopg[binary]')") from None
    raise VeilError(f"ledger url {url.split('://')[0]}://…: only sqlite:/// and postgresql:// ledgers are supported")


def _retryable(e: BaseException) -> bool:
    if isinstance(e, IntegrityError):
        return True   # two first-time inserts of one key raced; the retry sees the winner's row
    if isinstance(e, DBAPIError):
        code = getattr(getattr(e, "orig", None), "sqlstate", None) or getattr(getattr(e, "orig", None), "pgcode", None)
        if code in RETRY_SQLSTATES:
            return True
        if "database is locked" in str(e):
            return True
    return False


def _damaged(engine: Engine, e: BaseException) -> VeilError | None:
    """A damaged SQLite file (SQLite's own words) as one line with what to restore."""
    from components.core.sqlite_files import unreadable

    if engine.dialect.name == "sqlite" and unreadable(e):
        msg = str(getattr(e, "orig", e)).splitlines()[0]
        return VeilError(f"ledger {engine.url.database} is damaged ({msg}); {RESTORE}")
    return None


def transact(engine: Engine, work: Callable[[Connection], T]) -> T:
    """Run `work` in one serializable transaction, retrying it whole on a serialization failure."""
    delay = 0.005
    for attempt in range(MAX_ATTEMPTS):
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "sqlite":
                    pass  # BEGIN IMMEDIATE already holds the write lock
                return work(conn)
        except (DBAPIError, IntegrityError) as e:
            bad = _damaged(engine, e)
            if bad is not None:
                raise bad from None
            if not _retryable(e) or attempt == MAX_ATTEMPTS - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)
    raise AssertionError("unreachable")


def create(engine: Engine) -> None:
    """Create the tables once; concurrent first opens serialize on the transaction (and PG's lock).

    An SQLite ledger's file is created with its tables (`_create_aside`); here it only gains tables
    added since it was made. A file without the ledger's own table is not a ledger — another
    application's database, or one emptied — and is refused rather than turned into a fresh one."""
    def work(conn: Connection) -> None:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(716172)"))  # DDL of several processes at once
        else:
            from sqlalchemy import inspect as _inspect

            if meta.name not in _inspect(conn).get_table_names():
                raise VeilError(f"ledger {engine.url.database} is an SQLite database without the ledger's tables "
                                f"(emptied, or another application's file); {RESTORE}")
        metadata.create_all(conn, checkfirst=True)
    transact(engine, work)


def read_meta(conn: Connection) -> dict[str, str]:
    return {r.key: r.value for r in conn.execute(select(meta.c.key, meta.c.value))}


def insert_ignore(conn: Connection, table: Table, rows: list[dict]) -> None:
    """INSERT … ON CONFLICT DO NOTHING (both dialects)."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    for i in range(0, len(rows), _CHUNK):
        conn.execute(insert(table).on_conflict_do_nothing(), rows[i:i + _CHUNK])


def read_links(conn: Connection) -> dict[str, set[str]]:
    """linked_key → the person keys it counts for."""
    out: dict[str, set[str]] = {}
    for r in conn.execute(select(person_links.c.linked_key, person_links.c.person_key)):
        out.setdefault(r.linked_key, set()).add(r.person_key)
    return out


def linked_closure(conn: Connection, keys: list[str]) -> dict[str, set[str]]:
    """Each key's own key plus every key whose charges count for it through links (transitively: a
    pseudonym linked to one that was later linked again still counts)."""
    into: dict[str, set[str]] = {}          # person_key → keys linked into it, read once per frontier
    out = {k: {k} for k in keys}
    frontier = set(keys)
    seen: set[str] = set()
    while frontier:
        todo = sorted(frontier - seen)
        seen |= frontier
        frontier = set()
        for i in range(0, len(todo), _CHUNK):
            chunk = todo[i:i + _CHUNK]
            for r in conn.execute(select(person_links.c.linked_key, person_links.c.person_key)
                                  .where(person_links.c.person_key.in_(chunk))):
                into.setdefault(r.person_key, set()).add(r.linked_key)
                frontier.add(r.linked_key)
    if not into:
        return out
    for k in keys:
        stack, got = [k], out[k]
        while stack:
            for l in into.get(stack.pop(), ()):
                if l not in got:
                    got.add(l)
                    stack.append(l)
    return out


def spend_by_mechanism(conn: Connection, keys: list[str], n_orders: int) -> dict[str, dict[str, np.ndarray]]:
    """Each person's RDP spend per release mechanism (the relation a charge is under is its mechanism's),
    their linked pseudonyms' charges included (`person_links`)."""
    closure = linked_closure(conn, keys)
    own: dict[str, dict[str, np.ndarray]] = {}
    wanted = sorted(set().union(*closure.values())) if closure else []
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i:i + _CHUNK]
        q = (select(charges.c.person_key, charges.c.rdp, releases.c.mechanism)
             .join(releases, releases.c.id == charges.c.release_id).where(charges.c.person_key.in_(chunk)))
        for r in conn.execute(q):
            v = np.asarray(json.loads(r.rdp), dtype=float)
            if v.shape != (n_orders,):
                raise VeilError("ledger: a charge is not on the ledger's order grid; the database was edited")
            d = own.setdefault(r.person_key, {})
            d[r.mechanism] = d.get(r.mechanism, 0.0) + v
    out: dict[str, dict[str, np.ndarray]] = {}
    for k in keys:
        for member in sorted(closure[k]):
            for m, v in own.get(member, {}).items():
                d = out.setdefault(k, {})
                d[m] = d.get(m, 0.0) + v
    return out


def secret_spend_of(conn: Connection, keys: list[str]) -> dict[str, float]:
    """Each secret's lifetime KL: the sum of every KL charge ever inserted for it (chain rule)."""
    out: dict[str, float] = {}
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i:i + _CHUNK]
        for r in conn.execute(select(secret_charges.c.secret_key, secret_charges.c.kl)
                              .where(secret_charges.c.secret_key.in_(chunk))):
            out[r.secret_key] = out.get(r.secret_key, 0.0) + float(r.kl)
    return out


def dumps_curve(v: np.ndarray) -> str:
    """Exact: json writes floats by repr, which round-trips; +∞ is written as a large sentinel-free 'Infinity'."""
    return json.dumps([float(x) for x in v])


@contextmanager
def read_only(engine: Engine) -> Iterator[Connection]:
    try:
        with engine.connect() as conn:
            yield conn
    except DBAPIError as e:
        bad = _damaged(engine, e)
        if bad is not None:
            raise bad from None
        raise
