"""The single-writer lock, catalog statistics, and the CLI contract (JSON output, exit 2 on bad input)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from typer.testing import CliRunner

from catalog import store
from catalog.ingest import ingest_source
from catalog.snapshots import load_snapshot
from catalog.stats import catalog_stats, list_secrets
from components.core.errors import VeilError
from flows.cli import app

RULES = [{"secret_class": "codename", "kind": "literal", "patterns": ["BLUEHERON"], "case_sensitive": True},
         {"secret_class": "email", "kind": "detector", "patterns": ["email"], "case_sensitive": False}]


def _source(tmp_path, n_users=7):
    lines = []
    for u in range(n_users):
        for k in range(u * u + 1):  # 1, 2, 5, 10, 17, … records: a skewed contribution profile
            extra = " BLUEHERON" if (u + k) % 4 == 0 else ""
            lines.append(json.dumps({"user": f"u{u}@x.example", "text": f"note {k} from {u}{extra}"}))
    lines.append("{broken")
    p = tmp_path / "org.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_second_writer_gets_a_clear_error_and_the_catalog_survives(settings, tmp_path):
    src = _source(tmp_path)
    first = ingest_source(src, "jsonl", settings=settings, rules=RULES)
    with store.writer(settings):
        with pytest.raises(VeilError, match="another writer holds the catalog"):
            ingest_source(src, "jsonl", settings=settings, rules=RULES)
        # a writer in another process is refused the same way, before touching the file
        code = textwrap.dedent(f"""
            from components.core.settings import load_settings
            from catalog.ingest import ingest_source
            from components.core.errors import VeilError
            try:
                ingest_source({str(src)!r}, "jsonl", settings=load_settings({str(settings.home)!r}))
            except VeilError as e:
                print("VEIL", e)
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.stdout.startswith("VEIL ") and "another writer" in out.stdout and "pid" in out.stdout
    again = ingest_source(src, "jsonl", settings=settings, rules=RULES)  # lock released: works, unchanged
    assert again.snapshot_id == first.snapshot_id
    assert load_snapshot(settings).records.num_rows == first.records


def test_failed_ingest_changes_nothing(settings, tmp_path, monkeypatch):
    src = _source(tmp_path)
    first = ingest_source(src, "jsonl", settings=settings, rules=RULES)
    other = tmp_path / "more.jsonl"
    other.write_text(json.dumps({"user": "new@x.example", "text": "fresh"}) + "\n")
    import catalog.snapshots as snaps

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(snaps.SnapshotBuilder, "_finish", boom)
    with pytest.raises(RuntimeError):
        ingest_source(other, "jsonl", settings=settings, rules=RULES)
    monkeypatch.undo()
    assert not [p for p in settings.snapshots_dir.iterdir() if p.name.startswith(".tmp")]
    snap = load_snapshot(settings)
    assert snap.snapshot_id == first.snapshot_id and snap.records.num_rows == first.records
    import duckdb
    con = duckdb.connect(str(settings.catalog_path), read_only=True)
    assert con.sql("SELECT count(*) FROM ingests").fetchall()[0][0] == 1
    con.close()


def test_stats_quantiles_match_numpy_and_secrets_counts(settings, tmp_path):
    src = _source(tmp_path)
    ingest_source(src, "jsonl", settings=settings, rules=RULES)
    st = catalog_stats(settings)
    counts = np.array([u * u + 1 for u in range(7)])
    assert st["users"] == 7 and st["records"] == counts.sum()
    q = st["records_per_user"]
    assert (q["min"], q["max"]) == (1, 37)
    for key, p in (("median", 50), ("p90", 90), ("p99", 99)):
        assert q[key] == pytest.approx(np.percentile(counts, p))
    recs = load_snapshot(settings).records.to_pylist()
    tagged = [r for r in recs if "BLUEHERON" in r["text"]]
    assert st["tagged_records"] == len(tagged) and st["secrets"] == 1
    (sec,) = list_secrets(settings)
    assert sec["secret_id"] == "codename:BLUEHERON"
    assert sec["records"] == len(tagged) and sec["users"] == len({r["user_id"] for r in tagged})


