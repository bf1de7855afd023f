"""The neighbour harness (issue 22): whole scenarios run on D and on D without one person, same keys.

A scenario is a scripted sequence of Veil's real stages (planning with the ledger's exclusions and its
N̂ charge, the training reservation, the certificate) over an organization's life: retraining on
growing data, a new base on an unchanged snapshot, two release lines, a person retired mid-way, a
secret release, a multi-owner release. Everything the stages publish passes the publication gate,
whose recorder (`components.publication.recording`) hands the harness every published leaf with its
declaration. For each removed person u the harness diffs the two runs' published outputs and checks:

  * a differing leaf is DP-released (or a post-processing of a DP release), and u's ledger holds a
    charge for that release in the run on D; or it is public only under a relation the release
    claims (secret substitution, replace-one), and the release then charges no person;
  * a differing PUBLIC leaf (public "by construction") fails; an UNCOVERED one fails when more than
    10 % of the removed people move it;
  * every person a published N̂ counted holds that N̂'s charge (retired or not), and each N̂ release
    is charged once per distinct counted population.

Training itself is not run: the weights are the DP-SGD release whose charge the reservation holds,
and the certificate is issued from the plan and a bound run (tests/bound_run.py) exactly as for a
trained one. Runs small in `make test` (tests/privacy/test_neighbour_scenarios.py) and large in
bench/neighbours.py.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import importlib.util
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from components.core.hashing import sha256_bytes
from components.publication import Kind, Published, recording

ROOT = Path(__file__).resolve().parents[2]
WORDS = "alpha beta gamma delta budget review launch invoice meeting roadmap deploy fix".split()


def _helper(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bound_run = _helper("bound_run")


# --- the organization ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Snap:
    """A snapshot as the planner reads it (the catalog's Snapshot has the same attributes)."""
    snapshot_id: str
    sha256: str
    records: pa.Table
    secret_spans: pa.Table
    manifest: dict


SPAN_SCHEMA = pa.schema([("record_id", pa.string()), ("secret_id", pa.string()), ("secret_class", pa.string()),
                         ("detector", pa.string()), ("detector_version", pa.string()), ("start", pa.int64()),
                         ("end", pa.int64())])


def organization(n_people: int, seed: int, *, weeks: int = 1, owners: bool = False) -> list[dict]:
    """Records of `n_people` over `weeks` weeks: (record_id, user_id, text, week[, owners]); secrets
    (codename/credential) tagged in some texts."""
    rng = np.random.default_rng(seed)
    people = [f"p{u:03d}@org.example" for u in range(n_people)]
    rows = []
    for u, who in enumerate(people):
        for w in range(weeks):
            for j in range(int(rng.integers(1, 5))):
                text = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 16))))
                secret = None
                if rng.random() < 0.3:
                    cls = "codename" if rng.random() < 0.5 else "credential"
                    secret = f"{cls}:S{int(rng.integers(0, 8))}"
                rid = sha256_bytes(f"{who}\x00{w}\x00{j}\x00{text}".encode())
                row = {"record_id": rid, "user_id": who, "text": text, "week": w, "secret": secret}
                if owners:
                    others = [people[int(x)] for x in rng.choice(n_people, size=int(rng.integers(0, 3)), replace=False)]
                    row["owners"] = sorted({who, *others})
                rows.append(row)
    return rows


def snapshot(rows: list[dict], *, upto_week: int | None = None, without: str | None = None) -> Snap:
    """The snapshot of `rows` (up to a week), less every record `without` authors or owns."""
    keep = [r for r in rows if (upto_week is None or r["week"] <= upto_week)
            and r["user_id"] != without and without not in (r.get("owners") or ())]
    # recipients as the mail connector writes them (metadata to/cc): the policy's people rules make them
    # owners (components.bounding.people), exactly as for a catalog snapshot
    meta = [json.dumps({"to": [o for o in r["owners"] if o != r["user_id"]]}) if r.get("owners") else "{}"
            for r in keep]
    cols = {"record_id": [r["record_id"] for r in keep], "user_id": [r["user_id"] for r in keep],
            "text": [r["text"] for r in keep], "source": ["mail"] * len(keep),
            "created_at": [None] * len(keep), "metadata": meta}
    spans = [{"record_id": r["record_id"], "secret_id": r["secret"], "secret_class": r["secret"].split(":")[0],
              "detector": "literal", "detector_version": "1", "start": 0, "end": 1} for r in keep if r["secret"]]
    digest = sha256_bytes("".join(cols["record_id"]).encode())
    # named as the catalog names a snapshot: its id is a content hash (D and D − u differ), which is why
    # public documents carry only a salted commitment to it (issue 22); the date is the same for both
    return Snap(f"snap-{digest[:16]}", digest, pa.table(cols), pa.Table.from_pylist(spans, schema=SPAN_SCHEMA),
                {"created_at": "2026-11-01T00:00:00+00:00"})


# --- policies ----------------------------------------------------------------------------------------------

def policy(tmp: Path, name: str, *, base: str = "demo.yaml", steps: int = 6, batch: int = 4,
           budget: tuple[float, float] | None = (16.0, 1e-4), epsilon: float | None = 2.0,
           edit: Callable[[dict], None] | None = None) -> Path:
    """A variant of a shipped policy, small enough to plan in well under a second."""
    doc = yaml.safe_load((ROOT / "policies" / base).read_text())
    spec = doc["spec"]
    spec["training"]["steps"] = steps
    spec["training"]["expected_batch_size"] = batch
    spec.setdefault("population", {})["epsilon_fraction"] = 0.25   # N̂ well above the batch for a small org
    spec["audit"]["canaries"] = {**(spec["audit"].get("canaries") or {}), "users": 0}
    if budget is None:
        spec.pop("lifetime_budget", None)
    else:
        spec["lifetime_budget"] = {"epsilon": budget[0], "delta": budget[1]}
    if epsilon is not None and "target" in spec:      # a secret policy's targets are per class
        spec["target"]["epsilon"] = epsilon
    if edit:
        edit(spec)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


