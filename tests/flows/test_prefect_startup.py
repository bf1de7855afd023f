"""Issue 28: Prefect's start-up under load. A generous default for the ephemeral server's start-up
timeout, and when Prefect still cannot be reached, one line naming the setting and exit 2 — not the
70-line traceback every Prefect-driven command died with on a loaded host. The failure is made cheaply:
a 1 s timeout (no server starts that fast), and a PREFECT_API_URL where nothing listens."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

from flows import stages


def _veil_retrain(tmp_path, **env):
    pol = tmp_path / "p.yaml"
    pol.write_text(yaml.safe_dump(yaml.safe_load(stages.DEMO_POLICY.read_text())))
    src = tmp_path / "m.jsonl"
    src.write_text('{"user": "a@x.org", "text": "hello"}\n')
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    full.update({"PYTHONPATH": os.getcwd(), "VEIL_HOME": str(tmp_path / "home"),
                 "PREFECT_HOME": str(tmp_path / "prefect"), **env})
    return subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "retrain", "--policy", str(pol),
                           "--source", str(src), "--base-model", str(base)],
                          env=full, capture_output=True, text=True, timeout=240)


def test_default_startup_timeout_is_generous_and_the_operators_wins(monkeypatch):
    from components.core import quiet

    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    quiet.quiet_environment()
    assert int(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]) >= 180
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "7")
    quiet.quiet_environment()
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "7"


def test_ephemeral_server_that_does_not_start_in_time_is_one_line(tmp_path):
    """A real `veil retrain` process (the traceback came from Prefect's own logging too)."""
    got = _veil_retrain(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    errors = [line for line in got.stderr.splitlines() if line.startswith("error:")]
    assert got.returncode == 2, got.stderr[-3000:]
    assert len(errors) == 1 and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=1" in errors[0], got.stderr[-3000:]
    assert "Traceback" not in got.stderr, got.stderr[-3000:]


def test_unreachable_prefect_api_url_is_one_line(tmp_path, veil_home, capsys):
    """In this process (cheap): the CLI turns Prefect's "Failed to reach API" into one line naming the URL."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.cli import app

    with socket.socket() as s:      # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    pol = tmp_path / "p.yaml"
    pol.write_text(stages.DEMO_POLICY.read_text())
    src = tmp_path / "m.jsonl"
    src.write_text('{"user": "a@x.org", "text": "hello"}\n')
    (tmp_path / "base").mkdir()
    with temporary_settings({PREFECT_API_URL: url}), pytest.raises(SystemExit) as e:
        app(["retrain", "--policy", str(pol), "--source", str(src), "--base-model", str(tmp_path / "base")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: the Prefect server at PREFECT_API_URL={url}/ does not answer: start it, or unset PREFECT_API_URL to "
        "run on a temporary server"], err
