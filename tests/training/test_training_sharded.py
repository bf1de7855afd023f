"""Sharded full fine-tuning (issue 24): a policy with `sharding: fsdp` reaches the plan and the spec; a
2-process torchrun (gloo) run with FSDP2 holds about half of the weights per rank and ends on the
weights of the 1-process unsharded run (fixed seed, to 1e-6); both certificates carry the same ε, and
the sharded one records world size 2 and sharding fsdp."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from components.core.errors import VeilError
from components.training import TrainSpec, train

warnings.filterwarnings("ignore")
WORKER = Path(__file__).with_name("tiny_lm_training.py")
REPO = Path(__file__).resolve().parents[2]


def _policy(tmp_path: Path, lora: str = "null") -> Path:
    demo = (REPO / "policies" / "demo.yaml").read_text()
    text = (demo.replace(re.search(r"    steps: \d+", demo).group(0), "    steps: 3")
            .replace(re.search(r"expected_batch_size: \d+", demo).group(0), "expected_batch_size: 6"))
    text = re.sub(r"    lora:.*\n", f"    lora: {lora}\n    sharding: fsdp\n", text)
    pol = tmp_path / "fsdp.yaml"
    pol.write_text(text)
    return pol


def _plan(tmp_path: Path):
    from components.planning import make_plan
    from components.draws.annex import load_annex
    from components.draws.data import training_records
    from components.policy import load_policy

    sys.path.insert(0, str(REPO / "tests" / "planning"))
    from _planning_fixtures import make_snapshot

    snap = make_snapshot(40, seed=3)
    plan = make_plan(load_policy(_policy(tmp_path)), snap, private_dir=tmp_path / "private").to_dict()
    annex = load_annex(tmp_path / "private", plan)
    return plan, annex, training_records(plan, annex, snap.records)


def _env():
    import os

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def test_fsdp_two_ranks_match_single_process_and_certificate(tiny_lm, tiny_tokenizer, tmp_path):
    from components.certificate import build_certificate
    from components.draws.annex import commitment

    plan, annex, data = _plan(tmp_path)
    assert plan["training"]["sharding"] == "fsdp" and plan["training"]["lora"] is None
    spec = TrainSpec.from_plan(plan, private_seed=11, seq_len=16, micro_batch_size=3, checkpoint_every=2,
                               learning_rate=0.01)
    assert spec.sharding == "fsdp"
    pq.write_table(data, tmp_path / "data.parquet")      # keeps the train-records sha256 (schema metadata)

    out = tmp_path / "fsdp"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0",
           "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", str(WORKER), str(out),
           json.dumps(spec.to_dict()), "0", str(tmp_path / "data.parquet")]
    r = subprocess.run(cmd, env=_env(), capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    got = torch.load(out / "final.pt", weights_only=False)
    sharded = got["result"]
    assert sharded["world_size"] == 2 and sharded["sharding"] == "fsdp" and sharded["steps_run"] == 3
    total = sum(p.numel() for p in got["params"].values())
    assert sharded["trainable_params"] == total
    # rank 0 held a shard of every weight, not the model: about half (dim-0 chunks round up)
    assert got["local_numel"] < 0.6 * total, (got["local_numel"], total)

    model = tiny_lm.make_model()
    start = tiny_lm.trainable_state(model)
    single = train(dataclasses.replace(spec, sharding="none"), data, model, tiny_tokenizer, tmp_path / "single",
                   progress=False)
    assert single.world_size == 1 and single.sharding == "none"
    assert sharded["batch_min"] == single.batch_min and sharded["batch_max"] == single.batch_max
    moved = 0.0
    for n, p in tiny_lm.trainable_state(model).items():
        torch.testing.assert_close(got["params"][n], p, rtol=0, atol=1e-6)
        moved = max(moved, float((p - start[n]).abs().max()))
    assert moved > 1e-3     # the steps did move the weights (a no-op on both sides would also "match")
    assert sharded["losses"] == pytest.approx(single.losses, rel=1e-5)
    # the gathered model the sharded run wrote is the one it trained
    from safetensors.torch import load_file

    saved = load_file(str(out / "model" / "model.safetensors"))
    torch.testing.assert_close(saved["transformer.h.0.attn.c_attn.weight"],
                               got["params"]["transformer.h.0.attn.c_attn.weight"], rtol=0, atol=0)

    certs = []
    for res in (sharded, single.to_dict()):
        res = dict(res, train_records_commitment=commitment(annex["salt"], res["train_records_sha256"]))
        certs.append(build_certificate(plan, res).to_dict())
    assert certs[0]["epsilon"] == certs[1]["epsilon"] and certs[0]["delta"] == certs[1]["delta"]
    assert (certs[0]["run"]["world_size"], certs[0]["run"]["sharding"]) == (2, "fsdp")
    assert certs[1]["run"]["world_size"] == 1 and "sharding" not in certs[1]["run"]   # absent: not sharded


def test_fsdp_settings_are_refused_where_they_cannot_run(tmp_path):
    from components.policy import load_policy

    with pytest.raises(VeilError, match="fsdp"):   # before a plan exists: a LoRA adapter is not sharded
        load_policy(_policy(tmp_path, lora="{r: 2, alpha: 4.0}"))
    base = dict(mechanism="uls", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1, records_per_user=2)
    with pytest.raises(VeilError, match="sharding"):
        TrainSpec(**base, sharding="zero")
    with pytest.raises(VeilError, match="vmap"):
        TrainSpec(**base, sharding="fsdp", per_record="vmap")
    # one process: nothing to shard, the plain step runs and the result says so
    assert TrainSpec(**base, sharding="fsdp").identity()["sharding"] == "fsdp"
    assert "sharding" not in TrainSpec(**base).identity()   # older checkpoints still resume
