"""Privacy audit: what an attacker actually gets from a trained model, next to what the certificate promises.

- `ceiling`: the AUROC / TPR any test can reach against an (ε, δ)-DP mechanism.
- `metrics`: ROC, AUROC (Mann–Whitney), TPR at low FPR, bootstrap over users.
- `user_inference`: the seed-003 user inference statistic on a model and its reference.
"""
from components.audit.ceiling import (auroc_ceiling, auroc_ceiling_from_pld, auroc_ceiling_from_profile,
                                      tpr_ceiling, tradeoff)
from components.audit.metrics import (FPR_TARGETS, auroc, bootstrap_metrics, empirical_epsilon_lower_bound,
                                      roc_curve, tpr_at_fpr)
from components.audit.user_inference import score_users, user_inference_report

__all__ = [
    "auroc_ceiling", "auroc_ceiling_from_pld", "auroc_ceiling_from_profile", "tpr_ceiling", "tradeoff",
    "FPR_TARGETS", "auroc", "bootstrap_metrics", "empirical_epsilon_lower_bound", "roc_curve", "tpr_at_fpr",
    "score_users", "user_inference_report",
]
