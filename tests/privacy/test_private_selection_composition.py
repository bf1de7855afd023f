"""Private selection composes with everything else it publishes (issue 22, case 5).

Attacks this file pins (each failed on the code before the fix):
* every grid point is planned and its N̂ published, but ε_N was charged once, inside the selection
  theorem's Q: for P points about (P−1)·ε_N per person went uncharged;
* people who could not afford even the points' N̂ were counted in every plan (nobody left them out
  before planning);
* the published JSON held `seconds` (and the study folder one folder per trial), from which K — the
  random number of trials, which must stay hidden — follows; nothing went through the publication gate.

Training is replaced by a recorder (the properties here are about plans, the ledger and what is
published, not about the weights): `stages.train` writes nothing and takes a fixed time per trial, as a
real trial would; the score is a fixed function of the point, so two runs differ only in K.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from flows import stages

MAPPING = {"id_field": "id", "time_field": "ts", "metadata_fields": ["team", "path"]}
EPSILONS = (2, 4, 6, 8)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A demo organization, ingested once, a tiny public base, a small policy; each test copies it."""
    import os

    from components.core.settings import load_settings
    from components.modeling import build_base_model

    root = tmp_path_factory.mktemp("psel")
    home = root / "home"
    home.mkdir()
    old = os.environ.get("VEIL_HOME")
    os.environ["VEIL_HOME"] = str(home)
    try:
        s = load_settings(home).ensure()
        org = stages.demo_data(s)
        texts = [json.loads(line)["text"] for line in open(org["public"])][:200]
        base = build_base_model(texts, root / "base", vocab_size=300, n_layer=1, n_embd=16, n_head=2,
                                n_positions=64, steps=1, seq_len=32, batch_size=8, progress=False)
        stages.ingest(s, org["messages"], "jsonl", policy=stages.DEMO_POLICY, **MAPPING)
        doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
        doc["spec"]["training"].update(steps=20, expected_batch_size=8, seq_len=32, micro_batch_size=16)
        doc["spec"]["evaluation"] = {"fraction": 0.2}
        pol = root / "tiny.yaml"
        pol.write_text(yaml.safe_dump(doc, sort_keys=False))
        doc["spec"].pop("lifetime_budget")     # charges are recorded, nobody is retired
        free = root / "nobudget.yaml"
        free.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield {"home": home, "base": base, "policy": pol, "free": free}
    finally:
        if old is None:
            os.environ.pop("VEIL_HOME", None)
        else:
            os.environ["VEIL_HOME"] = old


@pytest.fixture
def org(template, tmp_path, monkeypatch):
    from components.core.settings import load_settings

    home = tmp_path / "home"
    shutil.copytree(template["home"], home)
    monkeypatch.setenv("VEIL_HOME", str(home))
    return {**template, "settings": load_settings(home).ensure()}


@pytest.fixture
def fake_trials(monkeypatch):
    """Training and scoring replaced: each trial takes 0.2 s (a real one takes minutes) and scores by
    its point alone, so the best point does not depend on K."""
    import flows.private_selection as ps

    calls = []

    def train(settings, plan_path, base_dir, **kw):
        calls.append({"plan_path": str(plan_path), "at": time.time(), **kw})
        time.sleep(0.2)
        return {}

    def score(settings, plan_doc, base_dir, tr, params, excluded):
        return -float(plan_doc["target"]["epsilon"])

    monkeypatch.setattr(stages, "train", train)
    monkeypatch.setattr(ps, "score_trial", score)
    return calls


def _grid(tmp_path: Path, extra: str = "", eps=EPSILONS) -> Path:
    p = tmp_path / "grid.yaml"
    p.write_text(f"name: psel\naxes: {{mechanism: [uls], epsilon: [{', '.join(str(e) for e in eps)}]}}\n" + extra)
    return p


