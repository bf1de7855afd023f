"""The endpoint's durable token budget and its API keys, in a database of their own.

Where: `private/pmixed.db` (SQLite) beside the ledger — never in `ledger.db`, so that a token charge never
waits for a reservation holding the ledger's write lock (issue 27: a one-row charge waited 16.6 s behind a
30k-person reservation, and at 10⁶ people would have passed the 300 s lock timeout). With a team ledger
(`ledger_url` PostgreSQL) the tables sit in that database, apart from the ledger's: PostgreSQL locks rows,
not the database, and a charge touches none of the ledger's tables, so it never waits for a reservation
either. A budget kept in `ledger.db` by an earlier Veil moves once (`_move_out_of_ledger`).

One counter per ensemble, append-only: a charge is an inserted row; spent = the sum of the rows. A charge
reads the spend and inserts in ONE serializable transaction (SQLite `BEGIN IMMEDIATE`, WAL, synchronous=FULL;
PostgreSQL SERIALIZABLE with retries) — the per-person ledger's design (components/ledger/store.py, issue
13), whose engine and transaction helper are reused when that package is present. The row is committed
before the token is sampled, so a crash (even SIGKILL between commit and draw) loses the token and never
gives it back, and every server process that opens the same database shares one budget.

A charge costs O(1), not O(charges so far) (issue 27): `pmixed_spent` keeps, per ensemble (and per key),
the sum of the charge rows up to a row id (`through_id`), advanced in the same transaction as each row it
counts; the spend is that sum plus the rows after `through_id` (none, unless something that does not
advance it — an earlier Veil on the same file — inserted rows: they are counted, never skipped). On SQLite
each process charges through ONE persistent connection with SQLite's prepared-statement cache, no ORM: a
charge is a few short statements and one commit (its fsync): ≈ 0.4–0.7 ms of CPU measured, the fsync's system
time included, against ≈ 3.2 ms before (bench/scale.py), so a busy machine (a million-person reservation
beside it) delays it by little. The fsync stays: see `_Sqlite`.

Why a counter and not a per-token ledger reservation: one private token costs *every* person in the
ensemble the same curve (their shard may be selected). The per-person ledger is charged once, at build
time, for the whole budget T (docs/privacy/pmixed.md §5); this counter guarantees no more than T private
tokens are ever drawn, so that charge is never exceeded.

Per-key quotas (policy `key_quota_tokens`): a second append-only table counts each key's private tokens
per ensemble, written in the SAME transaction as the ensemble's counter, so a grant never exceeds either
and a restart (or another server process on the same database) sees the same per-key spend.

API keys: stored as sha256 of a 256-bit random key (a high-entropy secret needs no slow hash); the key
itself is shown once. A key's id is the first 16 hex digits of that hash (`veil keys list`). Revoking a key
inserts a row into a revocation table (durable, never undone); every request looks its key up in the same
database, so a running server refuses a revoked key from its next request on.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Callable

from sqlalchemy import Column, Integer, MetaData, String, Table, select, text

from components.core.errors import VeilError

# the per-person ledger's engine (SQLite/PostgreSQL, serializable) and retrying transaction
from components.core.sqlite_files import unreadable
from components.ledger.store import _create_aside, _sqlite_path, make_engine, transact

metadata = MetaData()

budgets = Table("pmixed_budgets", metadata,
                Column("ensemble_id", String(64), primary_key=True),
                Column("total_tokens", Integer, nullable=False),
                Column("when_exhausted", String(16), nullable=False),
                Column("created_at", String(40), nullable=False))

spends = Table("pmixed_token_charges", metadata,
               Column("id", Integer, primary_key=True, autoincrement=True),
               Column("ensemble_id", String(64), nullable=False, index=True),
               Column("tokens", Integer, nullable=False),
               Column("at", String(40), nullable=False))

api_keys = Table("pmixed_api_keys", metadata,
                 Column("key_sha256", String(64), primary_key=True),
                 Column("created_at", String(40), nullable=False))

# A revoked key: its own table (not a column) so that ledgers created before revocation existed gain it by
# create_all, with no migration.
key_revocations = Table("pmixed_api_key_revocations", metadata,
                        Column("key_sha256", String(64), primary_key=True),
                        Column("revoked_at", String(40), nullable=False))

KEY_ID_CHARS = 16

# One row per grant to a key: the key's spend = the sum of its rows (same design as the ensemble's counter).
key_spends = Table("pmixed_key_charges", metadata,
                   Column("id", Integer, primary_key=True, autoincrement=True),
                   Column("ensemble_id", String(64), nullable=False, index=True),
                   Column("key_sha256", String(64), nullable=False, index=True),
                   Column("tokens", Integer, nullable=False),
                   Column("at", String(40), nullable=False))

# The running sums (module docstring): `tokens` = the sum of the charge rows of this ensemble (key_sha256 '')
# or of this key's grant rows (key_sha256 = the key's digest) with id ≤ through_id. Derived, never the record:
# the rows are; a test checks the two agree. Its own table, so an older file gains it by create_all.
counters = Table("pmixed_spent", metadata,
                 Column("ensemble_id", String(64), primary_key=True),
                 Column("key_sha256", String(64), primary_key=True),
                 Column("tokens", Integer, nullable=False),
                 Column("through_id", Integer, nullable=False))

BUDGET_SPENT, QUOTA_SPENT = "budget_spent", "key_quota_spent"
ENSEMBLE = ""       # counters.key_sha256 of an ensemble's own counter

# The charge path's statements: plain SQL that SQLite and PostgreSQL both run (ON CONFLICT, RETURNING), so one
# function (`_grant`) holds the logic for both; on SQLite they are prepared once per connection and reused.
_Q_TOTAL = "SELECT total_tokens FROM pmixed_budgets WHERE ensemble_id = :e"
_Q_COUNTER = "SELECT tokens, through_id FROM pmixed_spent WHERE ensemble_id = :e AND key_sha256 = :k"
# the rows after the counter (normally none): an index range (ensemble_id, then the row id) on both engines
_Q_SINCE = {ENSEMBLE: "SELECT COALESCE(SUM(tokens), 0), MAX(id) FROM pmixed_token_charges "
                      "WHERE ensemble_id = :e AND id > :t",
            "key": "SELECT COALESCE(SUM(tokens), 0), MAX(id) FROM pmixed_key_charges "
                   "WHERE ensemble_id = :e AND key_sha256 = :k AND id > :t"}
_Q_INSERT = {ENSEMBLE: "INSERT INTO pmixed_token_charges (ensemble_id, tokens, at) VALUES (:e, :n, :at) RETURNING id",
             "key": "INSERT INTO pmixed_key_charges (ensemble_id, key_sha256, tokens, at) "
                    "VALUES (:e, :k, :n, :at) RETURNING id"}
_Q_ADVANCE = ("INSERT INTO pmixed_spent (ensemble_id, key_sha256, tokens, through_id) VALUES (:e, :k, :n, :t) "
              "ON CONFLICT (ensemble_id, key_sha256) DO UPDATE SET tokens = excluded.tokens, "
              "through_id = excluded.through_id")

Run = Callable[[str, dict], list]     # runs one statement inside the caller's transaction, returns its rows


def _spent(run: Run, ensemble_id: str, digest: str = ENSEMBLE) -> tuple[int, int]:
    """(tokens spent, id of the last row counted) of an ensemble (digest '') or of one key in it."""
    c = run(_Q_COUNTER, {"e": ensemble_id, "k": digest})
    spent, through = (int(c[0][0]), int(c[0][1])) if c else (0, 0)
    more, last = run(_Q_SINCE["key" if digest else ENSEMBLE], {"e": ensemble_id, "k": digest, "t": through})[0]
    return spent + int(more), (through if last is None else int(last))


def _total(run: Run, ensemble_id: str) -> int:
    row = run(_Q_TOTAL, {"e": ensemble_id})
    if not row:
        raise VeilError(f"pmixed: no token budget for ensemble {ensemble_id[:12]} in this ledger")
    return int(row[0][0])


def _record(run: Run, ensemble_id: str, digest: str, spent: int, k: int, at: str) -> None:
    """Insert one charge (or key grant) row of k tokens and advance its counter to include it."""
    table = "key" if digest else ENSEMBLE
    rid = run(_Q_INSERT[table], {"e": ensemble_id, "k": digest, "n": k, "at": at})[0][0]
    run(_Q_ADVANCE, {"e": ensemble_id, "k": digest, "n": spent + k, "t": int(rid)})


def _grant(run: Run, ensemble_id: str, tokens: int, digest: str | None, quota: int | None,
           whole: bool) -> tuple[int, str | None]:
    """Inside one write transaction: grant up to `tokens` (all or none when `whole`) within the ensemble's budget
    and, with `digest`, the key's `quota`; record what is granted. Returns (granted, why fewer)."""
    total = _total(run, ensemble_id)
    spent, _ = _spent(run, ensemble_id)
    left, why = total - spent, BUDGET_SPENT
    kspent = 0
    if digest is not None:
        kspent, _ = _spent(run, ensemble_id, digest)
        if int(quota) - kspent < left:
            left, why = int(quota) - kspent, QUOTA_SPENT
    k = max(0, min(int(tokens), left))
    if whole and k < int(tokens):
        k = 0
    if k:
        at = _now()
        _record(run, ensemble_id, ENSEMBLE, spent, k, at)
        if digest is not None:
            _record(run, ensemble_id, digest, kspent, k, at)
    return k, (why if k < int(tokens) else None)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


