"""`veil study --private-selection`: an accounted choice of hyper-parameters (Papernot & Steinke 2022).

A = draw K from the grid's distribution (OS CSPRNG; K stays private) → K times: draw a grid point
uniformly (independent of the data), train it (a tuning run of the pipeline's stages), score it on
the evaluation people with a Gaussian-noised sum of per-person clipped mean NLLs → output the best
trial's point and its noisy score. Derivation and theorem: components/accounting/private_selection.py
and docs/privacy/private-selection.md.

Per person, Q's Rényi curve is the largest of (a) each grid point's training cost for that person
(the ledger's own `release_costs` of the point's plan, ε_N included) and (b) the score's Gaussian
curve λ/(2σ_s²) for evaluation people; A's curve follows from the theorem and is reserved in the
per-person ledger — before any trial trains — as one release of mechanism `private-selection`.
People the ledger's filter retires are left out of every trial's training and of the score.

Public output: the chosen point, its noisy score and the selection's (ε, δ). The trials (how many,
which points, their scores) stay under VEIL_HOME/private/studies/<id>/: publishing them would
publish K, and the theorem's bound holds only while K is hidden. The selected weights are covered by
the ledger's charge but get no Veil certificate (they are not registered).
"""
from __future__ import annotations

import json
import os
import secrets as _secrets
import time
from pathlib import Path

import numpy as np

from components.core.errors import VeilError
from components.core.settings import Settings

DEFAULTS = {"distribution": "truncated-negative-binomial", "eta": 0.0, "gamma": 0.3, "mu": None,
            "score_clip": 8.0, "score_noise": 2.0, "score_records_per_person": 8}


def person_curves(settings: Settings, plans: list[dict], score_noise: float, orders) -> tuple[dict, set, set]:
    """person → Q's RDP curve (max over the points' training costs and, for evaluation people, the
    score's Gaussian curve); also the training and evaluation people."""
    from components.accounting.private_selection import gaussian_rdp
    from components.ledger.release import release_costs
    from components.planning.annex import load_annex
    from components.planning.data import train_rows

    curves: dict[str, np.ndarray] = {}
    trained: set[str] = set()
    evaluated: set[str] = set()
    for plan_doc in plans:
        annex = load_annex(settings.private_dir, plan_doc)
        for person, cost in release_costs(plan_doc, train_rows(annex), orders).items():
            c = np.asarray(cost.rdp, dtype=float)
            curves[person] = np.maximum(curves[person], c) if person in curves else c
            trained.add(person)
        evaluated |= {str(u) for u in annex.get("eval_users") or ()}
    g = gaussian_rdp(orders, score_noise)
    for person in evaluated:
        curves[person] = np.maximum(curves[person], g) if person in curves else g.copy()
    return curves, trained, evaluated


def noisy_score(users: list[str], sums: np.ndarray, counts: np.ndarray, clip: float, noise: float,
                rng: np.random.Generator) -> float:
    """Σ_person clip(mean NLL of the person's scored tokens, 0, B) + N(0, (σ_s·B)²): one person moves
    the sum by at most B (add/remove), so it is the Gaussian mechanism with noise multiplier σ_s.
    Lower is better."""
    per: dict[str, list[float]] = {}
    for u, s, c in zip(users, sums, counts):
        if c > 0:
            acc = per.setdefault(u, [0.0, 0.0])
            acc[0] -= float(s)
            acc[1] += float(c)
    total = sum(min(max(nll / n, 0.0), clip) for nll, n in per.values())
    return float(total + rng.normal(0.0, noise * clip))


def score_texts(settings: Settings, plan_doc: dict, per_person: int, excluded: set[str]):
    """(user ids, texts) scored: at most `per_person` records of each evaluation person, picked by a
    hash of that person's own records only. A global cap (as a plain study uses) would let one person's
    records push other people's out of the score, and the sum's sensitivity would no longer be B."""
    import hashlib

    from catalog.snapshots import load_snapshot
    from components.planning import evaluation_records
    from components.planning.annex import load_annex
    from flows.stages import plan_snapshot_id

    annex = load_annex(settings.private_dir, plan_doc)
    t = evaluation_records(plan_doc, annex, load_snapshot(settings, plan_snapshot_id(settings, plan_doc, annex)).records)
    by: dict[str, list[str]] = {}
    for u, x in zip(t.column("user_id").to_pylist(), t.column("text").to_pylist()):
        if u not in excluded:
            by.setdefault(u, []).append(x)
    users, texts = [], []
    for u in sorted(by):
        for x in sorted(by[u], key=lambda x: hashlib.sha256(x.encode()).hexdigest())[:per_person]:
            users.append(u)
            texts.append(x)
    return users, texts


def score_trial(settings: Settings, plan_doc: dict, base_dir: str, train_result: dict, ps: dict,
                excluded: set[str]) -> float:
    from components.modeling.base import load_finetuned
    from components.modeling.scoring import token_statistics

    users, texts = score_texts(settings, plan_doc, int(ps["score_records_per_person"]), excluded)
    model, tok = load_finetuned(base_dir, adapter_dir=train_result.get("adapter_dir"),
                                model_dir=train_result.get("model_dir"))
    sums, counts, _ = token_statistics(model, tok, texts, int(plan_doc["training"]["seq_len"]), 32)
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "big"))
    return noisy_score(users, sums, counts, float(ps["score_clip"]), float(ps["score_noise"]), rng)


