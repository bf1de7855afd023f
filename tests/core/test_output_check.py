"""The shared noise check (tests/_output.py) finds each kind of third-party noise and passes Veil's own lines."""
from __future__ import annotations

import pytest

from _output import assert_quiet, noise_in

VEIL = """train (DP steps): 40/120 … (0:31 elapsed, about 1:02 left)
step: registered
audit: INCONCLUSIVE · AUROC in [0.5, 1) · ceiling 0.820
Tuning on private data is not covered by any certificate: these scores are measured on private people."""


def test_veil_lines_pass():
    assert_quiet(VEIL)


@pytest.mark.parametrize("line", [
    "/x/transformers/modeling_utils.py:3312: FutureWarning: `is_gradient_checkpointing` is deprecated",
    "  warnings.warn(",
    "Traceback (most recent call last):",
    "\x1b[33mAdd type hints to the `predict` method\x1b[0m",
    "Downloading artifacts: 100%|██████████| 7/7 [00:00<00:00, 2150.93it/s]",
    "Loading weights: 100%|██████████| 28/28",
    "Token indices sequence length is longer than the specified maximum sequence length for this model "
    "(301 > 256). Running this sequence through the model will result in indexing errors",
    "sqlite3.OperationalError: database is locked",
    "Passing a Python object as `python_model` causes it to be serialized using CloudPickle",
])
def test_each_kind_of_noise_is_found(line):
    assert noise_in(VEIL + "\n" + line), line
    with pytest.raises(AssertionError, match="third-party noise"):
        assert_quiet(line)


def test_importing_the_pyfunc_class_is_quiet():
    """A consumer's `mlflow.pyfunc.load_model` imports the pyfunc class before any Veil code can set a
    filter: MLflow's check of `predict`'s type hints must find nothing to warn about (issue 26)."""
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-W", "always", "-c", "import components.registry.pyfunc_model"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr
    assert_quiet(r.stdout + r.stderr, "importing components.registry.pyfunc_model")


def test_progress_plain_lines_off_a_terminal(monkeypatch):
    """Off a terminal (a pipe, a worker's log): plain lines at the start, every VEIL_PROGRESS_SECONDS and
    at the end — no bar, no carriage return; none after a failure; nothing with VEIL_PROGRESS=0."""
    import io

    from components.core.progress import progress, step

    monkeypatch.setenv("VEIL_PROGRESS_SECONDS", "0.000001")
    buf = io.StringIO()
    with progress("train (DP steps)", 3, stream=buf) as tick:
        for _ in range(3):
            tick(1, loss="1.234")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "train (DP steps): started (3 to do)"
    assert lines[1].startswith("train (DP steps): 1/3 … (") and "left" in lines[1] and lines[1].endswith("loss 1.234")
    assert lines[-1].startswith("train (DP steps): 3/3 done (") and "\r" not in buf.getvalue()
    assert_quiet(buf.getvalue())
    buf = io.StringIO()
    with pytest.raises(ValueError), progress("evaluate: model", 2, stream=buf) as tick:
        raise ValueError("boom")
    assert "done" not in buf.getvalue()
    buf = io.StringIO()
    with step("register veil", stream=buf):
        pass
    assert buf.getvalue().splitlines()[0] == "register veil: started" and "register veil: done (" in buf.getvalue()
    monkeypatch.setenv("VEIL_PROGRESS", "0")
    buf = io.StringIO()
    with progress("x", 2, stream=buf) as tick, step("y", stream=buf):
        tick(2)
    assert buf.getvalue() == ""
