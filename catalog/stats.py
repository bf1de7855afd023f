"""Catalog statistics and the secrets listing, computed from a snapshot (readers never lock the catalog)."""
from __future__ import annotations

import duckdb

from catalog.snapshots import load_snapshot
from components.core.errors import VeilError
from components.core.settings import Settings


def _con(snap) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rec = str(snap.records_file).replace("'", "''")
    spans = str(snap.secret_spans_file).replace("'", "''")
    con.execute(f"CREATE VIEW records AS SELECT * FROM read_parquet('{rec}')")
    con.execute(f"CREATE VIEW secret_spans AS SELECT * FROM read_parquet('{spans}')")
    return con


def _unreadable(snap, e: Exception) -> VeilError:
    """A snapshot file DuckDB cannot read (damaged after the check, or on a failing disk): one line
    naming the file (DuckDB's message names it) and the snapshot."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return VeilError(f"snapshot {snap.snapshot_id} ({snap.path}): cannot be read: {first[:300]}")


def _quantile(sorted_counts: list[int], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), on counts sorted ascending."""
    if not sorted_counts:
        return 0.0
    pos = q * (len(sorted_counts) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_counts) - 1)
    return float(sorted_counts[lo] + (sorted_counts[hi] - sorted_counts[lo]) * (pos - lo))


def catalog_stats(settings: Settings, snapshot_id: str | None = None) -> dict:
    """Users, records, per-user record-count quantiles, secrets and tagged records of a snapshot."""
    # Verified: a damaged file either fails to read or reads as wrong numbers; its sha256 (one more pass
    # over bytes these queries read anyway) names it in one line instead (issue 28).
    snap = load_snapshot(settings, snapshot_id)
    con = _con(snap)
    try:
        counts = [r[0] for r in con.sql("SELECT count(*) AS n FROM records GROUP BY user_id ORDER BY n").fetchall()]
        n_records = sum(counts)
        chars = con.sql("SELECT coalesce(sum(length(text)), 0) FROM records").fetchall()[0][0]
        secrets, spans, tagged, tagged_users = con.sql(
            "SELECT count(DISTINCT secret_id), count(*), count(DISTINCT s.record_id), count(DISTINCT r.user_id) "
            "FROM secret_spans s JOIN records r USING (record_id)").fetchall()[0]
        by_class = {c: {"secrets": n, "records": r, "users": u} for c, n, r, u in con.sql(
            "SELECT secret_class, count(DISTINCT secret_id), count(DISTINCT s.record_id), count(DISTINCT r.user_id) "
            "FROM secret_spans s JOIN records r USING (record_id) GROUP BY secret_class ORDER BY secret_class").fetchall()}
        sources = dict(con.sql("SELECT source, count(*) FROM records GROUP BY source ORDER BY source").fetchall())
    except duckdb.Error as e:
        raise _unreadable(snap, e) from None
    finally:
        con.close()
    return {
        "snapshot_id": snap.snapshot_id,
        "sha256": snap.sha256,
        "users": len(counts),
        "records": n_records,
        "chars": int(chars),
        "records_per_user": {
            "min": counts[0] if counts else 0,
            "median": _quantile(counts, 0.5),
            "p90": _quantile(counts, 0.9),
            "p99": _quantile(counts, 0.99),
            "max": counts[-1] if counts else 0,
            "mean": (n_records / len(counts)) if counts else 0.0,
        },
        "secrets": int(secrets),
        "spans": int(spans),
        "tagged_records": int(tagged),
        "tagged_users": int(tagged_users),
        "secret_classes": by_class,
        "sources": sources,
    }


def list_secrets(settings: Settings, snapshot_id: str | None = None, *, secret_class: str | None = None,
                 limit: int | None = None) -> list[dict]:
    """Each secret with its class, detectors, occurrences, and the records and users it appears in."""
    snap = load_snapshot(settings, snapshot_id)  # verified, as in catalog_stats
    con = _con(snap)
    try:
        where = "WHERE s.secret_class = ?" if secret_class else ""
        q = (f"SELECT s.secret_id, min(s.secret_class), string_agg(DISTINCT s.detector, ',' ORDER BY s.detector), "
             f"count(*), count(DISTINCT s.record_id), count(DISTINCT r.user_id) "
             f"FROM secret_spans s JOIN records r USING (record_id) {where} GROUP BY s.secret_id "
             f"ORDER BY count(DISTINCT r.user_id) DESC, count(DISTINCT s.record_id) DESC, s.secret_id"
             + (f" LIMIT {int(limit)}" if limit else ""))
        rows = con.execute(q, [secret_class] if secret_class else []).fetchall()
    except duckdb.Error as e:
        raise _unreadable(snap, e) from None
    finally:
        con.close()
    return [{"secret_id": a, "secret_class": b, "detectors": c.split(","), "occurrences": d, "records": e,
             "users": f} for a, b, c, d, e, f in rows]
