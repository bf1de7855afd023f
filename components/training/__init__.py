"""DP training engine: ULS, ELS, group, record and secret-protection DP-SGD on HF causal LMs.

    spec = TrainSpec.from_plan(plan)
    result = train(spec, data, model, tokenizer, out_dir)   # data: user_id, text[, rate]
"""
from components.training.engine import train
from components.training.spec import MECHANISMS, TrainResult, TrainSpec

__all__ = ["MECHANISMS", "TrainResult", "TrainSpec", "train"]
