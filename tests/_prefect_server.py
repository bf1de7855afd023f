"""A REAL Prefect server for the tests (not prefect_test_harness's ephemeral API: that one runs no
scheduler), shared by tests/conftest.py's `prefect_server` and `prefect_harness` fixtures and by the
tests that start one of their own (tests/flows/test_team_postgres.py, on PostgreSQL).

Started from the venv's `prefect server start` on a free 127.0.0.1 port with its own PREFECT_HOME
and database, analytics off; the scheduler's loops are shortened so a schedule shows its runs
within seconds. Always stopped (process group killed) whatever the test did.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

PREFECT = str(Path(sys.executable).parent / "prefect")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    def __init__(self, home: Path, **env: str):
        self.home = home
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.log = home / "server.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        self.env.update({
            "PREFECT_HOME": str(home), "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_UI_ENABLED": "false",
            # seconds, not the default minute: a schedule's runs appear while the test waits
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
            "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
            # a run waiting for the deployment's concurrency slot retries in 2 s, not 30
            "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "2",
            # services the tests do not need cost CPU on 2 shared cores
            "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_ENABLED": "false",
        })
        self.env.update(env)
        # where the server keeps its records (Prefect's default: PREFECT_HOME/prefect.db), so a test can
        # read the bytes it stored (tests/privacy/test_prefect_*.py look for private values in them)
        self.db_url = (env.get("PREFECT_API_DATABASE_CONNECTION_URL") or env.get("PREFECT_SERVER_DATABASE_CONNECTION_URL")
                       or f"sqlite+aiosqlite:///{home / 'prefect.db'}")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> "PrefectServer":
        self.proc = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(self.port), "--no-ui"],
            env=self.env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server not healthy after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def api(self, method: str, path: str, **kw):
        # The server answers 503 while its SQLite file is locked by its own services (the scheduler
        # writing runs) and 429 when busy; Prefect's own client retries both with backoff, so the
        # tests' raw calls do too (CI saw one 503 on POST /deployments/ on 2 busy cores).
        for attempt in range(6):
            r = httpx.request(method, f"{self.api_url}{path}", timeout=30, **kw)
            if r.status_code not in (429, 503) or attempt == 5:
                break
            time.sleep(0.5 * 2 ** attempt)
        r.raise_for_status()
        return r.json() if r.content else None

    def server_log(self) -> str:
        return self.log.read_text(errors="replace")


def drain_prefect_workers() -> None:
    """Send this process' queued flow logs and events while the server is up (as
    prefect_test_harness does): otherwise they retry a stopped server at exit for a minute."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain():
        try:
            r = APILogWorker.instance().drain()
            if inspect.isawaitable(r):
                await r
        except RuntimeError:  # never started
            pass
        r = EventsWorker.drain_all()
        if inspect.isawaitable(r):
            await r

    run_coro_as_sync(drain())