def run_private_selection(settings: Settings, policy: str | Path, grid_path: str | Path, *,
                          base_dir: str | Path | None, rng=None) -> dict:
    from components.accounting.private_selection import (draw_trials, expected_trials, rdp_to_epsilon,
                                                         selection_rdp)
    from components.core.hashing import sha256_json
    from components.ledger import Budget, Ledger, PersonCost
    from components.policy import load_policy
    from flows import stages
    from flows.study import CAVEAT, new_study_dir
    from flows.study_grid import parse_grid, point_policy

    grid = parse_grid(grid_path)
    ps = {**DEFAULTS, **(grid.private_selection or {})}
    bad = [p.key for p in grid.points if p.mechanism in ("non-private", "record")]
    if bad:
        raise VeilError(f"--private-selection: point {bad[0]} cannot be part of a person-level private selection "
                        "(non-private has no privacy; record protects records, not people): drop it from the grid")
    pol = load_policy(policy)
    if base_dir is None:
        raise VeilError("veil study: pass --base-model DIR (a public base)")
    base_dir = stages.base_model(settings, base_model_dir=base_dir)
    delta = float(pol.spec.target.delta) if pol.spec.target else 1e-5
    sid, out = new_study_dir(settings, grid)
    private_out = settings.private_dir / "studies" / sid
    private_out.mkdir(mode=0o700, parents=True)
    t0 = time.perf_counter()

    # Plan every point first: the charge must cover every point a trial may draw, before any training.
    plans, plan_paths = [], []
    for pt in grid.points:
        pp = point_policy(policy, pt, grid.training, out / "policies" / f"{pt.key}.yaml")
        planned = stages.plan(settings, pp, base_dir=base_dir)
        plans.append(planned["plan"])
        plan_paths.append(planned["plan_path"])

    led = Ledger.open(settings)
    try:
        orders = np.asarray(led.orders, dtype=float)
        curves, trained, evaluated = person_curves(settings, plans, float(ps["score_noise"]), orders)
        kw = {"eta": ps["eta"], "gamma": ps["gamma"], "mu": ps["mu"]}
        costs = {}
        worst = np.zeros(len(orders))
        for person, c in curves.items():
            a = selection_rdp(orders, c, ps["distribution"], **kw)
            worst = np.maximum(worst, a)
            costs[person] = PersonCost(rows=1, sampling_rate=1.0, rdp=a)
        eps_total, order = rdp_to_epsilon(orders, worst, delta)
        life = pol.spec.lifetime_budget
        params = {"grid_sha256": grid.sha256, "policy_sha256": pol.sha256, "points": len(grid.points),
                  "distribution": ps["distribution"], **{k: v for k, v in kw.items() if v is not None},
                  "score_clip": ps["score_clip"], "score_noise": ps["score_noise"],
                  "score_records_per_person": ps["score_records_per_person"],
                  "plans": [p["sha256"] for p in plans]}
        res = led.reserve(kind="user", mechanism="private-selection", plan_sha256=sha256_json(params), params=params,
                          costs=costs, budget=Budget.parse(life.model_dump()) if life else None)
    finally:
        led.dispose()
    retired = set(res.retired)
    if not set(res.admitted) & trained:
        raise VeilError("ledger: every trained person of this selection has spent their lifetime budget")

    k = draw_trials(ps["distribution"], rng=rng, **kw)
    pick = rng if rng is not None else _secrets.SystemRandom()
    trials = []
    for i in range(k):
        j = pick.randrange(len(grid.points))
        pt = grid.points[j]
        run_dir = out / "runs" / f"trial-{i:03d}"
        tr = stages.train(settings, plan_paths[j], base_dir, progress=False, release=False, out_dir=run_dir,
                          drop_users=tuple(sorted(retired)))
        score = score_trial(settings, plans[j], str(base_dir), tr, ps, retired)
        trials.append({"trial": i, "point": pt.key, "score": score, "run_dir": str(run_dir)})
    best = min(trials, key=lambda t: t["score"]) if trials else None
    stages._ledger_event(settings, {"release_id": res.release_id}, "trained")
    (private_out / "trials.json").write_text(json.dumps({"trials": trials, "k": k}, indent=2))
    os.chmod(private_out / "trials.json", 0o600)
    if best is not None:
        (private_out / "selected.json").write_text(json.dumps(best, indent=2))
    doc = {
        "study_id": sid, "mode": "private-selection",
        "grid": {"name": grid.name, "sha256": grid.sha256, "points": [p.to_dict() for p in grid.points]},
        "policy": {"name": pol.name, "sha256": pol.sha256},
        "selected": None if best is None else next(p.to_dict() for p in grid.points if p.key == best["point"]),
        "selected_noisy_score": None if best is None else best["score"],
        "selection": {"theorem": ("Papernot & Steinke 2022, Thm 2 (truncated negative binomial)"
                                  if ps["distribution"] != "poisson" else "Papernot & Steinke 2022, Thm 6 (Poisson)"),
                      **{k2: v for k2, v in ps.items() if v is not None},
                      "expected_trials": expected_trials(ps["distribution"], **kw),
                      "epsilon": eps_total, "delta": delta, "order": order,
                      "ledger_release_id": res.release_id,
                      "note": ("K, the trials and their scores stay private (the bound needs K hidden). The "
                               "selected weights are covered by this ledger charge but get no certificate.")},
        "covered_by_certificate": False,
        "caveat": CAVEAT.replace("Use --private-selection for an accounted choice (Papernot & Steinke 2022).",
                                 "This choice is accounted in the per-person ledger (above), not by a certificate."),
        "seconds": round(time.perf_counter() - t0, 1), "dir": str(out),
    }
    if best is None:
        doc["note"] = "K = 0 trials were drawn (Poisson): nothing is selected; the charge stands."
    (out / "selection.json").write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    return doc
