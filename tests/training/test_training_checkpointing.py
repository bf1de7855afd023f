"""Activation (gradient) checkpointing with per-unit clipping: the backward reruns each decoder
layer's forward, and with it the per-record samplers' forward hooks. Each layer use must still be
counted once, so the clipped-and-noised update with checkpointing equals the one without it, on
every per-record path, for a GPT-2 and a Llama config (random weights, no download). torch.func
(`vmap`) cannot run through torch's checkpoint: refused before any step."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from components.core.errors import VeilError
from components.training import TrainSpec, train
from components.dpsgd.model_prep import checkpointing_on, set_gradient_checkpointing
from components.dpsgd.per_sample import PerUnitGradients, Unit
from components.dpsgd.step import DPStep

warnings.filterwarnings("ignore", category=FutureWarning)
V = 64


def _model(kind: str, lora: bool, ckpt: bool):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":   # dropout on: the rerun must draw the same masks (checkpoint keeps the RNG state)
        m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=32,
                                       resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                       bos_token_id=0, eos_token_id=0))
        targets = ["c_attn", "c_proj"]
    else:
        m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                                         max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
                                         pad_token_id=0))
        targets = ["q_proj", "v_proj", "down_proj"]
    if lora:
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets))
        with torch.no_grad():   # B starts at zero in peft: give the LoRA path a nonzero gradient to A
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    else:
        for p in m.parameters():
            p.requires_grad_(True)
    set_gradient_checkpointing(m, ckpt)
    m.train()
    return m


IDS = np.random.RandomState(0).randint(1, V, (7, 16))
LENS = np.array([16, 10, 16, 5, 16, 12, 9])
# ULS-style units (several records, mean weight), single records, and a unit larger than the
# micro-batch (accumulated over micro-batches: the per-record path, not the book-kept one)
UNITS = [Unit(np.array([0, 1]), 0.5), Unit(np.array([2]), 1.0), Unit(np.array([3, 4, 5, 6]), 0.25)]


def _update(kind, lora, ckpt, method, mbs):
    m = _model(kind, lora, ckpt)
    named = [(n, p) for n, p in m.named_parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in named}
    opt = torch.optim.SGD([p for _, p in named], lr=1.0)
    step = DPStep(m, opt, private=True, clip_norm=0.05, noise_multiplier=0.7, expected_batch_size=3.0,
                  micro_batch_size=mbs, private_seed=1234, per_record=method)
    torch.manual_seed(5)    # dropout masks: the same stream in both runs
    try:
        step(0, UNITS, IDS, LENS)
    finally:
        step.close()
    return {n: before[n] - p.detach() for n, p in named}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("method", ["mixed", "hooks", "ghost"])
def test_update_with_checkpointing_equals_without(kind, lora, method):
    for mbs in (8, 3):    # 8: every group book-kept in one pass; 3: the 4-record unit is accumulated
        want = _update(kind, lora, False, method, mbs)
        got = _update(kind, lora, True, method, mbs)
        assert want.keys() == got.keys()
        assert max(float(want[n].abs().max()) for n in want) > 1e-3   # noise and a real update
        for n in want:
            torch.testing.assert_close(got[n], want[n], rtol=0, atol=1e-6, msg=f"{kind} {method} mbs={mbs}: {n}")


def test_checkpointing_really_reruns_the_layers():
    """The equality above is not vacuous: with checkpointing on, a block's layers run twice per step."""
    calls = {False: 0, True: 0}
    for ckpt in (False, True):
        m = _model("gpt2", True, ckpt)
        assert checkpointing_on(m) is ckpt
        lin = m.get_base_model().transformer.h[0].attn.c_attn.lora_A["default"]
        h = lin.register_forward_hook(lambda *_a, ckpt=ckpt: calls.__setitem__(ckpt, calls[ckpt] + 1))
        pu = PerUnitGradients(m, [n for n, p in m.named_parameters() if p.requires_grad], 8, "mixed")
        pu._checked = True    # count the step's own forward only (the self-check runs two more)
        pu.clipped_sum(UNITS[:2], IDS, LENS, 0.05, torch.device("cpu"))
        pu.close()
        h.remove()
    assert calls == {False: 1, True: 2}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["mixed", "hooks", "ghost"])
def test_a_huge_record_is_clipped_to_exactly_C_once(kind, method):
    """One record with a gradient 10⁴× its own: its clipped contribution is C · ∇ℓ/‖∇ℓ‖ with
    autograd's ∇ℓ (no sampler, no checkpointing) — a use counted twice would change the direction
    of a full-model gradient and the length of each layer's share."""
    C = 0.1
    ref = _model(kind, False, False)
    torch.manual_seed(5)
    ids = torch.as_tensor(IDS[2:3])
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    from components.dpsgd.per_sample import sequence_losses

    loss = sequence_losses(ref(input_ids=ids, position_ids=pos, use_cache=False).logits, ids, torch.as_tensor(LENS[2:3]))
    names = [n for n, p in ref.named_parameters() if p.requires_grad]
    g = torch.autograd.grad(loss.sum() * 1e4, [p for p in ref.parameters() if p.requires_grad])
    norm = torch.sqrt(sum(x.double().square().sum() for x in g))
    want = {n: (x.double() * (C / norm)).float() for n, x in zip(names, g)}

    m = _model(kind, False, True)
    pu = PerUnitGradients(m, names, 8, method)
    pu._checked = True     # same RNG stream as the reference forward (the self-check would draw from it)
    torch.manual_seed(5)
    got, _, _ = pu.clipped_sum([Unit(np.array([2]), 1e4)], IDS, LENS, C, torch.device("cpu"))
    pu.close()
    total = torch.sqrt(sum(got[n].double().square().sum() for n in names))
    assert abs(float(total) - C) <= 1e-6 * C
    for n in names:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-7, msg=n)


