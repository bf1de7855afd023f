"""`veil pmixed build`: latest snapshot → keyed-hash partition → ledger reservation → one adapter per shard
(a Prefect map) → certificate → MLflow registration. Adapters stay in VEIL_HOME/private/pmixed/<id>/.

Task runner: threads by default; `task_runner: dask` in the policy uses prefect-dask's DaskTaskRunner
(a LocalCluster unless VEIL_DASK_ADDRESS names a scheduler) when that package is installed.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from catalog import snapshots
from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.core.quiet import quiet_third_party
from components.core.settings import Settings
from components.mechanisms import get as get_mechanism
from components.policy import load_prediction_policy
from components.prediction import partition as part
from components.prediction.ensemble import dir_sha256, ShardTraining, train_shard
from components.publication import publish
from flows import stages
from flows.prefect_boundary import prefect_safe
from components.draws.annex import plan_key, snapshot_commitment


def _ledger_reserve(settings: Settings, spec, params, rows_per_person: dict[str, int], policy_sha: str):
    """Charge every person the whole token budget's curve in the per-person ledger (issue 13), when present.
    Returns (retired person ids, public reservation facts)."""
    from components.ledger import Budget, Ledger  # startup

    curve = params.budget_rdp()
    led = Ledger.open(settings)
    try:
        from components.prediction.mechanism import ORDERS  # startup

        if tuple(led.orders) != tuple(float(a) for a in ORDERS):
            raise VeilError("pmixed: the ledger's order grid differs from the mechanism's; cannot charge it")

        costs = get_mechanism("pmixed").ledger_costs(
            {"budget_rdp": curve, "sampling_rate": float(spec.subsample_rate)},
            {p: [float(spec.subsample_rate)] * int(n) for p, n in rows_per_person.items()}, led.orders)
        budget = Budget.parse(spec.lifetime_budget.model_dump()) if spec.lifetime_budget else None
        res = led.reserve(kind="user", mechanism="pmixed", plan_sha256=policy_sha,
                          params={"shards": params.shards, "q": params.q, "radius": params.radius,
                                  "tokens": params.tokens}, costs=costs, budget=budget)
        return list(res.retired), res.public()
    finally:
        led.dispose()


def _runner(kind: str, cluster_kwargs: dict | None = None):
    if kind == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=max(1, min(4, os.cpu_count() or 1)))
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise VeilError("task_runner: dask needs prefect-dask (pip install prefect-dask)") from None
    addr = os.environ.get("VEIL_DASK_ADDRESS")
    if addr:
        return DaskTaskRunner(address=addr)
    return DaskTaskRunner(cluster_kwargs=cluster_kwargs or {"n_workers": max(1, min(4, os.cpu_count() or 1)),
                                                            "threads_per_worker": 1})


def build(settings: Settings, policy_path: str | Path, *, base_dir: str | Path | None = None,
          snapshot_id: str | None = None, name: str | None = None, use_prefect: bool = True,
          progress: bool = False) -> dict:
    from components.prediction import mechanism as mech  # startup
    from components.prediction import release as prel  # startup
    from components.prediction.pyfunc import register_ensemble  # startup
    from components.prediction.release import commitment, manifest_of, private_root  # startup

    quiet_third_party(prefect=use_prefect)   # its shards train in threads or dask workers: same quiet there
    pol, raw = load_prediction_policy(policy_path)
    spec = pol.spec
    policy_sha = sha256_bytes(raw)
    if base_dir is None:
        demo_public = settings.home / "demo-org" / "public" / "corpus.jsonl"
        if not demo_public.is_file():
            raise VeilError("no base model: pass --base-model DIR (or run `veil demo-data` for the demo's corpus)")
        base_dir = stages.base_model(settings, public_corpus=demo_public, progress=progress)
    else:
        base_dir = stages.base_model(settings, base_model_dir=base_dir)
    snap = snapshots.load_snapshot(settings, snapshot_id)   # through the module: tests stand a snapshot in
    recs = snap.records
    people_public = None
    from components.bounding.people import canonical_records, plan_accounts  # startup

    # earlier pseudonyms of every account count for its person before the reservation (stages.link_identities)
    stages.link_identities(settings, recs, spec.people.model_dump(),
                           plan_accounts(recs, spec.people.model_dump())[0])
    if spec.people.exclude or spec.people.aliases:
        # one id per person before anything is counted or partitioned (components/bounding/people.py)
        from components.bounding.people import people_for_plan  # startup

        recs, people_public, _annex = people_for_plan(recs, spec.people.model_dump())
    else:
        recs = canonical_records(recs)    # one id per person under the identity rule (components.core.identity)
    users = [str(u) for u in recs.column("user_id").to_pylist()]
    texts = recs.column("text").to_pylist()

    radius = mech.calibrate_radius(epsilon=spec.target.epsilon, delta=spec.target.delta,
                                   tokens=spec.token_budget, q=spec.subsample_rate)
    params = mech.MechanismParams(shards=spec.shards, q=spec.subsample_rate, radius=radius,
                                  tokens=spec.token_budget, delta=spec.target.delta, temperature=spec.temperature)
    rows: dict[str, int] = {}
    for u in users:
        rows[u] = rows.get(u, 0) + 1
    retired, ledger_facts = _ledger_reserve(settings, spec, params, rows, policy_sha)
    retired_set = set(retired)
    key = part.load_or_create_key(settings.private_dir)
    assign = part.partition(key, [u for u in rows if u not in retired_set], spec.shards)
    shard_texts: list[list[str]] = [[] for _ in range(spec.shards)]
    for u, t in zip(users, texts):
        if u in assign:
            shard_texts[assign[u]].append(t)

    base_sha = dir_sha256(base_dir)
    ensemble_id = sha256_bytes(json.dumps({"policy": policy_sha, "snapshot": snap.sha256, "base": base_sha,
                                           "shards": spec.shards, "key": sha256_bytes(key)},
                                          sort_keys=True).encode())[:32]
    root = private_root(settings) / ensemble_id
    root.mkdir(parents=True, exist_ok=True)
    t = spec.training
    cfg = ShardTraining(epochs=t.epochs, learning_rate=t.learning_rate, seq_len=t.seq_len, batch_size=t.batch_size,
                        lora_r=t.lora.r, lora_alpha=t.lora.alpha, lora_dropout=t.lora.dropout, seed=t.seed)
    outs = [root / f"shard-{i:04d}" for i in range(spec.shards)]
    facts = train_shards(str(base_dir), shard_texts, cfg, outs, runner=spec.task_runner, use_prefect=use_prefect)
    # Private bookkeeping: shard sizes and the person→shard map name people; they never leave the private area.
    (root / "partition.json").write_text(json.dumps({"sizes_people": part.shard_sizes(assign, spec.shards),
                                                     "retired": len(retired), "facts": facts}, default=str))
    os.chmod(root / "partition.json", 0o600)
    commits = [commitment(settings, f["sha256"]) for f in facts]
    cert = prel.make_certificate(params=params, target=spec.target.model_dump(), policy_name=pol.metadata.name,
                            policy_sha256=policy_sha, snapshot_commitment=snapshot_commitment(plan_key(settings.private_dir),
                                                                       snap.snapshot_id, snap.sha256)[1],
                            base_sha256=base_sha, commitments=commits, when_exhausted=spec.when_exhausted,
                            ledger=ledger_facts, ensemble_id=ensemble_id, people=people_public)
    from components.prediction.budget import TokenBudget  # startup

    tb = TokenBudget.open(settings)
    try:
        tb.create(ensemble_id, spec.token_budget, spec.when_exhausted)
    finally:
        tb.dispose()
    reg = register_ensemble(settings, name=name or pol.metadata.name, certificate=cert,
                            manifest={**manifest_of(params, base_sha),
                                      "max_tokens_per_request": spec.max_tokens_per_request,
                                      "key_quota_tokens": spec.key_quota_tokens},
                            base_dir=base_dir)
    return {"model_uri": reg["model_uri"], "shards": spec.shards, "certificate": cert,
            "sizing": sizing_of(spec)}


def sizing_of(spec, keys: int | None = None) -> dict:
    from components.prediction.sizing import sizing  # startup

    return sizing(token_budget=spec.token_budget, max_tokens_per_request=spec.max_tokens_per_request,
                  key_quota_tokens=spec.key_quota_tokens, keys=keys)


def plan(policy_path: str | Path, *, keys: int | None = None) -> dict:
    """`veil pmixed plan`: what the policy's token budget buys (requests, keys) and its ε/radius trade, from policy
    values alone — nothing is read from the data, so it is safe to show anyone before a build."""
    from components.prediction import sizing  # startup

    pol, raw = load_prediction_policy(policy_path)
    if keys is not None and keys < 1:
        raise VeilError(f"--keys: expected an integer ≥ 1, got {keys}")
    doc = {"policy": {"name": pol.metadata.name, "sha256": sha256_bytes(raw)}, **sizing.plan(pol.spec, keys=keys)}
    return publish("pmixed.plan", doc, subject=doc["policy"]["sha256"])


def train_shards(base_dir: str, shard_texts, cfg, outs, *, runner: str = "thread", use_prefect: bool = True,
                 cluster_kwargs: dict | None = None):
    if not use_prefect:
        return [train_shard(base_dir, tx, cfg, o) for tx, o in zip(shard_texts, outs)]
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(name="pmixed-train-shard", cache_policy=NO_CACHE, retries=0, persist_result=False)  # facts: private
    @prefect_safe("pmixed-train-shard")
    def shard_task(i: int):
        # the texts are passed by index, never as task parameters: Prefect would persist them in its run DB
        return train_shard(base_dir, shard_texts[i], cfg, outs[i])

    @flow(name="pmixed-build", task_runner=_runner(runner, cluster_kwargs), log_prints=False,
          persist_result=False)
    @prefect_safe("pmixed-build")
    def shards_flow():
        futures = shard_task.map(list(range(len(outs))))
        return [f.result() for f in futures]

    return shards_flow()
