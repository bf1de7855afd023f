"""A throwaway PostgreSQL server for ledger tests: initdb + pg_ctl on 127.0.0.1, a free port, a tmp dir.

Skips only when the server binaries are absent (CI installs them: .ci/run). Run as the `postgres` user
when we are root (initdb refuses root)."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest


def _bindir() -> Path | None:
    if shutil.which("initdb") and shutil.which("pg_ctl"):
        return Path(shutil.which("initdb")).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server():
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    pytest.importorskip("psycopg")
    root = Path(tempfile.mkdtemp(prefix="veil-pg-"))
    data, port = root / "data", _free_port()
    as_root = os.geteuid() == 0
    if as_root:
        import pwd
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o700)

    def run(*args: str) -> None:
        cmd = [str(bindir / args[0]), *args[1:]]
        if as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    run("initdb", "-D", str(data), "-U", "veil", "--auth=trust", "-E", "UTF8", "--no-sync")
    run("pg_ctl", "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60", "-o",
        f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c fsync=off", "start")
    try:
        yield f"postgresql://veil@127.0.0.1:{port}/postgres"
    finally:
        try:
            run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(root, ignore_errors=True)