DB_NAME = "pmixed.db"
TABLES = (budgets, spends, api_keys, key_revocations, key_spends)
MOVED = "moved_"     # the prefix their old copies in ledger.db get when they move out (kept, never read)
RESTORE = ("restore it from a backup (it holds every ensemble's spent private tokens: a new, empty one would "
           "hand them out again)")


def default_url(settings) -> str:
    url = getattr(settings, "ledger_url", None)
    return url or f"sqlite:///{Path(settings.private_dir).resolve() / DB_NAME}"


def _move_out_of_ledger(ledger_db: Path, path: Path) -> None:
    """Move a token budget an earlier Veil kept in `ledger.db` into its own file, once, losing nothing.

    Under ledger.db's write lock, its `pmixed_*` tables are renamed `moved_pmixed_*` (an older Veil still
    serving then finds no table and refuses tokens: it fails closed, it never draws unrecorded ones) and
    their rows read; after that commit, `path` is created whole with those rows (written aside, then
    hard-linked into place). A crash between the two leaves the renamed tables and no `path`: the next
    open copies them again. Every row keeps its id; the old copies stay in ledger.db, unread."""
    import sqlite3

    con = sqlite3.connect(ledger_db, timeout=300, isolation_level=None)
    try:
        ours = {t.name for t in TABLES} | {MOVED + t.name for t in TABLES}
        if not ours & {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}:
            return          # nothing to move: take no lock (a reservation may hold it)
        con.execute("BEGIN IMMEDIATE")
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for t in TABLES:
            if t.name in names and MOVED + t.name not in names:
                con.execute(f'ALTER TABLE "{t.name}" RENAME TO "{MOVED + t.name}"')
                names.add(MOVED + t.name)
        rows = {}
        for t in TABLES:
            if MOVED + t.name in names:
                cols = [c.name for c in t.columns]
                rows[t.name] = [dict(zip(cols, r)) for r in con.execute(
                    f'SELECT {", ".join(cols)} FROM "{MOVED + t.name}"')]
        con.execute("COMMIT")
    finally:
        con.close()
    if not rows or path.exists():
        return

    def fill(conn) -> None:
        for t in TABLES:
            if rows.get(t.name):
                conn.execute(t.insert(), rows[t.name])
    _create_aside(path, metadata, fill)


