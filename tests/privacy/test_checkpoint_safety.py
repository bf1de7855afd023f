"""Checkpoints load without arbitrary code (issue 11, item 10): whoever can write a run folder must
not be able to run code when the run resumes; a truncated checkpoint is a one-line error."""
from __future__ import annotations

import builtins
import importlib.util
import os
import warnings
from pathlib import Path

import pytest
import torch

from components.core.errors import VeilError
from components.training import TrainSpec, train
from components.training import checkpoint as ckpt

warnings.filterwarnings("ignore")
_spec = importlib.util.spec_from_file_location(
    "tiny_lm_training", Path(__file__).resolve().parents[1] / "training" / "tiny_lm_training.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

SPEC = dict(mechanism="record", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=2,
            lora={"r": 2, "alpha": 4, "dropout": 0.0}, seq_len=16, private_seed=5, checkpoint_every=1)


class _Payload:
    """Unpickling this creates `marker`: stands for any code an attacker would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


class _Crash(Exception):
    pass


def _train(run: Path, steps: int = 2, crash_after: int | None = None):
    torch.set_num_threads(1)

    def on_step(done):
        if crash_after is not None and done >= crash_after:
            raise _Crash()

    return train(TrainSpec(**{**SPEC, "steps": steps}), tiny.make_texts(n_users=4, per_user=(1, 2)),
                 tiny.make_model(), tiny.make_tokenizer(), run, progress=False, on_step=on_step)


def test_malicious_pickle_in_run_folder_does_not_execute(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "spec": {}, "payload": _Payload(marker)}, run / ckpt.CHECKPOINT)
    with pytest.raises(VeilError) as e:
        _train(run)
    assert not marker.exists(), "unpickling the checkpoint ran the attacker's code"
    msg = str(e.value)
    assert "\n" not in msg and "refused" in msg and ckpt.CHECKPOINT in msg


def test_truncated_checkpoint_is_one_line_error(tmp_path):
    run = tmp_path / "run"
    _train(run, steps=1)
    data = (run / ckpt.CHECKPOINT).read_bytes()
    (run / ckpt.CHECKPOINT).write_bytes(data[: len(data) // 2])
    with pytest.raises(VeilError) as e:
        _train(run, steps=1)
    assert "\n" not in str(e.value) and "truncated or corrupt" in str(e.value)


def test_garbled_checkpoint_is_refused_by_its_sha256(tmp_path):
    """Issue 28: bytes garbled inside a checkpoint's tensors loaded as weights (then blamed on "the model's
    trainable weights are not finite", and resumed forever). The checkpoint carries the sha256 of its own
    bytes: any garble is one line naming the file and the hash, never a resume."""
    run = tmp_path / "run"
    with pytest.raises(_Crash):
        _train(run, steps=2, crash_after=1)
    p = run / ckpt.CHECKPOINT
    data = bytearray(p.read_bytes())
    assert data.startswith(ckpt.MAGIC)
    # every byte of the tensors' storage, garbled: what a bad disk sector or a torn copy leaves
    state = ckpt.load_checkpoint(run)
    raw = b"".join(t.numpy().tobytes() for t in state["trainable"].values())
    at = bytes(data).find(raw[:64])
    assert at > 0
    data[at:at + 64] = bytes(b ^ 0xFF for b in data[at:at + 64])
    p.write_bytes(bytes(data))
    with pytest.raises(VeilError) as e:
        _train(run, steps=2)
    msg = str(e.value)
    assert "\n" not in msg and "sha256" in msg and ckpt.CHECKPOINT in msg and "still charged" not in msg
    assert "stay charged" in msg
    # a garbled header is refused too
    data[:4] = b"XXXX"
    p.write_bytes(bytes(data))
    with pytest.raises(VeilError, match="garbled header"):
        _train(run, steps=2)


def test_real_checkpoint_resumes_under_weights_only(tmp_path):
    """The engine's own checkpoint (weights, Adam state, RNG state, losses) is plain data: a run
    stopped after one step resumes to the same weights as a run of two steps straight through."""
    straight = _train(tmp_path / "a", steps=2)
    with pytest.raises(_Crash):
        _train(tmp_path / "b", steps=2, crash_after=1)
    resumed = _train(tmp_path / "b", steps=2)
    assert resumed.resumed_from_step == 1 and straight.steps_run == resumed.steps_run == 2
    a = ckpt.load_checkpoint(tmp_path / "a")["trainable"]
    b = ckpt.load_checkpoint(tmp_path / "b")["trainable"]
    for n in a:
        torch.testing.assert_close(a[n], b[n])
    assert (os.stat(tmp_path / "b" / ckpt.CHECKPOINT).st_mode & 0o777) == 0o600


def test_corrupt_ledger_is_refused_not_read_as_zero(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(_Crash):
        _train(run, steps=2, crash_after=1)
    (run / ckpt.LEDGER).write_text("{not json")
    with pytest.raises(VeilError) as e:
        _train(run, steps=2)
    assert "\n" not in str(e.value) and "ledger" in str(e.value)
