"""`veil study --private-selection`: an accounted choice of hyper-parameters (Papernot & Steinke 2022).

Order of operations (docs/privacy/private-selection.md has the composition argument):
1. leave out the people who cannot afford even the N̂ of every point (`stages.exhausted_people` with
   the points' ε_N summed) — before any planning, so no N̂ counts them;
2. plan every grid point: each plan is public and its N̂ a Laplace release; every N̂ is charged to
   everyone it counts (at plan time, or here for a plan that came back uncharged);
3. reserve, per person, the selection theorem's curve over Q = "draw a point uniformly, train it at its
   public plan, score it" — N̂ is Q's public input, not part of Q, so the trials, given the plans, are
   independent runs of one fixed Q;
4. draw K (OS CSPRNG; private) and run Q K times, each trial with its own point draw, run folder
   (fresh private seed: its own Poisson batches and noise) and score noise; output the best.

Per person, Q's Rényi curve is the largest of (a) each grid point's training cost for that person
(the ledger's row/user cost of the point's plan, without N̂) and (b) the score's Gaussian curve
λ/(2σ_s²) for evaluation people; A's curve follows from the theorem and is reserved in the per-person
ledger — before any trial trains — as one release of mechanism `private-selection`. People the
ledger's filter retires there are left out of every trial's training and of the score.

Public output (through the publication gate, channel `selection`): the chosen point, its noisy score,
the selection's (ε, δ) with its composition. Nothing published depends on K: the trials (how many,
which points, their scores, their run folders) stay under VEIL_HOME/private/studies/<id>/, there is
no duration, and the selection file's and study folder's times are set to the start. The selected
weights are covered by the ledger's charge but get no Veil certificate (they are not registered).
"""
from __future__ import annotations

import json
import os
import secrets as _secrets
import time
from pathlib import Path

import numpy as np

from catalog import snapshots  # its module, not the function: tests stand a snapshot in
from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.core.settings import Settings
from components.evaluation.dp import clip_nll, person_means
from components.mechanisms import get as get_mechanism
from components.modeling.base import load_finetuned
from components.modeling.scoring import token_statistics
from components.policy import load_policy
from components.publication.gate import publish
from flows import stages, study
from flows.stages import plan_snapshot_id
from flows.study_grid import parse_grid, point_policy
from components.draws.annex import load_annex
from components.draws.data import evaluation_records, train_rows
from components.renyi.costs import person_rates, plan_population_epsilon, pure_dp_rdp

DEFAULTS = {"distribution": "truncated-negative-binomial", "eta": 0.0, "gamma": 0.3, "mu": None,
            "score_clip": 8.0, "score_noise": 2.0, "score_records_per_person": 8}


def _rows_table(settings: Settings, plan_doc: dict):
    annex = load_annex(settings.private_dir, plan_doc)
    return annex, train_rows(annex)


def population_curves(plan_doc: dict, rows, orders) -> dict[str, np.ndarray]:
    """person → the Rényi curve of this plan's N̂ for that person: everyone the plan counts (its
    training people) pays ε_N × (how many units of N they are), pure DP (`release.pure_dp_rdp`)."""

    eps_n = plan_population_epsilon(plan_doc)
    if eps_n <= 0:
        return {}
    mech = get_mechanism(str(plan_doc["mechanism"]))
    rates = person_rates(rows, float(plan_doc["sampling_rate"]))
    return {u: pure_dp_rdp(eps_n * mech.ledger_population_rows(len(r)), orders) for u, r in rates.items()}


def person_curves(settings: Settings, plans: list[dict], score_noise: float, orders) -> tuple[dict, set, set]:
    """person → Q's RDP curve: the largest of every point's *training* cost for that person (the
    population estimate N̂ is not part of Q: it is released, and charged, once per plan before any
    trial — docs/privacy/private-selection.md) and, for evaluation people, the score's Gaussian curve;
    also the training and evaluation people."""
    from components.accounting.private_selection import gaussian_rdp  # startup
    # the release's training part alone: its N̂ share is charged with the plan (population_curves)
    from components.ledger.release import training_costs  # startup

    curves: dict[str, np.ndarray] = {}
    trained: set[str] = set()
    evaluated: set[str] = set()
    for plan_doc in plans:
        annex, rows = _rows_table(settings, plan_doc)
        for person, cost in training_costs(plan_doc, rows, orders).items():
            c = np.asarray(cost.rdp, dtype=float)
            curves[person] = np.maximum(curves[person], c) if person in curves else c
            trained.add(person)
        evaluated |= {str(u) for u in annex.get("eval_users") or ()}
    g = gaussian_rdp(orders, score_noise)
    for person in evaluated:
        curves[person] = np.maximum(curves[person], g) if person in curves else g.copy()
    return curves, trained, evaluated


