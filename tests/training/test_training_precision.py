"""Training precision (issue 24): a bf16/fp16 base gives the fp32 run's clipped-and-noised update within
16-bit rounding on every per-record path; a unit's norm is never taken in 16 bits; fp16's loss scale is
undone before clipping; a checkpoint of another precision is not resumed; ε does not depend on it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from components.core.errors import VeilError
from components.dpsgd import grad_samplers, per_sample
from components.dpsgd.per_sample import Unit
from components.dpsgd.precision import FP16_LOSS_SCALE, MasterWeights, PRECISIONS, trainable_to_float32
from components.dpsgd.step import DPStep

ROOT = Path(__file__).resolve().parents[2]
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                     pad_token_id=0))
    with torch.no_grad():   # RMSNorm weights start at 1: make them differ so their gradients matter
        for n, p in m.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return m


ARCH = {"gpt2": _gpt2, "llama": _llama}
LORA_TARGETS = {"gpt2": ["c_attn", "c_proj"], "llama": ["q_proj", "v_proj"]}


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 64, size=(12, 16)).astype(np.int64)
    lengths = rng.integers(4, 17, size=12).astype(np.int64)
    # ULS-style units of several records (averaged, then clipped as one) and single records
    units = ([Unit(np.array([0, 1, 2]), 1 / 3), Unit(np.array([3]), 1.0), Unit(np.array([4, 5]), 0.5)]
             + [Unit(np.array([i]), 1.0) for i in range(6, 12)])
    return units, ids, lengths


def _update(arch: str, precision: str, lora: bool, method: str, sigma: float, clip: float = 0.05):
    """One DP step from the same start; returns ({name: Δ trainable weight (float32)}, the DPStep)."""
    from components.modeling.lora import attach_lora, lora_config

    m = ARCH[arch]()
    m.to(DT[precision])
    if lora:
        m = attach_lora(m, lora_config(r=4, alpha=8, target_modules=LORA_TARGETS[arch]), seed=0)
        trainable_to_float32(m)
    masters = MasterWeights([(n, p) for n, p in m.named_parameters() if p.requires_grad])
    before = {n: t.detach().clone() for n, t in masters.named}
    step = DPStep(m, torch.optim.SGD(masters.params, lr=1.0), private=True, clip_norm=clip, noise_multiplier=sigma,
                  expected_batch_size=9.0, micro_batch_size=8, private_seed=1, per_record=method)
    units, ids, lengths = _batch()
    try:
        step(0, units, ids, lengths)
    finally:
        step.close()
    for n, p in m.named_parameters():    # the model holds the (rounded) masters after the step
        if n in masters.masters:
            assert torch.equal(p, masters.masters[n].to(p.dtype))
    return {n: (t.detach() - before[n]).float() for n, t in masters.named}, step


def _flat(d):
    return torch.cat([v.flatten() for v in d.values()])


def test_precision_names_agree():
    from components.training.spec import PRECISIONS as SPEC_PRECISIONS

    assert PRECISIONS == SPEC_PRECISIONS


@pytest.mark.parametrize("arch,lora,method", [
    ("gpt2", True, "mixed"), ("gpt2", True, "hooks"), ("gpt2", True, "ghost"),
    ("gpt2", False, "mixed"), ("gpt2", False, "hooks"), ("gpt2", False, "ghost"), ("gpt2", False, "vmap"),
    ("llama", True, "mixed"), ("llama", False, "mixed"), ("llama", False, "ghost"),
])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16bit_update_matches_fp32(arch, lora, method, precision):
    """(a), (c): the clipped sum alone (σ = 0) and the clipped-and-noised update (σ = 1, the same seeded
    noise) of a 16-bit base equal the fp32 run's within 16-bit rounding of the model's forward/backward
    (bf16 keeps 8 mantissa bits, ~0.4 %; fp16 11). The trainable weights and the update are float32."""
    tol = {"bf16": 2e-2, "fp16": 4e-3}[precision]
    ref, ref_step = _update(arch, "fp32", lora, method, 0.0)
    got, step = _update(arch, precision, lora, method, 0.0)
    assert step.per_unit.method == method and step.per_unit.loss_scale == (FP16_LOSS_SCALE if precision == "fp16" else 1)
    assert all(v.dtype == torch.float32 for v in got.values())
    r, g = _flat(ref), _flat(got)
    assert float(r.norm()) > 0
    assert float((g - r).norm()) <= tol * float(r.norm())
    ref_n, _ = _update(arch, "fp32", lora, method, 1.0)
    got_n, _ = _update(arch, precision, lora, method, 1.0)
    assert float((_flat(got_n) - _flat(ref_n)).norm()) <= tol * float(r.norm())
    # the step did clip: some unit's norm is above C (a sum of unclipped gradients would also match)
    big, _ = _update(arch, "fp32", lora, method, 0.0, clip=1e3)
    assert float((_flat(big) - r).norm()) > 0.1 * float(r.norm())


@pytest.mark.parametrize("method", ["mixed", "hooks", "ghost", "vmap"])
@pytest.mark.parametrize("arch,lora", [("gpt2", False), ("llama", False), ("llama", True)])
def test_a_units_norm_is_never_computed_in_16_bits(monkeypatch, arch, lora, method):
    """(b): every per-unit squared norm is taken of a float32 tensor, and every ghost-norm Gram product
    (the only other way a norm is formed) is float32: float32 factors, or 16-bit factors multiplied by
    precision.bmm32 (exact products, float32 accumulation and result), on a bf16 base."""
    seen = {"rows": 0, "gram": 0}
    row_sq_norms, gram, bmm32 = grad_samplers.row_sq_norms, grad_samplers._gram, grad_samplers.bmm32

    def checked_rows(u):
        assert u.dtype == torch.float32, f"a unit's norm from a {u.dtype} tensor"
        seen["rows"] += 1
        return row_sq_norms(u)

    def checked_bmm32(a, b, **kw):
        out = bmm32(a, b, **kw)
        assert out.dtype == torch.float32, f"a per-record or Gram product in {out.dtype}"
        return out

    def checked_gram(x, y, x_onehot, y_onehot, dtype):
        assert dtype == torch.float32, f"a ghost-norm product in {dtype}"
        out = gram(x, y, x_onehot, y_onehot, dtype)
        assert out.dtype == torch.float32, f"a ghost-norm Gram matrix in {out.dtype}"
        seen["gram"] += 1
        return out

    monkeypatch.setattr(grad_samplers, "row_sq_norms", checked_rows)
    monkeypatch.setattr(per_sample, "row_sq_norms", checked_rows)
    monkeypatch.setattr(grad_samplers, "_gram", checked_gram)
    monkeypatch.setattr(grad_samplers, "bmm32", checked_bmm32)
    _update(arch, "bf16", lora, method, 1.0)
    assert seen["rows"] > 0 or seen["gram"] > 0
    if method == "ghost":
        assert seen["gram"] > 0          # the ghost path was checked, not skipped


def test_fp16_loss_scale_is_undone_before_clipping():
    """(c): with the loss scaled by 1024 and the per-record gradients not unscaled, every unit would be
    clipped to C from a 1024× larger norm and the sum would be off: the fp16 run equals fp32 instead, on a
    step where no unit is clipped (C large), so the unclipped sum shows any leftover scale directly."""
    ref, _ = _update("gpt2", "fp32", False, "mixed", 0.0, clip=1e3)
    got, step = _update("gpt2", "fp16", False, "mixed", 0.0, clip=1e3)
    assert step.loss_scale == FP16_LOSS_SCALE
    assert float((_flat(got) - _flat(ref)).norm()) <= 4e-3 * float(_flat(ref).norm())


def test_16bit_weights_without_a_float32_master_are_refused():
    m = _gpt2().to(torch.bfloat16)
    with pytest.raises(VeilError, match="float32 master"):
        DPStep(m, torch.optim.SGD(m.parameters(), lr=1.0), private=True, clip_norm=1.0, noise_multiplier=1.0,
               expected_batch_size=4.0, micro_batch_size=4, private_seed=0)


def test_llama_bf16_lora_has_float32_adapters_on_a_bf16_base():
    from components.dpsgd.model_prep import prepare_model
    from components.training.spec import TrainSpec

    spec = TrainSpec(mechanism="record", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                     lora={"r": 2}, precision="bf16")
    m = prepare_model(_llama().to(torch.bfloat16), spec)
    train = {p.dtype for p in m.parameters() if p.requires_grad}
    frozen = {p.dtype for p in m.parameters() if not p.requires_grad}
    assert train == {torch.float32} and frozen == {torch.bfloat16}


def _spec(**kw):
    from components.training.spec import TrainSpec

    base = dict(mechanism="uls", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=0.5, steps=2,
                records_per_user=2, seq_len=16, micro_batch_size=8, private_seed=3, checkpoint_every=1,
                lora={"r": 2, "alpha": 4})
    base.update(kw)
    return TrainSpec(**base)


def test_a_checkpoint_of_another_precision_is_not_resumed(tiny_lm, tiny_tokenizer, tmp_path):
    """(d): precision is part of the spec's identity."""
    from components.training import train

    data = tiny_lm.make_texts(n_users=6)
    res = train(_spec(precision="bf16", steps=1), data, tiny_lm.make_model(), tiny_tokenizer, tmp_path, progress=False)
    assert res.precision.startswith("bf16 base") and "fp32 LoRA weights" in res.precision
    with pytest.raises(VeilError, match="different training spec"):
        train(_spec(precision="fp32", steps=1), data, tiny_lm.make_model(), tiny_tokenizer, tmp_path, progress=False)
    with pytest.raises(VeilError, match="precision"):
        _spec(precision="fp8")


