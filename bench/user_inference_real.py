"""Seed 003 on a real corpus: user inference against fine-tuning without bounds, with within-person
dedup, with a contribution bound, and with user-level DP — side by side, one run, the same people.

    VEIL_HOME=HOME python bench/user_inference_real.py --policy policies/debian-changelogs.yaml \\
        --base-model BASE --source /usr/share/doc [--steps 120] [--batch 64] [--k 2] [--epsilon 8] \\
        [--holdout 0.5] [--m 2] [--settings nodedup,dedup,bounded,dp] [--plot PNG] [--json]

HOME holds the corpus (`veil ingest /usr/share/doc --format debian-changelog --policy P`).

**The attack** (Kandpal et al., seed 003): for a person with attacker samples x⁽¹⁾…x⁽ᵐ⁾, the statistic is
the mean over i of log p_θ(x⁽ⁱ⁾) − log p_ref(x⁽ⁱ⁾), the reference p_ref being the public base the model
was fine-tuned from (`components.audit.user_inference.score_users`). Members ("in") are trained people,
non-members ("out") people held out of training. **Fresh samples**: the plan's audit split
(`components.draws.audit_split`) holds out each person by an independent keyed draw
(probability `--holdout`) and, from *every* eligible person (≥ m+1 distinct records), reserves m of their
own records for the attacker before training: an in-person's attacker samples are never trained on.

**Settings** (all on the same plan split, the same steps, the same public base):

* `nodedup` — baseline: non-private fine-tuning (`nonprivate` mechanism: Poisson records, no clipping,
  no noise) on every in-person's records *as shipped*: each changelog entry repeated as many times as
  the machine has copies of it (binary packages of one source ship the same changelog; the catalog's
  ingest drops those within-person exact duplicates — here they are put back, counted by re-reading
  `--source` with the Debian connector and matching each record's id).
* `dedup` — the same without the duplicates (the catalog's snapshot).
* `bounded` — dedup + a contribution bound: at most `--k` records per person (the ELS plan's
  per-person random pick, `contribution.max_records_per_user`), trained non-privately.
* `dp` — ours: ULS user-level DP-SGD at person-level `--epsilon` (G = k records per visit), as planned.

Non-private settings draw `--batch` expected records per step; DP draws the plan's expected people per
step (≤ G records each). Reported per setting: perplexity on the plan's evaluation people (utility),
the attack's AUROC (bootstrap std), TPR at low FPR, the AUROC per bin of the person's data amount
(`auroc_by_share`: bins cut on the records a person has for training — for a held-out person, what they
would have had — with each setting's mean share of the training rows per bin), and the slope gap
(`share_slope_gap`: how much faster members' scores rise with log share than non-members'). For `dp`,
the AUROC ceiling any attack can reach against the plan's (ε, δ) and against its whole privacy-loss
profile (`components.audit.ceiling`), and the audit's verdict on the measured attack.

Per-person scores are membership evidence: they are never written; only aggregates are printed.
Everything here trains on private data and is a tuning measurement: not covered by any certificate.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETTINGS = ("nodedup", "dedup", "bounded", "dp")
DESCRIBE = {
    "nodedup": "non-private, no bound, duplicates as shipped",
    "dedup": "non-private, no bound, within-person dedup",
    "bounded": "non-private, dedup + ≤k records per person",
    "dp": "ULS DP-SGD (user-level ε), dedup, G=k",
}


def variant_policy(base_policy: Path, mechanism: str, epsilon: float, k: int, training: dict, holdout: float,
                   m: int, out: Path, lora: bool) -> Path:
    """The study's point policy (flows.study_grid.point_policy) with the audit split this bench needs."""
    import yaml

    from components.policy import load_policy
    from flows.study_grid import Point, point_policy

    p = point_policy(base_policy, Point(mechanism=mechanism, epsilon=epsilon, selection="random", k=k, lora=lora),
                     training, out)
    doc = yaml.safe_load(p.read_text())
    audit = dict(doc["spec"].get("audit") or {})
    audit["holdout_users"] = float(holdout)
    audit["attacker_samples_per_user"] = int(m)
    doc["spec"]["audit"] = audit
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    load_policy(p)
    return p


