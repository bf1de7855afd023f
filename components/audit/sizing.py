"""Sizing the audit from public quantities, at plan time (the planner calls `size_audit`).

The audit decides only when its intervals clear the policy's limits, and how narrow they get depends on
how many people, canaries and secrets it has. The planner knows three public quantities before
training: the policy, N̂ (the DP estimate of the people trained on) and the certified ε at the plan's
σ. From them it sizes what the policy leaves to it (candidates per secret) and says, in the plan and on
`veil plan`, whether each gate can pass at this size and what it would need — so "inconclusive, rerun
with more" is known before a release is spent, and the governance team can choose `require:
not_failed` for an organization too small for a passing audit.

Design point: a model that leaks nothing (AUROC 0.5; exceedances at the chance rate). That is the
best case for passing, so "cannot pass" is a firm statement; "can pass" means "would, if the model
leaks nothing measurable".
"""
from __future__ import annotations

from components.audit.ceiling import auroc_ceiling
from components.audit.verdict import (CONFIDENCE, auroc_interval, candidates_for_limit, people_needed,
                                      round_up_ladder, secrets_to_pass, z_value)

HOLDOUT_LADDER = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)


def sweep_size(m: int) -> int:
    """How many AUROC curves the user-inference verdict is simultaneous over (components.audit.run's
    m-sweep: 1, 2, 4, 8, 16 below m, and m)."""
    return len([x for x in (1, 2, 4, 8, 16) if x < m]) + 1


def _ui_settles(n_in: float, n_out: float, bound: float, z: float) -> bool:

    if n_in < 1 or n_out < 1:
        return False
    return auroc_interval(0.5, max(1, int(n_in)), max(1, int(n_out)), z)[1] < bound


