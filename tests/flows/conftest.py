"""The flow tests' helpers: Prefect's console handler on the live stream, the `api` fixture (this process'
flows report to the session's real Prefect server, tests/conftest.py's `prefect_server`), a tiny
organization and policy for the retraining tests."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import sys

import pytest

from _prefect_server import PREFECT, PrefectServer  # noqa: F401 (tests in tests/flows import them from here)

# Prefect configures its console log handler on import, bound to the sys.stderr of that moment:
# imported here (collection, pytest's session-long stream), not inside a test whose captured
# stream (capsys) is closed when it ends and would break every later test's flow logging.
import prefect  # noqa: F401,E402


def _console_handlers_to(stream) -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    for logger in [logging.getLogger()] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]:
        for h in getattr(logger, "handlers", []):
            if isinstance(h, PrefectConsoleHandler):
                h.stream = stream  # not setStream: it flushes the old, closed stream
                h.console.file = stream


@pytest.fixture(autouse=True)
def _prefect_console_on_live_stream():
    """Prefect's console handler keeps the stderr it was (re)configured with; pytest's per-test
    capture streams are closed after each test. Point it at the live stream around every test, and
    at the process' own stderr after it (later tests, e2e included, must not write to a closed file)."""
    _console_handlers_to(sys.stderr)
    yield
    _console_handlers_to(sys.__stderr__)


# --- a tiny organization and policy for the retraining tests ----------------------------------------

MAPPING = ["--id-field", "id", "--time-field", "ts", "--meta", "team", "--meta", "path"]


@pytest.fixture
def api(prefect_server, monkeypatch):
    """This process' flows report to the test's real server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("PREFECT_API_URL", prefect_server.api_url)
    with temporary_settings({PREFECT_API_URL: prefect_server.api_url}):
        yield prefect_server


def tiny_policy(tmp_path, steps=4, *, promoters=(), approval_timeout=None, passable=False, name="tiny"):
    """The demo policy, sized to train in seconds. `passable`: audit thresholds a tiny model passes
    (AUROC ceiling 0.999, no secret classes), so the promotion path past the audit is exercised."""
    import yaml

    from flows import stages

    doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
    doc["metadata"]["name"] = "retrain-tiny"
    doc["spec"]["training"].update(steps=steps, expected_batch_size=8, seq_len=64, micro_batch_size=8)
    doc["spec"]["audit"]["attacker_samples_per_user"] = 2
    # 100 candidates, as before the planner sized audits (`auto` gives 500 at 6 bits): these tests
    # exercise the flow, not the audit's power, and 5× the secret scoring costs minutes in CI
    doc["spec"]["audit"]["candidates_per_secret"] = 100
    # and at most 10 secrets of each class (the demo org has 188 in all): the secret scoring was three
    # quarters of a retraining's time. The verdict these tests see is unchanged — a class needs about
    # 100 secrets to pass (the plan says so), so this audit stays inconclusive and nothing is promoted
    # past it; the audit's power is tested in tests/audit/.
    doc["spec"]["audit"]["secrets_per_class"] = 10
    doc["spec"]["release"]["promoters"] = list(promoters)
    if approval_timeout is not None:
        doc["spec"]["release"]["approval_timeout_seconds"] = approval_timeout
    if passable:
        doc["spec"]["audit"].update(max_user_inference_auroc=0.999, max_secret_exposure=1000.0)
        doc["spec"]["secrets"]["classes"] = []
    path = tmp_path / f"{name}-{steps}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def build_org(tmp_path, settings):
    import json

    from components.modeling import build_base_model
    from flows import stages

    org = stages.demo_data(settings)
    texts = [json.loads(l)["text"] for l in open(org["public"])][:400]
    base = build_base_model(texts, tmp_path / "base", vocab_size=512, n_layer=1, n_embd=32, n_head=2,
                            n_positions=64, steps=4, seq_len=64, batch_size=8, progress=False)
    lines = open(org["messages"]).read().splitlines()
    users = sorted({json.loads(l)["user"] for l in lines})
    late = set(users[: len(users) // 5])  # these people's text arrives later
    src = tmp_path / "messages.jsonl"
    src.write_text("".join(l + "\n" for l in lines if json.loads(l)["user"] not in late))
    rest = [l for l in lines if json.loads(l)["user"] in late]
    return {"source": src, "late": rest, "base": base, "n_late": len(late)}


@pytest.fixture(scope="session")
def _org_template(tmp_path_factory):
    """`build_org` once per test process (~7.5 s of CPU: the demo organization and a tiny base model; 15 tests
    and a module fixture asked for one each). The base model is deterministic for its seed and the demo data
    for theirs, so a copy is what a fresh build would write."""
    from components.core.settings import load_settings

    tmp = tmp_path_factory.mktemp("org-template")
    (tmp / "veil-home").mkdir()
    return build_org(tmp, load_settings(tmp / "veil-home").ensure())


def copy_org(template, tmp_path):
    """The template's source and base model copied under `tmp_path`, where `build_org` would have put them: a
    test appends to its source (tests/flows/test_retrain.py) or moves its base, never the template's."""
    import shutil

    src, base = tmp_path / "messages.jsonl", tmp_path / "base"
    shutil.copyfile(template["source"], src)
    shutil.copytree(template["base"], base)
    return {**template, "source": src, "base": base, "late": list(template["late"])}


@pytest.fixture
def org(tmp_path, settings, _org_template):
    return copy_org(_org_template, tmp_path)


@pytest.fixture(scope="session")
def org_builder(_org_template):
    """`org` for module-scoped fixtures (`org_builder(tmp_path, settings)`): `from conftest import build_org`
    would find whichever tests/*/conftest.py an xdist worker registered as `conftest` first."""
    return lambda tmp_path, settings: copy_org(_org_template, tmp_path)


# --- shared by test_retrain.py and test_retrain_killed.py ---------------------------------------------
def retrain_json(policy, org, capsys, name="rt"):
    """`veil retrain … --json` in this process (CliRunner's and capsys' swapped streams are closed after
    the test but outlive it in Prefect's log handlers)."""
    from flows.cli import app

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # stdout only: Prefect's log handler holds stderr
        app(["retrain", "--policy", str(policy), "--source", str(org["source"]), "--format", "jsonl", *MAPPING,
             "--base-model", str(org["base"]), "--name", name, "--json"], standalone_mode=False)
    return json.loads(buf.getvalue())


def training_releases(home):
    """Training releases in the ledger (a plan's N̂ and a model's evaluation are releases of their own)."""
    from sqlalchemy import select

    from components.ledger import Ledger
    from components.ledger import store as st

    from components.core.settings import load_settings

    led = Ledger.open(load_settings(home))
    try:
        with st.read_only(led.engine) as conn:
            rows = conn.execute(select(st.releases.c.kind, st.releases.c.mechanism)).all()
    finally:
        led.dispose()
    return sum(1 for r in rows if r.kind != "population" and r.mechanism != "evaluation")