def test_full_finetuning_bf16_resumes_from_float32_masters(tiny_lm, tiny_tokenizer, tmp_path):
    """Full fine-tuning in bf16: the checkpoint holds the float32 masters, so a run stopped after step 1
    and resumed ends where the uninterrupted run does, to the bit."""
    from components.training import train

    data = tiny_lm.make_texts(n_users=6)
    whole = tiny_lm.make_model()
    res = train(_spec(precision="bf16", lora=None), data, whole, tiny_tokenizer, tmp_path / "a", progress=False)
    assert "fp32 master weights" in res.precision and res.model_dir
    assert {p.dtype for p in whole.parameters()} == {torch.bfloat16}
    from components.training.checkpoint import load_checkpoint

    state = load_checkpoint(tmp_path / "a")
    assert {t.dtype for t in state["trainable"].values()} == {torch.float32}
    class Stop(Exception):
        pass

    def stop_after_first(done):
        if done == 1:
            raise Stop

    with pytest.raises(Stop):   # a crash after step 1's checkpoint
        train(_spec(precision="bf16", lora=None), data, tiny_lm.make_model(), tiny_tokenizer, tmp_path / "b",
              progress=False, on_step=stop_after_first)
    resumed = tiny_lm.make_model()
    train(_spec(precision="bf16", lora=None), data, resumed, tiny_tokenizer, tmp_path / "b", progress=False)
    for (n, a), (_, b) in zip(whole.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), n