def size_audit(audit, *, people: float | None, epsilon: float | None, delta: float | None,
               secret_classes: int = 0) -> dict:
    """The plan's `audit.sizing` section. `audit`: the policy's spec.audit; `people`: the public count of
    people trained on (N̂, or N where the release's relation makes it public; None when unknown);
    `epsilon`, `delta`: the plan's certified (ε, δ) when user-level, else None; `secret_classes`: the
    policy's tagged classes (0: unknown, taken as 1). Public values and N̂'s post-processings only."""

    limit = float(audit.max_secret_exposure)
    r = candidates_for_limit(limit) if audit.candidates_per_secret == "auto" else int(audit.candidates_per_secret)
    out: dict = {"require": audit.require, "confidence": CONFIDENCE, "design_point": (
        "a model that leaks nothing measurable (AUROC 0.5, exceedances at the chance rate): the best case for "
        "passing, so a gate that cannot pass here cannot pass at all"),
        "candidates_per_secret": r,
        "candidates_source": "policy" if audit.candidates_per_secret != "auto" else
        f"auto: first of 10, 20, 50, … with R + 1 >= 2^(max_secret_exposure + 2) = 2^{limit + 2:g}",
        "secrets_per_class": int(audit.secrets_per_class), "max_exposed_fraction": float(audit.max_exposed_fraction)}
    cannot: list[str] = []

    # --- user inference: members ≈ the people trained on, non-members ≈ N̂·p/(1 − p) -----------------------
    p, m = float(audit.holdout_users), int(audit.attacker_samples_per_user)
    bound = float(audit.max_user_inference_auroc)
    z = z_value(CONFIDENCE, sweep_size(m))
    ui: dict = {"bound": bound, "simultaneous_over": sweep_size(m)}
    if people is None:
        ui.update(settles=None, why="the number of people trained on is not public for this plan")
    elif p <= 0:
        ui.update(settles=False, why="audit.holdout_users is 0: nobody is held out, so user inference cannot run")
        cannot.append("user inference: nobody is held out (audit.holdout_users: 0)")
    else:
        n_in, n_out = float(people), float(people) * p / (1 - p)
        ui.update(expected_in=round_up_ladder(max(1, int(n_in))), expected_out=round_up_ladder(max(1, int(n_out))))
        if _ui_settles(n_in, n_out, bound, z):
            ui.update(settles=True, why=f"at about {int(n_in)} in and {int(n_out)} out a model at AUROC 0.5 shows an "
                                        f"interval below the policy's {bound:g} (if every person has the {m + 1} "
                                        "distinct texts an audited person needs; `veil plan` shows administrators "
                                        "how many do)")
        else:
            total = n_in / (1 - p)
            better = next((q for q in HOLDOUT_LADDER if q > p and _ui_settles(total * (1 - q), total * q, bound, z)),
                          None)
            need = people_needed(0.5, max(1, int(n_in)), max(1, int(n_out)), z, bound - 0.5)
            ui.update(settles=False, holdout_needed=better,
                      people_needed={k: round_up_ladder(v) for k, v in need.items()} if need else None)
            if better is not None:
                ui["why"] = (f"at about {int(n_in)} in and {int(n_out)} out even a model at AUROC 0.5 has an interval "
                             f"reaching the policy's {bound:g}; audit.holdout_users: {better:g} would settle it")
            else:
                ui["why"] = (f"at about {int(total)} people no holdout up to 0.5 narrows the interval below the "
                             f"policy's {bound:g}: too small for a passing user-inference audit")
            cannot.append(f"user inference: {ui['why']}")
    out["user_inference"] = ui

    # --- canaries: exactly the synthetic users the policy asks for, half trained, against the ceiling -----
    cu = int(audit.canaries.users)
    if cu:
        ceiling = auroc_ceiling(epsilon, delta) if epsilon is not None and delta is not None else None
        cz = z_value(CONFIDENCE, 1)
        can: dict = {"users": cu, "bound": ceiling}
        if ceiling is None:
            can.update(settles=None, why="no user-level ε: canaries have no ceiling to be compared with")
        elif _ui_settles(cu / 2, cu / 2, ceiling, cz):
            can.update(settles=True, why=f"{cu} canaries (about half trained) settle against the ceiling {ceiling:.3f} "
                                          "of the certified ε")
        else:
            need = people_needed(0.5, max(1, cu // 2), max(1, cu // 2), cz, ceiling - 0.5)
            can.update(settles=False, users_needed=round_up_ladder(2 * max(need.values())) if need else None)
            can["why"] = (f"{cu} canaries cannot settle against the ceiling {ceiling:.3f}: audit.canaries.users: "
                          f"{can['users_needed'] or 'more than 1000000'} would")
            cannot.append(f"canaries: {can['why']}")
        out["canaries"] = can

    # --- secret exposure: a class passes only with enough secrets --------------------------------------------
    k = max(1, int(secret_classes))
    need_s = secrets_to_pass(limit, float(audit.max_exposed_fraction), r, (1 - CONFIDENCE) / (2 * k))
    se = {"candidates_per_secret": r, "secrets_needed_per_class": need_s, "classes_assumed": k}
    if not secret_classes:
        se.update(settles=None, why=f"the policy tags no secret classes; secrets found anyway are audited with {r} "
                                    f"candidates each, and a class needs about {need_s} of them to pass")
    elif need_s is None or need_s > int(audit.secrets_per_class):
        se.update(settles=False, why=f"a class needs about {need_s or 'more than 1000000'} audited secrets to pass at "
                                      f"max_exposed_fraction {float(audit.max_exposed_fraction):g}, and "
                                      f"audit.secrets_per_class caps it at {int(audit.secrets_per_class)}")
        cannot.append(f"secret exposure: {se['why']}")
    else:
        se.update(settles=True, why=f"a class with at least {need_s} secrets can pass (fewer: at best not failed)")
    out["secret_exposure"] = se
    out["can_pass"] = not cannot
    out["cannot_pass"] = cannot
    if cannot and audit.require == "passed":
        out["statement"] = ("this audit cannot pass at this size, and the policy requires 'passed': the release will "
                            "not be promoted. Fix the policy as said, or set audit.require: not_failed")
    elif cannot:
        out["statement"] = "this audit cannot pass at this size; the policy promotes on 'not failed'"
    else:
        out["statement"] = f"the audit can settle at this size; the gate requires '{audit.require}'"
    return out


def audited_sizing(audit, counts: dict) -> dict | None:
    """PRIVATE (exact counts: the operator's terminal only, `veil plan`): user inference with the people
    the plan's split actually audits. The public sizing above can only assume that every person trained
    on is audited (N̂ in); only people with m + 1 distinct texts are (issue 26: 181 in and 48 out on the
    Debian changelogs, not the ~300 and ~75 N̂ implied). `counts`: the annex's counts. Says whether a
    model at AUROC 0.5 settles, and the largest AUROC a model may show and still pass (the interval's
    upper end below the policy's bound). None for record units or when nobody is held out."""
    out = counts.get("n_held_out_users")
    eligible = counts.get("n_audit_eligible_users")
    if not out or eligible is None or float(audit.holdout_users) <= 0:
        return None
    n_in, n_out = max(0, int(eligible) - int(out)), int(out)
    m, bound = int(audit.attacker_samples_per_user), float(audit.max_user_inference_auroc)
    z = z_value(CONFIDENCE, sweep_size(m))
    doc = {"people_in": n_in, "people_out": n_out, "min_texts": m + 1, "bound": bound, "require": audit.require}
    if n_in < 1:
        return {**doc, "settles": False, "passes_below_auroc": None, "people_needed": None,
                "why": "nobody trained on is audited"}
    settles = _ui_settles(n_in, n_out, bound, z)
    lo, hi = 0.5, bound          # the largest AUROC whose interval still ends below the bound (bisection)
    if not settles:
        hi = 0.5
    else:
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if auroc_interval(mid, n_in, n_out, z)[1] < bound else (lo, mid)
    need = None if settles else people_needed(0.5, n_in, n_out, z, bound - 0.5)
    return {**doc, "settles": settles, "passes_below_auroc": round(lo, 3) if settles else None,
            "people_needed": need,
            "why": (f"{n_in} in and {n_out} out are audited (people with {m + 1}+ distinct texts): a model passes "
                    f"only if its attack AUROC is below about {lo:.3f} (the interval must end below {bound:g})")
            if settles else
            (f"{n_in} in and {n_out} out are audited (people with {m + 1}+ distinct texts): even a model at AUROC "
             f"0.5 has an interval reaching {bound:g}" + (f"; about {need['in']} in and {need['out']} out would "
                                                           "settle it" if need else ""))}