def _plans(settings, doc):
    from components.planning import load_plan

    shas = {hashlib_sha(p) for p in (Path(doc["dir"]) / "policies").glob("*.yaml")}
    return [p for p in (load_plan(f).to_dict() for f in settings.plans_dir.glob("*.json"))
            if p["policy"]["sha256"] in shas]


def hashlib_sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _uls_curve(plan, orders):
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(orders=list(orders))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        plan["sampling_rate"], dp_accounting.GaussianDpEvent(plan["noise_multiplier"])), plan["steps"]))
    return np.asarray(acc._rdp)


def test_every_population_estimate_is_charged_and_published(org, fake_trials, tmp_path):
    """Per person, the ledger's total for the selection is at least Σ over the P plans' N̂ (each its own
    Laplace release, pure ε_N) + the theorem over Q = max(training curves, score curve), Q without N̂ —
    computed here independently (dp-accounting's RDP, Theorem 2 with η = 0 written out); the published
    ε is that total's conversion, and the composition lists every N̂."""
    from components.ledger import Ledger
    from components.draws.annex import load_annex
    from components.draws.data import train_rows
    from flows.private_selection import run_private_selection

    settings = org["settings"]
    doc = run_private_selection(settings, org["free"], _grid(tmp_path, "private_selection: {eta: 0, gamma: 0.3, "
                                                                      "score_noise: 3}\n"),
                                base_dir=org["base"], rng=random.Random(1))
    plans = _plans(settings, doc)
    assert len(plans) == len(EPSILONS)
    led = Ledger.open(settings)
    try:
        a = np.asarray(led.orders)
        pops = sum(np.minimum(p["data"]["population"]["epsilon"], a * p["data"]["population"]["epsilon"] ** 2 / 2)
                   for p in plans)
        q = np.maximum(np.max([_uls_curve(p, a) for p in plans], axis=0), a / (2 * 3.0 ** 2))
        g = 0.3
        ek = (1 / g - 1) / math.log(1 / g)
        hat = min([math.log(1 / g)] + [(1 - 1 / h) * c + math.log(1 / g) / h for h, c in zip(a, q)])
        want = pops + q + hat + math.log(ek) / (a - 1)
        people = sorted({u for p in plans for u in train_rows(load_annex(settings.private_dir, p))["user_id"].to_pylist()})
        spend = led.spend(people)
    finally:
        led.dispose()
    assert people
    for u in people:
        assert np.all(spend[u] >= want * (1 - 1e-9)), f"{u}: charged below Σ N̂ + the selection theorem"
    sel = doc["selection"]
    want_eps = float(np.min(want + math.log(1 / sel["delta"]) / (a - 1)))
    assert sel["epsilon"] >= want_eps * (1 - 1e-9) and sel["epsilon"] == pytest.approx(want_eps, rel=1e-6)
    listed = sel["composition"]["population_estimates"]
    assert sorted(e["plan_sha256"] for e in listed) == sorted(p["sha256"] for p in plans)