def test_cli_ingest_json_stats_secrets_and_exit_codes(veil_home, tmp_path):
    runner = CliRunner()
    src = _source(tmp_path)
    res = runner.invoke(app, ["ingest", str(src), "--format", "jsonl", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for k in ("snapshot_id", "read", "accepted", "quarantined", "duplicates", "users"):
        assert k in doc
    assert doc["read"] == doc["accepted"] + doc["quarantined"] + doc["duplicates"]
    assert doc["quarantined"] == 1
    res = runner.invoke(app, ["catalog", "stats", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["records_per_user"]["max"] == 37
    res = runner.invoke(app, ["secrets", "--json"])
    assert res.exit_code == 0 and isinstance(json.loads(res.stdout), list)
    res = runner.invoke(app, ["ingest", str(src), "--format", "jsonl"])  # readable summary
    assert res.exit_code == 0 and "quarantined" in res.stdout and doc["snapshot_id"] in res.stdout
    res = runner.invoke(app, ["catalog", "quarantine", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["reason"].startswith("malformed JSON")
    for bad in (["ingest", str(tmp_path / "nope.jsonl"), "--format", "jsonl"],
                ["ingest", str(src), "--format", "xml"],
                ["ingest", str(src), "--format", "csv"],
                ["ingest", str(src), "--format", "jsonl", "--policy", str(tmp_path / "none.yaml")],
                ["ingest", str(src), "--format", "jsonl", "--shards", "0"],
                ["catalog", "stats", "--snapshot", "snap-nope"]):
        res = runner.invoke(app, bad)
        assert res.exit_code == 2, (bad, res.output)
        assert "Traceback" not in res.output and res.output.strip().startswith("error:")


def test_retag_replaces_spans_keeps_records(settings, tmp_path):
    from catalog.retag import retag

    src = _source(tmp_path)
    first = ingest_source(src, "jsonl", settings=settings, rules=RULES)
    old = load_snapshot(settings)
    same = retag(settings, RULES)
    assert not same["changed"] and same["snapshot_id"] == first.snapshot_id
    new_rules = [{"secret_class": "note", "kind": "regex", "patterns": [r"note (?P<secret>\d+) from 3"],
                  "case_sensitive": True}]
    res = retag(settings, new_rules)
    assert res["changed"] and res["snapshot_id"] != first.snapshot_id
    snap = load_snapshot(settings)
    assert snap.manifest["files"]["records.parquet"]["sha256"] == old.manifest["files"]["records.parquet"]["sha256"]
    assert snap.records.equals(old.records)
    texts = dict(zip(snap.records.column("record_id").to_pylist(), snap.records.column("text").to_pylist()))
    spans = snap.secret_spans.to_pylist()
    assert {s["secret_class"] for s in spans} == {"note"}
    assert len(spans) == 10  # user u3 wrote notes 0..9
    for s in spans:
        assert texts[s["record_id"]][s["start"]:s["end"]] == s["secret_id"].split(":", 1)[1]
    assert load_snapshot(settings, first.snapshot_id).secret_spans.num_rows == old.secret_spans.num_rows


def test_reingest_after_retag_tags_again(settings, tmp_path):
    from catalog.retag import retag

    src = _source(tmp_path)
    first = ingest_source(src, "jsonl", settings=settings, rules=RULES)
    retag(settings, [{"secret_class": "x", "kind": "literal", "patterns": ["zzz"]}])
    assert load_snapshot(settings).secret_spans.num_rows == 0
    again = ingest_source(src, "jsonl", settings=settings, rules=RULES)  # must not take the unchanged-file shortcut
    assert again.new == 0 and again.new_spans == load_snapshot(settings, first.snapshot_id).secret_spans.num_rows
    assert again.snapshot_id == first.snapshot_id  # same records, same spans: the same content again
