"""Publish a model's evaluation: reserve the ledger charge, draw the keyed noise, log the DP metrics.

    published = publish_evaluation(settings, plan=plan, run_id=run_id, models=identities,
                                   per_model=person_stats, epsilon=…, delta=…, nll_clip=…,
                                   record=registry.record_evaluation)

The mechanism and its calibration are `components.evaluation.dp`. This module adds what makes a
release of it honest over the life of an organization:

* **Charged before anything is computed from the data**: every candidate (an evaluation person with
  a scored token) is offered to the ledger's filter as one release of mechanism `evaluation` with the
  Gaussian's Rényi curve; the people it retires are left out of the sums, the people it admits are
  charged — once per evaluation release.
* **Re-evaluation publishes nothing new**: a release is named by a hash of its public parameters,
  the plan, the evaluated models' identities and a keyed commitment to the candidates. When the ledger
  already holds a release of that name whose metrics were logged, the same metrics are logged again
  (no new charge: no new information). Otherwise a new release is reserved and charged, and its noise
  is keyed on its name *and on the people actually counted*, so a draw is never reused across
  different counted sets.
* **Only the noisy metrics reach MLflow** (`registry.record_evaluation` refuses anything but a
  `PublishedEvaluation`), each through the publication gate; the exact figures are the caller's, for
  the operator's terminal.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.evaluation import dp
from components.evaluation.dp import PublishedEvaluation
from components.draws.annex import plan_key, prf, prf_seed


CAVEAT = ("differentially private: Gaussian noise on per-person clipped metrics of the evaluation people (reserved "
          "at plan time, never trained on), each of them charged in the ledger; these are not the exact figures "
          "(person-weighted, NLL clipped to evaluation.nll_clip) and are not covered by the model's certificate")


def _release_name(plan: Mapping, run_id: str, models: Mapping[str, str], mech: dp.EvaluationMechanism,
                  people_commitment: str) -> str:
    return sha256_json({"release": dp.MECHANISM, "plan_sha256": plan.get("sha256"), "run_id": run_id,
                        "models": dict(models), "epsilon": float(mech.epsilon), "delta": float(mech.delta),
                        "nll_clip": float(mech.nll_clip), "candidates": people_commitment})


def _logged_before(led, name: str) -> tuple[int, dict] | None:
    """(release id, metrics) of an earlier release of this name whose metrics were logged."""
    for rid in reversed(led.releases_for_plan(name)):
        for ev in reversed(led.events(rid)):
            if ev.get("status") == "registered" and isinstance(ev.get("published"), dict):
                return rid, {k: float(v) for k, v in ev["published"].items()}
    return None


def publish_evaluation(settings, *, plan: Mapping, run_id: str, models: Mapping[str, str],
                       per_model: Mapping[str, Mapping[str, tuple[float, float, int]]], epsilon: float,
                       delta: float, nll_clip: float,
                       record: Callable[[object, str, PublishedEvaluation], None]) -> PublishedEvaluation:
    """Release the evaluation of `models` (name → identity: a run id or a weights hash; names 'model',
    'base', optionally 'reference') from per-person statistics (`dp.person_means` per model), charge it
    to the counted people and log it on `run_id`. A caller that does not log calls nothing here: the
    exact figures alone are shown, and nobody is charged. `record(settings, run_id, published)` logs the
    release on the run (`components.registry.record_evaluation`: passed in, because the registry sits
    above this package)."""
    from components.ledger import Budget, Ledger, PersonCost  # startup

    names = tuple(models)
    if set(names) != set(per_model) or "model" not in names:
        raise VeilError("evaluation: per-person statistics are needed for exactly the evaluated models")
    mech = dp.EvaluationMechanism(float(epsilon), float(delta), float(nll_clip), names)
    # candidates: people with a scored token under every model (the tokenizers are the same, so all)
    sets = [set(per_model[n]) for n in names]
    candidates = sorted(set.intersection(*sets))
    if not candidates:
        raise VeilError("evaluation: no evaluation person has a token to score")
    key = plan_key(settings.private_dir)
    name = _release_name(plan, run_id, models, mech, prf(key, "evaluation-candidates", candidates).hex())
    public = {"release": name, "run_id": run_id, "plan_sha256": plan.get("sha256"), **mech.public()}
    led = Ledger.open(settings)
    try:
        before = _logged_before(led, name)
        counted = 0
        if before is not None:
            rid, metrics = before
            reused = True
        else:
            curve = mech.rdp(led.orders)
            costs = {u: PersonCost(rows=1, sampling_rate=1.0, rdp=curve) for u in candidates}
            res = led.reserve(kind="user", mechanism=dp.MECHANISM, plan_sha256=name, params=public, costs=costs,
                              budget=Budget.parse(plan.get("lifetime_budget")))
            rid, reused = res.release_id, False
            people = sorted(res.admitted)
            if not people:
                led.record(rid, "refused", reason="every evaluation person has spent their lifetime budget")
                raise VeilError("evaluation: every evaluation person has spent their lifetime budget; nothing "
                                "can be published about them")
            counted = len(people)
            # keyed on the evaluated models (the run fixes its plan, hence every counted person's records), the
            # mechanism's parameters and whom it counts — exactly what it counts, like N̂: not on the candidates
            # (the release's name commits to them, retired ones included) nor on the plan's sha256 (it moves
            # with the snapshot's content hash when a person who is not counted leaves), either of which let a
            # person the release does not count move the draw (issue 22's neighbour harness, scenario
            # `evaluation_retired`); a different counted set still gets a fresh draw
            public_name = sha256_json({"release": dp.MECHANISM, "run_id": run_id, "models": dict(models),
                                       "epsilon": float(mech.epsilon), "delta": float(mech.delta),
                                       "nll_clip": float(mech.nll_clip)})
            seed = prf_seed(key, "evaluation-noise", public_name, prf(key, "evaluation-counted", people).hex())
            metrics = dp.release(mech, dp.exact_sums(mech, per_model, people),
                                 dp.standard_normals(seed, mech.coordinates))
        tags = {"evaluation.caveat": CAVEAT, "evaluation.mechanism": public["mechanism"],
                "evaluation.epsilon": repr(float(mech.epsilon)), "evaluation.delta": repr(float(mech.delta)),
                "evaluation.nll_clip": repr(float(mech.nll_clip)),
                "evaluation.noise_multiplier": repr(float(mech.noise_multiplier)),
                "evaluation.definition": dp.DEFINITION, "evaluation.ledger_release_id": str(rid)}
        out = PublishedEvaluation(metrics=metrics, tags=tags, release_id=int(rid), release_name=name,
                                  reused=reused, counted=counted)
        record(settings, run_id, out)
        if not reused:
            led.record(rid, "registered", published=metrics, run_id=run_id)
        return out
    finally:
        led.dispose()
