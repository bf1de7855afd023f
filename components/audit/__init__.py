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
"""
from components.audit.canaries import make_canary_users
from components.audit.ceiling import (auroc_ceiling, auroc_ceiling_from_pld, auroc_ceiling_from_profile,
                                      tpr_ceiling, tradeoff)
from components.audit.exposure import SecretProbe, exposure_summary, probes_from_spans, probes_from_truth, \
    secret_exposure, shape_of
from components.audit.metrics import (FPR_TARGETS, auroc, bootstrap_metrics, empirical_epsilon_lower_bound,
                                      roc_curve, tpr_at_fpr)
from components.audit.inputs import AuditReservations, audit_reservations
from components.audit.run import AuditResult, resolve_thresholds, run_audit, user_level_guarantee
from components.audit.verdict import FAILED, INCONCLUSIVE, PASSED, auroc_interval, auroc_verdict
from components.audit.user_inference import score_users, user_inference_report

__all__ = [
    "auroc_ceiling", "auroc_ceiling_from_pld", "auroc_ceiling_from_profile", "tpr_ceiling", "tradeoff",
    "FPR_TARGETS", "auroc", "bootstrap_metrics", "empirical_epsilon_lower_bound", "roc_curve", "tpr_at_fpr",
    "score_users", "user_inference_report", "make_canary_users", "SecretProbe", "exposure_summary",
    "probes_from_spans", "probes_from_truth", "secret_exposure", "shape_of", "AuditResult", "resolve_thresholds",
    "run_audit", "user_level_guarantee", "AuditReservations", "audit_reservations", "PASSED", "FAILED",
    "INCONCLUSIVE", "auroc_interval", "auroc_verdict",
]
