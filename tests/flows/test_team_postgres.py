"""infra/README.md's team setup, as written there: one PostgreSQL holding the Prefect server's
database, MLflow's tracking + registry store and the per-person ledger; a `veil retrain` against
them registers a version, the ledger's release is in PostgreSQL, the run is on the server.

The PostgreSQL cluster is a throwaway (initdb + pg_ctl on 127.0.0.1, tests/privacy/_ledger_pg.py);
skipped only when the server binaries are absent (CI installs them: .ci/run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MAPPING, PrefectServer, tiny_policy

pytestmark = pytest.mark.slow
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "privacy"))


def test_retrain_on_postgresql_backed_prefect_mlflow_and_ledger(tmp_path, veil_home, org):
    pytest.importorskip("asyncpg")
    from _ledger_pg import postgres_server

    with postgres_server() as url:  # postgresql://veil@127.0.0.1:PORT/postgres
        import psycopg

        with psycopg.connect(url, autocommit=True) as con:
            for db in ("prefect", "mlflow", "veil_ledger"):
                con.execute(f"CREATE DATABASE {db}")
        base = url.rsplit("/", 1)[0]
        host = base.split("://", 1)[1]
        server = PrefectServer(tmp_path / "prefect-pg", PREFECT_API_DATABASE_CONNECTION_URL=
                               f"postgresql+asyncpg://{host}/prefect")
        (tmp_path / "prefect-pg").mkdir()
        server.start(timeout=180)
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VEIL_"))}
            env.update({"PYTHONPATH": os.getcwd(), "VEIL_HOME": str(veil_home), "PREFECT_API_URL": server.api_url,
                        "VEIL_MLFLOW_TRACKING_URI": f"postgresql+psycopg://{host}/mlflow",
                        "VEIL_LEDGER_URL": f"postgresql://{host}/veil_ledger"})
            r = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "retrain",
                                "--policy", str(tiny_policy(tmp_path)), "--source", str(org["source"]), *MAPPING,
                                "--base-model", str(org["base"]), "--name", "team", "--json"],
                               env=env, capture_output=True, text=True, timeout=900)  # xdist: files in parallel
            assert r.returncode == 0, r.stderr[-3000:]
            res = json.loads(r.stdout)
            assert res["action"] == "trained" and res["model_uri"] == "models:/team/1", res

            # the version is in PostgreSQL's MLflow store, with its certificate
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=env["VEIL_MLFLOW_TRACKING_URI"],
                                  registry_uri=env["VEIL_MLFLOW_TRACKING_URI"])
            (mv,) = client.search_model_versions("name='team'")
            assert mv.tags.get("privacy.epsilon") or client.get_run(mv.run_id).data.metrics["privacy_epsilon"] > 0
            assert not (veil_home / "mlflow.db").exists()  # nothing fell back to the embedded sqlite
            # the ledger's release is in PostgreSQL, not in private/ledger.db
            with psycopg.connect(f"{base}/veil_ledger") as con:
                # one training release, the population estimate N̂ charged to everyone it counts (issue 22), and
                # the retrain's DP evaluation charged to the evaluation people (issue 26)
                    rows = con.execute("SELECT kind, mechanism FROM ledger_releases").fetchall()
                    kinds = sorted(k for k, _ in rows)
                    assert kinds.count("population") == 1 and len(kinds) == 3, rows
                    assert sum(1 for _, m in rows if m == "evaluation") == 1, rows
            assert not (veil_home / "private" / "ledger.db").exists()
            # the run is recorded by the PostgreSQL-backed Prefect server, completed
            runs = server.api("POST", "/flow_runs/filter", json={"flows": {"name": {"any_": ["veil-retrain"]}}})
            assert [x["state"]["type"] for x in runs] == ["COMPLETED"]
            with psycopg.connect(f"{base}/prefect") as con:
                assert con.execute("SELECT count(*) FROM flow_run").fetchone()[0] == 1
        finally:
            server.stop()