def _load(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_epsilon_does_not_depend_on_precision(tiny_lm, tiny_tokenizer, tmp_path):
    """(e): policy → plan → train → certificate in fp32 and in bf16: the same ε; the certificate says
    which precision ran."""
    from components.certificate import build_certificate
    from components.planning import make_plan
    from components.draws.annex import load_annex
    from components.draws.annex import commitment
    from components.draws.data import training_records
    from components.policy import load_policy
    from components.training import TrainSpec, train

    sys.path.insert(0, str(ROOT / "tests" / "planning"))
    from _planning_fixtures import make_snapshot

    demo = (ROOT / "policies" / "demo.yaml").read_text()
    demo = (demo.replace(re.search(r"    steps: \d+", demo).group(0), "    steps: 3")
            .replace(re.search(r"expected_batch_size: \d+", demo).group(0), "expected_batch_size: 8"))
    demo = re.sub(r"    lora:.*\n", "    lora: {r: 2, alpha: 4.0}\n", demo)
    snap = make_snapshot(40, seed=3)
    certs = {}
    for precision in ("fp32", "bf16"):
        text = demo if precision == "fp32" else demo.replace("    lora:", f"    precision: {precision}\n    lora:", 1)
        pol = tmp_path / f"{precision}.yaml"
        pol.write_text(text)
        policy = load_policy(pol)
        assert policy.spec.training.precision == precision
        plan = make_plan(policy, snap, private_dir=tmp_path / f"private-{precision}").to_dict()
        assert plan["training"].get("precision", "fp32") == precision
        annex = load_annex(tmp_path / f"private-{precision}", plan)
        data = training_records(plan, annex, snap.records)
        spec = TrainSpec.from_plan(plan, private_seed=7, seq_len=16, micro_batch_size=8)
        assert spec.precision == precision
        result = train(spec, data, tiny_lm.make_model(), tiny_tokenizer, tmp_path / precision, progress=False).to_dict()
        result["train_records_commitment"] = commitment(annex["salt"], result["train_records_sha256"])
        certs[precision] = build_certificate(plan, result).to_dict()
    assert certs["fp32"]["epsilon"] == certs["bf16"]["epsilon"] and certs["fp32"]["epsilon"] > 0
    assert certs["fp32"]["delta"] == certs["bf16"]["delta"]
    assert certs["fp32"]["run"]["precision"] == "float32"
    assert certs["bf16"]["run"]["precision"] == ("bf16 base (fp32 per-unit norms, clipping, clipped sum and noise; "
                                                 "fp32 LoRA weights)")


@pytest.mark.parametrize("cmd", ["train", "run"])
def test_cli_refuses_an_unknown_precision_in_one_line(cmd, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.setenv("VEIL_HOME", str(tmp_path / "home"))
    plan, src, base = tmp_path / "plan.json", tmp_path / "src.jsonl", tmp_path / "base"
    for f in (plan, src):
        f.write_text("{}")
    base.mkdir()
    args = (["train", "--plan", str(plan), "--base-model", str(base)] if cmd == "train" else
            ["run", "--policy", str(ROOT / "policies" / "demo.yaml"), "--source", str(src), "--base-model", str(base),
             "--no-prefect"])
    res = CliRunner().invoke(app, args + ["--precision", "fp8"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--precision: 'fp8' is not one of fp32, bf16, fp16" in lines[0]
