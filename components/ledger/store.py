"""The ledger's tables and its one write transaction (SQLAlchemy 2 Core; SQLite or PostgreSQL).

The history is append-only: releases, events, charges, retirements, links and secret charges are only
ever inserted. A DP-SGD plan has at most one release (`ledger_plan_releases`, checked in the reserving
transaction). A release's status is the last of its events; a secret's lifetime KL the sum of its KL
charges. A person's spend is the sum of their charges; so that a reservation need not re-read every
charge, `ledger_spend` keeps that sum per (person, mechanism) — updated in the same transaction as the
charge it adds, so it always equals the sum of the charge rows (a test re-adds them), and
`ledger_state.seq` counts the writes that moved any spend, so that a reservation priced outside the
write lock can tell in O(1) whether anything changed under it (docs/privacy/ledger.md "Storage").
These two tables are the only ones ever updated.

Serialization. A reservation's decisions are computed from a snapshot read outside any write lock and
then checked, inside one transaction that no other reservation can interleave with, against the spend
rows changed since that snapshot (`ledger_spend.seq`); the people whose rows changed are re-priced there:
  * SQLite: `BEGIN IMMEDIATE` takes the database's write lock before the first read;
  * PostgreSQL: SERIALIZABLE isolation; a serialization failure (SQLSTATE 40001, deadlock 40P01, or a
    unique-key race) rolls back and the whole transaction is retried from its first read.
"""
from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import random
import time
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import numpy as np
from sqlalchemy import (Column, Float, ForeignKey, Index, Integer, LargeBinary, MetaData, String, Table, Text,
                        create_engine, event, func, select, text)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from components.core.errors import VeilError
from components.core.sqlite_files import check_existing, unreadable

SCHEMA_VERSION = "veil.ledger/v2"
# v1 (before issue 27): curves as JSON in `ledger_charges`, no running spend. Opened once by this code, a v1
# ledger is migrated in one transaction (`migrate`); a v1 Veil then refuses the ledger (its schema check),
# and one still running finds its charges table gone: it fails, never charges beside the running spend.
LEGACY_SCHEMA = "veil.ledger/v1"
LEGACY_CHARGES = "ledger_charges"
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

charges = Table("ledger_charges_v2", metadata,
                Column("person_key", String(64), ForeignKey("ledger_people.person_key"), primary_key=True),
                Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True),
                Column("rdp", LargeBinary, nullable=False),              # encode_curves: tag + float64 per order
                Column("rows", Integer, nullable=False),                 # the person's rows in this release
                Column("sampling_rate", Float, nullable=False))          # their q' (module rdp)
Index("ix_ledger_charges_v2_release", charges.c.release_id)              # burn-down reads release by release

# The running spend (issue 27): per (pseudonym, mechanism of the releases charged) the sum of that key's
# charges in release order, and how many they are. Derived from `ledger_charges_v2`, updated in the same
# transaction as each charge; `seq` is the `ledger_state.seq` of the write that last moved it.
spend = Table("ledger_spend", metadata,
              Column("person_key", String(64), primary_key=True),
              Column("mechanism", String(32), primary_key=True),
              Column("rdp", LargeBinary, nullable=False),
              Column("charges", Integer, nullable=False),
              Column("seq", Integer, nullable=False, index=True))

# One row (id 1): `seq` grows by one with every write that moves a spend, fixes the budget or adds links;
# `links_seq` is the seq of the last write that added identity links (links re-shape whole closures).
state = Table("ledger_state", metadata,
              Column("id", Integer, primary_key=True, autoincrement=False),
              Column("seq", Integer, nullable=False),
              Column("links_seq", Integer, nullable=False))

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

# What each release's charge rows are, recorded with them (issue 27: `veil ledger` at 10⁶ people × 10
# releases): how many, how many distinct stored curves among them (0, 1, or 2 for "several") and, when
# they are one curve, that curve — so the burn-down adds a release priced everyone alike without a scan
# of its rows. Written in the transaction that writes the charges, from the very bytes inserted (a row
# here is never stale: a release's charges are only ever inserted, all in that one transaction). A
# ledger made before this table gets it filled once when it is created (`create`: `backfill_release_curves`,
# a scan per release); a release with no row (written by a Veil without this table) is scanned when read.
release_curves = Table("ledger_release_curves", metadata,
                       Column("release_id", Integer, ForeignKey("ledger_releases.id"), primary_key=True),
                       Column("charges", Integer, nullable=False),
                       Column("curves", Integer, nullable=False),
                       Column("rdp", LargeBinary))

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
_READ_CHUNK = 5000   # IN-list size of the running-spend reads (one statement per 5000 people)
WRITE_CHUNK = 100_000  # people per bulk write of a reservation: each chunk's rows are built, written, dropped
# SQLite page cache per connection (KiB; SQLite's default is 2 MB): a 10⁶-person reservation rewrites the
# pages of four B-trees keyed by pseudonym; a cache that holds them spills each page to the WAL once, not
# again and again (issue 27: 1M people). Allocated as pages are used, so a small database stays small.
SQLITE_CACHE_KIB = 262_144

