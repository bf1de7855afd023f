"""The pipeline's stages as plain functions: catalog → plan → train → certify → register → audit.

Each stage reads a hashed artifact and writes one. Prefect wraps these in `flows/pipeline.py`;
tests call them directly.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from catalog import snapshots  # its module, not the function: tests stand a snapshot in
from catalog.demo import write_demo_org
from components import modeling  # modeling.load_base through its module, likewise (tests/flows/test_device.py)
from components.certificate import build_certificate
from components.core.device import resolve_device
from components.core.errors import VeilError
from components.core.faults import kill_point
from components.core.fingerprints import directory_fingerprint, weights_fingerprint
from components.core.hashing import sha256_file, sha256_json
from components.core.progress import step
from components.core.settings import Settings
from components.evaluation import evaluate_texts_per_text
from components.evaluation.bottleneck import diagnose
from components.evaluation.dp import person_means
from components.evaluation.release import CAVEAT, publish_evaluation
from components.mechanisms import get as get_mechanism
from components.mechanisms.auto import default_for
from components.mechanisms.gaussian import PopulationRefusal
from components.modeling import build_base_model, perplexity_scores
from components.modeling.lora import count_trainable_parameters
from components.modeling.public_text import read_corpus
from components.policy import load_policy
from components.policy.model import Evaluation
from components.draws.annex import commitment, load_annex, plan_key, plan_snapshot_ref as ref, snapshot_commitment
from components.draws.data import evaluation_records, train_rows, training_records
from components.renyi.costs import Budget, pure_dp_rdp
from components.planning import load_plan, make_plan, save_plan

DEMO_POLICY = Path(__file__).resolve().parents[1] / "policies" / "demo.yaml"
# How the demo organization's JSONL maps onto catalog records (user and text use the defaults).
DEMO_MAPPING = {"id_field": "id", "time_field": "ts", "metadata_fields": ["team", "path"]}


def demo_data(settings: Settings, out_dir: Path | None = None, seed: int = 0) -> dict:
    out = Path(out_dir) if out_dir else settings.home / "demo-org"
    org = write_demo_org(out, seed=seed)
    return {"dir": str(out), "messages": str(out / "org" / "messages.jsonl"),
            "public": str(out / "public" / "corpus.jsonl"), "truth": str(out / "truth.json"),
            **{k: v for k, v in vars(org).items() if isinstance(v, (int, float, str))}}


def ingest(settings: Settings, source: str | Path, fmt: str, *, policy: str | Path | None = None,
           progress: bool = False, **mapping: Any) -> dict:
    from catalog.ingest import ingest_source  # startup

    rules = None
    if policy is not None:
        rules = load_policy(policy).tagging_rules()
    report = ingest_source(Path(source), fmt, settings=settings, rules=rules, progress=progress, **mapping)
    return report.to_dict()


def base_model(settings: Settings, *, public_corpus: str | Path | None = None,
               base_model_dir: str | Path | None = None, progress: bool = True,
               config: dict | None = None, out_dir: str | Path | None = None) -> str:
    """Any local HF causal-LM directory, or a base trained here on public text.

    `public_corpus`: the demo's JSONL, or anything `components.modeling.public_text.read_corpus` takes (a text
    file, a directory, `system`). `config`: `build_base_model` options (n_layer, n_embd, n_head, steps, …).
    The built base is cached by the corpus' sha256 (and the config, when not the default), so re-runs reuse it.
    """
    if base_model_dir is not None:
        modeling.load_base(base_model_dir)  # fail early and clearly on a bad directory
        return str(Path(base_model_dir).resolve())
    if public_corpus is None:
        raise VeilError("no base model: pass --base-model PATH or a public corpus to pretrain one")
    config = {k: v for k, v in (config or {}).items() if v is not None}
    src = Path(str(public_corpus))
    if src.is_file() and src.suffix == ".jsonl":
        digest = sha256_file(src)
        texts = None
    else:
        texts = read_corpus(public_corpus)
        digest = sha256_json(texts)
    # the default config keeps the cache key the demo has always used
    key = digest[:12] if not config else sha256_json({"corpus": digest, "config": config})[:12]
    out = Path(out_dir) if out_dir is not None else settings.models_dir / f"base-{key}"
    if (out / "veil_base.json").is_file():
        if progress:
            print(f"base model: reusing {out} (same corpus and options)", file=sys.stderr)
        return str(out)
    if texts is None:
        texts = read_corpus(src)
    return str(build_base_model(texts, out, progress=progress, **config))


def planning_aids(pol, base_dir: str | Path | None):
    """What the planner may take from the *public* base model: perplexity scores for ppl-high/ppl-low
    selection, and a gradient-diversity estimate for mechanism `auto`. Returns (scorer, compute)."""
    scorer = compute = None
    if pol.spec.contribution.selection in ("ppl-high", "ppl-low"):
        if base_dir is None:
            raise VeilError(f"selection '{pol.spec.contribution.selection}' scores records with the public base "
                            "model: pass --base-model DIR")

        model, tok = modeling.load_base(base_dir)
        seq_len = pol.spec.training.seq_len
        scorer = lambda texts: perplexity_scores(model, tok, texts, seq_len=seq_len)  # noqa: E731
    if pol.spec.mechanism == "auto" and pol.spec.privacy_unit == "user" and base_dir is not None:
        compute = {"base_model": modeling.load_base(base_dir)}
    if base_dir is not None:
        # d for the utility forecast: a fact of the public architecture and the policy's LoRA config
        lora = pol.spec.training.lora
        compute = {**(compute or {}), "trainable_parameters": count_trainable_parameters(
            base_dir, None if lora is None else lora.model_dump())}
    return scorer, compute


def planned_population_epsilon(pol) -> float:
    """ε_N of the population estimate N̂ a plan of this policy will release (target ε × the policy's
    population.epsilon_fraction, both public), 0 when its mechanism publishes N under its relation."""
    spec = pol.spec
    mech = default_for(spec.privacy_unit) if spec.mechanism == "auto" else get_mechanism(spec.mechanism)
    if spec.people.ownership == "all-participants" and mech.owners_variant:
        mech = get_mechanism(mech.owners_variant)
    if spec.target is None or not mech.population_estimate:
        return 0.0
    return float(spec.target.epsilon) * float(spec.population.epsilon_fraction)


def exhausted_people(settings: Settings, pol, user_ids, *, population_epsilons=None) -> set[str]:
    """The people this policy's release cannot admit whatever the plan: even its smallest part, the
    ε_N of the population estimate N̂ (target ε × population.epsilon_fraction, public, Laplace: its
    Rényi curve `pure_dp_rdp(ε_N)` is below every release's cost), would take them past their
    lifetime budget at every order. The reservation's filter would retire them anyway; left out
    before planning, N̂, q and the audit split are those of people who can be trained.

    `population_epsilons`: the ε_N of every N̂ the operation will release counting the person (private
    selection plans every grid point, and each plan's N̂ counts them): the floor is their sum.

    One person's answer reads only that person's ledger row, the ledger's budget and the policy
    (public). Empty when there is no lifetime budget or no population estimate to price."""
    import numpy as np

    from components.ledger import Ledger  # startup

    eps = [planned_population_epsilon(pol)] if population_epsilons is None else [float(e) for e in population_epsilons]
    eps = [e for e in eps if e > 0]
    if not eps:
        return set()  # no Laplace N̂ (the count is public under its relation): nothing to price before planning
    led = Ledger.open(settings)
    try:
        budget = led.budget() or Budget.parse(pol.spec.lifetime_budget.model_dump()
                                              if pol.spec.lifetime_budget is not None else None)
        if budget is None:
            return set()
        cap = led.rdp_budget(budget)
        floor = sum(pure_dp_rdp(e, led.orders) for e in eps)
        spend = led.spend(sorted({str(u) for u in user_ids}))
    finally:
        led.dispose()
    return {u for u, row in spend.items() if not bool(np.any(np.asarray(row, dtype=float) + floor <= cap))}


def _without_people(snap, people: set[str]):
    """The snapshot as the planner sees it, less these people's records and their secret spans
    (same id and sha256: the plan still names the snapshot it was drawn from)."""
    import copy

    import pyarrow.compute as pc

    out = copy.copy(snap)       # the same snapshot (id, sha256, path, manifest); its records replaced below
    keep = pc.invert(pc.is_in(snap.records["user_id"], pa.array(sorted(people), pa.string())))
    if "owners" in snap.records.column_names:      # multi-owner: a record goes with any of its owners
        keep = pc.and_(keep, pa.array([not (set(o or ()) & people) for o in snap.records["owners"].to_pylist()]))
    records = snap.records.filter(keep)
    spans = snap.secret_spans
    if records.num_rows == 0:
        raise VeilError("ledger: every person of this snapshot has spent their lifetime budget: nothing to plan "
                        "(the policy's lifetime_budget is the governance team's call)")
    out.__dict__["records"] = records  # cached_property: the instance's value wins
    out.__dict__["secret_spans"] = spans.filter(pc.is_in(spans["record_id"], records["record_id"]))
    return out


def plan(settings: Settings, policy: str | Path, *, snapshot_id: str | None = None,
         base_dir: str | Path | None = None, progress=None, exclude_people=None) -> dict:
    """Plan a release, leaving `exclude_people` (ids; retraining passes `exhausted_people`) out of
    the snapshot the planner sees. Returns {"plan_path", "plan", "excluded_people"} (that count is
    exact and private: never logged or published)."""

    return plan_snapshot(settings, policy, snapshots.load_snapshot(settings, snapshot_id), base_dir=base_dir,
                         progress=progress, exclude_people=exclude_people)


def plan_snapshot(settings: Settings, policy: str | Path, snap, *, base_dir: str | Path | None = None,
                  progress=None, exclude_people=None, compute: dict | None = None) -> dict:
    """`plan` on a loaded snapshot (anything with snapshot_id, sha256, records, secret_spans and
    manifest): people rules, exclusions, the plan, N̂ charged, the plan written."""
    from components.bounding.people import canonical_records, plan_accounts  # startup

    pol = load_policy(policy)
    people = pol.spec.people
    people_sections = None
    accounts, _ = plan_accounts(snap.records, pol.people())
    # Every account's pseudonyms from before (an earlier identity rule, an alias since added) count for
    # its person before anything is charged: a rule change never gives anyone a fresh budget.
    link_identities(settings, snap.records, pol.people(), accounts)
    if people.exclude or people.aliases or people.ownership == "all-participants":
        # Bots out, a person's identities merged into one user id, before any per-person decision:
        # otherwise a person with two addresses is two units and gets twice the contribution.
        from components.bounding.people import people_for_plan  # startup

        records, people_public, people_annex = people_for_plan(snap.records, pol.people())
        people_sections = (people_public, people_annex)
        snap.__dict__["records"] = records      # Snapshot.records is a cached_property: this is its value
    else:
        # one id per person under the identity rule (components.core.identity) — the same table for a
        # snapshot ingest cut under the rule, so its plan is unchanged
        records = canonical_records(snap.records)
        if records is not snap.records:
            snap.__dict__["records"] = records
    # then the people the ledger retired, as the plan sees them (an account id → its person)
    excluded = {accounts.get(u) or u for u in (exclude_people or ())}
    scorer, aids = planning_aids(pol, base_dir)
    compute = {**(aids or {}), **(compute or {})} or None
    base_snap = snap
    ledger_filter = None
    if pol.spec.schedule is not None:
        # the schedule is fitted under this ledger's own grid and conversion (an old ledger's are stricter)
        from components.ledger import Ledger  # startup

        led = Ledger.open(settings)
        try:
            ledger_filter = led.filter_spec()
        finally:
            led.dispose()
    for _attempt in range(_PLAN_ATTEMPTS):
        if excluded:
            snap = _without_people(base_snap, excluded)
        # the public part goes to plans/, the annex (membership, exact counts) to the private area.
        # The plan's date is its snapshot's: the same snapshot, policy and base give the same plan (and
        # sha256), so a run killed mid-training and started again resumes under its own plan, checkpoint
        # and ledger reservation instead of starting (and paying) again under a new one.
        try:
            p = make_plan(pol, snap, private_dir=settings.private_dir, scorer=scorer, compute=compute,
                          cache_dir=settings.cache_dir, progress=progress, created_at=snap.manifest.get("created_at"),
                          people=people_sections, ledger_filter=ledger_filter)
        except PopulationRefusal as e:
            # N̂ < B: the refusal reads only the DP estimate, but it is seen (no plan, no model, N̂ in the
            # message), so that N̂ is charged to everyone it counted exactly as a published one (issue 22)
            refused = charge_refused_population(settings, e)
            if not refused:
                raise
            excluded |= set(refused)
            continue
        population_release_id, refused = charge_plan_population(settings, p.to_dict())
        if not refused:
            break
        # someone counted cannot afford N̂ (another release spent their budget since the exclusion check):
        # nothing was published or charged; plan again without them (fresh noise: another population)
        excluded |= set(refused)
    else:
        raise VeilError("ledger: the population estimate could not be charged to the people it counts after "
                        f"{_PLAN_ATTEMPTS} attempts (concurrent releases keep spending their budgets); try again")
    path = save_plan(p, settings.plans_dir)
    return {"plan_path": str(path), "plan": p.to_dict(), "excluded_people": len(excluded),
            "population_release_id": population_release_id}


_PLAN_ATTEMPTS = 4


def link_identities(settings: Settings, records, people, accounts: dict | None = None) -> int:
    """Link, in the ledger, every account's earlier pseudonyms to its person (Ledger.link_identities):
    the spellings ingest kept (`metadata.account`), ids of records ingested before the identity rule,
    `people.aliases` entries. Nothing to do — and no ledger opened — when the ledger was never used (no
    key) or no account has another pseudonym. Returns the links added (private)."""
    from components.ledger import Ledger  # startup
    from components.ledger import keys as ledger_keys  # startup
    from components.bounding.people import person_accounts  # startup

    if not ledger_keys.key_path(settings.private_dir).exists():
        return 0
    by_person = person_accounts(records, people, accounts)
    led = Ledger.open(settings)
    try:
        return led.link_identities(by_person)
    finally:
        led.dispose()


def charge_plan_population(settings: Settings, plan_doc: dict) -> tuple[int | None, tuple[str, ...]]:
    """Charge the plan's N̂ to every person it counts, before the plan is published (issue 22, cases 1
    and 2): retired later or not, they were counted. Returns (the ledger release that holds the charge —
    an earlier one when the same N̂ was charged before; None when N is public —, the ids who could not
    afford it: nothing was charged then)."""
    from components.ledger import charge_population  # startup

    annex = _annex(settings, plan_doc)
    res = charge_population(settings, plan_doc, train_rows(annex),
                            release_key=(annex.get("population") or {}).get("release_key"))
    return (None, ()) if res is None else (res.release_id, tuple(res.refused))


def charge_refused_population(settings: Settings, refusal) -> tuple[str, ...]:
    """Charge the N̂ a plan refused on (`PopulationRefusal`) to everyone it counted, once per distinct N̂
    (its release key). Returns the ids who could not afford it (nothing was charged then: the caller
    plans again without them, which draws fresh noise)."""
    from components.ledger import charge_population  # startup

    if refusal.persons is None or refusal.plan_like is None:
        raise VeilError("plan: a population refusal without the people it counted (a bug: report it)")
    res = charge_population(settings, refusal.plan_like, refusal.persons, release_key=refusal.release_key)
    return () if res is None else tuple(res.refused)


def _annex(settings: Settings, plan_doc: dict) -> dict:
    return load_annex(settings.private_dir, plan_doc)


def training_data(settings: Settings, plan_doc: dict, annex: dict | None = None, *,
                  drop_records=()) -> pa.Table:
    """The plan's training records (user_id, text[, rate]) from the plan's own snapshot and its
    private annex (checked against the plan's commitment), less the records in `drop_records`."""

    annex = _annex(settings, plan_doc) if annex is None else annex
    snap = _plan_snapshot(settings, plan_doc, annex)
    return training_records(plan_doc, annex, snap.records, drop_records=drop_records)


RESERVATION_FILE = "ledger_reservation.json"
TRAIN_LOCK_FILE = ".train.lock"
RANK0_WAIT_S = 600.0   # how long a torchrun rank > 0 waits for rank 0's reservation


def _rank() -> tuple[int, int]:
    """(global rank, local rank) under torchrun; (0, 0) otherwise."""
    import os

    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("LOCAL_RANK", "0") or 0)


def _already_released(plan_doc: dict, release_id: int, status: str | None, settings: Settings) -> VeilError:
    """One line for a plan whose one release is past training: what to do instead. Never "make a new
    plan": a new plan of the same data charges the same people again."""
    sha = plan_doc["sha256"]
    run = settings.runs_dir / sha[:16]
    after = {
        "trained": f"its trained run is in {run}: certify and register it (`veil register --plan PLAN --base-model "
                   "DIR` after `veil train` wrote its certificate, or `veil retrain`, which goes on from a finished run)",
        "registered": "it is registered already (`veil models`)",
        "audit_failed": "it was registered and failed its audit; its charge stays",
        "deleted": "its model was deleted; its charge stays",
        "refused": "nothing was trained: everyone in it had spent their lifetime budget",
    }.get(status or "", "see `veil ledger --json`")
    return VeilError(f"plan {sha[:12]}: its ledger release {release_id} is already {status}; training it again would "
                     f"charge the same people a second time for the same data, so it is refused — {after}")


def _write_private_json(path: Path, doc: dict) -> None:
    """Atomically (aside, then renamed into place), 0600: a kill leaves the old file or the new one."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reserve(settings: Settings, plan_doc: dict, annex: dict, out_dir: Path) -> dict | None:
    """The release's cost, reserved in the per-person ledger before any training (a trained model on
    disk is a release: crashes, refusals and deletions keep their charge).

    One release per plan, and the ledger is the source of truth (issue 28): it refuses a second release
    of the same plan sha256 inside its serialized transaction (`components.ledger.PlanAlreadyReleased`).
    A plan whose release is `reserved` or `crashed` resumes under it — also when the process died between
    the ledger's commit and writing the run folder's copy (`ledger_reservation.json`, a cache): the
    retired people and dropped secrets are read back from the ledger. A plan whose release already
    finished training is refused rather than trained (and charged) again, with what to do instead.
    Secret-protection plans are also charged per secret (KL, composed across releases) in the same
    transaction; the records holding a secret that has no KL budget left are dropped from the release.
    Returns {"release_id", "retired": [ids], "dropped_records": [record ids]} (private), or None when the
    mechanism has no Rényi curve and no budget applies (filtered ULS without a lifetime budget)."""
    from components.ledger import Ledger, PlanAlreadyReleased, reserve_release  # startup

    path = out_dir / RESERVATION_FILE
    sha = plan_doc["sha256"]
    mech = get_mechanism(plan_doc["mechanism"])
    led = Ledger.open(settings)
    try:
        first = led.plan_release(sha)
        if _rank()[0] > 0:
            # torchrun: rank 0 reserves the one release; the other ranks wait for it and resume it
            # (reading the same retired people and dropped secrets, so every rank trains the same data)
            deadline = time.monotonic() + RANK0_WAIT_S
            while first is None and time.monotonic() < deadline:
                time.sleep(0.5)
                first = led.plan_release(sha)
            if first is None:
                raise VeilError(f"plan {sha[:12]}: rank {_rank()[0]} waited {RANK0_WAIT_S:g} s for rank 0's ledger "
                                "reservation and none came; see rank 0's error")
        if first is None and path.is_file():
            saved = json.loads(path.read_text())
            raise VeilError(f"{path}: names ledger release {saved.get('release_id')} for plan {sha[:12]}, but the ledger "
                            f"at {led._where()} has no release of this plan: it was replaced or restored from an older "
                            "copy; restore the ledger that holds that release (charging again would count these "
                            "people twice)")
        if first is None:
            if not mech.ledger_curve and plan_doc.get("lifetime_budget") is None and led.budget() is None:
                return None
            targets = secret_targets(settings, plan_doc) if mech.secret_targets else None
            try:
                res = reserve_release(settings, plan_doc, train_rows(annex), ledger=led, secrets=targets,
                                      population_release_key=(annex.get("population") or {}).get("release_key"))
            except PlanAlreadyReleased as e:      # another trainer's reservation committed first
                raise VeilError(f"plan {sha[:12]}: another trainer reserved it a moment ago (ledger release "
                                f"{e.release_id}, {e.status}); this run stops without charging anyone — wait for "
                                "that one, or run this again once it is gone to resume its release") from None
            # a release with no person-level claim (secret protection) charges and admits nobody: not a refusal
            if not res.admitted and mech.ledger_person_claim:
                led.record(res.release_id, "refused", reason="the filter retired everyone")
                raise VeilError("ledger: every person of this plan has spent their lifetime budget: nothing to train "
                                "(the policy's lifetime_budget is the governance team's call)")
            kill_point("after-reserve")     # committed in the ledger; the run folder's copy not yet written
            # Record ids, not secret ids, are kept in the run folder: a secret id carries the secret's value.
            saved = {"release_id": int(res.release_id), "retired": sorted(res.retired),
                     "dropped_records": secret_records(settings, plan_doc, res.secrets_dropped)}
            _write_private_json(path, saved)
            return saved
        release_id, status = first
        if status not in ("reserved", "crashed"):
            raise _already_released(plan_doc, release_id, status, settings)
        if path.is_file():
            saved = json.loads(path.read_text())
            if int(saved.get("release_id", -1)) == release_id:
                return saved
        # Resume from the ledger: the process that reserved died before (or while) writing the cache.
        targets = secret_targets(settings, plan_doc) if mech.secret_targets else []
        retired, dropped = led.reservation_of(release_id, [str(u) for u in set(train_rows(annex)["user_id"].to_pylist())],
                                              [t.secret_id for t in targets])
        saved = {"release_id": int(release_id), "retired": retired,
                 "dropped_records": secret_records(settings, plan_doc, dropped)}
        _write_private_json(path, saved)
        return saved
    finally:
        led.dispose()


class RunLock:
    """An exclusive lock on a run folder for the whole of a training (fcntl.flock on `.train.lock`): a
    second trainer of the same plan on this machine refuses in one line naming the first, instead of
    racing it on the checkpoints and `private_seed.tmp`. The kernel drops the lock when its process
    dies, so a killed run never leaves it stale. (Across machines, the ledger's one release per plan
    stops the second trainer before any charge.)"""

    def __init__(self, settings: Settings, out_dir: Path, plan_sha256: str | None = None):
        self.settings, self.out_dir, self.plan_sha256 = settings, Path(out_dir), plan_sha256
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        import datetime as _dt
        import fcntl
        import os
        import socket

        self.out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.out_dir / TRAIN_LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise VeilError(f"{self.out_dir}: already being trained by {holder}{self._release_words()}; "
                            "this one stops without charging anyone (run it again once that one has finished "
                            "or died: it resumes the same release)") from None
        me = (f"pid {os.getpid()} on {socket.gethostname()} since "
              f"{_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, me, 0)
        self._fd = fd
        return self

    def _release_words(self) -> str:
        if not self.plan_sha256:
            return ""
        try:
            from components.ledger import Ledger  # startup

            led = Ledger.open(self.settings)
            try:
                first = led.plan_release(self.plan_sha256)
            finally:
                led.dispose()
        except VeilError:
            return ""
        return "" if first is None else f" (ledger release {first[0]}, {first[1]})"

    def __exit__(self, *exc) -> None:
        import os

        if self._fd is not None:
            os.close(self._fd)      # closing the descriptor releases the flock
            self._fd = None


def secret_records(settings: Settings, plan_doc: dict, secret_ids) -> list[str]:
    """Every record the snapshot tags with one of these secrets (all of a dropped secret's records go)."""
    import pyarrow.compute as pc

    if not secret_ids:
        return []
    spans = snapshots.load_snapshot(settings, plan_snapshot_id(settings, plan_doc)).secret_spans
    hit = spans.filter(pc.is_in(spans["secret_id"], pa.array(sorted(set(secret_ids)), spans["secret_id"].type)))
    return sorted({str(r) for r in hit.column("record_id").to_pylist()})


def finished_training(settings: Settings, plan_path: str | Path) -> dict | None:
    """The public train result of PLAN's run when it already finished (its ledger release is past
    `reserved`/`crashed` and train_result.json is there), else None. Lets a retraining that stopped
    after training (before registration) go on without training — or charging — again."""
    from components.ledger import Ledger  # startup
    from components.training.spec import PRIVATE_FIELDS  # startup

    plan_doc = load_plan(plan_path).to_dict()
    out_dir = settings.runs_dir / plan_doc["sha256"][:16]
    res_file = out_dir / "train_result.json"
    if not res_file.is_file():
        return None
    led = Ledger.open(settings)
    try:   # the ledger, not the run folder's cache, says whether the release finished training
        first = led.plan_release(plan_doc["sha256"])
        if first is not None and first[1] in ("reserved", "crashed"):
            return None
    finally:
        led.dispose()
    res = json.loads(res_file.read_text())
    return {k: v for k, v in res.items() if k not in PRIVATE_FIELDS}


def _ledger_event(settings: Settings, reservation: dict | None, status: str, **detail) -> None:
    if reservation is None:
        return
    from components.ledger import Ledger  # startup

    led = Ledger.open(settings)
    try:
        led.record(int(reservation["release_id"]), status, **detail)
    finally:
        led.dispose()


def train(settings: Settings, plan_path: str | Path, base_dir: str | Path, *, progress: bool = True,
          release: bool = True, out_dir: str | Path | None = None, adjust=None, drop_users=(),
          precision: str | None = None) -> dict:
    """Train PLAN's run. `release=False` is a study's tuning run (flows/study.py): not a release, so
    nothing is charged to the ledger, and it trains in `out_dir`, never in the plan's run folder, so
    `certify`/`register` of the plan never see its weights. `adjust(spec, data) -> spec` changes the
    spec (the study's non-private reference); `drop_users` leaves people out (retired by a study's
    own reservation). `precision` (fp32 | bf16 | fp16) overrides the plan's `training.precision`:
    the base model is loaded in that dtype; the certificate records what ran."""
    import pyarrow.compute as pc

    from components.training import TrainSpec, train as run_training  # startup

    # the operator's device, checked first and before any charge: a missing GPU is an error, not a
    # CPU fallback
    device = resolve_device(settings.device)
    plan_doc = load_plan(plan_path).to_dict()
    # the spec (and so a bad precision) is checked before any charge
    spec = TrainSpec.from_plan(plan_doc, **({"precision": precision} if precision is not None else {}))
    annex = _annex(settings, plan_doc)
    data = training_data(settings, plan_doc, annex)
    if not release and out_dir is None:
        raise VeilError("a tuning run (not a release) needs its own out_dir")
    out_dir = Path(out_dir) if out_dir is not None else settings.runs_dir / plan_doc["sha256"][:16]
    # One trainer per run folder for the whole training (RunLock); the ledger's one release per plan
    # covers trainers on other machines.
    # (under torchrun, the job's local rank 0 holds it for the ranks on its machine)
    lock = RunLock(settings, out_dir, plan_doc["sha256"] if release else None) if _rank()[1] == 0 else nullcontext()
    with lock:
        reservation = reserve(settings, plan_doc, annex, out_dir) if release else None
        if reservation and reservation.get("dropped_records"):
            # The per-secret filter's decision reads only the ledger and that secret: its records go.
            data = training_data(settings, plan_doc, annex, drop_records=reservation["dropped_records"])
        retired = sorted(set(reservation["retired"] if reservation else ()) | {str(u) for u in drop_users})
        rows = train_rows(annex)
        if retired and "owners" in rows.column_names:
            # multi-owner: a retired person's records go wherever they are an owner (recipients too)
            out = set(retired)
            shared = [r for r, o in zip(rows["record_id"].to_pylist(), rows["owners"].to_pylist()) if set(o or ()) & out]
            data = training_data(settings, plan_doc, annex,
                                 drop_records=sorted(set(shared) | set((reservation or {}).get("dropped_records") or ())))
        if retired:
            # The filter's decision about a person reads only the ledger and that person: their rows go.
            meta = data.schema.metadata
            data = data.filter(pc.invert(pc.is_in(data["user_id"], pa.array(retired, pa.string()))))
            data = data.replace_schema_metadata(meta)
        from components.dpsgd.precision import dtype_of  # startup

        model, tokenizer = modeling.load_base(base_dir, device=device, dtype=dtype_of(spec.precision))
        if adjust is not None:
            spec = adjust(spec, data)
        try:
            result = run_training(spec, data, model, tokenizer, out_dir, resume=True, progress=progress,
                                  base_dir=base_dir)
        except BaseException as e:
            _ledger_event(settings, reservation, "crashed", reason=type(e).__name__)
            raise
        res = result.to_dict()
        # The run binds to the plan through the salted commitment to the sha256 of the bytes it read
        # (the raw sha256 stays in the run folder: with the roster it would test membership guesses).
        if res.get("train_records_sha256"):
            res["train_records_commitment"] = commitment(annex["salt"], res["train_records_sha256"])
        if reservation is not None:
            res["ledger_release_id"] = int(reservation["release_id"])
        # atomically: a kill mid-write must not leave a truncated result that `finished_training` reads
        _write_private_json(out_dir / "train_result.json", json.loads(json.dumps(res, default=str)))
        kill_point("after-training")   # the result is on disk; the ledger's `trained` event not yet
        _ledger_event(settings, reservation, "trained")
    # Per-step losses, realised batch sizes, exact counts and the count of units dropped for a
    # non-finite gradient are statistics of the sampled private batches: they stay in the run folder.
    pub = result.public_dict()
    for key in ("train_records_commitment", "ledger_release_id"):
        if key in res:
            pub[key] = res[key]
    return pub


def certify(settings: Settings, plan_path: str | Path, train_result: dict) -> dict:
    plan_doc = load_plan(plan_path).to_dict()
    if not get_mechanism(plan_doc["mechanism"]).secret_targets:
        return build_certificate(plan_doc, train_result).to_dict()
    return build_certificate(plan_doc, train_result, secret_targets=secret_targets(settings, plan_doc),
                             untagged_rate=untagged_rate(settings, plan_doc)).to_dict()


def untagged_rate(settings: Settings, plan_doc: dict) -> float | None:
    """The largest rate of a training record holding no protected secret (None: none is trained on)."""
    from components.bounding.secret_plan import untagged_max_rate  # startup

    snap = snapshots.load_snapshot(settings, plan_snapshot_id(settings, plan_doc))
    return untagged_max_rate(train_rows(_annex(settings, plan_doc)), snap.secret_spans, plan_doc["target"]["secrets"])


def secret_targets(settings: Settings, plan_doc: dict) -> list:
    """Every secret the plan's training rows hold, with its class' (κ, γ) and the rows' Poisson rates."""
    from components.accounting.secrets import secret_targets as targets_for  # startup

    snap = _plan_snapshot(settings, plan_doc)
    return targets_for(train_rows(load_annex(settings.private_dir, plan_doc)), snap.secret_spans,
                       plan_doc["target"]["secrets"])


def register(settings: Settings, *, name: str, certificate: dict, plan_path: str | Path, base_dir: str | Path,
             adapter_dir: str | Path | None, alias: str | None = "latest-certified") -> dict:
    from components.registry import register_model  # startup

    plan_doc = load_plan(plan_path).to_dict()
    _check_certified_weights(certificate, adapter_dir)
    target_eps = plan_doc["target"].get("epsilon")

    with step(f"register {name}"):   # sealing, packaging and copying the model into MLflow
        reg = register_model(settings, name=name, certificate=certificate, plan=plan_doc, base_model_dir=base_dir,
                             adapter_dir=adapter_dir,
                             policy_max_epsilon=float(target_eps) if target_eps is not None else None, alias=alias)
    # MLflow copies artifacts with their source's mode (a base model outside VEIL_HOME may be 0644)
    settings.make_private(settings.mlflow_artifacts_dir)
    return reg.to_dict()


def settle_latest(settings: Settings, model_uri: str, audit_summary: dict | None) -> None:
    """`latest-certified` is never on a version whose audit failed (the promotion gate checks it at load,
    components.registry.gate): registration set it before the audit; a failed audit takes it off."""
    if (audit_summary or {}).get("verdict") != "failed":
        return
    from components.registry.gate import LATEST  # startup
    from components.registry.mlflow_registry import _client  # startup

    name, version = model_uri[len("models:/"):].split("/", 1)
    client = _client(settings)
    try:
        on = client.get_model_version_by_alias(name, LATEST).version
    except Exception:  # noqa: BLE001 - MLflow raises when the alias is not set
        return
    if str(on) == str(version):
        client.delete_registered_model_alias(name, LATEST)


def _check_certified_weights(certificate: dict, weights_dir: str | Path | None) -> None:
    """The weights being registered are the ones the certificate names (nothing swapped since)."""
    want = ((certificate.get("run") or {}).get("weights") or {}).get("sha256")
    if want is None:
        raise VeilError("certificate names no trained weights (made by an older Veil): certify the run again")
    if weights_dir is None or weights_fingerprint(weights_dir)["sha256"] != want:
        raise VeilError(f"{weights_dir}: these weights are not the ones the certificate names "
                        f"(sha256 {want[:12]}…): not registered")


@dataclass
class PipelineResult:
    ingest: dict
    plan_path: str
    plan: dict
    train: dict
    certificate: dict
    registration: dict
    audit: dict | None


def audit(settings: Settings, model_uri: str, *, policy: str | Path | None = None,
          truth: str | Path | None = None, progress: bool = True) -> dict:
    """Audit a registered model; aggregates go into its certificate, per-user scores stay private."""
    from components.audit.run import run_audit  # startup
    from components.registry import load_model, record_audit  # startup

    loaded = load_model(model_uri, settings, interrupted_audit_ok=True)   # a killed audit is done again
    snap = snapshots.load_snapshot(settings, plan_snapshot_id(settings, loaded.plan))
    thresholds = load_policy(policy).spec.audit if policy else None
    truth_doc = json.loads(Path(truth).read_text()) if truth else None
    result = run_audit(loaded, snap.records, policy_thresholds=thresholds, settings=settings, truth=truth_doc,
                       secret_spans=snap.secret_spans, progress=progress)
    summary = result.summary() if hasattr(result, "summary") else dict(result)
    new_cert = record_audit(settings, model_uri, summary, plot_path=getattr(result, "plot_path", None))
    return {"summary": summary, "certificate": new_cert}


def _reference_model(settings: Settings, reference: str, base):
    """(model, tokenizer, identity) of a non-private reference: a registered model URI, a peft adapter
    directory (on the evaluated model's base), or a Hugging Face causal-LM directory. The identity (its
    run, or its files' hash) names it in the evaluation release."""
    if reference.startswith("models:/"):
        from components.registry import load_model  # startup

        ref = load_model(reference, settings)
        return ref.model, ref.tokenizer, "run:" + str(ref.run_id)
    p = Path(reference).expanduser()
    if not p.is_dir():
        raise VeilError(f"--reference {reference}: neither a models:/ URI nor a model directory")

    identity = "files:" + directory_fingerprint(p)["sha256"]
    if (p / "adapter_config.json").is_file():
        import copy

        from peft import PeftModel

        return PeftModel.from_pretrained(copy.deepcopy(base[0]), str(p)).eval(), base[1], identity
    return (*modeling.load_base(p), identity)


def evaluation_params(plan_doc: dict, policy: str | Path | None = None):
    """The public (ε, δ, nll_clip) of an evaluation release: the given policy's `evaluation`, else the
    plan's own policy file when it is still there unchanged (sha256), else the documented defaults."""
    if policy is not None:
        return load_policy(policy).spec.evaluation
    ref = plan_doc.get("policy") or {}
    path = ref.get("path")
    if path and Path(path).is_file():
        try:
            pol = load_policy(path)
        except VeilError:
            pol = None
        if pol is not None and pol.sha256 == ref.get("sha256"):
            return pol.spec.evaluation
    return Evaluation()


def evaluate(settings: Settings, model_uri: str, *, reference: str | None = None, log: bool = True,
             batch_size: int = 64, missing_ok: bool = False, policy: str | Path | None = None,
             progress: bool = True) -> dict | None:
    """Perplexity and next-token accuracy of a registered model, its base and (optionally) a reference
    on the plan's evaluation people (never trained on).

    The exact figures (and exact counts of evaluation people and records) are the operator's: they are
    returned, never logged. With `log`, the model's run gets only the DP release of
    `components.evaluation.release` (per-person clipped metrics + Gaussian noise at the policy's
    `evaluation.epsilon`), charged in the ledger to every evaluation person it counts; that part is
    returned under `published`. `missing_ok` (pipelines): None instead of an error when the plan
    reserved no evaluation people."""
    from components.registry import load_model, record_evaluation  # startup

    loaded = load_model(model_uri, settings, with_base=True)
    plan = dict(loaded.plan)
    annex = _annex(settings, plan)
    if missing_ok and not annex.get("eval_records_file"):
        return None
    # multi-owner data: only what each evaluation person owns alone is scored (planning.data), so one
    # person's content moves their own figures only
    rows = evaluation_records(plan, annex, _plan_snapshot(settings, plan, annex).records, single_owner=True)
    if rows.num_rows == 0:
        raise VeilError(f"{model_uri}: no evaluation person owns a record alone (multi-owner data); nothing to score")
    texts = rows.column("text").to_pylist()
    users = rows.column("user_id").to_pylist()
    seq_len = int(plan["training"]["seq_len"])
    base = loaded.extra["base_model"]
    if base[1].get_vocab() != loaded.tokenizer.get_vocab():
        raise VeilError(f"{model_uri}: its base model's tokenizer differs from the model's; perplexities per token "
                        "would not be comparable")
    params = evaluation_params(plan, policy) if log else None
    dp, dp_stats = evaluate_texts_per_text(loaded.model, loaded.tokenizer, texts, max_length=seq_len,
                                           batch_size=batch_size, progress="evaluate: model" if progress else None)
    b, b_stats = evaluate_texts_per_text(base[0], base[1], texts, max_length=seq_len, batch_size=batch_size,
                                         progress="evaluate: base" if progress else None)
    # the base is fixed by the model's certificate (its fingerprint); the run names the fine-tuned weights
    identities = {"model": "run:" + str(loaded.run_id),
                  "base": "base:" + sha256_json((loaded.certificate or {}).get("base_model") or {})}
    stats = {"model": dp_stats, "base": b_stats}
    ref = None
    if reference:
        r_model, r_tok, identities["reference"] = _reference_model(settings, reference, base)
        if r_tok.get_vocab() != loaded.tokenizer.get_vocab():
            raise VeilError(f"--reference {reference}: another tokenizer than the model's; perplexities per token "
                            "would not be comparable")
        ref, stats["reference"] = evaluate_texts_per_text(r_model, r_tok, texts, max_length=seq_len,
                                                          batch_size=batch_size,
                                                          progress="evaluate: reference" if progress else None)
    out = {"model_uri": model_uri, "run_id": loaded.run_id,
           "perplexity": dp.perplexity, "base_perplexity": b.perplexity,
           "next_token_accuracy": dp.next_token_accuracy, "base_next_token_accuracy": b.next_token_accuracy,
           "reference_perplexity": None if ref is None else ref.perplexity,
           "reference_next_token_accuracy": None if ref is None else ref.next_token_accuracy,
           "eval_people": len(set(users)), "eval_records": dp.records,
           "eval_tokens": dp.tokens, "max_length": seq_len,
           # issue 16's target: the share of the base → non-private perplexity gap the DP model closes
           "gap_closed": None if ref is None or b.perplexity == ref.perplexity else
           (b.perplexity - dp.perplexity) / (b.perplexity - ref.perplexity),
           "published": None}
    # base or privacy? from the exact figures: the operator's, like them (never logged)
    out["utility_limit"] = diagnose(out, (loaded.certificate or {}).get("utility_forecast") or plan.get("utility_forecast"),
                                    loaded.extra.get("base_facts"))
    if log:
        per_model = {name: person_means(users, *st) for name, st in stats.items()}
        rel = publish_evaluation(settings, plan=plan, run_id=str(loaded.run_id), models=identities,
                                 per_model=per_model, epsilon=float(params.epsilon), delta=float(params.delta),
                                 nll_clip=float(params.nll_clip), record=record_evaluation)
        out["published"] = {"metrics": dict(rel.metrics), "epsilon": float(params.epsilon),
                            "delta": float(params.delta), "nll_clip": float(params.nll_clip),
                            "noise_multiplier": float(rel.tags["evaluation.noise_multiplier"]),
                            "ledger_release_id": rel.release_id, "reused": rel.reused,
                            # exact and private, like eval_people: the operator's terminal only
                            "counted_people": rel.counted}
        out["caveat"] = CAVEAT
    return out


def plan_snapshot_ref(settings: Settings, plan_doc: dict, annex: dict | None = None) -> tuple[str, str]:
    """(snapshot_id, snapshot_sha256) of the plan's snapshot. The public plan carries only a salted
    commitment to them (issue 22); they are read from the plan's private annex (loaded here when not
    given). A plan from before the commitment still names them in its public data section."""

    data = plan_doc.get("data") or {}
    if annex is None:
        try:
            annex = _annex(settings, plan_doc)
        except VeilError:
            if data.get("snapshot_commitment"):
                raise
            annex = None        # a plan from before the commitment names its snapshot publicly
    return ref(plan_doc, annex)


def snapshot_commitment_of(settings: Settings, snapshot_id: str) -> str:
    """The salted commitment a plan of this snapshot publishes (`data.snapshot_commitment`): how logs that
    leave the private area (Prefect) name a snapshot. Keyed by this home's plan key."""

    return snapshot_commitment(plan_key(settings.private_dir), snapshot_id,
                               snapshots.load_snapshot(settings, snapshot_id, verify=False).sha256)[1]


def plan_snapshot_id(settings: Settings, plan_doc: dict, annex: dict | None = None) -> str:
    return plan_snapshot_ref(settings, plan_doc, annex)[0]


def _plan_snapshot(settings: Settings, plan_doc: dict, annex: dict | None = None):
    sid, sha = plan_snapshot_ref(settings, plan_doc, annex)
    snap = snapshots.load_snapshot(settings, sid)
    if snap.sha256 != sha:
        raise VeilError(f"snapshot {sid} changed since planning (sha256 differs)")
    return snap
