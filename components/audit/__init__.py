"""Privacy audit: what an attacker actually gets from a trained model, next to what the certificate promises.

- `ceiling`: the AUROC / TPR any test can reach against an (ε, δ)-DP mechanism.
- `metrics`: ROC, AUROC (Mann–Whitney), TPR at low FPR, bootstrap over users, empirical ε lower bound.
- `scoring`: token-summed sequence log-likelihoods (and continuations) under a causal LM.
- `user_inference`: the seed-003 user inference statistic and its report against the ceiling.
- `canaries`: synthetic canary users (seed 003 App. D.2) to inject at plan time.
- `exposure`: secret exposure against random candidates of the secret's shape.
- `verdict`: passed / failed / inconclusive from intervals (AUROC at every m, exposure), people needed.
- `public`: what may be published (verdicts, quantized class-level aggregates); `inputs`: the one
  reader of the plan's membership reservations (held-out and canary users, attacker files).
- `report`: private report, plots, keys; `run`: `run_audit`, the whole audit of one model.
- `echo`: the canary echo audit of a synthetic corpus (echo canaries against the corpus alone).

The package re-exports nothing: import from the module that owns a name. `veil verify` and the
registry read only `public` (light); re-exporting `metrics` here made them load scipy.stats (~1.5 s).
"""
