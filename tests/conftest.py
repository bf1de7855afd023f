"""Test environment: every test gets its own VEIL_HOME; nothing touches the network or ~/.

Prefect's ephemeral server takes 20–30 s to start on 2 cores, so flow tests share one
session-scoped harness (`prefect_harness`); everything else tests plain functions.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="veil-tests-"))
os.environ.setdefault("PREFECT_HOME", str(_SESSION_TMP / "prefect"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# Under pytest-xdist (`make test`: several workers on 2 cores) one thread per worker: more would only
# fight the other workers for the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")


@pytest.fixture
def veil_home(tmp_path, monkeypatch) -> Path:
    """A fresh VEIL_HOME for one test; returns its path."""
    home = tmp_path / "veil-home"
    home.mkdir()
    monkeypatch.setenv("VEIL_HOME", str(home))
    monkeypatch.delenv("VEIL_CONFIG", raising=False)
    monkeypatch.delenv("VEIL_MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture
def settings(veil_home):
    from components.core.settings import load_settings

    return load_settings(veil_home).ensure()


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(autouse=True, scope="session")
def _pinned_plan_key():
    """New planner keys are a fixed 32 bytes in tests: the population estimate N̂ is a keyed Laplace
    draw, and on the suite's small orgs a fresh random key would now and then put N̂ below the batch
    (a correct refusal, but a flaky test). Production keys come from os.urandom. Session-scoped, so
    that module-scoped fixtures which plan (they are set up before any function-scoped fixture) get
    the pinned key too: a function-scoped pin left test_planning_plan's module plan on a random key,
    refused about one run in eleven."""
    from components.draws import annex

    mp = pytest.MonkeyPatch()
    mp.setattr(annex, "_new_key", lambda n: b"\x05" * n)
    yield
    mp.undo()
