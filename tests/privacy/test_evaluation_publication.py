"""What a model's evaluation publishes (issue 22, case 4).

Before: `record_evaluation` logged the exact token-weighted perplexity and accuracy of the evaluation
people (4 digits) on the model's MLflow run: removing one evaluation person moved the logged
perplexity in 24/24 cases. Now the registry takes only a `PublishedEvaluation` — per-person clipped
metrics plus analytic-Gaussian noise at the policy's evaluation ε, charged in the ledger to every
person it counts. These tests check, against computations of their own:

(a) the noise on each logged coordinate is what dp-accounting calibrates for (ε, δ) under add/remove
    of one person, and the ledger charges each counted person the Gaussian's Rényi curve, once per
    release — a repeat of the same release republishes the same values without a new charge;
(b) removing one evaluation person changes the published values only through the mechanism: the
    noise is keyed on the counted set (fresh for a different set, never reused), and what is
    published is exactly the post-processing of (clipped sums + that noise);
(c) the exact figures never reach MLflow: the tracking store is searched for them, and a plain dict
    of metrics is refused.
"""
from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from components.core.errors import VeilError

EPS, DELTA, CLIP = 1.0, 1e-6, 8.0
PLAN = {"sha256": "ab" * 32, "lifetime_budget": {"epsilon": 16.0, "delta": 1e-4}}


def _people(n: int, seed: int = 0) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per-person (mean NLL, accuracy, tokens) for the fine-tuned model and its base, some NLLs above
    the clip (so clipping matters)."""
    rng = np.random.default_rng(seed)
    model, base = {}, {}
    for i in range(n):
        u = f"person{i:03d}@example.org"
        model[u] = (float(rng.uniform(1.0, 10.0)), float(rng.uniform(0.05, 0.6)), int(rng.integers(5, 300)))
        base[u] = (float(rng.uniform(3.0, 12.0)), float(rng.uniform(0.0, 0.3)), model[u][2])
    return {"model": model, "base": base}


def _run(settings, name="eval-pub"):
    import mlflow

    client = mlflow.tracking.MlflowClient(settings.mlflow_tracking_uri)
    return client, client.create_run(client.create_experiment(name)).info.run_id


def _publish(settings, run_id, per_model, **kw):
    from components.evaluation.release import publish_evaluation
    from components.registry import record_evaluation

    return publish_evaluation(settings, plan=PLAN, run_id=run_id, models={"model": "run:" + run_id, "base": "base:x"},
                              per_model=per_model, epsilon=kw.get("epsilon", EPS), delta=DELTA, nll_clip=CLIP,
                              record=record_evaluation)


def _pld(m: float):
    """dp-accounting's privacy-loss distribution of the Gaussian mechanism with noise m × sensitivity."""
    from dp_accounting.pld import privacy_loss_distribution

    return privacy_loss_distribution.from_gaussian_mechanism(m, value_discretization_interval=1e-4)


def _assert_tight(m: float, eps: float, delta: float) -> None:
    """m is (ε, δ)-DP by dp-accounting's (pessimistic) PLD, and 0.3 % less noise would not be."""
    assert _pld(m).get_delta_for_epsilon(eps) <= delta * (1 + 1e-4)
    assert _pld(m * 0.997).get_delta_for_epsilon(eps) > delta


def _rdp_curve(m: float, orders):
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant(list(orders))
    acc.compose(dp_accounting.GaussianDpEvent(m))
    return np.asarray(acc._rdp, dtype=float)


def _independent_sums(per_model, people):
    out = []
    for name in ("model", "base"):
        out.append(sum(min(max(per_model[name][u][0], 0.0), CLIP) for u in people))
        out.append(sum(per_model[name][u][1] for u in people))
    return np.array(out + [float(len(people))])


def _post(noisy):
    n = max(noisy[-1], 1.0)
    return {"eval_perplexity": math.exp(min(max(noisy[0] / n, 0.0), CLIP)),
            "eval_next_token_accuracy": min(max(noisy[1] / n, 0.0), 1.0),
            "eval_base_perplexity": math.exp(min(max(noisy[2] / n, 0.0), CLIP)),
            "eval_base_next_token_accuracy": min(max(noisy[3] / n, 0.0), 1.0)}


