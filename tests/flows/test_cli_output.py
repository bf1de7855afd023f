"""What `veil retrain` / `veil run` print: a user error raised inside the flow is one line on stderr
(exit 2) — not Prefect's three copies of it, no traceback, no native leak dump — and a successful
retraining prints Veil's own output, no third-party warning."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import MAPPING, tiny_policy

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-c", "from flows.cli import main; main()"]


def _veil(args, env, timeout=300):
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def env(prefect_server, veil_home):
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VEIL_"))}
    return {**keep, "PYTHONPATH": os.getcwd(), "VEIL_HOME": str(veil_home), "PREFECT_API_URL": prefect_server.api_url}


@pytest.mark.parametrize("command", ["retrain", "run"])
def test_user_error_inside_the_flow_is_one_line(env, tmp_path, org, command):
    policy = tiny_policy(tmp_path)
    r = _veil([command, "--policy", str(policy), "--source", str(org["source"]), "--user-field", "nope",
               "--base-model", str(org["base"])], env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr  # ingest failed inside the flow: said once, by Veil
    assert lines[0].startswith("error: ") and "'nope'" in lines[0] and "--user-field" in lines[0]
    assert "warning" not in r.stderr.lower() and r.stdout == ""


def test_retrain_prints_no_third_party_warnings(env, tmp_path, org):
    r = _veil(["retrain", "--policy", str(tiny_policy(tmp_path)), "--source", str(org["source"]), *MAPPING,
               "--base-model", str(org["base"]), "--name", "quiet", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["action"] == "trained" and doc["model_uri"] == "models:/quiet/1"
    low = r.stderr.lower()
    for noise in ("warning", "deprecat", "traceback", "leaked", "cloudpickle", "type hint", "attention_mask",
                  "downloading artifacts", "loading weights", "beginning flow run", "finished in state"):
        assert noise not in low, f"{noise!r} in stderr:\n{r.stderr[-3000:]}"
