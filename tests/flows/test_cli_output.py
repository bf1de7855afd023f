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
from _output import assert_quiet, prefect_log_text

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-c", "from flows.cli import main; main()"]


def _veil(args, env, timeout=900):  # generous: `make test` runs files in parallel (xdist)
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def env(prefect_server, veil_home):
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VEIL_"))}
    return {**keep, "PYTHONPATH": os.getcwd(), "VEIL_HOME": str(veil_home), "PREFECT_API_URL": prefect_server.api_url}


# `veil ARGS…` for each argument (a command line: a JSON list of its words) in ONE process, each followed by a
# marker line on stderr with its exit code: a process start pays ~8-15 s of CPU for the flows' imports.
# Whatever a lone command's process would print at exit (a native leak dump) comes after the last marker.
COMMANDS = """
import json, sys
from flows.cli import main
for line in sys.argv[1:]:
    sys.argv = ["veil", *json.loads(line)]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    sys.stdout.flush()
    print(f"=== exit {code}", file=sys.stderr, flush=True)
"""


def test_user_error_inside_the_flow_is_one_line(env, tmp_path, org):
    """`veil retrain` and `veil run`, their ingest failing inside the flow: one line each, exit 2. Both run in
    one process (one import of the flows, not two): what a process prints once (an import's warning) is in
    the first command's part, what it prints at exit in the tail; each is still seen, and fails the test."""
    import re

    policy = tiny_policy(tmp_path)
    commands = ["retrain", "run"]
    r = subprocess.run([sys.executable, "-c", COMMANDS,
                        *(json.dumps([c, "--policy", str(policy), "--source", str(org["source"]), "--user-field", "nope",
                                     "--base-model", str(org["base"])]) for c in commands)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout == "", r.stderr[-3000:]
    parts = re.split(r"^=== exit (\S*)\n", r.stderr, flags=re.M)   # [said, code, said, code, tail]
    assert len(parts) == 2 * len(commands) + 1, r.stderr[-3000:]
    for i, command in enumerate(commands):
        said, code = parts[2 * i], parts[2 * i + 1]
        assert code == "2", f"veil {command}: exit {code}\n{said[-3000:]}"
        lines = said.splitlines()
        assert len(lines) == 1, f"veil {command}:\n{said[-3000:]}"  # ingest failed inside the flow: said once, by Veil
        assert lines[0].startswith("error: ") and "'nope'" in lines[0] and "--user-field" in lines[0], command
        assert "warning" not in said.lower(), command
    assert parts[-1] == "", f"printed at exit:\n{parts[-1][-3000:]}"


def test_retrain_prints_no_third_party_warnings(env, prefect_server, tmp_path, org):
    """…on the terminal and in the run's Prefect log (issue 26), and the log shows the steps."""
    from datetime import datetime, timezone

    since = datetime.now(timezone.utc)
    r = _veil(["retrain", "--policy", str(tiny_policy(tmp_path)), "--source", str(org["source"]), *MAPPING,
               "--base-model", str(org["base"]), "--name", "quiet", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["action"] == "trained" and doc["model_uri"] == "models:/quiet/1"
    assert_quiet(r.stderr, "veil retrain's stderr")
    low = r.stderr.lower()
    for noise in ("warning", "beginning flow run", "finished in state"):
        assert noise not in low, f"{noise!r} in stderr:\n{r.stderr[-3000:]}"
    log = prefect_log_text(prefect_server.api, since)
    assert_quiet(log, "the retraining's Prefect log")
    for step in ("base model ready", "ingested", "planned", "trained", "audited"):
        assert f"step: {step}" in log, log[-3000:]


def test_sigint_stops_a_served_retraining(env, prefect_server, tmp_path, org):
    """`veil retrain --serve`: SIGINT stops it promptly, one line, exit 130, no traceback; its
    schedule is paused on the server (no run comes due for a runner that is gone)."""
    import signal
    import time

    proc = subprocess.Popen([*CLI, "retrain", "--policy", str(tiny_policy(tmp_path)), "--source", str(org["source"]),
                             *MAPPING, "--base-model", str(org["base"]), "--name", "served", "--serve",
                             "--cron", "0 3 * * 0", "--timezone", "Europe/Paris"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, dep = time.monotonic() + 120, None
        while time.monotonic() < deadline and dep is None and proc.poll() is None:
            deps = prefect_server.api("POST", "/deployments/filter", json={})
            dep = next((d for d in deps if d["name"] == "retrain-served"), None)
            time.sleep(0.5)
        assert dep is not None, proc.communicate(timeout=30)
        (sched,) = dep["schedules"]
        assert sched["schedule"]["cron"] == "0 3 * * 0" and sched["schedule"]["timezone"] == "Europe/Paris"
        time.sleep(1)  # the runner is polling
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130, err
    assert took < 15, took
    lines = err.strip().splitlines()
    assert lines[0].startswith("serving veil-retrain/retrain-served on '0 3 * * 0' (Europe/Paris)"), err
    assert len(lines) == 2 and lines[1].startswith("stopped serving veil-retrain/retrain-served (SIGINT)"), err
    assert "Traceback" not in err and out == ""
    assert prefect_server.api("GET", f"/deployments/{dep['id']}")["paused"] is True


def test_serve_refuses_a_bad_schedule(env, tmp_path, org):
    r = _veil(["retrain", "--policy", str(tiny_policy(tmp_path)), "--source", str(org["source"]),
               "--base-model", str(org["base"]), "--serve", "--cron", "99 * * * *"], env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--cron '99 * * * *'" in r.stderr, r.stderr


DEMO = ("import pathlib, sys; from flows import stages; stages.DEMO_POLICY = pathlib.Path(sys.argv.pop(1)); "
        "from flows.cli import main; main()")


def test_demo_prints_no_third_party_warnings_and_ends_in_its_summary(env, prefect_server, tmp_path, settings):
    """`veil demo` in its own process against a real Prefect server, as a user runs it: the demo organization,
    its base model, plan, DP training, certificate, registry, evaluation and synthetic records. Its
    terminal and its runs' Prefect log hold Veil's lines only (issue 26), and it ends in Veil's summary
    table. Sized for CI: `--no-audit` (the demo's one size option: scoring its planted secrets takes
    minutes on CPU; the audit's output is checked by the retrain and pipeline tests), the demo policy at 4
    steps (`tiny_policy`, put in place of the shipped file in that process), and a tiny base model built by
    the demo's own stage into the cache the demo then reuses (the full-size base takes minutes too)."""
    from datetime import datetime, timezone

    from components.core.hashing import sha256_file
    from flows import stages

    org = stages.demo_data(settings)
    cache = settings.models_dir / f"base-{sha256_file(org['public'])[:12]}"
    stages.base_model(settings, public_corpus=org["public"], out_dir=cache, progress=False,
                      config={"vocab_size": 512, "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 64,
                              "steps": 4, "seq_len": 64, "batch_size": 8})
    since = datetime.now(timezone.utc)
    r = subprocess.run([sys.executable, "-c", DEMO, str(tiny_policy(tmp_path)), "demo", "--no-audit"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_quiet(r.stdout + r.stderr, "veil demo's terminal output")
    assert f"reusing {cache}" in r.stderr                      # the tiny base, not a fresh full-size one
    # the last thing on screen is Veil's summary, one row per stage
    table = r.stdout[r.stdout.rindex("Veil run"):]
    assert r.stdout.rstrip().endswith("┘") or r.stdout.rstrip().endswith("╯"), r.stdout[-2000:]
    for row in ("ingest", "plan", "train", "certificate", "registry", "evaluation", "synthetic", "time"):
        assert f"│ {row}" in table, table
    assert "models:/veil-demo/1" in table
    log = prefect_log_text(prefect_server.api, since)
    assert_quiet(log, "the demo's Prefect log")
    for step in ("base model ready", "ingested", "planned", "trained", "registered", "evaluated"):
        assert f"step: {step}" in log, log[-3000:]
