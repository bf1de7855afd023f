"""The planner sizes the audit from public quantities (policy, N̂, certified ε), or says it cannot."""
import numpy as np

from components.audit.verdict import auroc_interval, auroc_verdict, exposure_verdict, z_value
from components.audit.sizing import size_audit, sweep_size
from components.policy.model import Audit


def test_candidates_are_sized_from_the_limit():
    assert size_audit(Audit(max_secret_exposure=6.0), people=1000, epsilon=8.0, delta=1e-6)["candidates_per_secret"] == 500
    assert size_audit(Audit(), people=1000, epsilon=8.0, delta=1e-6)["candidates_per_secret"] == 100
    assert size_audit(Audit(candidates_per_secret=37), people=1000, epsilon=8, delta=1e-6)["candidates_per_secret"] == 37


def test_user_inference_settles_at_a_large_population_and_the_verdict_agrees():
    a = Audit(holdout_users=0.25, attacker_samples_per_user=4)
    s = size_audit(a, people=2000, epsilon=8.0, delta=1e-6, secret_classes=1)
    assert s["user_inference"]["settles"] is True
    # what the verdict would do with a model that leaks nothing at those sizes
    n_in, n_out = 2000, int(2000 * 0.25 / 0.75)
    curves = [{"m": None, "auroc": 0.5, "users_in": n_in, "users_out": n_out}] * sweep_size(4)
    assert auroc_verdict(curves, threshold=0.65, ceiling=None)["verdict"] == "passed"


def test_a_small_organization_is_told_before_training():
    a = Audit(holdout_users=0.1, attacker_samples_per_user=2)
    s = size_audit(a, people=40, epsilon=8.0, delta=1e-6, secret_classes=1)
    ui = s["user_inference"]
    assert ui["settles"] is False and not s["can_pass"] and "not be promoted" in s["statement"]
    if ui["holdout_needed"] is not None:       # the suggested holdout does settle, by the verdict's own interval
        q = ui["holdout_needed"]
        total = 40 / 0.9
        z = z_value(0.95, sweep_size(2))
        assert auroc_interval(0.5, int(total * (1 - q)), int(total * q), z)[1] < 0.65
    tiny = size_audit(a, people=8, epsilon=8.0, delta=1e-6)
    assert tiny["user_inference"]["holdout_needed"] is None and "too small" in tiny["user_inference"]["why"]
    ok = size_audit(Audit(holdout_users=0.1, attacker_samples_per_user=2, require="not_failed"), people=8,
                    epsilon=8.0, delta=1e-6)
    assert "not failed" in ok["statement"]


def test_canaries_are_sized_against_the_certified_ceiling():
    few = size_audit(Audit(canaries={"users": 4, "records_per_user": 8}), people=2000, epsilon=1.0, delta=1e-6)
    c = few["canaries"]
    assert c["settles"] is False and c["users_needed"] > 4
    enough = size_audit(Audit(canaries={"users": c["users_needed"], "records_per_user": 8}), people=2000,
                        epsilon=1.0, delta=1e-6)
    assert enough["canaries"]["settles"] is True


def test_secret_classes_need_enough_secrets_and_the_verdict_agrees():
    s = size_audit(Audit(), people=2000, epsilon=8.0, delta=1e-6, secret_classes=2)
    need = s["secret_exposure"]["secrets_needed_per_class"]
    assert s["secret_exposure"]["settles"] is True and 10 <= need <= 100
    capped = size_audit(Audit(secrets_per_class=need - 1), people=2000, epsilon=8.0, delta=1e-6, secret_classes=2)
    assert capped["secret_exposure"]["settles"] is False
    # `need` clean secrets per class (exceedances at the chance rate, spread evenly) pass; half of them do not
    r = s["candidates_per_secret"]

    def rows(n, cls):
        ranks = np.linspace(1, r + 1, n).round().astype(int)
        return [{"secret_ref": f"{cls}{i}", "secret_class": cls, "rank": 1, "calibrated_rank": int(k),
                 "n_candidates": r} for i, k in enumerate(ranks)]
    assert exposure_verdict(rows(need, "a") + rows(need, "b"), limit=4.0)["verdict"] == "passed"
    assert exposure_verdict(rows(need // 2, "a") + rows(need // 2, "b"), limit=4.0)["verdict"] == "inconclusive"


def test_audited_people_sizing_says_which_auroc_still_passes():
    # issue 26: on the Debian changelogs the plan's public sizing (N̂ ≈ 300 in) said "can settle", but only
    # 181 in and 48 out had the m + 1 distinct texts an audited person needs, and the model at ε=4 measured
    # AUROC 0.59: the operator's line says which AUROC still passes at the audited counts
    from components.audit.sizing import audited_sizing

    a = Audit(holdout_users=0.2, attacker_samples_per_user=2, max_user_inference_auroc=0.65)
    got = audited_sizing(a, {"n_held_out_users": 48, "n_audit_eligible_users": 229})
    assert (got["people_in"], got["people_out"], got["settles"]) == (181, 48, True)
    z = z_value(0.95, sweep_size(2))
    top = got["passes_below_auroc"]
    assert auroc_interval(top - 0.002, 181, 48, z)[1] < 0.65 <= auroc_interval(top + 0.002, 181, 48, z)[1]
    assert 0.5 < top < 0.59                    # the measured 0.59 could not pass: inconclusive, as observed
    small = audited_sizing(a, {"n_held_out_users": 5, "n_audit_eligible_users": 25})
    assert small["settles"] is False and small["people_needed"]["in"] > 20 and "reaching 0.65" in small["why"]
    assert audited_sizing(a, {"n_held_out_users": 0, "n_audit_eligible_users": 25}) is None