# --- one run of a scenario -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    published: list[Published]
    plans: list[dict]                 # the public plans, in order
    annexes: list[dict]               # their private annexes
    settings: object
    # releases beyond plans and certificates, as the stages returned them (D run: what prices a field)
    evaluations: dict = dataclasses.field(default_factory=dict)   # run id → the evaluation release
    selections: dict = dataclasses.field(default_factory=dict)    # study id → the selection release
    pmixeds: dict = dataclasses.field(default_factory=dict)       # certificate sha → the PMixED build's release
    home: str = ""
    # each stage call of the scenario, in order: {"kind", "start" (index of its first published leaf),
    # "outcome" ("ok", "nothing", "refused on N̂" or "refused: <why>"), "keys" (the N̂ release keys drawn)}
    steps: list = dataclasses.field(default_factory=list)
    refused_counted: dict = dataclasses.field(default_factory=dict)  # refused N̂'s release key → who it counted


_MLFLOW_TEMPLATE: Path | None = None


REFUSED_ON_N = "refused on N̂"
EVERYONE_RETIRED = "everyone retired"     # the training reservation's filter admitted no one


def _stage(kind: str):
    """A stage call of a scenario: one step of the run (the harness aligns D's and D − u's documents by
    step, and finds the first step whose outcome differs)."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(self, *a, **k):
            step = {"kind": kind, "start": len(self.rec) if self.rec is not None else 0, "outcome": "ok", "keys": []}
            self.steps.append(step)
            out = fn(self, *a, **k)
            if out is None and step["outcome"] == "ok":
                step["outcome"] = "nothing"
            return out
        return wrapper
    return deco


class Home:
    """A VEIL_HOME with fixed keys: the plan key and the ledger key are the scenario's, so D and D − u
    draw with the same keys (the harness compares like with like)."""

    def __init__(self, path: Path, key: bytes):
        from components.core.settings import load_settings
        from components.ledger.keys import key_path
        from components.draws.annex import KEY_FILE

        self.settings = load_settings(path).ensure()
        private = Path(self.settings.private_dir)
        (private / KEY_FILE).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        (private / KEY_FILE).write_bytes(sha256_bytes(b"plan" + key).encode()[:32])
        key_path(private).write_bytes(sha256_bytes(b"ledger" + key).encode()[:32])
        self.plans: list[dict] = []
        self.annexes: list[dict] = []
        self.refusals: list[str] = []
        self.rec: list | None = None           # the run's recorder (set by run())
        self.steps: list[dict] = []
        self.refused_counted: dict[str, set] = {}
        self.key = key
        self.weights: dict[str, str] = {}      # plan sha → the released weights' fingerprint
        self.evaluations: dict[str, dict] = {}
        self.selections: dict[str, dict] = {}
        self.pmixeds: dict[str, dict] = {}
        self._runs = 0

    def _refused(self, e) -> None:
        """A stage refused (VeilError): a refusal on N̂ alone (`PopulationRefusal`, a post-processing of the
        DP estimate) is told apart from any other, and the people that N̂ counted are kept (the check that
        they hold its charge)."""
        from components.renyi.costs import person_rates
        from components.mechanisms.gaussian import PopulationRefusal

        self.refusals.append(str(e))
        step = self.steps[-1]
        if "spent their lifetime budget" in str(e):
            step["outcome"] = EVERYONE_RETIRED      # the ledger's filter, person by person: nobody left to count
        elif isinstance(e, PopulationRefusal):
            step["outcome"] = REFUSED_ON_N
            step["keys"].append(e.release_key)
            self.refused_counted[e.release_key] = set(person_rates(e.persons, 0.0)) if e.persons is not None else set()
        else:
            step["outcome"] = f"refused: {e}"

    def _drew(self, annex: dict) -> None:
        key = (annex.get("population") or {}).get("release_key")
        if key and self.steps:
            self.steps[-1]["keys"].append(key)

    # the stages, as the pipeline calls them --------------------------------------------------------
    @_stage("plan")
    def plan(self, policy_path: Path, snap: Snap, *, exclude_exhausted: bool = True,
             compute: dict | None = None) -> dict | None:
        """The retraining flow's planning: exhausted people out, then the plan (N̂ charged). None when the
        planner refuses (nothing is published then)."""
        from components.core.errors import VeilError
        from components.policy import load_policy
        from flows import stages

        pol = load_policy(policy_path)
        excluded = stages.exhausted_people(self.settings, pol, snap.records["user_id"].to_pylist()) \
            if exclude_exhausted else set()
        try:
            res = stages.plan_snapshot(self.settings, policy_path, snap, exclude_people=excluded, compute=compute)
        except VeilError as e:
            self._refused(e)
            return None
        self.plans.append(res["plan"])
        self.annexes.append(stages._annex(self.settings, res["plan"]))
        self._drew(self.annexes[-1])
        return res["plan"]

    @_stage("release")
    def release(self, plan: dict, snap: Snap) -> dict | None:
        """The training reservation, then the certificate of a bound run (the weights' release)."""
        if plan is None:
            return None
        from components.accounting.secrets import secret_targets
        from components.certificate import build_certificate
        from components.draws.data import train_rows
        from flows import stages

        out = Path(self.settings.runs_dir) / plan["sha256"][:16]
        self.steps[-1]["plan"] = plan["sha256"]
        annex = stages._annex(self.settings, plan)
        orig = stages._plan_snapshot
        stages._plan_snapshot = lambda _s, _p: snap          # the snapshot the plan was made from
        try:
            try:
                reservation = stages.reserve(self.settings, plan, annex, out)
            except Exception as e:                           # everyone retired: nothing released
                if "spent their lifetime budget" in str(e):
                    self.steps[-1]["outcome"] = EVERYONE_RETIRED
                    return None
                raise
        finally:
            stages._plan_snapshot = orig
        # the weights stand-in: a function of what DP-SGD reads (the training rows and the plan's σ, q, T,
        # C), as trained weights are; not of the plan's sha (which also moves with fields training never
        # reads, e.g. when an evaluation person is removed)
        from components.draws.data import training_records

        rows = training_records(plan, annex, snap.records)
        wdir = out / "weights"
        wdir.mkdir(parents=True, exist_ok=True)
        (wdir / "adapter_model.safetensors").write_bytes(b"weights of " + sha256_bytes(json.dumps(
            [rows.column("user_id").to_pylist(), rows.column("text").to_pylist(), plan["noise_multiplier"],
             plan["sampling_rate"], plan["steps"], plan["clip_norm"]], default=str).encode()).encode())
        (wdir / "adapter_config.json").write_text("{}")
        result = {"steps_run": plan["steps"], "steps_attempted": plan["steps"], "mechanism": plan["mechanism"],
                  "noise_multiplier": plan["noise_multiplier"], "sampling_rate": plan["sampling_rate"],
                  "clip_norm": plan["clip_norm"], "private_seed_source": "os_entropy",
                  **bound_run.binding(plan, weights_dir=out / "weights")}
        if plan["mechanism"] == "uls-filtered":
            result["extra"]["filter"] = dict(plan["filter"])
        kw = {}
        if plan["mechanism"] == "secret":
            kw["secret_targets"] = secret_targets(train_rows(annex), snap.secret_spans, plan["target"]["secrets"])
        build_certificate(plan, result, created_at="2026-11-02T00:00:00+00:00", version="veil harness", **kw)
        self.weights[plan["sha256"]] = json.dumps(result["weights"], sort_keys=True)
        return reservation

    def mlflow_store(self) -> None:
        """A fresh MLflow store under this VEIL_HOME: a copy of an empty, migrated sqlite store made once per
        process (MLflow's migrations cost seconds per store; the copy is the same empty store)."""
        global _MLFLOW_TEMPLATE
        import shutil
        import tempfile

        uri = str(self.settings.mlflow_tracking_uri)
        if not uri.startswith("sqlite:///"):
            return
        db = Path(uri[len("sqlite:///"):])
        if db.exists():
            return
        if _MLFLOW_TEMPLATE is None or not _MLFLOW_TEMPLATE.exists():
            import mlflow

            tmpl = Path(tempfile.mkdtemp(prefix="veil-harness-mlflow-")) / "mlflow.db"
            mlflow.tracking.MlflowClient(f"sqlite:///{tmpl}").search_experiments()
            _MLFLOW_TEMPLATE = tmpl
        shutil.copyfile(_MLFLOW_TEMPLATE, db)

    def mlflow_run(self, name: str) -> str:
        """A run in the Home's own MLflow store (settings.mlflow_tracking_uri, under VEIL_HOME), its id drawn
        from the scenario's key: a run id is public randomness, so D and D − u get the same one (as they get
        the same keys) and a difference downstream is the data's, not MLflow's uuid4."""
        import types
        import uuid
        from unittest import mock

        import mlflow
        from mlflow.store.tracking import sqlalchemy_store

        self._runs += 1
        self.mlflow_store()
        rid = uuid.UUID(bytes=bytes.fromhex(sha256_bytes(b"run" + self.key + str(self._runs).encode())[:32]))
        from components.registry.mlflow_registry import _client, _experiment

        client = _client(self.settings)
        exp_id = _experiment(self.settings, name)
        with mock.patch.object(sqlalchemy_store, "uuid", types.SimpleNamespace(uuid4=lambda: rid)):
            return client.create_run(exp_id).info.run_id

    @_stage("evaluate")
    def evaluate(self, plan: dict, snap: Snap, *, fake_scores: Callable | None = None) -> dict | None:
        """`stages.evaluate` after a release, on the plan's evaluation people, without a model: each text's
        statistics are a fixed function of the text and of the *training data the weights saw* (so they
        move with a trained person, as the real weights would), then the real release: the ledger charge,
        the keyed noise, the registry's gate and MLflow (`publish_evaluation`)."""
        if plan is None or plan["sha256"] not in self.weights:
            return None
        from components.core.errors import VeilError
        from components.core.hashing import sha256_json
        from components.evaluation.dp import person_means
        from components.evaluation.release import publish_evaluation
        from components.registry import record_evaluation
        from components.draws.data import evaluation_records, training_records
        from flows import stages

        annex = stages._annex(self.settings, plan)
        rows = evaluation_records(plan, annex, snap.records, single_owner=True)
        if rows.num_rows == 0:
            return None
        texts, users = rows.column("text").to_pylist(), rows.column("user_id").to_pylist()
        seen = set(" ".join(training_records(plan, annex, snap.records).column("text").to_pylist()).split())
        stats = {}
        for name, learned in (("model", seen), ("base", set())):
            sums, counts, hits = [], [], []
            for t in texts:
                words = t.split()
                h = int(sha256_bytes(f"{name}\x00{t}".encode())[:8], 16) / 16 ** 8
                nll = 2.0 + 6.0 * h - 0.1 * sum(w in learned for w in words)
                sums.append(-nll * len(words))
                counts.append(len(words))
                hits.append(sum(w in learned for w in words))
            stats[name] = person_means(users, np.array(sums), np.array(counts), np.array(hits, dtype=float))
        if fake_scores:
            stats = fake_scores(stats)
        run_id = self.mlflow_run("harness-" + plan["sha256"][:8])
        params = stages.evaluation_params(plan)
        try:
            rel = publish_evaluation(self.settings, plan=plan, run_id=run_id,
                                     models={"model": "run:" + run_id, "base": "base:" + sha256_json({"b": 1})},
                                     per_model=stats, epsilon=float(params.epsilon), delta=float(params.delta),
                                     nll_clip=float(params.nll_clip), record=record_evaluation)
        except VeilError as e:
            self._refused(e)
            return None
        self.steps[-1]["release_ids"] = [int(rel.release_id)]
        self.evaluations[run_id] = {"release_name": rel.release_name, "release_id": rel.release_id,
                                    "plan_sha256": plan["sha256"]}
        return self.evaluations[run_id]


    @_stage("select")
    def select(self, policy_path: Path, grid_path: Path, snap: Snap) -> dict | None:
        """`veil study --private-selection` (flows/private_selection.py, real: the exclusions, every point
        planned with its N̂ charged, the selection theorem's reservation, the published `selection`
        document), with what needs a model replaced as tests/privacy/test_private_selection_composition.py
        does: the catalog's snapshot is `snap`, a trial's training is a no-op, its score is the real
        per-person clipped sum over the real evaluation records, of a fixed per-text NLL, minus the point's
        ε. The public randomness (the study id, K and the points drawn, the score noise) comes from the
        scenario's key, so D and D − u draw the same."""
        import random
        from unittest import mock

        import catalog.snapshots
        import flows.private_selection as ps
        import flows.study as study
        from components.core.errors import VeilError
        from flows import stages

        home = self
        seed = int(sha256_bytes(b"selection" + self.key)[:16], 16)
        base = Path(self.settings.private_dir) / "harness-base"

        def plan(settings, pp, *, base_dir=None, exclude_people=None, **kw):
            res = stages.plan_snapshot(settings, pp, Snap(snap.snapshot_id, snap.sha256, snap.records,
                                                          snap.secret_spans, snap.manifest),
                                       exclude_people=exclude_people)
            home.plans.append(res["plan"])
            home.annexes.append(stages._annex(settings, res["plan"]))
            home._drew(home.annexes[-1])
            return res

        def new_study_dir(settings, grid):
            sid = f"{grid.name}-harness-{seed % 10 ** 6:06d}"
            out = study.studies_dir(settings) / sid
            out.mkdir(mode=0o700, parents=True)
            return sid, out

        noise = np.random.default_rng(seed)

        def score(settings, plan_doc, base_dir, tr, params, excluded):
            users, texts = ps.score_texts(settings, plan_doc, int(params["score_records_per_person"]), excluded)
            nll = [2.0 + 6.0 * int(sha256_bytes(t.encode())[:8], 16) / 16 ** 8 for t in texts]
            counts = np.array([max(1, len(t.split())) for t in texts], dtype=float)
            return ps.noisy_score(users, -np.array(nll) * counts, counts, float(params["score_clip"]),
                                  float(params["score_noise"]), noise) - float(plan_doc["target"]["epsilon"])

        with mock.patch.object(catalog.snapshots, "load_snapshot", lambda *a, **k: snap), \
                mock.patch.object(stages, "plan", plan), \
                mock.patch.object(stages, "base_model", lambda *a, **k: str(base)), \
                mock.patch.object(stages, "train", lambda *a, **k: {}), \
                mock.patch.object(ps, "score_trial", score), \
                mock.patch.object(study, "new_study_dir", new_study_dir):
            try:
                doc = ps.run_private_selection(self.settings, policy_path, grid_path, base_dir=str(base),
                                               rng=random.Random(seed))
            except VeilError as e:
                self._refused(e)
                return None
        sel = doc["selection"]
        self.selections[doc["study_id"]] = {
            "release_id": int(sel["ledger_release_id"]),
            "plans": [e["plan_sha256"] for e in sel["composition"]["population_estimates"]],
            "population_releases": [int(e["ledger_release_id"]) for e in sel["composition"]["population_estimates"]]}
        return doc


    @_stage("pmixed")
    def pmixed(self, policy_path: Path, snap: Snap) -> dict | None:
        """`veil pmixed build` (flows/pmixed.py, real: people rules, the ledger's 'pmixed' reservation, the
        keyed partition, the certificate, the token budget, `register_ensemble` through the gate into the
        Home's MLflow store) with the shard training replaced, as the harness replaces DP-SGD: a shard's
        adapter is a stand-in whose hash is a function of the shard's texts (what training reads). The
        partition key and the commitment salt are the scenario's (fixed keys); the certificate's clock is
        fixed (public, not the data's)."""
        import datetime as dt
        import types
        from unittest import mock

        import catalog.snapshots
        import flows.pmixed as pm
        from components.core.errors import VeilError
        from components.prediction import release as prel
        from components.prediction.partition import KEY_FILE
        from flows import stages

        pdir = Path(self.settings.private_dir) / "pmixed"
        pdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for f, label in ((KEY_FILE, b"partition"), (prel.SALT_FILE, b"salt")):
            if not (pdir / f).exists():
                (pdir / f).write_bytes(bytes.fromhex(sha256_bytes(label + self.key)))
        base = Path(self.settings.private_dir) / "harness-pmixed-base"
        base.mkdir(exist_ok=True)
        (base / "config.json").write_text('{"model_type": "harness stand-in: never loaded"}')

        def train_shards(base_dir, shard_texts, cfg, outs, **kw):
            facts = []
            for texts, out in zip(shard_texts, outs):
                out.mkdir(parents=True, exist_ok=True)
                facts.append({"sha256": sha256_bytes(json.dumps(sorted(texts)).encode()), "records": len(texts)})
            return facts

        class _Clock(dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return dt.datetime(2026, 11, 2, tzinfo=tz)

        self.mlflow_store()
        with mock.patch.object(catalog.snapshots, "load_snapshot", lambda *a, **k: snap), \
                mock.patch.object(stages, "base_model", lambda *a, **k: str(base)), \
                mock.patch.object(pm, "train_shards", train_shards), \
                mock.patch.object(prel, "_dt", types.SimpleNamespace(datetime=_Clock, timezone=dt.timezone)):
            try:
                out = pm.build(self.settings, policy_path, base_dir=str(base), use_prefect=False)
            except VeilError as e:
                self._refused(e)
                return None
        cert = out["certificate"]
        self.pmixeds[cert["sha256"]] = {"policy_sha256": cert["policy"]["sha256"],
                                        "release_id": (cert.get("ledger") or {}).get("ledger_release_id")}
        return out


def run(scenario: Callable[[Home, Path, str | None], None], home_dir: Path, key: bytes, *,
        without: str | None, policies: Path) -> Run:
    home = Home(home_dir, key)
    policies.mkdir(parents=True, exist_ok=True)
    with recording() as rec:
        home.rec = rec
        scenario(home, policies, without)
    return Run(published=list(rec), plans=home.plans, annexes=home.annexes, settings=home.settings,
               evaluations=home.evaluations, selections=home.selections, pmixeds=home.pmixeds,
               home=str(Path(home_dir).resolve()), steps=home.steps, refused_counted=home.refused_counted)


# --- the checks ----------------------------------------------------------------------------------------------

def _docs(rec: list[Published], home: str = "", steps: list[dict] | None = None
          ) -> tuple[dict[tuple[str, int, int], dict[str, list]], dict, dict]:
    """(channel, step, n-th document of that channel in the step) → path → sorted values; (channel, path)
    → declaration; and that key → the document's subject. Documents are aligned by the scenario's step
    that published them, so a stage that published nothing on one side does not shift the later ones.
    The run's VEIL_HOME is written `$VEIL_HOME` in values (the D and D − u runs live in two folders;
    where a folder is is not the data's)."""
    out: dict[tuple[str, int, int], dict[str, list]] = {}
    order: dict[tuple[str, int], list[int]] = {}
    fields, subjects = {}, {}
    starts = [st["start"] for st in steps or ()]
    for i, p in enumerate(rec):
        step = bisect.bisect_right(starts, i) - 1
        calls = order.setdefault((p.channel, step), [])
        if not calls or calls[-1] != p.call:
            calls.append(p.call)
        doc = (p.channel, step, len(calls) - 1)
        d = out.setdefault(doc, {})
        subjects[doc] = p.subject
        v = json.dumps(p.value, sort_keys=True, default=str)
        d.setdefault(p.path, []).append(v.replace(home, "$VEIL_HOME") if home else v)
        fields[(p.channel, p.path)] = p.field
    for d in out.values():
        for k in d:
            d[k].sort()
    return out, fields, subjects


def person_charges(settings, person: str) -> set[int]:
    """The ledger releases that charged `person` (read from the private ledger)."""
    from sqlalchemy import select

    from components.ledger import Ledger
    from components.ledger import store as st

    led = Ledger.open(settings)
    try:
        with st.read_only(led.engine) as conn:
            rows = conn.execute(select(st.charges.c.release_id).where(
                st.charges.c.person_key == led.person_key(person))).all()
        return {int(r.release_id) for r in rows}
    finally:
        led.dispose()


def release_of_plan(settings, plan: dict, annex: dict, field) -> tuple[int | None, str]:
    """The ledger release that prices a DP plan field, and what it is."""
    from components.ledger import Ledger

    root = field.post_processing_of or f"plan:{field.pattern}"
    if root == "plan:data.population.estimate":
        key = (annex.get("population") or {}).get("release_key")
        if not key:
            return None, "population estimate without a release key"
        led = Ledger.open(settings)
        try:
            return led.population_release(key), "population estimate"
        finally:
            led.dispose()
    return None, root


# Leaks the harness found that are not fixed yet, each named by the issue that owns it. They are skipped
# by the diff (so the rest stays checked) and listed by `known_open` in every report.
KNOWN_OPEN: dict[tuple[str, str], str] = {}      # the snapshot id/sha256 (issue 22): now a salted commitment


@dataclasses.dataclass
class Finding:
    scenario: str
    person: str
    channel: str
    path: str
    why: str


def check_counted_charged(name: str, r: Run, people: list[str]) -> list[Finding]:
    """Everyone a published N̂ counted holds its charge, retired later or not; once per distinct N̂."""
    from components.draws.data import train_rows
    from components.renyi.costs import person_rates

    bad = []
    seen: dict[str, int] = {}
    for plan, annex in zip(r.plans, r.annexes):
        pop = (plan.get("data") or {}).get("population") or {}
        if pop.get("mechanism") != "laplace":
            continue
        key = (annex.get("population") or {}).get("release_key")
        rid, _ = release_of_plan(r.settings, plan, annex, _FieldRef())
        if rid is None:
            bad.append(Finding(name, "*", "plan", "data.population.estimate",
                               "a published N̂ has no ledger release charged for it"))
            continue
        if key in seen and seen[key] != rid:
            bad.append(Finding(name, "*", "plan", "data.population.estimate", "one N̂ charged twice"))
        seen[key] = rid
        counted = set(person_rates(train_rows(annex), 0.0))
        for u in people:
            if u in counted and rid not in person_charges(r.settings, u):
                bad.append(Finding(name, u, "plan", "data.population.estimate",
                                   f"counted in N̂ (plan {plan['sha256'][:8]}) but not charged for it"))
    # an N̂ a plan refused on is seen too (no plan, no model; the refusal names it): charged the same way
    if r.refused_counted:
        from components.ledger import Ledger

        led = Ledger.open(r.settings)
        try:
            refused = {k: led.population_release(k) for k in r.refused_counted}
        finally:
            led.dispose()
        for k, counted in r.refused_counted.items():
            for u in people:
                if u in counted and (refused[k] is None or refused[k] not in person_charges(r.settings, u)):
                    bad.append(Finding(name, u, "refusal", "data.population.estimate",
                                       f"counted in an N̂ a plan refused on ({k[:8]}) but not charged for it"))
    return bad


def person_rates_of(annex: dict) -> dict:
    """person id → their training rows' rates in a plan (from its private annex)."""
    from components.renyi.costs import person_rates
    from components.draws.data import train_rows

    return person_rates(train_rows(annex), 0.0)


class _FieldRef:
    post_processing_of = "plan:data.population.estimate"
    pattern = "data.population.estimate"


def _plan_of(doc: str, values: dict[str, list], plans: dict) -> tuple[dict, dict] | None:
    """The D-run plan (and annex) a published document belongs to: a plan names itself, a certificate
    its plan."""
    key = {"plan": "sha256", "certificate": "plan_sha256"}.get(doc)
    if key is None or key not in values:
        return None
    return plans.get(json.loads(values[key][0]))


@dataclasses.dataclass
class Note:
    """A difference the harness allowed and why (printed by the bench next to the findings)."""
    scenario: str
    person: str
    step: int
    why: str


def divergence(name: str, full: Run, less: Run, u: str, charged: set[int]
               ) -> tuple[int | None, str | None, list[Finding]]:
    """The first step whose outcome differs between D and D − u (one planned, the other refused; one
    released, the other not), and why that is allowed: (step, reason, []) when the difference is an
    outcome of DP estimates N̂ that u holds the charge of; (step, None, [finding]) otherwise; (None, None,
    []) when every step had the same outcome.

    Allowed only when one side refused on N̂ alone (`PopulationRefusal`: N̂ < B, nothing else read) and
    every N̂ drawn at that step on D and not on D − u — the estimates that counted u; the others are the
    same keyed draw on both sides — is a ledger release u is charged for in the run on D. From there on
    the two histories are outputs of that DP release, so documents present on one side only and public
    fields that are functions of the published history (ledger ids, later plans) may differ; the DP
    fields of the later documents are still priced one by one (adaptive composition)."""
    from components.ledger import Ledger

    if len(full.steps) != len(less.steps):
        return 0, None, [Finding(name, u, "steps", "", f"the scenario ran {len(full.steps)} stages on D and "
                                                        f"{len(less.steps)} without this person")]
    for i, (x, y) in enumerate(zip(full.steps, less.steps)):
        if x["outcome"] == y["outcome"]:
            continue          # same outcome (other estimates or not): the documents' fields are priced one by one
        if x["kind"] in ("release", "evaluate") and (x["outcome"], y["outcome"]) == ("ok", EVERYONE_RETIRED):
            # the filter retires each person on their own spend: on D it admitted u (at least), without u no
            # one — the release's own charge to u (training, or the evaluation's) prices that
            rids = _ledger_ids(full.settings, x["plan"]) if x["kind"] == "release" else set(x.get("release_ids", ()))
            if not rids & charged:
                return i, None, [Finding(name, u, x["kind"], "", f"step {i}: released on D, everyone retired "
                                                                 "without this person, but this person holds no "
                                                                 "charge for the release")]
            return i, (f"step {i} ({x['kind']}): released on D, everyone retired without this person — the filter "
                       f"admitted this person, who holds the release's charge ({sorted(rids & charged)})"), []
        sides = {x["outcome"], y["outcome"]}
        if not sides <= {"ok", REFUSED_ON_N} or REFUSED_ON_N not in sides:
            return i, None, [Finding(name, u, x["kind"], "", f"step {i} ({x['kind']}) differs: on D "
                                                             f"{x['outcome']!r}, without this person {y['outcome']!r}"
                                                             " — not a refusal on the DP estimate N̂ alone")]
        counted = [k for k in x["keys"] if k not in set(y["keys"])]
        led = Ledger.open(full.settings)
        try:
            rids = {k: led.population_release(k) for k in counted}
        finally:
            led.dispose()
        missing = [k[:8] for k, r in rids.items() if r is None or r not in charged]
        if not counted or missing:
            return i, None, [Finding(name, u, x["kind"], "", f"step {i} ({x['kind']}): {x['outcome']!r} on D, "
                                                             f"{y['outcome']!r} without this person, but this person "
                                                             f"holds no charge for the N̂ that decided it "
                                                             f"({', '.join(missing) or 'none drawn on D'})")]
        return i, (f"step {i} ({x['kind']}): {x['outcome']!r} on D, {y['outcome']!r} without this person — the "
                   f"refusal reads only N̂ (DP), charged to this person (ledger release(s) "
                   f"{sorted(rids.values())}); later documents and public fields follow that outcome"), []
    return None, None, []


def diff(name: str, full: Run, less: Run, u: str, notes: list | None = None
         ) -> tuple[list[Finding], set[tuple[str, str]]]:
    """Findings for one removed person, and the uncovered fields that person moved. `notes` receives the
    differences allowed as the outcome of a DP release (`divergence`)."""
    a, fa, sa = _docs(full.published, full.home, full.steps)
    b, fb, _ = _docs(less.published, less.home, less.steps)
    findings, moved = [], set()
    charged = person_charges(full.settings, u)
    plans = {p["sha256"]: (p, x) for p, x in zip(full.plans, full.annexes)}
    at, why, bad = divergence(name, full, less, u, charged)
    findings += bad
    if why and notes is not None:
        notes.append(Note(name, u, at, why))
    for doc in sorted(set(a) | set(b)):
        da, db = a.get(doc, {}), b.get(doc, {})
        after = why is not None and doc[1] >= at       # follows the DP outcome at step `at`
        if not da or not db:
            if not after:
                side = "without" if not da else "with"
                findings.append(Finding(name, u, doc[0], "", f"document {doc[2]} of step {doc[1]} is published "
                                                             f"only {side} this person"))
            continue
        owner = _plan_of(doc[0], da, plans)
        other = _release_of_doc(full, doc[0], sa.get(doc))
        for path in sorted(set(da) | set(db)):
            if da.get(path) == db.get(path):
                continue
            f = fa.get((doc[0], path)) or fb.get((doc[0], path))
            if f.hiding or f.digest:
                continue          # a commitment reveals nothing; a digest moves with the leaves checked here
            if (doc[0], path) in KNOWN_OPEN:
                continue          # reported by known_open(), fixed by the issue that names it
            if f.kind is Kind.PUBLIC and not f.relation:
                if not after:
                    findings.append(Finding(name, u, doc[0], path, f"public-by-construction field differs ({f.what})"))
            elif f.kind is Kind.UNCOVERED:
                moved.add((doc[0], path))
            elif other is not None and f.kind is Kind.DP:
                findings.extend(other(name, full, u, doc[0], path, f, charged))
            elif owner is None:
                findings.append(Finding(name, u, doc[0], path, "a differing field the harness cannot price"))
            elif f.kind is Kind.PUBLIC or _public_n(owner[0]):
                # public under a relation — or DP only through an N̂ this release does not have: its N is
                # public under the relation it claims, so everything computed from N is too
                findings.extend(_relation_claim(name, full, u, doc[0], path, f, owner))
            else:
                findings.extend(_dp_charged(name, full, u, doc[0], path, f, charged, owner))
    return findings, moved


def _release_of_doc(full: Run, channel: str, subject: str | None):
    """The pricing of a document that is not a plan or a certificate: the evaluation release logged on a
    run (registry metrics and tags, subject = run id), or a private selection (subject = study id)."""
    if channel in ("registry.metric", "registry.tag") and subject in full.evaluations:
        ev = full.evaluations[subject]
        return lambda *a: _evaluation_charged(*a, ev=ev)
    if channel in ("pmixed.release", "registry.tag", "registry.param", "registry.metric") \
            and subject in full.pmixeds:
        pm = full.pmixeds[subject]
        return lambda *a: _pmixed_charged(*a, pm=pm)
    if channel == "selection" and subject in full.selections:
        sel = full.selections[subject]
        return lambda *a: _selection_charged(*a, sel=sel)
    return None


def _ledger_ids(settings, name: str, mechanism: str | None = None) -> set[int]:
    """The ledger releases reserved under `name` (a plan sha, or a release's own name), of `mechanism`."""
    from sqlalchemy import select

    from components.ledger import Ledger
    from components.ledger import store as st

    led = Ledger.open(settings)
    try:
        ids = set(led.releases_for_plan(name))
        if mechanism is not None and ids:
            with st.read_only(led.engine) as conn:
                rows = conn.execute(select(st.releases.c.id, st.releases.c.mechanism).where(
                    st.releases.c.id.in_(sorted(ids)))).all()
            ids = {int(r.id) for r in rows if r.mechanism == mechanism}
        return ids
    finally:
        led.dispose()


def _weights_charges(full: Run, plan_sha: str) -> set[int]:
    """What prices the weights of a plan: its training reservation, and the N̂ that set q."""
    plans = {p["sha256"]: (p, x) for p, x in zip(full.plans, full.annexes)}
    out = _ledger_ids(full.settings, plan_sha)
    if plan_sha in plans:
        pop, _ = release_of_plan(full.settings, *plans[plan_sha], _FieldRef())
        out |= {pop} - {None}
    return out


def _evaluation_charged(name, full: Run, u, channel, path, f, charged, *, ev) -> list[Finding]:
    """eval_*: the evaluation release (ledger mechanism 'evaluation', named by `_release_name`) that u was
    counted and charged in; or — the metrics are a function of the evaluated weights — u's charge for the
    weights (a trained person moves the model, hence its figures)."""
    rids = _ledger_ids(full.settings, ev["release_name"], "evaluation")
    if not rids:
        return [Finding(name, u, channel, path, "evaluation metric with no 'evaluation' ledger release")]
    if rids & charged:
        return []
    if _weights_charges(full, ev["plan_sha256"]) & charged:
        return []
    return [Finding(name, u, channel, path, "evaluation metric differs but the person holds no charge for the "
                                            "evaluation release nor for the evaluated weights")]


def _selection_charged(name, full: Run, u, channel, path, f, charged, *, sel) -> list[Finding]:
    """The selection document: A's output (the chosen point, its noisy score) is priced by the selection's
    ledger release (mechanism 'private-selection'); its ε and order, functions of the plans' public fields,
    by every N̂ the selection composed (each plan's population release)."""
    root = f.post_processing_of or f"{channel}:{f.pattern}"
    if root == "selection:selected":
        if sel["release_id"] not in charged:
            return [Finding(name, u, channel, path, "A's output differs but the person holds no charge for the "
                                                    "selection's ledger release")]
        return []
    if root == "plan:data.population.estimate":
        missing = [r for r in sel["population_releases"] if r not in charged]
        if missing or not sel["population_releases"]:
            return [Finding(name, u, channel, path, f"differs with the plans' N̂ but the person holds no charge "
                                                    f"for population release(s) {missing}")]
        return []
    return [Finding(name, u, channel, path, f"a DP selection field the harness cannot price ({root})")]


def _pmixed_charged(name, full: Run, u, channel, path, f, charged, *, pm) -> list[Finding]:
    """A PMixED build: its DP fields are priced by the build's ledger release (mechanism 'pmixed', reserved
    under the prediction policy's sha256: the whole token budget's curve, charged to every person)."""
    rids = _ledger_ids(full.settings, pm["policy_sha256"], "pmixed")
    if not rids:
        return [Finding(name, u, channel, path, "a PMixED field with no 'pmixed' ledger release")]
    if not rids & charged:
        return [Finding(name, u, channel, path, "a PMixED field differs but the person holds no charge for the build")]
    return []


def _dp_charged(name, full: Run, u, channel, path, f, charged, owner) -> list[Finding]:
    plan, annex = owner
    if f.mechanism == "DP-SGD" and _public_n(plan):
        return _relation_claim(name, full, u, channel, path, f, owner)
    if f.mechanism == "DP-SGD":
        # the weights: u's training charge, or — retired, so not trained on — the N̂ that set their q
        from components.ledger import Ledger

        led = Ledger.open(full.settings)
        try:
            rids = set(led.releases_for_plan(plan["sha256"]))
        finally:
            led.dispose()
        pop, _ = release_of_plan(full.settings, plan, annex, _FieldRef())
        if not (rids | {pop}) & charged:
            return [Finding(name, u, channel, path, "the weights differ but the person holds no charge for them")]
        return []
    rid, what = release_of_plan(full.settings, plan, annex, f)
    if rid is None:
        return [Finding(name, u, channel, path, f"DP field with no ledger release ({what})")]
    if rid not in charged:
        return [Finding(name, u, channel, path, f"DP field differs but the person holds no charge for its {what}")]
    return []


def _public_n(plan: dict) -> bool:
    return ((plan.get("data") or {}).get("population") or {}).get("mechanism") != "laplace"


def _relation_claim(name, full: Run, u, channel, path, f, owner) -> list[Finding]:
    """Public only under a relation: the release must claim it (not add/remove); a secret release charges
    no person; any other release charges u when it trained on u's records (u is in its training rows)."""
    from components.ledger import Ledger

    plan, annex = owner
    if str(plan.get("neighbouring", "")).startswith("add_remove"):
        return [Finding(name, u, channel, path, f"public only under '{f.relation or 'its relation'}' but the "
                                                f"release claims {plan['neighbouring']}")]
    led = Ledger.open(full.settings)
    try:
        rids = set(led.releases_for_plan(plan["sha256"]))
    finally:
        led.dispose()
    charged = person_charges(full.settings, u)
    if plan.get("privacy_unit") == "secret":
        if rids & charged:
            return [Finding(name, u, channel, path, "a secret release moves with this person, yet charges persons "
                                                    "as if add/remove were covered")]
    elif u in person_rates_of(annex) and not rids & charged:
        return [Finding(name, u, channel, path, "the release trained on this person's records but holds no charge "
                                                "for them")]
    return []


def check_scenario(name: str, scenario, tmp: Path, people: list[str], removed: list[str], keys: list[bytes],
                   notes: list | None = None) -> list[Finding]:
    """Every check over `removed` × `keys`; `notes` receives the differences allowed as DP outcomes."""
    findings = []
    for ki, key in enumerate(keys):
        pdir = tmp / f"{name}-policies"
        full = run(scenario, tmp / f"{name}-k{ki}-full" / "home", key, without=None, policies=pdir)
        findings += check_counted_charged(name, full, people)
        moved: dict[tuple[str, str], int] = {}
        for u in removed:
            less = run(scenario, tmp / f"{name}-k{ki}-{re.sub('[^a-z0-9]', '', u)}" / "home", key, without=u,
                       policies=pdir)
            findings += check_counted_charged(name, less, [p for p in people if p != u])
            f, m = diff(name, full, less, u, notes)
            findings += f
            for x in m:
                moved[x] = moved.get(x, 0) + 1
        for (ch, path), n in moved.items():
            if n > 0.1 * len(removed):
                findings.append(Finding(name, "*", ch, path, f"uncovered field moved by {n}/{len(removed)} people"))
    return findings