class _Sqlite:
    """The charge path's connection to an SQLite budget: one per process, kept open, shared by the process's
    threads under a lock (a charge takes the file's write lock anyway, so two threads never charge at once).

    Durability is unchanged: WAL with synchronous=FULL, so COMMIT returns only after the WAL is fsynced.
    synchronous=NORMAL would survive a killed process (the WAL is in the OS's cache) but not a power cut or
    a kernel crash: the last commits could vanish after the token they paid for was drawn and sent, and the
    budget would hand those tokens out again (more than T private tokens, more than the certificate says).
    The fsync (≈ 4 ms on this project's disk) is the charge's price; what issue 27 removed is the rest
    (an O(charges) sum, the ORM's per-statement work). A process that forks gets a connection of its own
    (SQLite connections must not cross a fork)."""

    def __init__(self, path: Path):
        self.path, self.lock, self.pid, self.con = path, threading.Lock(), None, None

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=300, isolation_level=None, check_same_thread=False,
                              cached_statements=64)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")     # the class docstring says why not NORMAL
        con.execute("PRAGMA busy_timeout=300000")
        return con

    def transact(self, work: Callable[[Run], object], *, write: bool = True):
        with self.lock:
            if self.pid != os.getpid():
                self.con, self.pid = self._connect(), os.getpid()
            con = self.con

            def run(sql: str, params: dict) -> list:
                return con.execute(sql, params).fetchall()
            try:
                # a reader takes a WAL snapshot; a charge takes the write lock before its first read
                con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    out = work(run)
                    con.execute("COMMIT")     # returns after the WAL's fsync: only then is a token drawn
                except BaseException:
                    if con.in_transaction:    # a failed COMMIT too: the next charge starts clean
                        con.execute("ROLLBACK")
                    raise
                return out
            except sqlite3.DatabaseError as e:
                if unreadable(e):
                    raise VeilError(f"token budget {self.path} is damaged ({str(e).splitlines()[0]}); "
                                    f"{RESTORE}") from None
                raise

    def close(self) -> None:
        with self.lock:
            if self.con is not None and self.pid == os.getpid():
                self.con.close()
            self.con, self.pid = None, None


