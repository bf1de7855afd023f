"""`veil study`: grid parsing, a tiny grid through the Prefect flow (thread and Dask runners), the
table, the plot and MLflow's parent/child runs; no ledger charge, no registration, no certificate
for the non-private point; private selection charged to the ledger as computed independently."""
from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from components.core.errors import VeilError
from flows import stages
from flows.study_grid import parse_grid

pytestmark = pytest.mark.slow

MAPPING = {"id_field": "id", "time_field": "ts", "metadata_fields": ["team", "path"]}


def _grid(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- grid parsing ----------------------------------------------------------------------------------
def test_grid_expands_axes_and_collapses_nonprivate_over_epsilon(tmp_path):
    g = parse_grid(_grid(tmp_path, """
name: t1
axes:
  mechanism: [uls, group, non-private]
  epsilon: [2, 8]
points:
  - {mechanism: uls, epsilon: 4, selection: random-chunk, k: 3, lora: false}
training: {steps: 5}
"""))
    keys = [p.key for p in g.points]
    assert keys == ["uls-e2-lora", "uls-e8-lora", "group-e2-lora", "group-e8-lora", "non-private-lora",
                    "uls-e4-random-chunk-k3-full"]
    assert g.training == {"steps": 5} and g.name == "t1" and len(g.sha256) == 64


@pytest.mark.parametrize("text,msg", [
    ("axes: {mechanism: [dpsgd]}", "axes (combination 1).mechanism: 'dpsgd' is not one of"),
    ("axes: {mechanism: [uls], epsilon: [0]}", "epsilon: 0 is not a finite number > 0"),
    ("axes: {mechanism: [uls]}", "needs an epsilon"),
    ("axes: {mechanism: [els], epsilon: [1], selection: [random-chunk]}", "random-chunk works with uls only"),
    ("axes: {sigma: [1]}", "unknown axis 'sigma'"),
    ("points: [{mechanism: uls, epsilon: 1, colour: red}]", "points[0]: unknown key 'colour'"),
    ("grid: 1", "unknown key 'grid'"),
    ("axes: {mechanism: uls}", "axes.mechanism: a non-empty list"),
    ("axes: {mechanism: [uls], epsilon: [1]}\ntraining: {steps: yes}", "training.steps"),
    ("axes: {mechanism: [uls], epsilon: [1]}\nprivate_selection: {gamma: 2}", "gamma must be in (0, 1)"),
    ("axes: [mechanism: [uls]", "not valid YAML"),
    ("name: t\n", "the grid has no points"),
])
def test_grid_errors_are_one_line(tmp_path, text, msg):
    with pytest.raises(VeilError) as e:
        parse_grid(_grid(tmp_path, text))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_grid_exits_2_with_one_line(tmp_path, veil_home):
    from flows.cli import app

    g = _grid(tmp_path, "axes: {mechanism: [dpsgd]}")
    r = CliRunner().invoke(app, ["study", "--policy", str(stages.DEMO_POLICY), "--grid", str(g)])
    assert r.exit_code == 2
    assert "is not one of" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["study", "--policy", str(stages.DEMO_POLICY), "--grid", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "no such file" in r.output


# -- a tiny study on the demo organization ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_home(tmp_path_factory):
    """One demo organization, ingested once, and a tiny public base for every study test here (the
    ledger accumulates across them: the private-selection test runs last)."""
    import os

    from components.core.settings import load_settings
    from components.modeling import build_base_model

    root = tmp_path_factory.mktemp("study")
    home = root / "home"
    home.mkdir()
    old = os.environ.get("VEIL_HOME")
    os.environ["VEIL_HOME"] = str(home)
    try:
        s = load_settings(home).ensure()
        org = stages.demo_data(s)
        texts = [json.loads(line)["text"] for line in open(org["public"])][:300]
        base = build_base_model(texts, root / "base", vocab_size=512, n_layer=1, n_embd=32, n_head=2,
                                n_positions=64, steps=3, seq_len=64, batch_size=8, progress=False)
        stages.ingest(s, org["messages"], "jsonl", policy=stages.DEMO_POLICY, **MAPPING)
        doc = yaml.safe_load(stages.DEMO_POLICY.read_text())
        doc["spec"]["training"].update(steps=2, expected_batch_size=8, seq_len=32, micro_batch_size=16)
        doc["spec"]["audit"]["attacker_samples_per_user"] = 2
        doc["spec"]["evaluation"] = {"fraction": 0.2}
        pol = root / "tiny.yaml"
        pol.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield {"home": home, "base": base, "policy": pol}
    finally:
        if old is None:
            os.environ.pop("VEIL_HOME", None)
        else:
            os.environ["VEIL_HOME"] = old


@pytest.fixture
def tiny(tiny_home, monkeypatch):
    from components.core.settings import load_settings

    monkeypatch.setenv("VEIL_HOME", str(tiny_home["home"]))
    return {**tiny_home, "settings": load_settings(tiny_home["home"]).ensure()}


def _ledger_releases(settings):
    """Training (and selection) releases: a point's plan publishes its N̂, a release of its own (kind
    'population', charged when the plan is written), which a study pays for like any plan."""
    from sqlalchemy import select

    from components.ledger import Ledger
    from components.ledger import store as st

    led = Ledger.open(settings)
    try:
        with st.read_only(led.engine) as conn:
            kinds = [r.kind for r in conn.execute(select(st.releases.c.kind))]
    finally:
        led.dispose()
    return sum(1 for k in kinds if k != "population")


def test_tiny_study_through_prefect(prefect_harness, tiny, tmp_path):
    settings = tiny["settings"]
    from mlflow import MlflowClient

    from flows.study import run_study

    grid = _grid(tmp_path, """
name: tiny
axes:
  mechanism: [uls, non-private]
  epsilon: [8]
eval: {max_records: 40}
""")
    doc = run_study(settings, tiny["policy"], grid, base_dir=tiny["base"])
    rows = {r["key"]: r for r in doc["rows"]}
    assert set(rows) == {"uls-e8-lora", "non-private-lora"}
    for r in rows.values():
        assert math.isfinite(r["perplexity"]) and r["perplexity"] > 1 and 0 <= r["next_token_accuracy"] <= 1
        assert r["certified"] is False
    assert rows["non-private-lora"]["noise_multiplier"] == 0.0 and rows["non-private-lora"]["epsilon"] is None
    assert rows["uls-e8-lora"]["plan_epsilon"] <= 8.0 + 1e-9
    assert doc["same_eval_texts"] and doc["covered_by_certificate"] is False
    assert "not covered by any certificate" in doc["caveat"]
    out = Path(doc["dir"])
    assert out.parent == settings.home / "studies"
    png = out / "privacy_utility.png"
    assert png.is_file() and png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_text = (out / "results.csv").read_text()
    assert "uls-e8-lora" in csv_text and "eval_records" not in csv_text
    assert json.loads((out / "results.json").read_text())["study_id"] == doc["study_id"]
    assert len(doc["gap_closing"]) == 1 and doc["gap_closing"][0]["nonprivate_key"] == "non-private-lora"
    # MLflow: one parent, one child per point, the plot and the table on the parent
    client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    pid = doc["mlflow"]["parent_run_id"]
    kids = [client.get_run(c) for c in doc["mlflow"]["child_run_ids"]]
    assert all(k.data.tags["mlflow.parentRunId"] == pid for k in kids) and len(kids) == 2
    parent = client.get_run(pid)
    assert parent.data.tags["veil.study.covered_by_certificate"] == "false"
    # the measured utility is exact (evaluation people's private text): it stays in the study folder and
    # on the operator's terminal; the registry gets the points' public settings and their plans' ε only
    assert not list(client.list_artifacts(pid))
    for k in kids:
        assert set(k.data.metrics) <= {"plan_epsilon"}
        assert not {"perplexity", "next_token_accuracy", "mean_nll"} & set(k.data.metrics)
    assert "eval_records" not in csv_text and "eval_people" not in csv_text and "eval_tokens" not in csv_text
    # tuning runs are not releases: nothing charged, nothing registered, the plans' run folders untouched
    assert _ledger_releases(settings) == 0
    assert client.search_registered_models() == []
    for r in rows.values():
        assert not (settings.runs_dir / r["plan_sha256"][:16]).exists()


def test_cli_study_json(prefect_harness, tiny, tmp_path, capfd):
    """`veil study … --json` prints one JSON document (run in this process, as tests/flows/test_retrain.py
    does: CliRunner's swapped streams outlive the test in Prefect's log handlers)."""
    import contextlib
    import io

    from flows.cli import app

    from datetime import datetime, timezone

    from _output import assert_quiet, harness_log_text

    grid = _grid(tmp_path, "axes: {mechanism: [uls], epsilon: [8]}\neval: {max_records: 20}\n", "cli.yaml")
    buf = io.StringIO()
    capfd.readouterr()
    since = datetime.now(timezone.utc)
    with contextlib.redirect_stdout(buf):
        app(["study", "--policy", str(tiny["policy"]), "--grid", str(grid), "--base-model", str(tiny["base"]),
             "--json"], standalone_mode=False)
    doc = json.loads(buf.getvalue())
    seen = capfd.readouterr()
    # the terminal and the study's Prefect log hold Veil's lines only (issue 26)
    assert_quiet(seen.out + seen.err, "veil study's terminal output")
    assert_quiet(harness_log_text(since), "veil study's Prefect log")
    assert doc["covered_by_certificate"] is False and [r["key"] for r in doc["rows"]] == ["uls-e8-lora"]
    assert Path(doc["plot"]).is_file()


def test_nonprivate_run_never_gets_a_certificate(tiny, tmp_path):
    settings = tiny["settings"]
    from components.certificate import build_certificate
    from components.planning import load_plan
    from flows.study import nonprivate_adjust

    planned = stages.plan(settings, tiny["policy"], base_dir=tiny["base"])
    res = stages.train(settings, planned["plan_path"], tiny["base"], progress=False, release=False,
                       out_dir=tmp_path / "np", adjust=nonprivate_adjust)
    assert res["mechanism"] == "nonprivate" and res["noise_multiplier"] == 0.0
    with pytest.raises(VeilError, match="not certifiable|nonprivate"):
        build_certificate(load_plan(planned["plan_path"]).to_dict(), res)
    with pytest.raises(VeilError, match="own out_dir"):
        stages.train(settings, planned["plan_path"], tiny["base"], progress=False, release=False)
    assert _ledger_releases(settings) == 0


def test_dask_runner_matches_the_flow(prefect_harness, tiny, tmp_path):
    settings = tiny["settings"]
    pytest.importorskip("prefect_dask")
    from flows.study import run_study

    grid = _grid(tmp_path, "axes: {mechanism: [uls], epsilon: [4, 8]}\neval: {max_records: 20}\n", "d.yaml")
    doc = run_study(settings, tiny["policy"], grid, base_dir=tiny["base"], task_runner="dask", workers=2,
                    dask_processes=False, log_mlflow=False)
    assert [r["key"] for r in doc["rows"]] == ["uls-e4-lora", "uls-e8-lora"]
    assert all(math.isfinite(r["perplexity"]) for r in doc["rows"])


def test_private_selection_charges_the_ledger_as_computed_independently(tiny, tmp_path):
    settings = tiny["settings"]
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from components.ledger import Ledger
    from components.renyi.rdp import ORDERS
    from components.planning import load_plan
    from flows.private_selection import run_private_selection

    grid = _grid(tmp_path, """
name: ps
axes: {mechanism: [uls], epsilon: [8]}
eval: {max_records: 20}
private_selection: {distribution: truncated-negative-binomial, eta: 1, gamma: 0.8, score_clip: 10, score_noise: 3}
""", "ps.yaml")
    doc = run_private_selection(settings, tiny["policy"], grid, base_dir=tiny["base"], rng=random.Random(3))
    sel = doc["selection"]
    assert doc["selected"]["key"] == "uls-e8-lora"
    assert not {"k", "trials", "scores"} & (set(sel) | set(doc))  # K and the losing trials stay private
    # independent computation: the point's ULS curve (dp-accounting), the score's Gaussian curve, the
    # max of both, then Theorem 2 with η = 1 (E[K] = 1/γ); plus the plan's N̂ (Laplace, pure DP), which
    # is released with the plan before any trial and composes outside the theorem
    pol_sha = hashlib.sha256((Path(doc["dir"]) / "policies" / "uls-e8-lora.yaml").read_bytes()).hexdigest()
    plan = next(p for p in (load_plan(f).to_dict() for f in settings.plans_dir.glob("*.json"))
                if p["policy"]["sha256"] == pol_sha)
    acc = RdpAccountant(orders=list(ORDERS))
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        plan["sampling_rate"], dp_accounting.GaussianDpEvent(plan["noise_multiplier"])), plan["steps"]))
    a = np.asarray(ORDERS)
    eps_n = plan["data"]["population"]["epsilon"]
    train_curve = np.asarray(acc._rdp)
    q_curve = np.maximum(train_curve, a / (2 * 3.0 ** 2))
    hat = min([2 * math.log(1 / 0.8)] + [2 * (1 - 1 / h) * c + 2 * math.log(1 / 0.8) / h for h, c in zip(a, q_curve)])
    want = q_curve + hat + math.log(1 / 0.8) / (a - 1) + np.minimum(eps_n, a * eps_n ** 2 / 2)
    want_eps = min(want + math.log(1 / plan["target"]["delta"]) / (a - 1))
    assert sel["epsilon"] == pytest.approx(want_eps, rel=1e-9)
    led = Ledger.open(settings)
    try:
        rows = led.person_rows()
    finally:
        led.dispose()
    # the study's tuning runs charge no training; the selection is one release (the plan's N̂ is another,
    # of kind 'population', charged when the plan was written: not counted by _ledger_releases)
    assert rows and _ledger_releases(settings) == 1
    # the score's sensitivity is B only if each person's scored texts depend on that person alone
    from flows.private_selection import score_texts

    users, texts = score_texts(settings, plan, 2, set())
    assert users and max(users.count(u) for u in set(users)) <= 2
    gone = users[0]
    u2, t2 = score_texts(settings, plan, 2, {gone})
    assert list(zip(u2, t2)) == [(u, t) for u, t in zip(users, texts) if u != gone]
    trials = json.loads((settings.private_dir / "studies" / doc["study_id"] / "trials.json").read_text())
    assert trials["k"] >= 1 and len(trials["trials"]) == trials["k"]
