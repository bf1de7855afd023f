"""Policy + snapshot → plan: the stage that asks each mechanism to bound and calibrate.

    plan = make_plan(load_policy("policies/demo.yaml"), snapshot, private_dir=settings.private_dir)
    path = save_plan(plan, settings.plans_dir)          # the public part
    annex = load_annex(settings.private_dir, plan)      # the private part (components.draws.annex)

`make` dispatches through the mechanism registry; `plan` is the public document; `forecast` is what
the plan's certificate and ledger will say. The primitives a plan is made of live below the
mechanisms: keyed draws, splits and the annex in `components.draws`, contribution bounds, people and
the secret LP in `components.bounding`.
"""
from components.planning.make import Compute, make_plan
from components.planning.plan import SCHEMA, Plan, load_plan, save_plan

__all__ = ["SCHEMA", "Compute", "Plan", "load_plan", "make_plan", "save_plan"]
