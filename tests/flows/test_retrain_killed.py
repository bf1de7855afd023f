"""`veil retrain` against a REAL Prefect server, killed mid-training (SIGKILL) and run again: the same
plan and reservation, one release, the run continues from its checkpoint and completes its planned steps
once. Apart from tests/flows/test_retrain.py (whose retraining line it shares nothing with) so that
`make test`'s workers (--dist loadfile: one file per worker) run the two at once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import MAPPING, retrain_json as _retrain, tiny_policy as _policy, training_releases as _releases

pytestmark = pytest.mark.slow

def test_killed_retrain_resumes_from_checkpoint(api, veil_home, tmp_path, org, capsys):
    """SIGKILL `veil retrain` mid-training; run it again: same plan, same reservation, one release,
    the run continues from its checkpoint and completes its planned steps once."""
    policy = _policy(tmp_path, steps=60)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PREFECT_API_URL": api.api_url, "VEIL_HOME": str(veil_home)}
    cmd = [sys.executable, "-c", "from flows.cli import main; main()", "retrain", "--policy", str(policy),
           "--source", str(org["source"]), *MAPPING, "--base-model", str(org["base"]), "--name", "kill", "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    runs = veil_home / "runs"
    try:
        deadline, progress = time.monotonic() + 240, None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(runs.glob("*/progress.json")) if runs.is_dir() else []
            if found:
                try:
                    done = json.loads(found[0].read_text()).get("steps_attempted", 0)
                except (json.JSONDecodeError, OSError):
                    done = 0
                if done >= 2 and list(runs.glob("*/checkpoint.pt")):
                    progress = found[0]
                    break
            time.sleep(0.2)
        assert progress is not None, "training never reached a checkpoint"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    killed_at = json.loads(progress.read_text())["steps_attempted"]
    assert 0 < killed_at < 60
    run_dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1 and not (run_dirs[0] / "train_result.json").exists()

    result = _retrain(policy, org, capsys, name="kill")
    assert result["action"] == "trained" and result["model_uri"] == "models:/kill/1", result
    assert [p for p in runs.iterdir() if p.is_dir()] == run_dirs  # same plan, same run folder
    res = json.loads((run_dirs[0] / "train_result.json").read_text())
    assert res["steps_run"] == 60
    assert _releases(veil_home) == 1  # one reservation, charged once
