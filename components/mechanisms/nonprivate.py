"""Non-private fine-tuning (a study's reference point): Poisson records, no clipping, no noise.

Training only: no policy can name it and nothing it trains can be certified or charged."""
from __future__ import annotations

from components.mechanisms.base import Mechanism, PlainStep, register


class NonPrivate(Mechanism):
    name = "nonprivate"
    description = "ordinary fine-tuning (no clipping, no noise): a reference, never a release"
    privacy_unit = "record"
    neighbouring = "none"
    plannable = False
    clipped = False
    certifiable = False
    per_user_clip = True     # random-chunk runs as a plain data choice

    def check_spec(self, spec, bad) -> None:
        if not (0.0 < float(spec.sampling_rate) <= 1.0):
            bad("sampling_rate", f"must be in (0, 1], got {spec.sampling_rate}")
        if spec.filter is not None:
            bad("filter", f"only a filtered mechanism takes a filter, not {self.name}")

    def step_divisor(self, spec, rates):
        return float(rates.sum())

    def make_step(self, spec, model, optimizer, *, n_units: int, private_seed: int, dctx, expected: float):
        from components.dpsgd.step import DPStep  # startup

        return PlainStep(DPStep(model, optimizer, private=False, clip_norm=float(spec.clip_norm),
                                noise_multiplier=float(spec.noise_multiplier), expected_batch_size=expected,
                                micro_batch_size=spec.micro_batch_size, private_seed=private_seed, dctx=dctx,
                                per_record=spec.per_record))


register(NonPrivate)