class TokenBudget:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url, tables=metadata, what="token budget", restore=RESTORE)
        transact(self.engine, lambda conn: metadata.create_all(conn, checkfirst=True))
        path = _sqlite_path(url) if self.engine.dialect.name == "sqlite" else None
        self._sqlite = _Sqlite(path) if path is not None else None

    @classmethod
    def open(cls, settings) -> "TokenBudget":
        private = Path(settings.private_dir)
        private.mkdir(parents=True, exist_ok=True)
        url = default_url(settings)
        if not getattr(settings, "ledger_url", None):
            path, old = private.resolve() / DB_NAME, private.resolve() / "ledger.db"
            if not path.exists() and old.exists():
                _move_out_of_ledger(old, path)
        return cls(url)

    def dispose(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        self.engine.dispose()

    def _run(self, work: Callable[[Run], object], *, write: bool = True):
        """`work(run)` in one transaction: SQLite's persistent connection, or the engine's serializable
        transaction (retried whole on a serialization failure) for PostgreSQL."""
        if self._sqlite is not None:
            return self._sqlite.transact(work, write=write)

        def on(conn):
            def run(sql: str, params: dict) -> list:
                r = conn.execute(text(sql), params)
                return r.all() if r.returns_rows else []
            return work(run)
        return transact(self.engine, on)

    def create(self, ensemble_id: str, total_tokens: int, when_exhausted: str) -> None:
        """Declare an ensemble's budget once; a second declaration must agree (budgets never top up)."""
        def work(conn):
            row = conn.execute(select(budgets).where(budgets.c.ensemble_id == ensemble_id)).first()
            if row is None:
                conn.execute(budgets.insert().values(ensemble_id=ensemble_id, total_tokens=int(total_tokens),
                                                     when_exhausted=when_exhausted, created_at=_now()))
            elif row.total_tokens != int(total_tokens):
                raise VeilError(f"pmixed budget {ensemble_id[:12]}: already {row.total_tokens} tokens; a budget "
                                "cannot change (a new budget needs a new ensemble and certificate)")
        transact(self.engine, work)

    def charge(self, ensemble_id: str, tokens: int = 1) -> bool:
        """Durably count `tokens` private tokens if they fit; False (nothing written) if they do not."""
        return self._run(lambda run: _grant(run, ensemble_id, tokens, None, None, whole=True))[1] is None

    def charge_upto(self, ensemble_id: str, tokens: int) -> int:
        """Durably count up to `tokens` private tokens (as many as remain); returns how many were granted.
        Granted tokens are spent whether or not they are then drawn (a request that stops early wastes them)."""
        return self.grant(ensemble_id, tokens)[0]

    def grant(self, ensemble_id: str, tokens: int, *, key: str | None = None,
              quota: int | None = None) -> tuple[int, str | None]:
        """Durably count up to `tokens` private tokens within the ensemble's budget and, when `quota` is set, within
        `key`'s quota (both in one transaction). Returns (granted, why fewer: BUDGET_SPENT, QUOTA_SPENT or None)."""
        if quota is not None and not key:
            raise VeilError("pmixed: a per-key quota needs the request's key")
        digest = key_digest(key) if quota is not None else None
        return self._run(lambda run: _grant(run, ensemble_id, tokens, digest, quota, whole=False))

    def key_remaining(self, ensemble_id: str, key: str, quota: int) -> int:
        """Private tokens `key` may still receive from this ensemble (its quota less its grants)."""
        d = key_digest(key)
        return self._run(lambda run: max(0, int(quota) - _spent(run, ensemble_id, d)[0]), write=False)

    def prepaid(self, ensemble_id: str, block: int, *, key: str | None = None, quota: int | None = None):
        """A `charge()` for `Ensemble.generate` that commits tokens `block` at a time (one fsync per block, not
        per token): every drawn token was committed before its draw; at most block − 1 are wasted per request.
        With `quota`, each block also counts against `key`'s quota. After a refusal, `charge.reason` says
        which limit was reached (BUDGET_SPENT or QUOTA_SPENT)."""
        left = [0]

        def charge() -> bool:
            if left[0] == 0:
                left[0], why = self.grant(ensemble_id, max(1, int(block)), key=key, quota=quota)
                if left[0] == 0:
                    charge.reason = why
                    return False
            left[0] -= 1
            return True
        charge.reason = None
        return charge

    def spent(self, ensemble_id: str) -> int:
        return self._run(lambda run: _spent(run, ensemble_id)[0], write=False)

    def remaining(self, ensemble_id: str) -> int:
        return self._run(lambda run: max(0, _total(run, ensemble_id) - _spent(run, ensemble_id)[0]), write=False)

    # --- API keys -------------------------------------------------------------------------------------

    def create_key(self) -> str:
        key = "veil_" + secrets.token_urlsafe(32)
        digest = key_digest(key)
        transact(self.engine, lambda conn: conn.execute(api_keys.insert().values(key_sha256=digest, created_at=_now())))
        return key

    def key_ok(self, key: str | None) -> bool:
        if not key:
            return False
        p = {"d": key_digest(key)}

        def work(run: Run) -> bool:   # every request asks: a read on the charge path's connection, no lock
            return (bool(run("SELECT 1 FROM pmixed_api_keys WHERE key_sha256 = :d", p))
                    and not run("SELECT 1 FROM pmixed_api_key_revocations WHERE key_sha256 = :d", p))
        return self._run(work, write=False)

    def list_keys(self) -> list[dict]:
        """Every key ever created, oldest first: its id (hash prefix), sha256, creation and revocation times.
        Never the key: only its hash is stored."""
        def work(conn) -> list[dict]:
            revoked = dict(conn.execute(select(key_revocations.c.key_sha256, key_revocations.c.revoked_at)).all())
            rows = conn.execute(select(api_keys.c.key_sha256, api_keys.c.created_at)
                                .order_by(api_keys.c.created_at, api_keys.c.key_sha256)).all()
            return [{"id": r.key_sha256[:KEY_ID_CHARS], "sha256": r.key_sha256, "created_at": r.created_at,
                     "revoked_at": revoked.get(r.key_sha256)} for r in rows]
        return transact(self.engine, work)

    def revoke_key(self, key_id: str) -> dict:
        """Revoke the key whose sha256 starts with `key_id` (at least 8 hex digits, one key only). Durable; a
        key already revoked keeps its first revocation time. Returns the key's listing after revocation."""
        kid = (key_id or "").strip().lower()
        if len(kid) < 8 or any(c not in "0123456789abcdef" for c in kid):
            raise VeilError(f"KEY_ID: expected at least 8 hex digits of a key's id (see `veil keys list`), "
                            f"got {key_id!r}")

        def work(conn) -> str:
            hits = [r.key_sha256 for r in conn.execute(select(api_keys.c.key_sha256)
                                                       .where(api_keys.c.key_sha256.like(kid + "%"))).all()]
            if not hits:
                raise VeilError(f"KEY_ID {kid}: no such key in this ledger (see `veil keys list`)")
            if len(hits) > 1:
                raise VeilError(f"KEY_ID {kid}: matches {len(hits)} keys; give more of its id")
            if conn.execute(select(key_revocations.c.key_sha256)
                            .where(key_revocations.c.key_sha256 == hits[0])).first() is None:
                conn.execute(key_revocations.insert().values(key_sha256=hits[0], revoked_at=_now()))
            return hits[0]
        digest = transact(self.engine, work)
        return next(k for k in self.list_keys() if k["sha256"] == digest)
