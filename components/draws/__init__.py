"""Keyed draws and the plan's private annex (imports core and bounding's owners).

Everything a plan decides person by person with its secret key lives here, so that each decision
about one person depends on that person alone (their id under the key) and never on who else is in
the data:
- `annex`: the plan key, the PRF (`prf`, `prf_uniform`, `prf_seed`), keyed Laplace noise, the
  population digest, and the private annex files sealed to the plan;
- `audit_split`: held-out people and canary slots for the audit; `eval_split`: evaluation people;
- `selection`: which of a person's records a release trains on; `gradient_diversity`: the keyed
  sample `mechanism: auto` estimates f(G) on;
- `data`: a plan's rows read back from its annex, hashes checked;
- `columns`, `streams`: the machinery that lets the splits and the selection run over Arrow/numpy
  columns at 10⁶–10⁷ people (issue 27) — people and their distinct texts as integer codes, the PRF
  one HMAC per distinct person (`annex.prf_*_column`), and each person's own numpy Generator replayed
  vectorised. Still one decision per person from that person's id under the key alone; the outputs
  are bit for bit the per-person code's (tests/planning/test_planning_columns.py).
Mechanisms (floor 4) and the stages above import these at module top.
"""
