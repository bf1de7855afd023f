"""Policy + snapshot → plan (see docs/ARCHITECTURE.md, "plan").

    plan = make_plan(load_policy("policies/demo.yaml"), snapshot, private_dir=settings.private_dir)
    path = save_plan(plan, settings.plans_dir)          # the public part
    annex = load_annex(settings.private_dir, plan)      # the private part, checked against the plan
    training_records(plan.to_dict(), annex, snapshot.records)
"""
from components.draws.annex import load_annex, save_annex, verify_annex
from components.draws.audit_split import AuditSplit, split_for_audit
from components.draws.data import evaluation_records, plan_texts, training_records
from components.planning.make import Compute, make_plan
from components.planning.plan import SCHEMA, Plan, load_plan, save_plan
from components.bounding.secret_lp import LPResult, sampling_rates, solve_secret_lp
from components.draws.selection import STRATEGIES, select_records

__all__ = [
    "load_annex",
    "save_annex",
    "verify_annex",
    "SCHEMA",
    "AuditSplit",
    "Compute",
    "LPResult",
    "Plan",
    "STRATEGIES",
    "load_plan",
    "make_plan",
    "sampling_rates",
    "save_plan",
    "select_records",
    "solve_secret_lp",
    "split_for_audit",
    "plan_texts",
    "training_records",
    "evaluation_records",
]
