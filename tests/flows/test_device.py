"""VEIL_DEVICE is read, checked and used by training: a missing device is a one-line error (exit 2)
before any privacy budget is charged; a typo is refused; the device trained on reaches the certificate."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from components.core.device import check_device, resolve_device
from components.core.errors import VeilError
from components.core.settings import load_settings

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps", " CUDA "])
def test_valid_values_accepted(value):
    assert check_device(value) == value.strip().lower()


@pytest.mark.parametrize("value", ["gpu", "cdua", "cuda:", "cuda:x", "tpu", "cpu,cuda"])
def test_invalid_values_refused_by_settings(value, tmp_path):
    with pytest.raises(VeilError, match="not a device"):
        load_settings(tmp_path, env={"VEIL_DEVICE": value})


def test_invalid_value_in_toml_names_the_file(tmp_path):
    (tmp_path / "veil.toml").write_text('[veil]\ndevice = "gpu"\n')
    with pytest.raises(VeilError, match=r"device in .*veil.toml='gpu': not a device"):
        load_settings(tmp_path, env={})


def test_cpu_and_auto_resolve():
    assert resolve_device("cpu") == "cpu"
    want = "cuda" if torch.cuda.is_available() else (
        "mps" if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available() else "cpu")
    assert resolve_device("auto") == want


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:3"])
def test_missing_cuda_is_an_error(value):
    with pytest.raises(VeilError, match="no CUDA device on this machine"):
        resolve_device(value)


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_cuda_index_out_of_range():
    n = torch.cuda.device_count()
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(VeilError, match=f"has {n} CUDA device"):
        resolve_device(f"cuda:{n}")


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
def test_train_refuses_missing_device_before_any_charge(settings, monkeypatch, tmp_path):
    """stages.train checks the device before reserving budget: nothing lands in the ledger."""
    from flows import stages

    monkeypatch.setenv("VEIL_DEVICE", "cuda")
    s = load_settings(settings.home)
    called = []
    monkeypatch.setattr(stages, "reserve", lambda *a, **k: called.append(1))
    monkeypatch.setattr(stages, "_annex", lambda *a, **k: {})
    monkeypatch.setattr(stages, "training_data", lambda *a, **k: None)

    class _Plan:
        def to_dict(self):
            return {"sha256": "0" * 64}

    monkeypatch.setattr(stages, "load_plan", lambda p: _Plan())
    with pytest.raises(VeilError, match="VEIL_DEVICE=cuda: no CUDA device"):
        stages.train(s, tmp_path / "plan.json", tmp_path)
    assert called == []


def test_cli_invalid_device_one_line_exit_2(veil_home):
    env = {**os.environ, "VEIL_DEVICE": "gpu", "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "models"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: VEIL_DEVICE='gpu': not a device; use auto, cpu, cuda, cuda:N or mps", r.stderr


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", ["run", "retrain"])
def test_cli_missing_cuda_is_said_before_any_model_load(veil_home, tmp_path, command, monkeypatch):
    """Issue 26: VEIL_DEVICE=cuda on a machine without CUDA is one line, exit 2, before ingest or any
    model is loaded (the base model directory here is not even a model)."""
    import time

    from typer.testing import CliRunner

    from flows import stages
    from flows.cli import app

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the device check")

    monkeypatch.setattr("components.modeling.load_base", no_load)
    monkeypatch.setattr(stages, "ingest", no_load)
    (tmp_path / "src.jsonl").write_text('{"user": "a", "text": "hi"}\n')
    (tmp_path / "base").mkdir()
    args = [command, "--policy", str(stages.DEMO_POLICY), "--source", str(tmp_path / "src.jsonl"),
            "--base-model", str(tmp_path / "base")] + (["--no-prefect"] if command == "run" else [])
    t0 = time.monotonic()
    r = CliRunner().invoke(app, args, env={"VEIL_DEVICE": "cuda", "VEIL_HOME": str(veil_home)})
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().startswith("error: VEIL_DEVICE=cuda: no CUDA device on this machine"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert time.monotonic() - t0 < 30
