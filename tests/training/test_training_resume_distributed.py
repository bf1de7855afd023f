"""Reliability and scale-out: a run killed with SIGKILL resumes to the clean run's result, and a
2-process torchrun (gloo) run matches the single-process run for a fixed seed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from components.training import TrainSpec, train
from components.training.checkpoint import read_ledger

warnings.filterwarnings("ignore")
WORKER = Path(__file__).with_name("tiny_lm_training.py")
REPO = Path(__file__).resolve().parents[2]
SPEC = dict(mechanism="uls", sampling_rate=0.5, noise_multiplier=0.8, clip_norm=0.5, steps=10,
            records_per_user=2, lora={"r": 2, "alpha": 4, "dropout": 0.0}, learning_rate=0.05,
            seq_len=16, micro_batch_size=3, checkpoint_every=3, optimizer="adam", private_seed=77)


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _clean_run(tiny_lm, tok, out):
    model = tiny_lm.make_model()
    res = train(TrainSpec(**SPEC), tiny_lm.make_texts(), model, tok, out, progress=False)
    return tiny_lm.trainable_state(model), res


def test_sigkill_then_resume_matches_clean_run(tiny_lm, tiny_tokenizer, tmp_path):
    out = tmp_path / "killed"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(WORKER), str(out), json.dumps(SPEC), "0.4"], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while read_ledger(out) < 8:  # past the step-6 checkpoint, mid-way to step 9
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "worker too slow"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    attempted = read_ledger(out)
    assert not (out / "final.pt").exists()

    model = tiny_lm.make_model()
    res = train(TrainSpec(**SPEC), tiny_lm.make_texts(), model, tiny_tokenizer, out, progress=False)
    assert res.resumed_from_step == 6
    assert res.steps_run == 10 and res.steps_attempted == 10 and attempted >= 8
    clean, clean_res = _clean_run(tiny_lm, tiny_tokenizer, tmp_path / "clean")
    for n, p in tiny_lm.trainable_state(model).items():
        torch.testing.assert_close(p, clean[n], rtol=0, atol=1e-6)
    assert res.losses == pytest.approx(clean_res.losses, rel=1e-5)

    # a finished run resumed again is a no-op with the same result
    model2 = tiny_lm.make_model()
    again = train(TrainSpec(**SPEC), tiny_lm.make_texts(), model2, tiny_tokenizer, out, progress=False)
    assert again.steps_run == 10 and again.resumed_from_step == 10
    for n, p in tiny_lm.trainable_state(model2).items():
        torch.testing.assert_close(p, clean[n], rtol=0, atol=1e-6)


def test_torchrun_two_processes_match_single_process(tiny_lm, tiny_tokenizer, tmp_path):
    out = tmp_path / "ddp"
    out.mkdir()
    spec = dict(SPEC, checkpoint_every=100, steps=6)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0",
           "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", str(WORKER), str(out), json.dumps(spec)]
    r = subprocess.run(cmd, env=_env(), capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    got = torch.load(out / "final.pt", weights_only=False)
    assert got["result"]["world_size"] == 2

    model = tiny_lm.make_model()
    res = train(TrainSpec(**spec), tiny_lm.make_texts(), model, tiny_tokenizer, tmp_path / "single",
                progress=False)
    assert got["result"]["batch_min"] == res.batch_min and got["result"]["steps_run"] == 6
    for n, p in tiny_lm.trainable_state(model).items():
        torch.testing.assert_close(got["params"][n], p, rtol=1e-5, atol=1e-6)
    assert got["result"]["losses"] == pytest.approx(res.losses, rel=1e-5)
