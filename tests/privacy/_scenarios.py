"""The scripted scenarios of the neighbour harness: an organization's life, run on D or on D − u.

Each is `scenario(home, policies, without)`: `home` a harness.Home (fixed keys), `policies` a folder
shared by the D and D − u runs (a plan records its policy's path), `without` the person removed."""
from __future__ import annotations

from pathlib import Path

from _neighbours import organization, policy, snapshot

N_PEOPLE = 14
ORG = organization(N_PEOPLE, seed=11, weeks=3)
OWNED = organization(N_PEOPLE, seed=12, owners=True)
PEOPLE = sorted({r["user_id"] for r in ORG})


def growing_data(home, policies: Path, without):
    """Weekly retraining over growing data: each week's snapshot holds every week so far."""
    pol = policy(policies, "weekly")
    for week in range(3):
        snap = snapshot(ORG, upto_week=week, without=without)
        home.release(home.plan(pol, snap), snap)


def new_base(home, policies: Path, without):
    """Retraining with a new base model on an unchanged snapshot (another d: another plan)."""
    pol = policy(policies, "weekly")
    snap = snapshot(ORG, without=without)
    for d in (40_000, 90_000):
        home.release(home.plan(pol, snap, compute={"trainable_parameters": d}), snap)


def two_lines(home, policies: Path, without):
    """Two release lines on one snapshot: the same data under two policies."""
    snap = snapshot(ORG, without=without)
    for name, steps in (("line-a", 6), ("line-b", 9)):
        home.release(home.plan(policy(policies, name, steps=steps), snap), snap)


def retired_midway(home, policies: Path, without):
    """A lifetime budget two releases deep: people retire on the way, and are still counted."""
    pol = policy(policies, "tight", budget=(13.0, 1e-4))
    for week in range(3):
        snap = snapshot(ORG, upto_week=week, without=without)
        home.release(home.plan(pol, snap), snap)


def secret_release(home, policies: Path, without):
    """A secret-protection release: N public under secret substitution, no person-level claim."""
    def edit(spec):
        spec["privacy_unit"], spec["mechanism"] = "secret", "secret"
        spec.pop("lifetime_budget", None)
    pol = policy(policies, "secret", base="code-team-secrets.yaml", budget=None, steps=6, batch=4)
    del edit
    snap = snapshot(ORG, without=without)
    home.release(home.plan(pol, snap), snap)


def multi_owner(home, policies: Path, without):
    """Records owned by every participant (els-owners: N public under the fixed-graph replace relation)."""
    pol = policy(policies, "owners", base="email-all-participants.yaml", budget=(6.0, 1e-6), batch=4)
    snap = snapshot(OWNED, without=without)
    home.release(home.plan(pol, snap), snap)


SCENARIOS = {"growing_data": growing_data, "new_base": new_base, "two_lines": two_lines,
             "retired_midway": retired_midway, "secret_release": secret_release, "multi_owner": multi_owner}
