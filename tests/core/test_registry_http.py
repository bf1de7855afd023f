"""A team's registry over HTTP: a real `mlflow server` (SQLite backend and proxied artifacts, both in tmp) on
127.0.0.1, and Veil's client side against `http://127.0.0.1:PORT` only — register, verify, load, serve.

The server needs the full `mlflow` package (Flask), which Veil's `mlflow-skinny` pin lacks; it lives in an
environment of its own, `.venv-mlflow-server` (`make mlflow-server-env`), or VEIL_MLFLOW_SERVER names its
`mlflow` executable. Without it this file skips, saying so.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "privacy"))
sys.path.insert(0, str(ROOT / "tests" / "prediction"))
from _sealed_release import build_adapter, build_base, plan_and_certificate  # noqa: E402

MLFLOW = os.environ.get("VEIL_MLFLOW_SERVER") or str(ROOT / ".venv-mlflow-server" / "bin" / "mlflow")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.access(MLFLOW, os.X_OK):
        pytest.skip(f"no MLflow server environment ({MLFLOW} missing): `make mlflow-server-env` installs the full "
                    "mlflow into .venv-mlflow-server (Veil's own mlflow-skinny has no server)")
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers to wait for
    log = open(tmp / "server.log", "w")
    p = subprocess.Popen([MLFLOW, "server", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
                          "--serve-artifacts", "--artifacts-destination", str(tmp / "artifacts"),
                          "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                         cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1800):   # a cold start on a loaded 2-core machine takes up to a minute
            if p.poll() is not None:
                raise AssertionError((tmp / "server.log").read_text()[-2000:])
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError("mlflow server did not start")
        yield url, tmp / "artifacts"
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


@pytest.fixture(scope="module")
def team(server, tmp_path_factory):
    """Settings whose tracking and registry URI is the server's http:// URL, nothing else."""
    from components.core.settings import load_settings

    url, artifacts = server
    home = tmp_path_factory.mktemp("team-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VEIL_HOME", str(home))
        mp.setenv("VEIL_MLFLOW_TRACKING_URI", url)
        for var in ("VEIL_CONFIG", "VEIL_MLFLOW_REGISTRY_URI", "VEIL_SIGNING_KEY", "VEIL_TRUSTED_KEYS"):
            mp.delenv(var, raising=False)
        s = load_settings(home).ensure()
        assert s.mlflow_tracking_uri == url and s.mlflow_registry_uri == url
        yield s, artifacts, home


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "tests" / "training"))
    import tiny_lm_training as tiny

    d = tmp_path_factory.mktemp("pmixed-base")
    tok = tiny.make_tokenizer()
    tiny.make_model(seed=0, vocab=len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_people():
    sys.path.insert(0, str(ROOT / "tests" / "training"))
    import tiny_lm_training as tiny

    return tiny.make_texts(n_users=12, per_user=(2, 5), seed=0)


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_register_verify_load_and_predict_over_http(team, tmp_path):
    import mlflow

    from components.registry import list_models, load_model, register_model
    from components.registry.mlflow_registry import verify_model

    s, artifacts, home = team
    base = build_base(tmp_path / "base")
    adapter = build_adapter(base, tmp_path / "adapter")
    plan, cert = plan_and_certificate(adapter, base)
    reg = register_model(s, name="team-model", certificate=cert, plan=plan, base_model_dir=base,
                         adapter_dir=adapter, policy_max_epsilon=8.0)
    assert reg.model_uri == "models:/team-model/1"
    # the package went through the server's artifact proxy: it is in the server's store, not VEIL_HOME
    assert any(p.name == "MLmodel" for p in _files(artifacts))
    assert not _files(s.mlflow_artifacts_dir) and not (home / "mlflow.db").exists()
    run = mlflow.MlflowClient(s.mlflow_tracking_uri).get_run(reg.run_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
    rows = [r for r in list_models(s) if r["name"] == "team-model"]
    assert [(r["version"], r["certificate_status"]) for r in rows] == [("1", "verified")]
    v = verify_model("models:/team-model@latest-certified", s)
    assert v.valid, v.to_dict()
    loaded = load_model("models:/team-model@latest-certified", s)
    assert loaded.certificate["sha256"] == cert["sha256"]
    # a consumer with only the URL: plain MLflow, the package verifies itself (and the registry side) on load
    mlflow.set_tracking_uri(s.mlflow_tracking_uri)
    out = mlflow.pyfunc.load_model("models:/team-model/1").predict({"prompt": ["the weekly"]},
                                                                   params={"max_new_tokens": 2})
    assert len(out) == 1


def test_pmixed_build_and_serve_from_the_http_registry(team, tiny_base, tiny_people, tmp_path):
    """`veil pmixed build` registers through the server; `resolve` + the endpoint serve from what it downloads."""
    import threading

    import uvicorn

    from components.prediction.budget import TokenBudget
    from components.prediction.release import open_ensemble, resolve
    from components.prediction.server import create_app
    from test_prediction_build import make_built

    s, artifacts, _ = team
    out = make_built(s, tiny_base, tiny_people, tmp_path)
    r = resolve(s, out["model_uri"])
    assert r["certificate"]["sha256"] == out["certificate"]["sha256"]
    tb = TokenBudget.open(s)
    key = tb.create_key()
    app = create_app(ensemble=open_ensemble(s, r), budget=tb, ensemble_id=r["certificate"]["ensemble_id"],
                     when_exhausted=r["certificate"]["when_exhausted"], max_tokens_cap=8,
                     key_quota=r["manifest"].get("key_quota_tokens"))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        for _ in range(200):
            if srv.started:
                break
            time.sleep(0.05)
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "alpha", "max_tokens": 3},
                          headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert resp.status_code == 200 and resp.json()["private_tokens"] >= 1, resp.text
    finally:
        srv.should_exit = True
        th.join(timeout=10)
        tb.dispose()