def worst_person_curves(plans: list[dict], score_noise: float, orders) -> tuple[np.ndarray, list[np.ndarray]]:
    """(Q's curve, each plan's N̂ curve) for a hypothetical person who is as costly as the plans allow
    in every one of them at once: k rows in each (the plan's public records_per_user; one user for
    ULS) and an evaluation person too. A function of the public plans only, so the published ε is
    public by construction; every real person's charge is checked to be at most this (pessimistic)."""
    from components.accounting.private_selection import gaussian_rdp  # startup
    from components.ledger.release import training_costs  # startup

    q = gaussian_rdp(orders, score_noise)
    pops = []
    for plan_doc in plans:
        rows = max(1, int(plan_doc.get("records_per_user") or 1))
        who = {"worst": rows}
        q = np.maximum(q, np.asarray(training_costs(plan_doc, who, orders)["worst"].rdp, dtype=float))
        pops.append(population_curves(plan_doc, who, orders).get("worst", np.zeros(len(orders))))
    return q, pops


def noisy_score(users: list[str], sums: np.ndarray, counts: np.ndarray, clip: float, noise: float,
                rng: np.random.Generator) -> float:
    """Σ_person clip(mean NLL of the person's scored tokens, 0, B) + N(0, (σ_s·B)²): one person moves
    the sum by at most B (add/remove), so it is the Gaussian mechanism with noise multiplier σ_s.
    Lower is better. The per-person means are the evaluation release's (components.evaluation.dp)."""
    total = sum(clip_nll(nll, clip) for nll, _, _ in person_means(users, sums, counts).values())
    return float(total + rng.normal(0.0, noise * clip))


def score_texts(settings: Settings, plan_doc: dict, per_person: int, excluded: set[str]):
    """(user ids, texts) scored: at most `per_person` records of each evaluation person, picked by a
    hash of that person's own records only. A global cap (as a plain study uses) would let one person's
    records push other people's out of the score, and the sum's sensitivity would no longer be B."""
    import hashlib


    annex = load_annex(settings.private_dir, plan_doc)
    t = evaluation_records(plan_doc, annex, snapshots.load_snapshot(settings, plan_snapshot_id(settings, plan_doc, annex)).records)
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
    users, texts = score_texts(settings, plan_doc, int(ps["score_records_per_person"]), excluded)
    model, tok = load_finetuned(base_dir, adapter_dir=train_result.get("adapter_dir"),
                                model_dir=train_result.get("model_dir"))
    sums, counts, _ = token_statistics(model, tok, texts, int(plan_doc["training"]["seq_len"]), 32)
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "big"))
    return noisy_score(users, sums, counts, float(ps["score_clip"]), float(ps["score_noise"]), rng)


def plan_points(settings: Settings, policy: str | Path, grid, out: Path, base_dir) -> tuple[list, list, list]:
    """Plan every grid point, after leaving out the people the selection cannot admit whatever it
    draws: each plan's N̂ counts them, so the floor is the sum of the points' ε_N (`stages.exhausted_people`;
    one person's answer reads only their ledger row and public policy values). The same people are left
    out of every point. Returns (plan docs, plan paths, `stages.plan`'s results)."""
    paths = [point_policy(policy, pt, grid.training, out / "policies" / f"{pt.key}.yaml") for pt in grid.points]
    pols = [load_policy(pp) for pp in paths]
    records = snapshots.load_snapshot(settings, None, verify=False).records
    users = set(records.column("user_id").to_pylist())
    if "owners" in records.column_names:
        users |= {str(o) for os_ in records.column("owners").to_pylist() for o in (os_ or ())}
    excluded = stages.exhausted_people(settings, load_policy(policy), users,
                                       population_epsilons=[stages.planned_population_epsilon(p) for p in pols])
    planned = [stages.plan(settings, pp, base_dir=base_dir, exclude_people=sorted(excluded)) for pp in paths]
    return [p["plan"] for p in planned], [p["plan_path"] for p in planned], planned


