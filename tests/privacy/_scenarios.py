"""The scripted scenarios of the neighbour harness: an organization's life, run on D or on D − u.

`make(n_people)` returns (people, {name: scenario}); each scenario is `scenario(home, policies,
without)`: `home` a _neighbours.Home (fixed keys), `policies` a folder shared by the D and D − u runs (a
plan records its policy's path), `without` the person removed (None for D)."""
from __future__ import annotations

from pathlib import Path

from _neighbours import organization, policy, snapshot


EVAL_RETIRED_BUDGET = (7.0, 1e-4)
PMIXED_POLICY = """apiVersion: veil.dev/v1
kind: PredictionPolicy
metadata: {name: harness-pmixed, owner: tests}
spec:
  target: {epsilon: 4.0, delta: 1.0e-5}
  shards: 16
  subsample_rate: 0.5
  token_budget: 6
  lifetime_budget: {epsilon: 16.0, delta: 1.0e-4}
  training: {epochs: 1, learning_rate: 1.0e-2, seq_len: 32, batch_size: 4, lora: {r: 2, alpha: 8.0}, seed: 0}
"""


def make(n_people: int = 14, seed: int = 11):
    org = organization(n_people, seed=seed, weeks=3)
    owned = organization(n_people, seed=seed + 1, owners=True)
    people = sorted({r["user_id"] for r in org})

    def growing_data(home, policies: Path, without):
        """Weekly retraining over growing data: each week's snapshot holds every week so far."""
        pol = policy(policies, "weekly")
        for week in range(3):
            snap = snapshot(org, upto_week=week, without=without)
            home.release(home.plan(pol, snap), snap)

    def new_base(home, policies: Path, without):
        """Retraining with a new base model on an unchanged snapshot (another d: another plan)."""
        pol = policy(policies, "weekly")
        snap = snapshot(org, without=without)
        for d in (40_000, 90_000):
            home.release(home.plan(pol, snap, compute={"trainable_parameters": d}), snap)

    def two_lines(home, policies: Path, without):
        """Two release lines on one snapshot: the same data under two policies."""
        snap = snapshot(org, without=without)
        for name, steps in (("line-a", 6), ("line-b", 9)):
            home.release(home.plan(policy(policies, name, steps=steps), snap), snap)

    def retired_midway(home, policies: Path, without):
        """A lifetime budget two releases deep: people retire on the way, and are still counted."""
        pol = policy(policies, "tight", budget=(5.0, 1e-4))
        for week in range(3):
            snap = snapshot(org, upto_week=week, without=without)
            home.release(home.plan(pol, snap), snap)

    def secret_release(home, policies: Path, without):
        """A secret-protection release: N public under secret substitution, no person-level claim."""
        pol = policy(policies, "secret", base="code-team-secrets.yaml", budget=None, steps=6, batch=4)
        snap = snapshot(org, without=without)
        home.release(home.plan(pol, snap), snap)

    def multi_owner(home, policies: Path, without):
        """Records owned by every participant (els-owners: N public under the fixed-graph replace relation)."""
        pol = policy(policies, "owners", base="email-all-participants.yaml", budget=(6.0, 1e-6), batch=4)
        snap = snapshot(owned, without=without)
        home.release(home.plan(pol, snap), snap)

    def evaluation(home, policies: Path, without):
        """A release, then its DP evaluation (ledger mechanism 'evaluation'; eval_* metrics and evaluation.*
        tags through the registry's gate into the Home's own MLflow store), evaluated twice: the second
        time republishes the same release without a new charge."""
        # ε = 8: five evaluation people under ε = 1 clamp most metrics at their range's ends in both runs,
        # hiding the differences the check is about
        pol = policy(policies, "evaluated", edit=lambda s: s.__setitem__("evaluation", {"fraction": 0.3, "epsilon": 8.0}))
        snap = snapshot(org, without=without)
        plan = home.plan(pol, snap)
        home.release(plan, snap)
        home.evaluate(plan, snap)

    def private_selection(home, policies: Path, without):
        """`veil study --private-selection` over a two-point ε grid (training replaced, scoring on the real
        evaluation records): every point planned (a fresh N̂ each, charged), the selection theorem reserved,
        the `selection` document published."""
        pol = policy(policies, "selecting", edit=lambda s: s.__setitem__("evaluation", {"fraction": 0.3}))
        grid = policies / "grid.yaml"
        grid.write_text("name: psel\naxes: {mechanism: [uls], epsilon: [2, 4]}\n"
                        "private_selection: {eta: 0, gamma: 0.3, score_noise: 2.0}\n")
        home.select(pol, grid, snapshot(org, without=without))

    def pmixed_build(home, policies: Path, without):
        """`veil pmixed build` on the snapshot (16 shards, the build's ledger reservation, the certificate and
        manifest registered); shard training replaced by a stand-in of each shard's texts."""
        pol = policies / "pmixed.yaml"
        pol.write_text(PMIXED_POLICY)
        home.pmixed(pol, snapshot(org, without=without))

    def evaluation_retired(home, policies: Path, without):
        """Two release lines, each evaluated, under a budget the second evaluation overdraws for some of its
        evaluation people (those trained by the first line): the ledger's filter retires them at the
        evaluation, so they are candidates the release does not count."""
        def line(eps_eval: float, seed: int):
            def edit(s):
                s["evaluation"] = {"fraction": 0.3, "epsilon": eps_eval}
                s["training"]["seed"] = seed
            return edit

        snap = snapshot(org, without=without)
        for name, eps_eval, seed in (("eval-a", 0.5, 0), ("eval-b", 6.0, 4)):
            pol = policy(policies, name, budget=EVAL_RETIRED_BUDGET, edit=line(eps_eval, seed))
            plan = home.plan(pol, snap)
            home.release(plan, snap)
            home.evaluate(plan, snap)

    return people, {"evaluation": evaluation, "evaluation_retired": evaluation_retired, "pmixed_build": pmixed_build, "private_selection": private_selection, "growing_data": growing_data, "new_base": new_base, "two_lines": two_lines,
                    "retired_midway": retired_midway, "secret_release": secret_release, "multi_owner": multi_owner}