def test_exhausted_people_are_left_out_before_any_plan(org, fake_trials, tmp_path):
    """A person whose spend leaves room for one point's N̂ but not for all P of them is counted by no
    plan: not trained, not held out, not evaluated (a decision from their own ledger row alone)."""
    from components.ledger import Budget, Ledger, PersonCost
    from components.renyi.costs import pure_dp_rdp
    from components.draws.annex import load_annex
    from components.draws.data import train_rows
    from components.policy import load_policy
    from flows.private_selection import run_private_selection

    settings = org["settings"]
    pol = load_policy(org["policy"])
    frac = float(pol.spec.population.epsilon_fraction)
    eps_ns = [1 * frac, 2 * frac]
    plain = stages.plan(settings, org["policy"], base_dir=org["base"])["plan"]
    victim = train_rows(load_annex(settings.private_dir, plain))["user_id"].to_pylist()[0]
    budget = Budget(16.0, 1e-4)
    led = Ledger.open(settings)
    try:
        cap = led.rdp_budget(budget)
        both = sum(pure_dp_rdp(e, led.orders) for e in eps_ns)
        one = pure_dp_rdp(max(eps_ns), led.orders)
        # what the plain plan's own N̂ already charged them (a plan is charged when it is written)
        spent = np.asarray(led.spend([victim])[victim], dtype=float)
        cost = np.maximum(cap - spent - 0.7 * both, 0.0)
        assert np.any(spent + cost + one <= cap) and not np.any(spent + cost + both <= cap)
        res = led.reserve(kind="user", mechanism="uls", plan_sha256=None, params={}, budget=budget,
                          costs={victim: PersonCost(rows=1, sampling_rate=1.0, rdp=cost)})
        assert res.admitted == (victim,)
    finally:
        led.dispose()
    doc = run_private_selection(settings, org["policy"], _grid(tmp_path, eps=(1, 2)), base_dir=org["base"],
                                rng=random.Random(2))
    plans = _plans(settings, doc)
    assert len(plans) == 2
    for p in plans:
        annex = load_annex(settings.private_dir, p)
        assert victim not in set(train_rows(annex)["user_id"].to_pylist())
        assert victim not in set(annex.get("eval_users") or ())
        assert victim not in set(annex.get("held_out_users") or ())


def _k_of(settings, doc) -> int:
    return json.loads((settings.private_dir / "studies" / doc["study_id"] / "trials.json").read_text())["k"]


def test_nothing_published_reveals_k(org, fake_trials, tmp_path):
    """Two selections on the same data and one grid point, one with K = 1 and one with K ≥ 4, publish
    the same document (up to the study's id, folder, plan hashes — the plan names its policy file's
    path — and ledger release numbers), through the gate; the
    study folder holds no trial folders, and its time and the file's say the start, not the end."""
    from components.accounting.private_selection import draw_trials
    from components.publication.gate import recording
    from flows.private_selection import run_private_selection

    settings = org["settings"]
    grid = _grid(tmp_path, "private_selection: {eta: 1, gamma: 0.25}\n", eps=(8,))
    ks = {s: draw_trials("truncated-negative-binomial", eta=1, gamma=0.25, rng=random.Random(s)) for s in range(60)}
    seeds = [min(s for s, k in ks.items() if k == 1), min(s for s, k in ks.items() if k >= 4)]
    docs, recs = [], []
    for seed in seeds:
        first = len(fake_trials)
        with recording() as rec:
            doc = run_private_selection(settings, org["free"], grid, base_dir=org["base"], rng=random.Random(seed))
        assert _k_of(settings, doc) == ks[seed]
        docs.append(doc), recs.append(rec)
        out = Path(doc["dir"])
        assert not (out / "runs").exists() and not any("trial" in p.name for p in out.rglob("*"))
        for p in (out, out / "selection.json"):
            # (the change time cannot be set: when the result appears is said in the docs as a channel)
            assert p.stat().st_mtime <= fake_trials[first]["at"], "the folder's or file's time gives the duration"
    assert len(fake_trials) == sum(ks[s] for s in seeds)
    assert all(str(c["out_dir"]).startswith(str(settings.private_dir)) for c in fake_trials)
    # each trial its own run folder, hence its own fresh private seed (Poisson batches, noise): independent runs
    assert len({str(c["out_dir"]) for c in fake_trials}) == len(fake_trials)

    def public(d):
        def strip(x):
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items()
                        if k not in ("study_id", "dir", "ledger_release_id", "selection_release_id", "plan_sha256")}
            return [strip(v) for v in x] if isinstance(x, list) else x
        return json.dumps(strip(d), sort_keys=True, default=str)

    assert public(docs[0]) == public(docs[1])
    for rec in recs:
        sent = [r for r in rec if r.channel == "selection"]
        assert sent, "the selection's JSON does not go through the publication gate"
        # (grid.points.k and selected.k are a point's records per user, a grid value)
        assert not {"seconds", "k", "trials", "runs"} & {seg for r in sent if not r.path.startswith(("grid.", "selected."))
                                                         for seg in r.path.split(".")}
