"""σ used is the spec's, noise is added once, steps run equal steps planned, empty steps still step."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch

from components.core.errors import VeilError
from components.training import TrainSpec, train

warnings.filterwarnings("ignore")


def _zero_grad_data(n: int) -> pa.Table:
    # one-token records: no next-token target, so every gradient is exactly zero
    return pa.table({"user_id": [f"u{i}" for i in range(n)], "text": ["a"] * n})


@pytest.mark.parametrize("mechanism", ["record", "uls"])
def test_update_is_pure_noise_with_the_specs_sigma(tiny_lm, tiny_tokenizer, tmp_path, mechanism):
    model = tiny_lm.make_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sigma, C, q, N = 2.0, 0.5, 0.5, 20
    spec = TrainSpec(mechanism=mechanism, sampling_rate=q, noise_multiplier=sigma, clip_norm=C, steps=1,
                     records_per_user=1, lora=None, learning_rate=1.0, optimizer="sgd", seq_len=8,
                     private_seed=99)
    res = train(spec, _zero_grad_data(N), model, tiny_tokenizer, tmp_path / "r", progress=False)
    delta = torch.cat([(p.detach() - before[n]).ravel() for n, p in model.named_parameters()])
    want_sd = sigma * C / (q * N)  # N(0, σ²C²) on the sum, ÷ expected batch q·N, lr 1
    n = delta.numel()
    assert n > 20000
    assert abs(float(delta.mean())) < 5 * want_sd / np.sqrt(n)
    assert float(delta.std()) == pytest.approx(want_sd, rel=0.03)
    assert res.noise_multiplier == sigma and res.clip_norm == C


def test_steps_run_equals_spec_and_empty_batches_step(tiny_lm, tiny_tokenizer, tmp_path):
    model = tiny_lm.make_model()
    data = tiny_lm.make_texts(n_users=4, per_user=(1, 2), seed=1)
    spec = TrainSpec(mechanism="uls", sampling_rate=0.1, noise_multiplier=1.0, clip_norm=1.0, steps=12,
                     records_per_user=2, lora={"r": 2, "alpha": 4, "dropout": 0.0}, learning_rate=0.01,
                     seq_len=16, checkpoint_every=5, private_seed=5)
    res = train(spec, data, model, tiny_tokenizer, tmp_path / "r", progress=False)
    assert res.steps_run == 12 and len(res.losses) == 12 and res.steps_attempted == 12
    assert res.empty_steps > 0  # q·N = 0.4 users per step: most steps are noise-only
    assert res.expected_batch_size == pytest.approx(0.4)
    saved = json.loads((tmp_path / "r" / "train_result.json").read_text())
    assert saved["steps_run"] == 12 and saved["private_seed_source"] == "spec"
    assert (tmp_path / "r" / "adapter" / "adapter_config.json").exists()


def test_secret_seed_is_drawn_and_kept_private(tiny_lm, tiny_tokenizer, tmp_path):
    data = tiny_lm.make_texts(n_users=3, per_user=(1, 1), seed=2)
    spec = TrainSpec(mechanism="record", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                     lora={"r": 2}, seq_len=16)
    res = train(spec, data, tiny_lm.make_model(), tiny_tokenizer, tmp_path / "r", progress=False)
    assert res.private_seed_source == "os_entropy"
    seed_file = tmp_path / "r" / "private_seed"
    assert seed_file.stat().st_mode & 0o077 == 0
    assert seed_file.read_text().strip() not in (tmp_path / "r" / "train_result.json").read_text()


def test_bad_inputs_are_one_line_errors(tiny_lm, tiny_tokenizer, tmp_path):
    with pytest.raises(VeilError, match="sampling_rate"):
        TrainSpec(mechanism="record", sampling_rate=1.5, noise_multiplier=1.0, clip_norm=1.0, steps=1)
    with pytest.raises(VeilError, match="records_per_user"):
        TrainSpec(mechanism="uls", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1)
    data = tiny_lm.make_texts(n_users=2, per_user=(3, 3), seed=2)
    spec = TrainSpec(mechanism="els", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                     records_per_user=2, lora={"r": 2}, seq_len=16)
    with pytest.raises(VeilError, match="bounded to k=2"):
        train(spec, data, tiny_lm.make_model(), tiny_tokenizer, tmp_path / "r", progress=False)
    with pytest.raises(VeilError, match="rate"):
        train(TrainSpec(mechanism="secret", sampling_rate=1.0, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                        lora={"r": 2}, seq_len=16), data, tiny_lm.make_model(), tiny_tokenizer,
              tmp_path / "s", progress=False)
    with_rates = data.append_column("rate", pa.array([0.2] * data.num_rows))
    with pytest.raises(VeilError, match="differs from the plan's sampling_rate"):
        train(TrainSpec(mechanism="secret", sampling_rate=0.3, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                        lora={"r": 2}, seq_len=16), with_rates, tiny_lm.make_model(), tiny_tokenizer,
              tmp_path / "t", progress=False)
    with pytest.raises(VeilError, match="random-chunk"):
        TrainSpec(mechanism="els", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                  records_per_user=2, selection="random-chunk")


def test_from_plan_maps_contract_keys():
    plan = {"schema": "veil.plan/v1", "mechanism": "uls", "sampling_rate": 0.05, "noise_multiplier": 1.3,
            "steps": 40, "expected_batch_size": 12, "clip_norm": 0.7, "records_per_user": 4,
            "training": {"learning_rate": 5e-4, "seq_len": 96, "micro_batch_size": 8, "seed": 3,
                         "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": None}}}
    s = TrainSpec.from_plan(plan)
    assert (s.mechanism, s.sampling_rate, s.noise_multiplier, s.steps, s.clip_norm, s.records_per_user) == \
        ("uls", 0.05, 1.3, 40, 0.7, 4)
    assert (s.learning_rate, s.seq_len, s.micro_batch_size, s.seed, s.lora["r"]) == (5e-4, 96, 8, 3, 8)
    assert s.expected_batch_size == 12 and s.private_seed is None
    with pytest.raises(VeilError, match="noise_multiplier"):
        TrainSpec.from_plan({k: v for k, v in plan.items() if k != "noise_multiplier"})


def test_uls_training_learns_and_leaves_model_clean(tiny_lm, tiny_tokenizer, tmp_path):
    model = tiny_lm.make_model()
    data = tiny_lm.make_texts(n_users=12, per_user=(2, 5), seed=9)
    spec = TrainSpec(mechanism="uls", sampling_rate=0.5, noise_multiplier=0.3, clip_norm=1.0, steps=12,
                     records_per_user=2, lora=None, learning_rate=0.01,
                     seq_len=24, micro_batch_size=8, private_seed=3)
    res = train(spec, data, model, tiny_tokenizer, tmp_path / "r", progress=False)
    first, last = np.nanmean(res.losses[:3]), np.nanmean(res.losses[-3:])
    assert last < first - 0.3, (first, last)
    assert res.extra["per_record"] == "mixed"
    assert all(not m._forward_hooks for m in model.modules())  # per-record hooks removed
