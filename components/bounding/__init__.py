"""Who is a person and how much each may contribute (imports core and accounting).

- `people`: a policy's `spec.people` (exclusions, identity rule, aliases, owners) applied to a snapshot;
- `owners`: multi-owner contribution bounding (every participant's share of a record);
- `secret_lp`, `secret_plan`: the per-secret LP weights and the sampling rates they give records
  (`_lp_worker` runs the LP in a child process so a time limit can stop it).
Mechanisms (floor 4) and the planner import these at module top.
"""