def test_vmap_is_refused_before_any_step():
    with pytest.raises(VeilError, match="gradient_checkpointing.*vmap"):
        TrainSpec(mechanism="record", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                  per_record="vmap", gradient_checkpointing=True)
    m = _model("gpt2", True, True)
    with pytest.raises(VeilError, match="cannot run through activation checkpointing"):
        PerUnitGradients(m, [n for n, p in m.named_parameters() if p.requires_grad], 8, "vmap")
    m = _model("gpt2", True, False)   # without checkpointing vmap runs (and HF's input-grad hook is not left on)
    PerUnitGradients(m, [n for n, p in m.named_parameters() if p.requires_grad], 8, "vmap").clipped_sum(
        UNITS[:1], IDS, LENS, 0.05, torch.device("cpu"))


def test_a_model_without_checkpointing_support_is_one_line():
    with pytest.raises(VeilError, match="does not support activation checkpointing"):
        set_gradient_checkpointing(torch.nn.Sequential(torch.nn.Linear(2, 2)), True)
    set_gradient_checkpointing(torch.nn.Sequential(torch.nn.Linear(2, 2)), False)   # off: nothing to do


def test_plan_setting_reaches_the_spec_and_not_the_resume_identity():
    plan = {"mechanism": "record", "sampling_rate": 0.5, "noise_multiplier": 1.0, "clip_norm": 1.0, "steps": 3,
            "training": {"seq_len": 32, "gradient_checkpointing": True}}
    on = TrainSpec.from_plan(plan)
    assert on.gradient_checkpointing is True
    plan["training"].pop("gradient_checkpointing")
    off = TrainSpec.from_plan(plan)
    assert off.gradient_checkpointing is False
    assert on.identity() == off.identity()
    with pytest.raises(VeilError, match="gradient_checkpointing: must be true or false"):
        TrainSpec.from_plan({**plan, "training": {"gradient_checkpointing": "yes"}})


def test_train_with_checkpointing_matches_and_resumes_across_the_switch(tiny_lm, tiny_tokenizer, tmp_path):
    """The engine end to end: the same weights with and without, the setting in the result, and a run
    started without it resumes with it on (not part of the spec's identity)."""
    data = tiny_lm.make_texts()
    kw = dict(mechanism="uls", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=0.5, steps=2, records_per_user=2,
              seq_len=32, micro_batch_size=4, lora={"r": 2, "alpha": 4}, private_seed=3, checkpoint_every=1)
    final = {}
    for ckpt in (False, True):
        model = tiny_lm.make_model()
        res = train(TrainSpec(**kw, gradient_checkpointing=ckpt), data, model, tiny_tokenizer, tmp_path / str(ckpt),
                    progress=False)
        assert res.extra["gradient_checkpointing"] is ckpt and checkpointing_on(model) is ckpt
        final[ckpt] = tiny_lm.trainable_state(model)
    for n in final[False]:
        torch.testing.assert_close(final[True][n], final[False][n], rtol=0, atol=1e-6)
    # one step without (the run stops after it), then resumed with it on: the same weights again
    class Stop(Exception):
        pass

    def stop(done):
        raise Stop

    with pytest.raises(Stop):
        train(TrainSpec(**kw), data, tiny_lm.make_model(), tiny_tokenizer, tmp_path / "r", progress=False, on_step=stop)
    model = tiny_lm.make_model()
    res = train(TrainSpec(**kw, gradient_checkpointing=True), data, model, tiny_tokenizer, tmp_path / "r", progress=False)
    assert res.resumed_from_step == 1
    resumed = tiny_lm.trainable_state(model)
    for n in final[False]:
        torch.testing.assert_close(resumed[n], final[False][n], rtol=0, atol=1e-6)


@pytest.mark.parametrize("flag,want", [("--gradient-checkpointing", True), ("--no-gradient-checkpointing", False),
                                       (None, None)])
def test_veil_train_flag_overrides_the_plan(veil_home, tmp_path, monkeypatch, flag, want):
    from typer.testing import CliRunner

    from flows import stages
    from flows.cli import app

    seen = {}
    plan_spec = TrainSpec(mechanism="record", sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0, steps=1,
                          gradient_checkpointing=True)

    def fake_train(settings, plan, base, adjust=None, **kw):
        seen["spec"] = adjust(plan_spec, None) if adjust is not None else None
        raise VeilError("stopped here")

    from flows.cli import core_cmds

    # not under test, and it binds logging to CliRunner's stream, which is closed after the call
    monkeypatch.setattr(core_cmds, "quiet_third_party", lambda: None)
    monkeypatch.setattr(stages, "base_model", lambda s, base_model_dir=None: str(base_model_dir))
    monkeypatch.setattr(stages, "train", fake_train)
    (tmp_path / "plan.json").write_text("{}")
    args = ["train", "--plan", str(tmp_path / "plan.json"), "--base-model", str(tmp_path)] + ([flag] if flag else [])
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "stopped here" in r.output, r.output
    if want is None:
        assert seen["spec"] is None           # the plan's own setting stands
    else:
        assert seen["spec"].gradient_checkpointing is want
        assert seen["spec"].identity() == plan_spec.identity()
