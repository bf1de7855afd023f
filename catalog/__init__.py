"""The catalog: an organization's raw text as versioned, tagged Arrow/DuckDB tables (see docs/catalog.md).

    from catalog.ingest import ingest_source      # a source -> catalog + new immutable snapshot
    from catalog.snapshots import load_snapshot    # the snapshot every later stage reads and cites
    from catalog.stats import catalog_stats, list_secrets
    from catalog.retag import retag                # new policy rules over the whole catalog

Connectors (catalog/connectors/): jsonl, csv, parquet, mbox, maildir, git. Tagging: catalog/tagging.py.
"""
