"""Keyed draws and the plan's private annex (imports core and bounding's owners).

Everything a plan decides person by person with its secret key lives here, so that each decision
about one person depends on that person alone (their id under the key) and never on who else is in
the data:
- `annex`: the plan key, the PRF (`prf`, `prf_uniform`, `prf_seed`), keyed Laplace noise, the
  population digest, and the private annex files sealed to the plan;
- `audit_split`: held-out people and canary slots for the audit; `eval_split`: evaluation people;
- `selection`: which of a person's records a release trains on; `gradient_diversity`: the keyed
  sample `mechanism: auto` estimates f(G) on;
- `data`: a plan's rows read back from its annex, hashes checked.
Mechanisms (floor 4) and the stages above import these at module top.
"""