def multiplicities(source: Path) -> Counter:
    """How many copies of each (person, entry) the source holds, keyed like the catalog's record id
    (sha256 of user ‖ 0x1f ‖ text, catalog/ingest.py)."""
    from catalog.connectors.debian import DebianChangelogSource

    c: Counter = Counter()
    for b in DebianChangelogSource(source).batches():
        d = b.to_pydict()
        for u, t, err in zip(d.get("user", []), d.get("text", []), d.get("error", [])):
            if err or u is None or t is None:
                continue
            c[hashlib.sha256((u.strip() + "\x1f" + t).encode()).hexdigest()] += 1
    return c


def rid(user: str, text: str) -> str:
    return hashlib.sha256((user + "\x1f" + text).encode()).hexdigest()


def nonprivate_spec(spec, rows: int, batch: int):
    """Poisson records at `batch` expected records per step, no clipping, no noise (the study's
    `nonprivate` reference, at a fixed expected batch so the settings train on equal compute)."""
    return replace(spec, mechanism="nonprivate", noise_multiplier=0.0, sampling_rate=min(1.0, batch / max(1, rows)),
                   expected_batch_size=float(batch), selection=None)


def slope_gap_std(scores, labels, x, n_boot: int, seed: int = 0) -> float:
    """Bootstrap std of share_slope_gap: members and non-members resampled within their group."""
    import numpy as np

    from components.audit.user_inference import share_slope_gap

    rng = np.random.default_rng(seed)
    yi, yo = np.flatnonzero(labels), np.flatnonzero(~labels)
    out = []
    for _ in range(max(2, n_boot)):
        idx = np.concatenate([rng.choice(yi, yi.size), rng.choice(yo, yo.size)])
        try:
            out.append(share_slope_gap(scores[idx], labels[idx], x[idx]))
        except Exception:  # a resample with one distinct share on a side: skip it
            continue
    return float(np.std(out, ddof=1))


def merge(paths: list[Path]) -> dict:
    """One table from runs of this bench over disjoint --settings (same plan split, bins and eval texts:
    checked), e.g. the DP setting run in a second process to save wall time."""
    docs = [json.loads(p.read_text()) for p in paths]
    first = docs[0]
    for d in docs[1:]:
        for key in ("corpus", "split", "training", "eval"):
            if d[key] != first[key] and key != "split":
                raise SystemExit(f"--merge: {key} differs between runs: not one comparison")
        if d["split"]["bin_edges_records"] != first["split"]["bin_edges_records"]:
            raise SystemExit("--merge: the runs' bins differ")
    order = {s: i for i, s in enumerate(SETTINGS)}
    out = dict(first)
    out["rows"] = sorted((r for d in docs for r in d["rows"]), key=lambda r: order[r["setting"]])
    out["merged_from"] = [str(p) for p in paths]
    out["seconds"] = round(sum(d["seconds"] for d in docs), 1)
    return out


