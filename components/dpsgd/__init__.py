"""DP-SGD steps and their parts (imports core, accounting and modeling; torch at module top).

Batch selection, clipping and noise kept apart:
- `sampling` (Poisson draws of units), `batches`, `data` (rows → per-record rates);
- `per_sample`, `grad_samplers` (per-layer per-sample gradient norms and clipped sums, registered by
  layer type), `precision` (16-bit bases with float32 norms, clipping and noise), `model_prep`;
- `step` (one clipped, noised step: `DPStep`), `filtered` (the individual-filter step),
  `distributed` (ranks share one noise draw).
The mechanisms build their steps from these (`Mechanism.make_step`); `components.training.engine`
drives them. Importing a module here loads torch, so the mechanisms import them where a step is made.
"""
