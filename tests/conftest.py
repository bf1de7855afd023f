"""Test environment: every test gets its own VEIL_HOME; nothing touches the network or ~/.

A Prefect server takes 20–30 s to start on 2 cores (more under xdist's load), so every test that runs
flows shares ONE per test process: the session's real server (`prefect_server`, tests/_prefect_server.py).
`prefect_harness` points this process' flows at it, in place of prefect_test_harness' ephemeral one,
which an xdist worker used to start beside the real one; everything else tests plain functions.
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


def pytest_configure(config):
    """absl (dp-accounting imports it) binds its log handler to whatever `sys.stderr` is at its first
    import: under pytest, the capture's temporary file. Prefect's logging setup closes every existing
    handler, and absl's close() closes its stream unless it *is* sys.stderr at that moment — inside a
    CliRunner invocation it is not, so pytest's own capture file was closed and every later test in
    that worker failed with 'I/O operation on closed file' (seen running test_accounting_secrets.py
    then test_device.py). In a real `veil` process the stream is the terminal's stderr and is never
    closed. Point absl at the process's real stderr, which absl never closes."""
    import sys

    import absl.logging

    absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


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
def prefect_server(tmp_path_factory):
    """One real Prefect server for every test of this process that needs one: tests tell their runs apart
    by flow run id, start time or parameters (model name, VEIL_HOME), never by counting all of the
    server's runs."""
    from _prefect_server import PrefectServer, drain_prefect_workers

    server = PrefectServer(tmp_path_factory.mktemp("prefect-server")).start()
    try:
        yield server
    finally:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        # pointed at the test's server: with no URL the drain would start an ephemeral one (~15 s)
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            drain_prefect_workers()
        server.stop()


@pytest.fixture(scope="session")
def prefect_harness(prefect_server):
    """From the first test that asks on, this process' flows report to the session's server, as inside
    prefect_test_harness (which this replaces: it started a second, ephemeral server). The server's
    database URL is set too, so a test reads the bytes that server stored (tests/privacy/test_prefect_*)."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_server.api_url,
                             PREFECT_SERVER_DATABASE_CONNECTION_URL: prefect_server.db_url}):
        # and as the process-global settings (as the harness does): code in a context copied before this
        # fixture ran (a thread started earlier) sees the server too
        with prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield prefect_server


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


# --- `make test`'s order: the files that take minutes start first --------------------------------------
# `make test` hands whole files to 3 workers (pytest-xdist --dist loadfile). xdist's own order is by the
# number of tests in a file, most first, so the one-test files that retrain against real servers (the
# PostgreSQL team setup, the deployment worker, the end-to-end pipelines) were handed out last of 147,
# where a file of two or three minutes started late keeps one worker going after the others are done.
# These files start first, roughly slowest first (the seconds: fresh-clone CI before their retrainings
# were shortened; the others are ordered by the work they do); a worker busy with one of them is given
# ordinary files meanwhile, never a second slow file queued behind the first. A file missing here only
# starts later than it could: keep the list to files of a minute or more.
SLOW_FILES = [
    "tests/flows/test_team_postgres.py",         # ~165 s: PostgreSQL, its own Prefect server, a retraining
    "tests/flows/test_cli_output.py",            # ~133 s for its retraining, plus three CLI runs
    "tests/flows/test_retrain.py",               # a retraining line: train, skip, skip, train
    "tests/flows/test_deployment_worker.py",     # ~100-124 s: `prefect deploy`, a process worker, two runs
    "tests/flows/test_retrain_killed.py",        # a 60-step retraining killed, then resumed
    "tests/flows/test_promotion_approval.py",    # three retrainings paused for approval
    "tests/flows/test_kill_points.py",           # a killed retraining, resumed, skipped
    "tests/flows/test_study.py",                 # a grid of trainings, thread and Dask runners
    "tests/flows/test_budget_exclusion.py",      # a retraining
    "tests/e2e/test_e2e_pipeline.py",
    "tests/e2e/test_e2e_secret.py",
    "tests/e2e/test_e2e_filtered.py",
    "tests/synthetic/test_synthesize.py",
    "tests/privacy/test_published_leak_scan.py",
    "tests/prediction/test_prediction_server.py",    # builds a PMixED ensemble, serves it over HTTP
    "tests/prediction/test_prediction_synthesize.py",  # builds an ensemble, synthesizes through its budget
]


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own (firstresult); absent without xdist
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    slow = set(SLOW_FILES)

    class SlowFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            # (xdist keeps a second file queued on each worker: a worker cannot run its last test before
            # it knows what follows it)
            busy = any(f in slow and not all(done.values()) for f, done in self.assigned_work.get(node, {}).items())
            if busy:
                pick = next((f for f in self.workqueue if f not in slow), None)
            else:
                pick = next((f for f in SLOW_FILES if f in self.workqueue), None)
            if pick is not None:
                self.workqueue.move_to_end(pick, last=False)
            super()._assign_work_unit(node)

    return SlowFilesFirst(config, log)