def train_setting(spec, data, base_dir: Path, out_dir: Path) -> dict:
    """One run of the training engine (components.training.train) — the same engine every stage uses."""
    from components.modeling import load_base
    from components.training import train as run_training

    model, tok = load_base(base_dir)
    res = run_training(spec, data, model, tok, out_dir, resume=False, progress=False, base_dir=base_dir)
    return res.public_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, required=True)
    ap.add_argument("--base-model", type=Path, required=True)
    ap.add_argument("--source", type=Path, default=Path("/usr/share/doc"),
                    help="the Debian changelog tree the corpus was ingested from (for the duplicate counts)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=64, help="expected records per step (non-private settings)")
    ap.add_argument("--dp-batch", type=int, default=48, help="expected people per step (dp)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the policy's)")
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of the policy's LoRA")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--holdout", type=float, default=0.5)
    ap.add_argument("--m", type=int, default=2, help="attacker samples per person")
    ap.add_argument("--bins", type=int, default=3, help="bins of the person's data amount (quantiles)")
    ap.add_argument("--edges", type=float, nargs="+", default=None,
                    help="inner bin edges in records (instead of quantiles), e.g. 5.5 20.5: same bins across splits")
    ap.add_argument("--seed", type=int, default=None,
                    help="the policy's training seed, which also keys the plan's split: another seed, other people in/out")
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--eval-records", type=int, default=600)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--workdir", type=Path, default=None, help="runs go here (default VEIL_HOME/bench-user-inference)")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="combine the --json outputs of earlier runs (disjoint --settings) into one table")
    args = ap.parse_args()
    if args.merge:
        doc = merge(args.merge)
        if args.plot is not None:
            plot(doc, args.plot)
            doc["plot"] = str(args.plot)
        print(json.dumps(doc, indent=2, sort_keys=True, default=str) if args.json else "", end="")
        if not args.json:
            print_table(doc)
        return
    wanted = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = sorted(set(wanted) - set(SETTINGS))
    if bad:
        ap.error(f"--settings: unknown {bad[0]!r}; choose from {', '.join(SETTINGS)}")

    import numpy as np
    import pyarrow as pa
    import torch

    from catalog.snapshots import load_snapshot
    from components.audit.ceiling import certificate_ceilings
    from components.audit.user_inference import (auroc_by_share, score_users, share_slope_gap,
                                                 user_inference_report)
    from components.core.settings import load_settings
    from components.evaluation import evaluate_texts
    from components.modeling import load_base
    from components.modeling.base import load_finetuned
    from components.planning import load_plan
    from components.draws.annex import load_annex
    from components.draws.data import attacker_rows
    from components.training import TrainSpec
    from flows import stages
    from flows.study import eval_texts

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t_start = time.perf_counter()
    s = load_settings().ensure()
    work = args.workdir or (s.home / "bench-user-inference" / time.strftime("%Y%m%dT%H%M%S"))
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    base_dir = Path(stages.base_model(s, base_model_dir=args.base_model))
    training = {"steps": args.steps, "expected_batch_size": args.dp_batch}
    if args.seed is not None:
        training["seed"] = args.seed
    if args.lr is not None:
        training["learning_rate"] = args.lr
    lora = not args.full

    # the same split for every setting: ULS (unbounded rows; the dp setting's own plan) and ELS (≤ k rows)
    plans = {}
    for mech in ("uls", "els"):
        pol = variant_policy(args.policy, mech, args.epsilon, args.k, training, args.holdout, args.m,
                             work / f"policy-{mech}.yaml", lora)
        plans[mech] = load_plan(stages.plan(s, pol, base_dir=base_dir)["plan_path"]).to_dict()
    annexes = {k: load_annex(s.private_dir, p) for k, p in plans.items()}
    att = {k: attacker_rows(a).sort_by([("record_id", "ascending")]) for k, a in annexes.items()}
    if not (att["uls"]["record_id"].equals(att["els"]["record_id"]) and att["uls"]["member"].equals(att["els"]["member"])):
        raise SystemExit("the ULS and ELS plans split people differently: the settings would not be comparable")
    uls_plan = plans["uls"]
    from flows.stages import plan_snapshot_id

    uls_snapshot = plan_snapshot_id(s, uls_plan)     # the operator's own report: the real id (annex)
    snap = load_snapshot(s, uls_snapshot)
    texts = dict(zip(snap.records["record_id"].to_pylist(), snap.records["text"].to_pylist()))
    a = att["uls"]
    samples = pa.table({"user_id": a["user_id"], "text": [texts[r] for r in a["record_id"].to_pylist()],
                        "member": a["member"]})
    seq_len = int(uls_plan["training"]["seq_len"])

    # each scored person's data amount: distinct records left for training (the attacker's m removed),
    # and how many copies of those the source ships — for held-out people, what they would have had
    attacked = set(a["user_id"].to_pylist())
    att_ids = set(a["record_id"].to_pylist())
    mult = multiplicities(args.source)
    n_avail: Counter = Counter()
    n_copies: Counter = Counter()
    for r, u in zip(snap.records["record_id"].to_pylist(), snap.records["user_id"].to_pylist()):
        if u in attacked and r not in att_ids:
            n_avail[u] += 1
            n_copies[u] += max(1, mult.get(r, 0))

    # training data per setting
    data_uls = stages.training_data(s, uls_plan, annexes["uls"])
    data_els = stages.training_data(s, plans["els"], annexes["els"])
    users_uls = data_uls["user_id"].to_pylist()
    found = np.array([mult.get(rid(u, t), 0) for u, t in zip(users_uls, data_uls["text"].to_pylist())])
    matched = float((found > 0).mean()) if found.size else 1.0
    if matched < 0.99:  # people aliases (merged ids) or another source: the copy counts would be wrong
        raise SystemExit(f"--source {args.source}: only {matched:.1%} of the training rows were found there; "
                         "the nodedup setting needs the tree the corpus was ingested from (and no people aliases)")
    reps = np.maximum(1, found)
    data_dup = data_uls.take(pa.array(np.repeat(np.arange(data_uls.num_rows), reps)))
    data_dup = data_dup.replace_schema_metadata(data_uls.schema.metadata)
    spec_uls = TrainSpec.from_plan(uls_plan)
    spec_els = TrainSpec.from_plan(plans["els"])
    runs = {
        "nodedup": (nonprivate_spec(spec_uls, data_dup.num_rows, args.batch), data_dup),
        "dedup": (nonprivate_spec(spec_uls, data_uls.num_rows, args.batch), data_uls),
        "bounded": (nonprivate_spec(spec_els, data_els.num_rows, args.batch), data_els),
        "dp": (spec_uls, data_uls),
    }
    amount = {"nodedup": n_copies, "dedup": n_avail, "bounded": Counter({u: min(n, args.k) for u, n in n_avail.items()}),
              "dp": Counter({u: min(n, args.k) for u, n in n_avail.items()})}

    _, ev_texts = eval_texts(s, uls_plan, args.eval_records)
    base, btok = load_base(base_dir)
    ev0 = evaluate_texts(base, btok, ev_texts, max_length=seq_len, batch_size=32)

    # bins on the person's distinct records for training (setting-independent): quantiles
    users_sorted = sorted(attacked)
    navail = np.array([n_avail[u] for u in users_sorted], dtype=float)
    if args.edges:
        inner = np.array(sorted(args.edges), dtype=float)
    else:
        q = np.unique(np.floor(np.quantile(navail, np.linspace(0, 1, args.bins + 1)[1:-1])))
        inner = q[(q > navail.min()) & (q < navail.max())] + 0.5
    inner = inner[(inner > navail.min()) & (inner < navail.max())]
    edges = np.concatenate([[navail.min()], inner, [navail.max()]])

    rows = []
    for name in wanted:
        spec, data = runs[name]
        t0 = time.perf_counter()
        tr = train_setting(spec, data, base_dir, work / name)
        t_train = time.perf_counter() - t0
        model, tok = load_finetuned(base_dir, adapter_dir=tr.get("adapter_dir"), model_dir=tr.get("model_dir"))
        model.eval()
        ev = evaluate_texts(model, tok, ev_texts, max_length=seq_len, batch_size=32)
        scores = score_users(model, tok, samples, reference=base, seq_len=seq_len, batch_size=32)
        by_user = dict(zip(scores["user_id"].to_pylist(), zip(scores["member"].to_pylist(),
                                                               scores["score"].to_pylist())))
        y = np.array([by_user[u][0] for u in users_sorted], dtype=bool)
        sc = np.array([by_user[u][1] for u in users_sorted])
        if name == "dp":
            # ULS samples people and takes ≤ G records from each: a person's share of what a step sees
            per = Counter(data["user_id"].to_pylist())
            total = float(sum(min(n, args.k) for n in per.values()))
        else:
            total = float(data.num_rows)
        share = np.array([amount[name][u] / total for u in users_sorted])
        dp = name == "dp"
        eps = float(uls_plan["accounting"]["epsilon"]) if dp else None
        delta = float(uls_plan["target"]["delta"]) if dp else None
        ceil = {"auroc_ceiling": None, "auroc_ceiling_pld": None}
        if dp:
            cert_like = {"privacy_unit": "user", "mechanism": uls_plan["mechanism"], "epsilon": eps, "delta": delta,
                         "sampling_rate": uls_plan["sampling_rate"], "noise_multiplier": uls_plan["noise_multiplier"],
                         "steps": int(tr["steps_run"]),
                         "contribution_bound": {"records_per_user": uls_plan["records_per_user"]}}
            ceil = certificate_ceilings(cert_like)
        rep = user_inference_report(scores, eps, delta, bootstrap=args.bootstrap, seed=0,
                                    auroc_ceiling_pld=ceil["auroc_ceiling_pld"])
        bins = auroc_by_share(sc, y, navail, edges, bootstrap=args.bootstrap)
        for b in bins:   # the setting's own share of the training rows, per bin (records → share)
            inside = (navail >= b["lo"]) & ((navail <= b["hi"]) if b is bins[-1] else (navail < b["hi"]))
            b["mean_records"] = b.pop("mean_share")
            b["mean_share"] = float(share[inside].mean()) if inside.any() else None
        row = {
            "setting": name, "description": DESCRIBE[name].replace("k", str(args.k)) if name != "nodedup" else DESCRIBE[name],
            "mechanism": spec.mechanism, "train_rows": data.num_rows, "steps": tr.get("steps_run"),
            "expected_batch": spec.expected_batch_size, "noise_multiplier": spec.noise_multiplier,
            "epsilon": eps, "delta": delta, "perplexity": ev.perplexity, "base_perplexity": ev0.perplexity,
            "auroc": rep["auroc"], "auroc_std": rep["auroc_std"], "auroc_interval": rep["auroc_interval"],
            "tpr_at_fpr": rep["tpr_at_fpr"], "users_in": rep["users_in"], "users_out": rep["users_out"],
            "bins": bins, "slope_gap": share_slope_gap(sc, y, np.log(share)),
            "slope_gap_std": slope_gap_std(sc, y, np.log(share), args.bootstrap),
            "auroc_ceiling": ceil["auroc_ceiling"], "auroc_ceiling_pld": ceil["auroc_ceiling_pld"],
            "verdict": rep["verdict"] if dp else None, "epsilon_lower_bound": rep["epsilon_lower_bound"] if dp else None,
            "train_seconds": round(t_train, 1),
        }
        rows.append(row)
        print(f"[{name}] auroc {row['auroc']:.3f} ± {row['auroc_std']:.3f}  ppl {row['perplexity']:.1f}  "
              f"bins {[None if b['auroc'] is None else round(b['auroc'], 3) for b in bins]}  {t_train:.0f}s",
              file=sys.stderr, flush=True)

    doc = {"corpus": {"snapshot_id": uls_snapshot, "source": str(args.source),
                      "training_rows_found_in_source": matched},
           "split": {"holdout_probability": args.holdout, "attacker_samples_per_user": args.m,
                     "fresh_samples": "each scored person's m attacker records are reserved before training "
                                      "and never trained on",
                     "users_in": rows[0]["users_in"] if rows else None,
                     "users_out": rows[0]["users_out"] if rows else None,
                     "bin_edges_records": [float(e) for e in edges]},
           "training": {"steps": args.steps, "seed": spec_uls.seed, "nonprivate_records_per_step": args.batch,
                        "dp_people_per_step": args.dp_batch, "k": args.k, "lora": lora,
                        "learning_rate": spec_uls.learning_rate, "seq_len": seq_len},
           "reference": "the public base model (p_ref = p_θ0)",
           "eval": {"records": ev0.records, "tokens": ev0.tokens, "base_perplexity": ev0.perplexity},
           "rows": rows, "seconds": round(time.perf_counter() - t_start, 1),
           "caveat": "measured on private people; tuning numbers, not covered by any certificate"}
    if args.plot is not None and rows:
        plot(doc, args.plot)
        doc["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return
    print_table(doc)


def print_table(doc: dict) -> None:
    sp = doc["split"]
    print(f"user inference (seed 003), {sp['users_in']} in / {sp['users_out']} out people, m = "
          f"{sp['attacker_samples_per_user']} fresh samples each; reference = public base")
    print(f"{'setting':<10}{'what':<46}{'rows':>7}{'PPL':>8}{'AUROC':>8}{'± sd':>7}{'TPR@10%':>9}{'slope gap':>14}"
          "  AUROC per bin")
    for r in doc["rows"]:
        tpr = r["tpr_at_fpr"].get("0.1", r["tpr_at_fpr"].get(0.1))
        bins = "  ".join("—" if b["auroc"] is None else f"{b['auroc']:.2f}" for b in r["bins"])
        print(f"{r['setting']:<10}{r['description'][:45]:<46}{r['train_rows']:>7}{r['perplexity']:>8.1f}"
              f"{r['auroc']:>8.3f}{r['auroc_std']:>7.3f}{tpr:>9.3f}"
              f"{r['slope_gap']:>8.2f}±{r['slope_gap_std']:<5.2f}  {bins}")
    e = doc["split"]["bin_edges_records"]
    print("bins (records a person has for training): "
          + ", ".join(f"[{e[i]:g}, {e[i + 1]:g}{']' if i == len(e) - 2 else ')'}" for i in range(len(e) - 1)))
    for r in doc["rows"]:
        if r["setting"] == "dp":
            print(f"dp: ε = {r['epsilon']:.2f}, δ = {r['delta']:g}: AUROC ceiling {r['auroc_ceiling']:.5f} ((ε, δ)), "
                  f"{r['auroc_ceiling_pld']:.5f} (privacy-loss profile); measured {r['auroc']:.3f} "
                  f"[{r['auroc_interval'][0]:.3f}, {r['auroc_interval'][1]:.3f}] → verdict {r['verdict']}")


def plot(doc: dict, path: Path) -> None:
    """Left: AUROC per bin against the bin's mean share of the training rows (each setting's own
    share); right: the same AUROCs per bin of the person's record count, settings side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    e = doc["split"]["bin_edges_records"]
    # edges sit between integers (k + 0.5) except the outer ones: label each bin by its whole counts
    labels = [f"{math.ceil(e[i]):d}–{(math.floor(e[i + 1]) if i == len(e) - 2 else math.ceil(e[i + 1]) - 1):d}"
              for i in range(len(e) - 1)]
    n = max(1, len(doc["rows"]))
    for j, r in enumerate(doc["rows"]):
        pts = [(b["mean_share"], b["auroc"], b.get("auroc_std") or 0.0) for b in r["bins"] if b["auroc"] is not None]
        if not pts:
            continue
        x, y, err = zip(*pts)
        lab = f"{r['setting']}: {r['description']} (all: {r['auroc']:.2f})"
        ax.errorbar([100 * v for v in x], y, yerr=err, marker="o", capsize=3, label=lab)
        xs = [i + (j - (n - 1) / 2) * 0.12 for i, b in enumerate(r["bins"]) if b["auroc"] is not None]
        ax2.errorbar(xs, y, yerr=err, marker="o", capsize=3, label=r["setting"])
    for a in (ax, ax2):
        a.axhline(0.5, color="grey", lw=0.8, ls="--")
        a.set_ylabel("user-inference AUROC, in vs out (±1 bootstrap sd)")
    ax.set_xscale("log")
    ax.set_xlabel("person's share of the training rows (%, bin mean; held-out: as if trained)")
    ax.set_title("AUROC vs a person's share", fontsize=10)
    ax.legend(fontsize=6.5, loc="lower left")
    ax2.set_xticks(range(len(labels)), labels)
    ax2.set_xlabel("records the person has for training (bin)")
    ax2.set_title("AUROC per bin of a person's data, by setting", fontsize=10)
    ax2.legend(fontsize=7, loc="lower left")
    fig.suptitle("Seed 003 on the Debian changelogs (%d in / %d out people, m = %d fresh samples)"
                 % (doc["split"]["users_in"], doc["split"]["users_out"], doc["split"]["attacker_samples_per_user"]),
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
