"""A small registered release built in seconds: a tiny base LM, a tiny LoRA adapter saved the way
training saves it, a sealed plan (with audit thresholds) and a certificate from the real
certificate code. Only public registry calls are used, so the same builder runs on old code."""
from __future__ import annotations

from pathlib import Path

STEPS = 120


def build_base(out: Path, seed: int = 0) -> Path:
    from components.modeling import build_base_model

    texts = [f"the weekly report number {i} is ready for review by the team" for i in range(200)]
    return Path(build_base_model(texts, out, vocab_size=300, n_layer=1, n_embd=16, n_head=2, n_positions=32,
                                 steps=2, seq_len=16, batch_size=4, progress=False, seed=seed))


def build_adapter(base_dir: Path, out: Path) -> Path:
    """LoRA on the tiny base, B made non-zero (a trained adapter is), saved with `save_pretrained`
    exactly as `components.training.engine` does."""
    import torch

    from components.modeling import load_base
    from components.modeling.lora import attach_lora, lora_config

    model, _ = load_base(base_dir)
    peft_model = attach_lora(model, lora_config(r=2, alpha=4), seed=0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    peft_model.save_pretrained(str(out))
    return out


def plan_and_certificate(weights_dir=None, base_dir=None) -> tuple[dict, dict]:
    from components.certificate import build_certificate
    from components.planning.plan import seal

    plan = seal({
        "schema": "veil.plan/v1", "created_at": "2026-01-01T00:00:00+00:00", "mechanism": "uls",
        "privacy_unit": "user", "neighbouring": "add_remove_user", "target": {"epsilon": 8.0, "delta": 1e-5},
        "sampling_rate": 0.05, "noise_multiplier": 1.0, "steps": STEPS, "expected_batch_size": 10,
        "clip_norm": 1.0, "records_per_user": 2, "selection": "random", "training": {"lr": 0.01},
        "accounting": {}, "data": {"snapshot_commitment": "cd" * 32,
                                   "train_records_commitment": "ef" * 32},
        "audit": {"thresholds": {"max_user_inference_auroc": 0.6, "max_canary_auroc": 0.6,
                                                        "max_secret_exposure": 4.0}},
        "policy": {"name": "t", "sha256": "01" * 32}})
    import importlib.util

    spec = importlib.util.spec_from_file_location("bound_run", Path(__file__).resolve().parents[1] / "bound_run.py")
    bound_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bound_run)
    res = {**bound_run.binding(plan, weights_dir, base_dir), "steps_run": STEPS, "mechanism": "uls", "noise_multiplier": 1.0, "sampling_rate": 0.05, "clip_norm": 1.0}
    return plan, build_certificate(plan, res).to_dict()