T = TypeVar("T")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


RESTORE = ("restore it from a backup (it holds every person's lifetime spend: a new, empty ledger would reset "
           "everyone's budget), or point VEIL_LEDGER_URL at the team's ledger")


def _create_aside(path: Path, tables: MetaData | None = None, fill: Callable[[Connection], None] | None = None) -> None:
    """Create an SQLite ledger's file once, atomically: the schema is written to a private file beside
    it, which is then hard-linked into place (never over an existing file: a concurrent creator's wins).
    So `path` never exists empty or half-made, and an empty or garbled file found there later is damage
    to refuse, not a ledger to re-initialise (components.core.sqlite_files). `fill`: rows written with the
    tables (a migration's), in the same transaction."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{random.randrange(1 << 30)}.new")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))   # private: per-person rows
    try:
        eng = create_engine(f"sqlite:///{tmp}")
        try:
            with eng.begin() as conn:
                (tables or metadata).create_all(conn)
                if fill is not None:
                    fill(conn)
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


def make_engine(url: str, *, tables: MetaData | None = None, what: str = "ledger", restore: str = RESTORE) -> Engine:
    """An engine whose `begin()` is serializable for the ledger's purposes (module docstring). `tables`: what
    a new SQLite file is created with (default: the ledger's); `what`/`restore` word its refusals."""
    if url.startswith("sqlite"):
        path = _sqlite_path(url)
        if path is None or str(path) in ("", ":memory:"):
            raise VeilError(f"{what} url {url!r}: an SQLite {what} must be a file (sqlite:////absolute/path.db)")
        path.parent.mkdir(parents=True, exist_ok=True)
        check_existing(path, what, restore)
        if not path.exists():
            _create_aside(path, tables)
        engine = create_engine(url, connect_args={"timeout": 300, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _rec):  # pragma: no cover - exercised by every test
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")   # durable: a reservation survives a power cut
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=300000")
            cur.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # pragma: no cover - exercised by every test
            # a reader (`read_only`) takes a WAL snapshot and never the write lock: it neither waits for a
            # reservation nor holds one up (issue 27); every other transaction writes, and locks first
            conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("veil_read") else "BEGIN IMMEDIATE")

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
        from sqlalchemy import inspect as _inspect

        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(716172)"))  # DDL of several processes at once
        had = set(_inspect(conn).get_table_names())
        if engine.dialect.name != "postgresql" and meta.name not in had:
            raise VeilError(f"ledger {engine.url.database} is an SQLite database without the ledger's tables "
                            f"(emptied, or another application's file); {RESTORE}")
        metadata.create_all(conn, checkfirst=True)
        insert_ignore(conn, state, [{"id": 1, "seq": 0, "links_seq": 0}])
        migrated = migrate(conn)
        if release_curves.name not in had:
            backfill_release_curves(conn)   # a ledger made before the table: its releases, once
        if not migrated and legacy_charges_present(conn) and \
                read_meta(conn).get("schema") == SCHEMA_VERSION and \
                conn.execute(text(f"SELECT count(*) FROM {LEGACY_CHARGES}")).scalar_one():
            # a v1 Veil re-made the v1 table after the migration and charged into it: those charges are
            # in no running spend. Refused, never ignored (they were releases people paid for).
            raise VeilError(f"ledger {engine.url.database}: holds charges written by an older Veil after it was "
                            "migrated to this Veil's format; stop every older Veil process and ask for help "
                            "recovering them (they are not counted yet)")
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


CURVE_TAG = 1   # first byte of a stored curve: little-endian float64 per order follows (encode_curves)


def encode_curves(mat: np.ndarray) -> list[bytes]:
    """Rows of a (people × orders) matrix as stored curves: one tag byte (CURVE_TAG), then each order's
    float64, little-endian — exact (the float's own bits, +∞ included) and ~40× faster than JSON."""
    mat = np.ascontiguousarray(np.asarray(mat, dtype="<f8"))
    if mat.ndim != 2:
        raise ValueError("encode_curves: a matrix")
    if mat.shape[0] == 0:
        return []
    raw = np.empty((mat.shape[0], 1 + 8 * mat.shape[1]), dtype=np.uint8)
    raw[:, 0] = CURVE_TAG
    raw[:, 1:] = mat.view(np.uint8).reshape(mat.shape[0], -1)
    return [r.tobytes() for r in raw]


def decode_curves(blobs: list, n_orders: int) -> np.ndarray:
    """The (len(blobs) × orders) matrix of stored curves; a curve of another length or tag is refused (the
    database was edited, or a curve is not on the ledger's grid)."""
    width = 1 + 8 * n_orders
    if not blobs:
        return np.zeros((0, n_orders))
    try:
        joined = b"".join(blobs)
    except TypeError:       # a driver's memoryview rows
        blobs = [bytes(b) for b in blobs]
        joined = b"".join(blobs)
    lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
    if len(joined) != width * len(blobs) or np.any(lengths != width):
        raise VeilError("ledger: a charge is not on the ledger's order grid; the database was edited")
    raw = np.frombuffer(joined, dtype=np.uint8).reshape(len(blobs), width)
    if np.any(raw[:, 0] != CURVE_TAG):
        raise VeilError("ledger: a stored curve has an unknown encoding; the database was edited")
    return raw[:, 1:].copy().view("<f8").astype(float)


def bulk(conn: Connection, table: Table, columns: tuple[str, ...], rows, *, conflict: str = "") -> None:
    """Insert many rows in one statement stream, inside the caller's transaction: SQLite `executemany` on
    the driver's cursor; PostgreSQL `COPY` (through a temporary table when `conflict` — an
    `ON CONFLICT …` clause — must apply). `rows`: an iterable of tuples in `columns`' order."""
    cols = ", ".join(columns)
    if conn.dialect.name == "postgresql":
        cur = conn.connection.driver_connection.cursor()
        target = table.name
        if conflict:
            target = f"_veil_bulk_{table.name}"
            cur.execute(f"CREATE TEMP TABLE {target} (LIKE {table.name}) ON COMMIT DROP")
        with cur.copy(f"COPY {target} ({cols}) FROM STDIN") as cp:
            for r in rows:
                cp.write_row(r)
        if conflict:
            cur.execute(f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {target} {conflict}")
            cur.execute(f"DROP TABLE {target}")
        return
    sql = f"INSERT INTO {table.name} ({cols}) VALUES ({', '.join('?' * len(columns))}) {conflict}"
    conn.connection.driver_connection.cursor().executemany(sql, rows)


SPEND_UPSERT = ("ON CONFLICT (person_key, mechanism) DO UPDATE SET rdp = excluded.rdp, "
                "charges = excluded.charges, seq = excluded.seq")


def read_state(conn: Connection) -> tuple[int, int]:
    r = conn.execute(select(state.c.seq, state.c.links_seq).where(state.c.id == 1)).first()
    return (0, 0) if r is None else (int(r.seq), int(r.links_seq))


def bump_state(conn: Connection, *, links: bool = False) -> int:
    """The next seq, in the caller's transaction (the row exists: `create`)."""
    seq = read_state(conn)[0] + 1
    conn.execute(state.update().where(state.c.id == 1)
                 .values(seq=seq, **({"links_seq": seq} if links else {})))
    return seq


def spend_rows(conn: Connection, keys, n_orders: int, *, since: int | None = None):
    """Running-spend rows as (person_keys, mechanisms, matrix, counts): of `keys` (None: everyone; a set
    or a dict's keys view is used as it is), or of rows moved after seq `since`. Reads the whole table in
    one scan when the keys are most of it. Streams the rows: each stored curve is kept once per distinct
    value (people charged alike have equal running spends) and decoded once."""
    cols = (spend.c.person_key, spend.c.mechanism, spend.c.rdp, spend.c.charges)
    want = None if keys is None else (keys if isinstance(keys, AbstractSet) else set(keys))
    if want is not None and not want:
        return [], [], np.zeros((0, n_orders)), np.zeros(0, dtype=np.int64)
    if since is not None:
        stmts = [select(*cols).where(spend.c.seq > int(since))]
    elif want is None:
        stmts = [select(*cols)]
    elif len(want) * 4 >= conn.execute(select(text("count(*)")).select_from(spend)).scalar_one():
        stmts = [select(*cols)]
    else:
        wl = sorted(want)
        stmts = [select(*cols).where(spend.c.person_key.in_(wl[i:i + _READ_CHUNK]))
                 for i in range(0, len(wl), _READ_CHUNK)]
        want = None     # the statements select exactly these
    ks, ms, gid, cnt = [], [], [], []
    curves: dict[bytes, int] = {}
    mechs: dict[str, str] = {}
    for stmt in stmts:
        for k, m, b, c in columns(conn, stmt, 4, keep=want):
            ks += k
            ms += [mechs.setdefault(x, x) for x in m]         # one str per mechanism, not per row
            b = [x if isinstance(x, bytes) else bytes(x) for x in b]
            for x in dict.fromkeys(b):                        # each distinct curve kept once
                curves.setdefault(x, len(curves))
            gid += map(curves.__getitem__, b)
            cnt += c
    if not ks:
        return [], [], np.zeros((0, n_orders)), np.zeros(0, dtype=np.int64)
    return ks, ms, decode_curves(list(curves), n_orders)[np.array(gid, dtype=np.int64)], np.array(cnt, dtype=np.int64)


FETCH = 50_000   # rows per driver fetch of the streamed reads


@contextmanager
def no_gc() -> Iterator[None]:
    """Python's cycle collector paused for a bulk read: 10⁶ rows make millions of tuples, strings and
    lists, none in a cycle, and each allocation burst would otherwise re-scan every object alive (measured:
    a 10⁶-row, 4-column read through `columns` 4.9–5.4 CPU s with it, 2.2–2.4 s without)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def columns(conn: Connection, stmt, width: int, *, keep=None) -> Iterator[tuple[list, ...]]:
    """`stmt`'s rows as batches of columns (one list per selected column), fetched from the driver's
    cursor in batches of FETCH rows: no SQLAlchemy row object, no Python loop per row (10⁶-person reads).
    `keep`: keep only rows whose first column is in it."""
    res = conn.execute(stmt)
    try:
        cur = res.cursor
        while True:
            part = cur.fetchmany(FETCH)
            if not part:
                return
            if keep is not None:
                part = [r for r in part if r[0] in keep]
                if not part:
                    continue
            yield tuple(list(c) for c in zip(*part))
    finally:
        res.close()


def shared_curves(blobs: list, n_orders: int) -> np.ndarray:
    """decode_curves of stored curves that repeat (people charged alike): each distinct curve decoded once."""
    if not blobs:
        return np.zeros((0, n_orders))
    if not isinstance(blobs[0], bytes):
        blobs = [bytes(b) for b in blobs]
    ids = {b: i for i, b in enumerate(dict.fromkeys(blobs))}
    gid = np.fromiter(map(ids.__getitem__, blobs), dtype=np.int64, count=len(blobs))
    return decode_curves(list(ids), n_orders)[gid]


def scan_release_curves(conn: Connection, release_id: int) -> tuple[int, int, bytes | None]:
    """A release's (charges, distinct curves capped at 2, the curve when one) from its charge rows: one
    aggregate over its index, no row per person in Python (≈ 0.5–1.5 s per 10⁶ charges)."""
    where = charges.c.release_id == int(release_id)
    if conn.dialect.name == "sqlite":       # blobs compare bytewise: min = max iff one curve
        cnt, lo, hi = conn.execute(select(func.count(), func.min(charges.c.rdp), func.max(charges.c.rdp))
                                   .where(where)).one()
        if not cnt:
            return 0, 0, None
        return (int(cnt), 1, bytes(lo)) if lo == hi else (int(cnt), 2, None)
    cnt, distinct = conn.execute(select(func.count(), func.count(charges.c.rdp.distinct())).where(where)).one()
    if not cnt:
        return 0, 0, None
    if distinct > 1:
        return int(cnt), 2, None
    return int(cnt), 1, bytes(conn.execute(select(charges.c.rdp).where(where).limit(1)).scalar())


def release_curves_of(conn: Connection) -> dict[int, tuple[int, int, bytes | None]]:
    """The recorded `ledger_release_curves` rows: release id → (charges, curves, the curve when one)."""
    return {int(r.release_id): (int(r.charges), int(r.curves), None if r.rdp is None else bytes(r.rdp))
            for r in conn.execute(select(release_curves))}


def record_release_curves(conn: Connection, release_id: int, charged: int, curves: set) -> None:
    """Record a release's charges, in the transaction that inserted them: `curves`, the distinct stored
    curves among the rows inserted (at most two kept: two means several)."""
    one = next(iter(curves)) if len(curves) == 1 else None
    conn.execute(release_curves.insert().values(release_id=int(release_id), charges=int(charged),
                                                curves=min(len(curves), 2), rdp=one))


def backfill_release_curves(conn: Connection) -> int:
    """`ledger_release_curves` rows for every release without one, each from a scan of its charges
    (`scan_release_curves`), in the caller's transaction. Returns how many were written."""
    have = set(conn.execute(select(release_curves.c.release_id)).scalars())
    todo = [int(r) for r in conn.execute(select(releases.c.id).order_by(releases.c.id)).scalars() if r not in have]
    for rid in todo:
        cnt, k, one = scan_release_curves(conn, rid)
        conn.execute(release_curves.insert().values(release_id=rid, charges=cnt, curves=k, rdp=one))
    return len(todo)


def one_curve_release(conn: Connection, release_id: int, n_orders: int,
                      recorded: dict | None = None) -> tuple[int, np.ndarray] | None:
    """(its number of charges, the curve) when every charge of the release is the same curve — a
    user-sampled release prices everyone alike — read without a row per person; None otherwise.
    `recorded` (`release_curves_of`): the release's row there is read instead of its charges."""
    got = None if recorded is None else recorded.get(int(release_id))
    cnt, k, one = got if got is not None else scan_release_curves(conn, release_id)
    if k > 1:
        return None
    return cnt, (np.zeros(n_orders) if not cnt else decode_curves([one], n_orders)[0])


def retired_keys(conn: Connection, release_id: int) -> list[str]:
    return list(conn.execute(select(exclusions.c.person_key).where(exclusions.c.release_id == int(release_id)))
                .scalars())


def charge_rows(conn: Connection, release_id: int, n_orders: int) -> tuple[list[str], np.ndarray]:
    """One release's charges as (pseudonyms, matrix), streamed (its index), each distinct curve decoded once."""
    ks, blobs = [], []
    for k, b in columns(conn, select(charges.c.person_key, charges.c.rdp)
                        .where(charges.c.release_id == int(release_id)), 2):
        ks += k
        blobs += b
    return ks, shared_curves(blobs, n_orders)


def charge_curve_ids(conn: Connection, release_id: int, n_orders: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """One release's charges as (pseudonyms, each row's curve id, the distinct curves decoded), streamed."""
    ks, blobs = [], []
    for k, b in columns(conn, select(charges.c.person_key, charges.c.rdp)
                        .where(charges.c.release_id == int(release_id)), 2):
        ks += k
        blobs += b if isinstance(b[0], bytes) else map(bytes, b)
    ids: dict[bytes, int] = {b: i for i, b in enumerate(dict.fromkeys(blobs))}
    gid = np.fromiter(map(ids.__getitem__, blobs), dtype=np.int64, count=len(blobs))
    return ks, gid, decode_curves(list(ids), n_orders)


def people_columns(conn: Connection) -> tuple[list[str], list[int]]:
    """Every pseudonym of `ledger_people` in key order, with its first release: two lists."""
    keys: list[str] = []
    firsts: list[int] = []
    for k, f in columns(conn, select(people.c.person_key, people.c.first_release_id).order_by(people.c.person_key), 2):
        keys += k
        firsts += f
    return keys, firsts


def spend_table(conn: Connection, n_orders: int):
    """The whole running spend as (pseudonyms, mechanism id per row, the mechanisms, distinct stored curves
    decoded, curve id per row, counts): each distinct curve decoded once and never repeated per row
    (people charged alike share one)."""
    ks: list[str] = []
    mid: list[int] = []
    gid: list[int] = []
    cnt: list[int] = []
    curves: dict[bytes, int] = {}
    mechs: dict[str, int] = {}
    for k, m, b, c in columns(conn, select(spend.c.person_key, spend.c.mechanism, spend.c.rdp, spend.c.charges), 4):
        ks += k
        for x in set(m):
            mechs.setdefault(x, len(mechs))
        mid += map(mechs.__getitem__, m)
        if not isinstance(b[0], bytes):     # a driver's memoryview rows
            b = [bytes(x) for x in b]
        for x in dict.fromkeys(b):
            curves.setdefault(x, len(curves))
        gid += map(curves.__getitem__, b)
        cnt += c
    return (ks, np.array(mid, dtype=np.int64), list(mechs), decode_curves(list(curves), n_orders),
            np.array(gid, dtype=np.int64), np.array(cnt, dtype=np.int64))


def spend_by_mechanism(conn: Connection, keys: list[str], n_orders: int) -> dict[str, dict[str, np.ndarray]]:
    """Each person's RDP spend per release mechanism (the relation a charge is under is its mechanism's),
    their linked pseudonyms' charges included (`person_links`): from the running spend."""
    closure = linked_closure(conn, keys)
    wanted = sorted(set().union(*closure.values())) if closure else []
    own: dict[str, dict[str, np.ndarray]] = {}
    ks, ms, mat, _ = spend_rows(conn, wanted, n_orders)
    for k, m, v in zip(ks, ms, mat):
        own.setdefault(k, {})[m] = v
    out: dict[str, dict[str, np.ndarray]] = {}
    for k in keys:
        for member in sorted(closure[k]):
            for m, v in own.get(member, {}).items():
                d = out.setdefault(k, {})
                d[m] = d.get(m, 0.0) + v
    return out


def legacy_charges_present(conn: Connection) -> bool:
    from sqlalchemy import inspect as _inspect

    return LEGACY_CHARGES in _inspect(conn).get_table_names()


def migrate(conn: Connection) -> bool:
    """A v1 ledger (JSON curves in `ledger_charges`, no running spend) made v2, in the caller's one
    transaction: every charge re-written in binary (exact: JSON held each float's repr), each pseudonym's
    running spend summed per mechanism in release order (the order the v1 reader summed in), the v1 table
    dropped, the schema stamped. A crash anywhere leaves the v1 ledger as it was. True when it migrated."""
    m = read_meta(conn)
    if m.get("schema") != LEGACY_SCHEMA or not legacy_charges_present(conn):
        return False
    orders = json.loads(m["orders"])
    n = len(orders)
    mech = {r.id: r.mechanism for r in conn.execute(select(releases.c.id, releases.c.mechanism))}
    old = conn.execute(text(f"SELECT person_key, release_id, rdp, rows, sampling_rate FROM {LEGACY_CHARGES} "
                            "ORDER BY person_key, release_id")).all()
    mat = np.zeros((len(old), n))
    for j, r in enumerate(old):
        v = np.asarray(json.loads(r.rdp), dtype=float)
        if v.shape != (n,):
            raise VeilError("ledger: a charge is not on the ledger's order grid; the database was edited")
        mat[j] = v
    blobs = encode_curves(mat)
    bulk(conn, charges, ("person_key", "release_id", "rdp", "rows", "sampling_rate"),
         ((r.person_key, int(r.release_id), b, int(r.rows), float(r.sampling_rate)) for r, b in zip(old, blobs)))
    sums: dict[tuple[str, str], list] = {}
    for j, r in enumerate(old):          # person, then release order: the sum the v1 reader made
        k = (r.person_key, mech[r.release_id])
        acc = sums.get(k)
        if acc is None:
            sums[k] = [0.0 + mat[j], 1]
        else:
            acc[0] = acc[0] + mat[j]
            acc[1] += 1
    keys = list(sums)
    enc = encode_curves(np.array([sums[k][0] for k in keys]).reshape(len(keys), n))
    bulk(conn, spend, ("person_key", "mechanism", "rdp", "charges", "seq"),
         ((k[0], k[1], b, sums[k][1], 1) for k, b in zip(keys, enc)))
    conn.execute(text(f"DROP TABLE {LEGACY_CHARGES}"))
    conn.execute(meta.update().where(meta.c.key == "schema").values(value=SCHEMA_VERSION))
    conn.execute(state.update().where(state.c.id == 1).values(seq=1, links_seq=1))
    return True


def secret_spend_of(conn: Connection, keys: list[str]) -> dict[str, float]:
    """Each secret's lifetime KL: the sum of every KL charge ever inserted for it (chain rule)."""
    out: dict[str, float] = {}
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i:i + _CHUNK]
        for r in conn.execute(select(secret_charges.c.secret_key, secret_charges.c.kl)
                              .where(secret_charges.c.secret_key.in_(chunk))):
            out[r.secret_key] = out.get(r.secret_key, 0.0) + float(r.kl)
    return out


@contextmanager
def read_only(engine: Engine) -> Iterator[Connection]:
    """A connection for reads: one consistent snapshot (SQLite WAL read transaction; PostgreSQL
    SERIALIZABLE), no write lock."""
    try:
        with engine.connect() as conn:
            conn.execution_options(veil_read=True)   # SQLite: a deferred BEGIN, one consistent snapshot
            yield conn
    except DBAPIError as e:
        bad = _damaged(engine, e)
        if bad is not None:
            raise bad from None
        raise
