"""Catalog commands: `veil ingest`, `veil secrets`, `veil catalog stats|snapshots|quarantine|people`."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from components.core.errors import VeilError
from flows.cli.common import out, print_json as _print_json, settings as _settings


catalog_app = typer.Typer(help="Inspect the catalog: statistics, snapshots, quarantine.", no_args_is_help=True)


def ingest(
    source: Path = typer.Argument(..., help="file (jsonl, csv, parquet, mbox) or directory (maildir, git, debian-changelog)"),
    fmt: str = typer.Option(..., "--format", "-f", help="jsonl | csv | parquet | mbox | maildir | git | debian-changelog"),
    user_field: str = typer.Option("user", "--user-field", help="field holding the user (jsonl/csv/parquet)"),
    text_field: str = typer.Option("text", "--text-field", help="field holding the text (jsonl/csv/parquet)"),
    id_field: Optional[str] = typer.Option(None, "--id-field", help="the source's own record id (kept in metadata)"),
    time_field: Optional[str] = typer.Option(None, "--time-field", help="timestamp field (ISO-8601 or epoch s)"),
    source_field: str = typer.Option("source", "--source-field", help="field naming the record's source/channel"),
    meta: List[str] = typer.Option([], "--meta", help="a field to keep in metadata (repeatable)"),
    policy: Optional[Path] = typer.Option(None, "--policy", "-p", help="policy YAML whose secret rules tag records"),
    keep_duplicates: bool = typer.Option(False, "--keep-duplicates",
                                         help="keep within-user duplicate records (default: drop and count them)"),
    shards: int = typer.Option(1, "--shards", help="worker processes for a JSONL file's per-record work "
                               "(parse, validate, hash, tag); the snapshot is the same as with 1"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Ingest a source into the catalog: users, secrets, quarantine, and a new immutable snapshot."""
    from catalog.ingest import FORMATS, ingest_source, tune_process  # startup

    if fmt not in FORMATS:
        raise VeilError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if policy is not None and not policy.is_file():
        raise VeilError(f"--policy: {policy}: no such file")
    s = _settings()
    tune_process()   # this process lives for the ingest alone
    rep = ingest_source(source, fmt, settings=s, user_field=user_field, text_field=text_field, id_field=id_field,
                        time_field=time_field, metadata_fields=tuple(meta), source_field=source_field,
                        rules=str(policy) if policy else None, progress=not json_out,
                        keep_duplicates=keep_duplicates, shards=shards)
    d = rep.to_dict()
    if json_out:
        _print_json(d)
        return
    t = Table(title=f"ingest {source} ({fmt})", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    t.add_column("")
    t.add_row("read", f"{rep.read:,}", "= accepted + quarantined + duplicates")
    t.add_row("accepted", f"{rep.accepted:,}", f"{rep.new:,} new to the catalog · {rep.users:,} users")
    reasons = ", ".join(f"{k} {v:,}" for k, v in rep.quarantine_reasons.items())
    t.add_row("quarantined", f"{rep.quarantined:,}", reasons + (" (veil catalog quarantine)" if reasons else ""))
    t.add_row("duplicates", f"{rep.duplicates:,}",
              "same user, same text: dropped" if not keep_duplicates else "kept (--keep-duplicates)")
    if rep.recipients_merged:
        t.add_row("recipients", f"{rep.recipients_merged:,}",
                  "records whose To/Cc gained a dropped copy's recipients")
    t.add_row("tagged", f"{rep.tagged_records:,}", f"records with a secret · {rep.new_spans:,} new spans")
    t.add_row("snapshot", rep.snapshot_id, f"{rep.records:,} records · {rep.snapshot_users:,} users · "
                                           f"sha256 {rep.sha256[:12]}…")
    t.add_row("names/places", rep.ner.split(":")[0], rep.ner.split(": ", 1)[-1])
    t.add_row("time", f"{rep.seconds:.2f} s", f"{d['records_per_second'] or 0:,.0f} records/s")
    out.print(t)
    import sys

    if rep.likely_duplicate_people:
        print(f"warning: {rep.likely_duplicate_people} name(s) appear under several account ids (likely one person "
              f"each); see {s.private_dir / 'people' / 'likely-duplicates.json'} and merge them with "
              "spec.people.aliases in the policy", file=sys.stderr)
    if rep.identity_merged_people:
        print(f"note: {rep.identity_merged_people} person(s) appear under several spellings (case, spacing, Unicode "
              "form, 'Name <address>') that Veil's identity rule counts as one person each; see "
              f"{s.private_dir / 'people' / 'likely-duplicates.json'}", file=sys.stderr)


def secrets(
    secret_class: Optional[str] = typer.Option(None, "--class", help="only this secret class"),
    limit: Optional[int] = typer.Option(None, "--limit", help="at most this many rows"),
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="snapshot id (default: latest)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """List tagged secrets with the number of records and users each appears in."""
    from catalog.stats import list_secrets  # startup

    rows = list_secrets(_settings(), snapshot, secret_class=secret_class, limit=limit)
    if json_out:
        _print_json(rows)
        return
    t = Table(title=f"secrets ({len(rows)})")
    for c, j in (("secret", "left"), ("class", "left"), ("detectors", "left"), ("records", "right"),
                 ("users", "right"), ("occurrences", "right")):
        t.add_column(c, justify=j)
    for r in rows:
        t.add_row(r["secret_id"], r["secret_class"], ", ".join(r["detectors"]), f"{r['records']:,}",
                  f"{r['users']:,}", f"{r['occurrences']:,}")
    out.print(t)


@catalog_app.command("stats")
def stats(
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="snapshot id (default: latest)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Users, records, per-user record counts (min/median/p90/p99/max), secrets and tagged records."""
    from catalog.stats import catalog_stats  # startup

    d = catalog_stats(_settings(), snapshot)
    if json_out:
        _print_json(d)
        return
    q = d["records_per_user"]
    t = Table(title=f"catalog · snapshot {d['snapshot_id']}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("users", f"{d['users']:,}")
    t.add_row("records", f"{d['records']:,} ({d['chars']:,} characters)")
    t.add_row("records per user", f"min {q['min']} · median {q['median']:g} · p90 {q['p90']:g} · "
                                  f"p99 {q['p99']:g} · max {q['max']}")
    t.add_row("secrets", f"{d['secrets']:,} in {d['tagged_records']:,} records of {d['tagged_users']:,} users "
                         f"({d['spans']:,} spans)")
    for c, v in d["secret_classes"].items():
        t.add_row(f"  {c}", f"{v['secrets']:,} secrets · {v['records']:,} records · {v['users']:,} users")
    t.add_row("sources", ", ".join(f"{k} {v:,}" for k, v in d["sources"].items()))
    t.add_row("sha256", d["sha256"])
    out.print(t)


@catalog_app.command("snapshots")
def snapshots(json_out: bool = typer.Option(False, "--json", help="print one JSON document")) -> None:
    """Every snapshot on disk, newest first."""
    from catalog.snapshots import list_snapshots  # startup

    rows = list_snapshots(_settings())
    if json_out:
        _print_json(rows)
        return
    t = Table(title="snapshots")
    for c in ("snapshot", "created", "records", "users", "secrets", "sha256"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["snapshot_id"], str(r["created_at"]), f"{r.get('records', 0):,}", f"{r.get('users', 0):,}",
                  f"{r.get('secrets', 0):,}", r["sha256"][:16] + "…")
    out.print(t)


@catalog_app.command("retag")
def retag_cmd(
    policy: Path = typer.Option(..., "--policy", "-p", help="policy YAML whose secret rules replace the current tags"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Re-tag every record under a policy's rules: spans replaced, records untouched, a new snapshot."""
    from catalog.retag import retag  # startup

    if not policy.is_file():
        raise VeilError(f"--policy: {policy}: no such file")
    d = retag(_settings(), str(policy))
    if json_out:
        _print_json(d)
        return
    what = "new snapshot" if d["changed"] else "no change, same snapshot"
    out.print(f"{what} {d['snapshot_id']} · {d['spans']:,} spans · rules sha256 {d['rules_sha256'][:12]}… · "
              f"{d['seconds']:.2f} s")


@catalog_app.command("quarantine")
def quarantine(
    limit: int = typer.Option(50, "--limit", help="at most this many rows"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Quarantined input: source, position, reason (raw bytes stay in the catalog)."""
    from catalog.store import read_quarantine  # startup

    rows = read_quarantine(_settings(), limit=limit)
    if json_out:
        _print_json(rows)
        return
    t = Table(title=f"quarantine (first {limit})")
    for c in ("source", "position", "reason"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["source"], r["position"], r["reason"])
    out.print(t)


@catalog_app.command("people")
def people(
    policy: Path = typer.Option(..., "--policy", "-p", help="policy whose spec.people is applied"),
    snapshot: Optional[str] = typer.Option(None, "--snapshot", help="snapshot id (default: the latest)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Who is a person under a policy: accounts excluded (bots, service users) and merged (aliases), as
    counts; names under several ids go to the private folder, never to this output."""
    from catalog.people import apply_people, likely_duplicates, load_people, write_likely_duplicates  # startup
    from catalog.snapshots import load_snapshot  # startup

    s = _settings()
    snap = load_snapshot(s, snapshot)
    _, rep = apply_people(snap.records, load_people(policy))
    found, merged = likely_duplicates(snap.records)
    path = write_likely_duplicates(s.private_dir, found, snap.snapshot_id, merged)
    rep = {"snapshot_id": snap.snapshot_id, **rep, "likely_duplicate_people": len(found),
           "identity_merged_people": len(merged), "likely_duplicates_file": str(path) if path else None}
    if json_out:
        _print_json(rep)
        return
    t = Table(title=f"people in {snap.snapshot_id}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    t.add_column("")
    t.add_row("accounts", f"{rep['accounts']:,}", "distinct user ids in the snapshot")
    t.add_row("excluded", f"{rep['excluded_accounts']:,}", f"accounts · {rep['excluded_records']:,} records")
    for pat, n in rep["excluded_accounts_by_pattern"].items():
        t.add_row("", f"{n:,}", f"  {pat}")
    t.add_row("merged", f"{rep['merged_accounts']:,}", "accounts folded into another identity (identity rule, aliases)")
    t.add_row("people", f"{rep['people']:,}", f"{rep['records']:,} records · ownership {rep['ownership']}")
    t.add_row("likely same", f"{len(found):,}", f"names under several ids{' → ' + str(path) if path else ''}")
    t.add_row("spellings", f"{len(merged):,}", "people under several spellings the identity rule made one")
    out.print(t)


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)
    app.command("secrets")(secrets)
    app.add_typer(catalog_app, name="catalog")
