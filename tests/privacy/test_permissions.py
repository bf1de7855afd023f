"""VEIL_HOME is private whatever the umask (issue 11, item 10): folders 0700, files 0600 (0400 for
read-only snapshot files) — the catalog holds every secret value, snapshots people's text, plans
membership, runs checkpoints, mlflow.db the registry."""
from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from components.core.settings import load_settings
from flows import stages
from flows.cli import app


@pytest.fixture
def loose_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _exposed(home: Path) -> list[str]:
    """Every path under home (home included) that its group or others could read, write or enter."""
    bad = []
    for p in [home, *home.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.lstat().st_mode
        if mode & 0o077:
            bad.append(f"{p.relative_to(home.parent)} {stat.filemode(mode)}")
        elif p.is_dir() and (mode & 0o700) != 0o700:
            bad.append(f"{p.relative_to(home.parent)} {stat.filemode(mode)} (owner cannot use it)")
    return bad


def test_cli_ingest_and_plan_under_loose_umask_write_nothing_readable_by_others(veil_home, loose_umask):
    runner = CliRunner()
    r = runner.invoke(app, ["demo-data", "--json"])
    assert r.exit_code == 0, r.output
    org = veil_home / "demo-org" / "org" / "messages.jsonl"
    r = runner.invoke(app, ["ingest", str(org), "--format", "jsonl", "--policy", str(stages.DEMO_POLICY),
                            "--id-field", "id", "--time-field", "ts", "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", "--policy", str(stages.DEMO_POLICY), "--json"])
    assert r.exit_code == 0, r.output
    assert (veil_home / "catalog.duckdb").is_file() and any((veil_home / "plans").iterdir())
    assert any((veil_home / "snapshots").iterdir())
    assert _exposed(veil_home) == []


def test_third_party_writers_end_up_owner_only(veil_home, loose_umask):
    """DuckDB, SQLite (MLflow's tracking database) and Parquet write files our code never opens:
    the umask set by Settings.ensure() covers them."""
    s = load_settings(veil_home).ensure()
    duckdb.connect(str(s.catalog_path)).execute("CREATE TABLE t AS SELECT 1 AS x").close()
    con = sqlite3.connect(s.home / "mlflow.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    pq.write_table(pa.table({"x": [1]}), s.plans_dir / "train-x.parquet")
    (s.runs_dir / "r1" / "adapter").mkdir(parents=True)
    (s.runs_dir / "r1" / "adapter" / "w.bin").write_bytes(b"0")
    assert _exposed(veil_home) == []


def test_ensure_repairs_an_existing_world_readable_home(tmp_path, loose_umask):
    home = tmp_path / "old-home"
    (home / "plans").mkdir(parents=True)
    (home / "plans" / "attacker-x.parquet").write_bytes(b"members")
    os.chmod(home, 0o755)
    os.chmod(home / "plans", 0o755)
    os.chmod(home / "plans" / "attacker-x.parquet", 0o644)
    (home / "mlflow.db").write_bytes(b"")
    os.chmod(home / "mlflow.db", 0o666)
    load_settings(home).ensure()
    assert _exposed(home) == []
    assert (home / "plans" / "attacker-x.parquet").stat().st_mode & 0o777 == 0o600


def test_artifacts_copied_with_their_source_mode_are_made_private(veil_home, tmp_path, loose_umask):
    """MLflow copies an artifact with its source's mode bits (shutil.copy2): a base model outside
    VEIL_HOME is typically 0644. The register stage strips group/other bits afterwards."""
    s = load_settings(veil_home).ensure()
    src = tmp_path / "base" / "config.json"
    src.parent.mkdir()
    src.write_text("{}")
    os.chmod(src, 0o644)
    dst = s.mlflow_artifacts_dir / "1" / "abc" / "artifacts" / "base_model"
    dst.mkdir(parents=True)
    shutil.copy2(src, dst / "config.json")
    os.chmod(dst, 0o755)
    assert _exposed(veil_home)  # the copy carried its 0644
    s.make_private(s.mlflow_artifacts_dir)
    assert _exposed(veil_home) == []


# --- what libraries write on Veil's behalf (issue 28: 7 files 0644 in the registry) ------------------------------

def _world_readable_copy(src: Path, dst: Path) -> Path:
    """A public base model as it usually arrives: files 0644, folders 0755 (a download, a shared disk)."""
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


def test_pmixed_build_register_and_plain_load_leave_nothing_readable(tmp_path, monkeypatch, loose_umask):
    """A PMixED build registers the public base (copied 0644 by MLflow before the fix); a consumer's plain
    `mlflow.pyfunc.load_model` under umask 022 writes `registered_model_meta` into the registry (0644 before)."""
    import sys

    import mlflow

    sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
    sys.path.insert(0, str(Path(__file__).parents[1] / "prediction"))
    import tiny_lm_training as tiny
    from test_prediction_build import make_built

    built = tmp_path / "built-base"
    tok = tiny.make_tokenizer()
    tiny.make_model(seed=0, vocab=len(tok)).save_pretrained(built)
    tok.save_pretrained(built)
    base = _world_readable_copy(built, tmp_path / "base")
    home = tmp_path / "home"
    monkeypatch.setenv("VEIL_HOME", str(home))
    s = load_settings(home).ensure()
    out = make_built(s, base, tiny.make_texts(n_users=6, per_user=(2, 3), seed=0), tmp_path)
    assert _exposed(home) == [], "after the PMixED build and registration"

    os.umask(0o022)   # the consumer's shell, not Veil's
    mlflow.set_tracking_uri(s.mlflow_tracking_uri)
    mlflow.set_registry_uri(s.mlflow_registry_uri)
    mlflow.pyfunc.load_model(out["model_uri"])
    metas = list(s.mlflow_artifacts_dir.rglob("registered_model_meta"))
    assert metas, "MLflow no longer writes registered_model_meta into the registry: revisit this test"
    assert _exposed(home) == [], "after a plain mlflow.pyfunc.load_model"


def test_plain_load_of_a_veil_model_leaves_the_registry_private(tmp_path, monkeypatch, loose_umask):
    import sys

    import mlflow

    sys.path.insert(0, str(Path(__file__).parent))
    from _sealed_release import build_adapter, build_base, plan_and_certificate
    from components.registry import register_model

    for var in ("VEIL_CONFIG", "VEIL_MLFLOW_TRACKING_URI", "VEIL_SIGNING_KEY", "VEIL_TRUSTED_KEYS"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("VEIL_HOME", str(home))
    s = load_settings(home).ensure()
    base = _world_readable_copy(build_base(tmp_path / "built-base"), tmp_path / "base")
    adapter = build_adapter(base, tmp_path / "adapter")
    plan, cert = plan_and_certificate(adapter, base)
    reg = register_model(s, name="perm", certificate=cert, plan=plan, base_model_dir=base, adapter_dir=adapter)
    assert _exposed(home) == [], "after registration"
    os.umask(0o022)
    mlflow.set_tracking_uri(s.mlflow_tracking_uri)
    mlflow.set_registry_uri(s.mlflow_registry_uri)
    mlflow.pyfunc.load_model(reg.model_uri)
    assert list(s.mlflow_artifacts_dir.rglob("registered_model_meta"))
    assert _exposed(home) == [], "after a plain mlflow.pyfunc.load_model"
