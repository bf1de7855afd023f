"""Settings precedence, embedded defaults, and the one-line user-error contract of the CLI."""
from pathlib import Path

from typer.testing import CliRunner

from components.core.errors import VeilError
from components.core.hashing import canonical_json, sha256_json
from components.core.settings import load_settings


def test_defaults_live_under_home(tmp_path):
    s = load_settings(tmp_path / "h", env={})
    assert s.home == (tmp_path / "h").resolve()
    assert s.catalog_path == s.home / "catalog.duckdb"
    # absolute sqlite URI: four slashes before an absolute path
    assert s.mlflow_tracking_uri == f"sqlite:///{s.home}/mlflow.db"
    assert s.mlflow_tracking_uri.startswith("sqlite:////")
    assert s.prefect_api_url is None


def test_toml_then_env_override(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    (home / "veil.toml").write_text('[veil]\nmlflow_tracking_uri = "http://mlflow:5000"\ndevice = "cuda"\n')
    s = load_settings(env={"VEIL_HOME": str(home)})
    assert s.mlflow_tracking_uri == "http://mlflow:5000" and s.device == "cuda"
    assert s.mlflow_registry_uri == "http://mlflow:5000"
    s2 = load_settings(env={"VEIL_HOME": str(home), "VEIL_DEVICE": "cpu", "PREFECT_API_URL": "http://p:4200/api"})
    assert s2.device == "cpu" and s2.prefect_api_url == "http://p:4200/api"
    assert s2.sources["device"] == "$VEIL_DEVICE"


def test_unknown_toml_key_is_a_user_error(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    (home / "veil.toml").write_text("[veil]\nmlflow_uri = 'x'\n")
    try:
        load_settings(env={"VEIL_HOME": str(home)})
    except VeilError as e:
        assert "mlflow_uri" in str(e) and "veil.toml" in str(e)
    else:
        raise AssertionError("unknown key accepted")


def test_canonical_json_is_order_independent():
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1})
    assert sha256_json({"x": 1.5}) != sha256_json({"x": 1.25})


def test_veil_error_is_one_line():
    assert "\n" not in str(VeilError("a\nb   c"))


def test_cli_user_error_is_one_line_exit_2(veil_home, tmp_path):
    from flows.cli import app

    r = CliRunner().invoke(app, ["train", "--plan", str(tmp_path / "missing.json"), "--base-model", str(tmp_path)])
    assert r.exit_code == 2, r.output
    lines = [l for l in r.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "missing.json" in lines[0]
    assert "Traceback" not in r.output