def charge_populations(settings: Settings, led, plans: list[dict], planned: list[dict], orders, budget) -> list[dict]:
    """Every plan's N̂ was charged at plan time to everyone it counts (`stages.plan` →
    `population_release_id`: a ledger release of kind 'population', ε_N per counted person, retired or
    not, once per distinct N̂); say how, as the composition's entries. Plans sharing one population
    release share one N̂: counted once."""

    del led, orders, budget     # the charge is the planner's; nothing is charged here
    out, seen = [], set()
    for plan_doc, p in zip(plans, planned):
        eps_n = plan_population_epsilon(plan_doc)
        if eps_n <= 0:
            continue
        rid = p.get("population_release_id")
        by = "plan"
        if rid is None:
            raise VeilError(f"private selection: plan {plan_doc['sha256'][:12]} publishes N̂ but the ledger holds no "
                            "charge for it; refusing to go on")
        if int(rid) in seen:
            continue
        seen.add(int(rid))
        out.append({"plan_sha256": plan_doc["sha256"], "epsilon_N": eps_n, "ledger_release_id": int(rid),
                    "charged_by": by})
    return out


def run_private_selection(settings: Settings, policy: str | Path, grid_path: str | Path, *,
                          base_dir: str | Path | None, rng=None) -> dict:
    from components.accounting.private_selection import (draw_trials, expected_trials, rdp_to_epsilon,  # startup
                                                         selection_rdp)
    from components.ledger import Budget, Ledger, PersonCost  # startup

    grid = parse_grid(grid_path)
    ps = {**DEFAULTS, **(grid.private_selection or {})}
    bad = [p.key for p in grid.points
           if p.mechanism == "non-private" or get_mechanism(p.mechanism).privacy_unit != "user"]
    if bad:
        raise VeilError(f"--private-selection: point {bad[0]} cannot be part of a person-level private selection "
                        "(non-private has no privacy; record and secret units protect records or secrets, not "
                        "people): drop it from the grid")
    pol = load_policy(policy)
    if pol.spec.people.ownership == "all-participants":
        # its points would be multi-owner releases (fixed-graph replace relation): the selection's ledger
        # release is read under add/remove, so the two would not compose under one stated relation
        raise VeilError("--private-selection: people.ownership all-participants is not supported (multi-owner "
                        "points are under the fixed-graph replace relation, the selection's charge under "
                        "add/remove); use a single-owner policy")
    if base_dir is None:
        raise VeilError("veil study: pass --base-model DIR (a public base)")
    base_dir = stages.base_model(settings, base_model_dir=base_dir)
    delta = float(pol.spec.target.delta) if pol.spec.target else 1e-5
    sid, out = study.new_study_dir(settings, grid)   # through its module: tests stand a folder in
    started = time.time()
    # Everything that depends on K (the trials' runs, their scores, K itself) lives in the private area:
    # a trial folder in the study's directory would publish K by its count.
    private_out = settings.private_dir / "studies" / sid
    private_out.mkdir(mode=0o700, parents=True)

    # 1. Plan every point, exhausted people left out first. Each plan is public, its N̂ a released value.
    plans, plan_paths, planned = plan_points(settings, policy, grid, out, base_dir)

    life = pol.spec.lifetime_budget
    budget = Budget.parse(life.model_dump()) if life else None
    kw = {"eta": ps["eta"], "gamma": ps["gamma"], "mu": ps["mu"]}
    led = Ledger.open(settings)
    try:
        orders = np.asarray(led.orders, dtype=float)
        # 2. Every N̂ charged to everyone it counts (plan time, or here where the plan did not).
        populations = charge_populations(settings, led, plans, planned, orders, budget)
        # 3. The selection theorem over Q = (uniform point, train it at its public plan, score it): N̂ is
        #    an input of Q, not a part of it, so Q's curve is the training and score curves alone.
        curves, trained, evaluated = person_curves(settings, plans, float(ps["score_noise"]), orders)
        costs = {person: PersonCost(rows=1, sampling_rate=1.0, rdp=selection_rdp(orders, c, ps["distribution"], **kw))
                 for person, c in curves.items()}
        # What is published: the worst person the public plans allow, the N̂ of every distinct population
        # release plus the theorem's curve; checked against every real person (never below the truth).
        q_worst, pop_worst = worst_person_curves(plans, float(ps["score_noise"]), orders)
        counted = {e["plan_sha256"] for e in populations}
        total_worst = selection_rdp(orders, q_worst, ps["distribution"], **kw) + sum(
            (c for plan_doc, c in zip(plans, pop_worst) if plan_doc["sha256"] in counted), np.zeros(len(orders)))
        pops = [population_curves(plan_doc, _rows_table(settings, plan_doc)[1], orders)
                if plan_doc["sha256"] in counted else {} for plan_doc in plans]
        for person, c in costs.items():
            mine = c.rdp + sum((p[person] for p in pops if person in p), np.zeros(len(orders)))
            if np.any(mine > total_worst * (1 + 1e-9) + 1e-12):
                raise VeilError("private selection: a person's cost exceeds the public worst case the selection "
                                "would publish; refusing to run (nothing trained; report this)")
        eps_total, order = rdp_to_epsilon(orders, total_worst, delta)
        params = {"grid_sha256": grid.sha256, "policy_sha256": pol.sha256, "points": len(grid.points),
                  "distribution": ps["distribution"], **{k: v for k, v in kw.items() if v is not None},
                  "score_clip": ps["score_clip"], "score_noise": ps["score_noise"],
                  "score_records_per_person": ps["score_records_per_person"],
                  "plans": [p["sha256"] for p in plans],
                  "population_releases": [e["ledger_release_id"] for e in populations]}
        res = led.reserve(kind="user", mechanism="private-selection", plan_sha256=sha256_json(params), params=params,
                          costs=costs, budget=budget)
    finally:
        led.dispose()
    retired = set(res.retired)
    if not set(res.admitted) & trained:
        raise VeilError("ledger: every trained person of this selection has spent their lifetime budget")

    # 4. K from the OS CSPRNG; each trial an independent run of Q given the public plans: its own
    #    uniform point, its own run folder (so a fresh private seed: its own Poisson batches and noise)
    #    and its own score noise.
    k = draw_trials(ps["distribution"], rng=rng, **kw)
    pick = rng if rng is not None else _secrets.SystemRandom()
    trials = []
    for i in range(k):
        j = pick.randrange(len(grid.points))
        pt = grid.points[j]
        run_dir = private_out / "runs" / f"trial-{i:03d}"
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
    theorem = ("Papernot & Steinke 2022, Thm 2 (truncated negative binomial)" if ps["distribution"] != "poisson"
               else "Papernot & Steinke 2022, Thm 6 (Poisson)")
    doc = {
        "study_id": sid, "mode": "private-selection",
        "grid": {"name": grid.name, "sha256": grid.sha256, "points": [p.to_dict() for p in grid.points]},
        "policy": {"name": pol.name, "sha256": pol.sha256},
        "selected": None if best is None else next(p.to_dict() for p in grid.points if p.key == best["point"]),
        "selected_noisy_score": None if best is None else best["score"],
        "selection": {"theorem": theorem,
                      **{k2: v for k2, v in ps.items() if v is not None},
                      "expected_trials": expected_trials(ps["distribution"], **kw),
                      "epsilon": eps_total, "delta": delta, "order": order,
                      "ledger_release_id": res.release_id,
                      "composition": {
                          "rule": ("adaptive RDP composition, per person: Σ over the distinct population estimates "
                                   "N̂ (one per grid point's plan, Laplace ε_N, pure DP) + the selection theorem "
                                   "over Q = a uniform point trained at its public plan and scored (N̂ is Q's public "
                                   "input, not part of Q); (ε, δ) at the worst person the public plans allow "
                                   "(k rows in every plan, and an evaluation person)"),
                          "population_estimates": [{k2: e[k2] for k2 in ("plan_sha256", "epsilon_N", "ledger_release_id")}
                                                   for e in populations],
                          "selection_release_id": res.release_id},
                      "note": ("K, the trials and their scores stay private (the bound needs K hidden); nothing here "
                               "depends on K. The selected weights are covered by this ledger charge but get no "
                               "certificate.")},
        "covered_by_certificate": False,
        "caveat": study.CAVEAT.replace("Use --private-selection for an accounted choice (Papernot & Steinke 2022).",
                                 "This choice is accounted in the per-person ledger (above), not by a certificate."),
        "dir": str(out),
    }
    if best is None:
        doc["note"] = "K = 0 trials were drawn (Poisson): nothing is selected; the charge stands."
    publish("selection", doc, subject=sid)
    path = out / "selection.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    # the file's and folder's times would give the run's duration, hence K: both say the start
    for p in (path, out):
        os.utime(p, (started, started))
    return doc
