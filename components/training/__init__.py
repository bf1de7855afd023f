"""The training stage: a plan's DP training run on an HF causal LM.

    spec = TrainSpec.from_plan(plan)
    result = train(spec, data, model, tokenizer, out_dir)   # data: user_id, text[, rate]

`engine` asks the plan's mechanism for its step (components.mechanisms) and drives it; `spec` is the
run's identity; `checkpoint` and `sharding` (FSDP2) serve the engine. The steps themselves —
sampling, per-sample clipping, noise, precision — live in `components.dpsgd`.
"""
from components.training.engine import train
from components.training.spec import MECHANISMS, TrainResult, TrainSpec

__all__ = ["MECHANISMS", "TrainResult", "TrainSpec", "train"]