@pytest.mark.parametrize("eps,delta,k", [(1.0, 1e-6, 5), (0.3, 1e-5, 3), (4.0, 1e-8, 7)])
def test_calibration_matches_dp_accounting(eps, delta, k):
    """The whole vector's privacy loss — each coordinate i moved by its range s_i under noise σ_i — is a
    1-D Gaussian with multiplier 1/√(Σ s_i²/σ_i²); dp-accounting must find it (ε, δ)-DP, tightly."""
    import dp_accounting

    from components.evaluation.dp import EvaluationMechanism

    models = ("model", "base", "reference")[:(k - 1) // 2]
    mech = EvaluationMechanism(eps, delta, CLIP, models)
    assert mech.coordinates == k
    scales, sigmas = mech.scales(), mech.sigmas()
    effective = 1.0 / math.sqrt(float(np.sum((scales / sigmas) ** 2)))
    _assert_tight(effective, eps, delta)
    assert _pld(effective).get_epsilon_for_delta(delta) == pytest.approx(eps, rel=2e-3)
    # the Rényi curve charged: dp-accounting's RDP of the same Gaussian
    orders = [1.5, 2.0, 4.0, 8.0, 32.0, 256.0]
    assert np.allclose(mech.rdp(orders), _rdp_curve(effective, orders), rtol=1e-9)


def test_logged_noise_is_calibrated_and_each_person_charged_once_per_release(settings, monkeypatch):
    from components.evaluation import dp
    from components.ledger import Ledger

    per_model = _people(40)
    people = sorted(per_model["model"])
    exact = _independent_sums(per_model, people)
    client, rid = _run(settings)
    recovered = {}
    # one unit normal on one coordinate at a time: the logged value then reveals that coordinate's σ
    for coord, metric in ((1, "eval_next_token_accuracy"), (3, "eval_base_next_token_accuracy")):
        e = np.zeros(5)
        e[coord] = 0.01                                          # small: no clamp binds
        monkeypatch.setattr(dp, "standard_normals", lambda seed, k, e=e: e.copy())
        _, r = _run(settings, f"coord-{coord}")
        pub = _publish(settings, r, per_model)
        recovered[coord] = (pub.metrics[metric] * exact[-1] - exact[coord]) / 0.01
        logged = client.get_run(r).data.metrics[metric]
        assert logged == pytest.approx(pub.metrics[metric], rel=1e-12)
    e = np.zeros(5)
    e[0] = 0.01
    monkeypatch.setattr(dp, "standard_normals", lambda seed, k: e.copy())
    pub = _publish(settings, rid, per_model)
    recovered[0] = (math.log(pub.metrics["eval_perplexity"]) * exact[-1] - exact[0]) / 0.01
    e = np.zeros(5)
    e[4] = 0.01                                                  # the count: every ratio moves with it
    monkeypatch.setattr(dp, "standard_normals", lambda seed, k: e.copy())
    _, r = _run(settings, "coord-count")
    pub4 = _publish(settings, r, per_model)
    recovered[4] = (exact[1] / pub4.metrics["eval_next_token_accuracy"] - exact[-1]) / 0.01
    # each σ_i over its coordinate's range s_i (the clip for an NLL sum, 1 otherwise) is the same z, and
    # the five together are exactly an (ε, δ) Gaussian: z/√5 is what dp-accounting needs, tightly
    z = [recovered[0] / CLIP, recovered[1], recovered[3], recovered[4]]
    assert np.allclose(z, z[0], rtol=1e-6)
    m = z[0] / math.sqrt(5)
    _assert_tight(m, EPS, DELTA)

    # the ledger: four releases so far (four runs), each charged once to every person
    led = Ledger.open(settings)
    try:
        curve = _rdp_curve(m, led.orders)
        spend = led.spend(people)
        for u in people:
            assert np.allclose(spend[u], 4 * curve, rtol=1e-6)
        n_releases = led.summary()["releases"]
        # the same release again (same model, people, parameters): the same values, nothing charged
        again = _publish(settings, rid, per_model)
        assert again.reused and again.metrics == pub.metrics and again.release_id == pub.release_id
        assert led.summary()["releases"] == n_releases
        assert all(np.allclose(led.spend([u])[u], spend[u]) for u in people)
        # another ε is another release: charged again
        _publish(settings, rid, per_model, epsilon=2.0)
        assert led.summary()["releases"] == n_releases + 1
        assert all(np.all(led.spend([u])[u] > spend[u]) for u in people)
    finally:
        led.dispose()


def test_removing_one_person_moves_the_output_only_through_the_mechanism(settings, monkeypatch):
    from components.evaluation import dp

    per_model = _people(30, seed=3)
    everyone = sorted(per_model["model"])
    drawn: list[tuple[tuple, np.ndarray]] = []
    real = dp.standard_normals

    def spy(seed, k):
        z = real(seed, k)
        drawn.append((tuple(seed), z))
        return z

    monkeypatch.setattr(dp, "standard_normals", spy)
    from components.evaluation.release import publish_evaluation
    from components.registry import record_evaluation

    client, rid = _run(settings)
    full = _publish(settings, rid, per_model)
    assert len(drawn) == 1
    mech = dp.EvaluationMechanism(EPS, DELTA, CLIP, ("model", "base"))
    assert full.metrics == pytest.approx(_post(_independent_sums(per_model, everyone) + mech.sigmas() * drawn[0][1]),
                                         rel=1e-12)
    scale = np.array([CLIP, 1.0, CLIP, 1.0, 1.0])
    for gone in everyone[:20]:
        without = {n: {u: v for u, v in d.items() if u != gone} for n, d in per_model.items()}
        rest = [u for u in everyone if u != gone]
        _, r2 = _run(settings, f"without-{gone}")
        n_draws = len(drawn)
        # the same model (identity) and the same key: only the population differs
        pub = publish_evaluation(settings, plan=PLAN, run_id=r2, models={"model": "run:" + rid, "base": "base:x"},
                                 per_model=without, epsilon=EPS, delta=DELTA, nll_clip=CLIP, record=record_evaluation)
        assert len(drawn) == n_draws + 1 and not pub.reused and pub.release_id != full.release_id
        # exactly the mechanism: clipped sums over the counted people + σ·z, then post-processing
        assert pub.metrics == pytest.approx(_post(_independent_sums(without, rest) + mech.sigmas() * drawn[-1][1]),
                                            rel=1e-12)
        # one person moves the range-scaled sums by at most √k (the sensitivity the noise is calibrated to)
        move = (_independent_sums(per_model, everyone) - _independent_sums(without, rest)) / scale
        assert np.linalg.norm(move) <= math.sqrt(5) + 1e-12
    # a different counted set never reuses a draw: 21 populations, 21 distinct keyed seeds and draws
    assert len({s for s, _ in drawn}) == len(drawn) == 21
    assert len({z.tobytes() for _, z in drawn}) == 21


def test_exact_figures_never_reach_mlflow(settings):
    from components.registry import record_evaluation

    per_model = _people(25, seed=7)
    people = sorted(per_model["model"])
    client, rid = _run(settings)
    # a plain dict (what `veil evaluate` logged before) is refused, whatever its keys
    with pytest.raises(VeilError, match="not a DP evaluation release"):
        record_evaluation(settings, rid, {"eval_perplexity": 9.678421126062595})
    assert client.get_run(rid).data.metrics == {}
    pub = _publish(settings, rid, per_model)
    run = client.get_run(rid)
    assert run.data.metrics == pub.metrics
    # the exact figures (person-weighted and token-weighted, several roundings) are nowhere in the store
    exact = []
    for name in ("model", "base"):
        d = per_model[name]
        clipped = sum(min(d[u][0], CLIP) for u in people) / len(people)
        tok = sum(d[u][0] * d[u][2] for u in people) / sum(d[u][2] for u in people)
        acc = sum(d[u][1] for u in people) / len(people)
        exact += [math.exp(clipped), math.exp(tok), acc, clipped]
    for v in exact:
        for logged in run.data.metrics.values():
            assert logged != pytest.approx(v, rel=1e-3)
    store = _tracking_bytes(settings)
    for v in exact:
        for text in {repr(v), f"{v:.4g}", f"{v:.6g}"}:
            assert text.encode() not in store, text
    assert str(len(people)).encode() + b" evaluation" not in store
    assert "not covered by the model's certificate" in run.data.tags["evaluation.caveat"]
    assert float(run.data.tags["evaluation.epsilon"]) == EPS
    assert not [k for k in run.data.tags if k.startswith(("privacy.", "audit."))]   # no certificate claim
    assert not [k for k in run.data.metrics if k.endswith(("_people", "_records", "_tokens"))]


def _tracking_bytes(settings) -> bytes:
    """Everything the tracking store holds: the database file (and its WAL) and every artifact."""
    uri = settings.mlflow_tracking_uri
    out = b""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        for p in (db, db.with_name(db.name + "-wal")):
            if p.is_file():
                out += p.read_bytes()
        con = sqlite3.connect(db)
        try:
            for table in ("metrics", "latest_metrics", "params", "tags"):
                for row in con.execute(f"SELECT * FROM {table}"):
                    out += repr(row).encode()
        finally:
            con.close()
    for p in Path(settings.mlflow_artifacts_dir).rglob("*"):
        if p.is_file():
            out += p.read_bytes()
    return out
