"""A model trained in bf16 is evaluated and audited on the float32 base: `load_finetuned` (what the
registry's pyfunc, evaluation and the audit load through) reads a bf16 run's LoRA adapter onto the
float32 base, and a bf16 full fine-tune's directory, as float32 models holding exactly the trained
weights."""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

from components.modeling.base import load_finetuned
from components.training import TrainSpec, train

warnings.filterwarnings("ignore")
_spec = importlib.util.spec_from_file_location("tiny_lm_training", Path(__file__).resolve().parent / "tiny_lm_training.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


@pytest.mark.parametrize("lora", [{"r": 4, "alpha": 8, "dropout": 0.0}, None])
def test_bf16_trained_weights_load_on_the_float32_base(tmp_path, lora):
    tok = tiny.make_tokenizer()
    base_dir = tmp_path / "base"
    tiny.make_model().save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    model = tiny.make_model()
    spec = TrainSpec(mechanism="record", sampling_rate=1.0, noise_multiplier=0.7, clip_norm=0.05, steps=1, lora=lora,
                     learning_rate=0.5, optimizer="sgd", seq_len=24, micro_batch_size=8, private_seed=3,
                     precision="bf16")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = train(spec, tiny.make_texts(n_users=4, per_user=(1, 2)), model, tok, tmp_path / "run", progress=False)
    finally:
        torch.set_num_threads(n)
    trained = {k: p.detach() for k, p in model.named_parameters()}
    loaded, _ = load_finetuned(base_dir, adapter_dir=res.adapter_dir, model_dir=res.model_dir)
    # peft names the loaded adapter's weights under base_model.model. (train injects them in place)
    got = {k.removeprefix("base_model.model."): p for k, p in loaded.named_parameters()}
    assert all(p.dtype == torch.float32 for p in got.values())
    checked = 0
    for k, want in trained.items():
        if lora is not None and "lora_" not in k:
            continue
        # the trained values exactly (a LoRA adapter trains in float32; a full fine-tune is saved in bf16)
        assert torch.equal(got[k], want.float()), k
        checked += 1
    assert checked > 0
    changed = [k for k in trained if (lora is None or "lora_B" in k)]
    assert any(not torch.equal(got[k], torch.zeros_like(got[k])) for k in changed)   # training moved them
    ids = torch.as_tensor([tok("alpha bravo charlie from user1")["input_ids"]])
    with torch.no_grad():
        logits = loaded(input_ids=ids).logits
        ref = model(input_ids=ids).logits.float()
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    # the same model up to the base's bf16 rounding
    torch.testing.assert_close(logits, ref, rtol=0.05, atol=0.05)
