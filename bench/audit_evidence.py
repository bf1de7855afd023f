"""Audit evidence: a non-private fine-tune next to the DP fine-tune of the same base, same data, same steps.

On the demo organization: ingest → base model (public corpus) → plan (policies/demo.yaml, ULS) →
two LoRA fine-tunes of the same base on the same planned records for the same number of steps:
  - "non-private": Poisson records at the plan's rate, no clipping, no noise (the baseline);
  - "DP (plan)":   the plan's user-level DP-SGD (q, σ, C, T, G).
Synthetic canary users (half injected, half held out) ride along in both. Then `run_audit` on each:
user-inference AUROC ± bootstrap std next to the DP ceiling, TPR at low FPR, canary AUROC/exposure,
and secret exposure of the planted secrets (truth.json) against the base model.

    python bench/audit_evidence.py            # table
    python bench/audit_evidence.py --json     # one JSON document
    python bench/audit_evidence.py --steps 60 --users 120 --candidates 50    # quicker
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--users", type=int, default=240, help="demo organization size")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the plan's)")
    ap.add_argument("--canaries", type=int, default=20, help="canary users (half injected)")
    ap.add_argument("--candidates", type=int, default=100, help="random candidates per secret")
    ap.add_argument("--per-class", type=int, default=15, help="secrets probed per class")
    ap.add_argument("--home", type=Path, default=None, help="VEIL_HOME to use (default: a temp dir)")
    ap.add_argument("--base-model", type=Path, default=None, help="reuse a built base model directory")
    ap.add_argument("--nonprivate-steps", type=int, default=None,
                    help="steps of the non-private baseline (default: the DP run's; more = more epochs)")
    ap.add_argument("--nonprivate-lr", type=float, default=None,
                    help="learning rate of the non-private baseline (default: the plan's)")
    ap.add_argument("--nonprivate-full", action="store_true",
                    help="fine-tune every weight of the non-private baseline (default: the plan's LoRA)")
    ap.add_argument("--runs", default="nonprivate,dp", help="which runs: nonprivate, dp or both")
    args = ap.parse_args(argv)

    import numpy as np
    import pyarrow as pa
    import torch
    from peft import PeftModel

    from components.audit.canaries import make_canary_users
    from components.audit.run import run_audit
    from components.audit.run import attacker_samples
    from components.certificate import build_certificate
    from components.core.settings import load_settings
    from components.modeling import load_base
    from components.training import TrainSpec, train
    from flows import stages

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    t_all = time.perf_counter()
    home = args.home or Path(tempfile.mkdtemp(prefix="veil-audit-bench-"))
    settings = load_settings(home).ensure()
    settings.apply_environment()
    timing = {}

    t = time.perf_counter()
    from catalog.demo import write_demo_org

    org = write_demo_org(home / "demo-org", seed=0, n_users=args.users)
    stages.ingest(settings, org.messages_path, "jsonl", policy=stages.DEMO_POLICY)
    base_dir = (stages.base_model(settings, base_model_dir=args.base_model) if args.base_model else
                stages.base_model(settings, public_corpus=org.corpus_path, progress=False))
    planned = stages.plan(settings, stages.DEMO_POLICY)
    plan, plan_path = planned["plan"], planned["plan_path"]
    data = stages.training_data(settings, plan)
    timing["prepare_s"] = time.perf_counter() - t

    # canaries: records_per_user = G + 2 (G trained per visit, 2 for the attacker)
    G = int(plan["records_per_user"] or 4)
    can = make_canary_users(args.canaries, G + 2, seed=1, substring_words=8)
    can_users = sorted(set(can["user_id"].to_pylist()))
    injected = set(can_users[::2])
    c_user, c_text, c_rid = can["user_id"].to_pylist(), can["text"].to_pylist(), can["record_id"].to_pylist()
    seen: dict[str, int] = {}
    train_rows, att_rows = [], []
    for u, tx in zip(c_user, c_text):
        i = seen[u] = seen.get(u, -1) + 1
        if i < 2:
            att_rows.append({"user_id": u, "text": tx, "member": u in injected})
        elif u in injected:
            train_rows.append({"user_id": u, "text": tx})
    cols = data.column_names
    extra = pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in train_rows], schema=data.schema)
    train_data = pa.concat_tables([data, extra])
    from catalog.snapshots import load_snapshot

    from flows.stages import plan_snapshot_id

    snap = load_snapshot(settings, plan_snapshot_id(settings, plan))
    samples = pa.concat_tables([attacker_samples(plan, snap.records, settings),
                                pa.Table.from_pylist(att_rows).cast(
                                    pa.schema([("user_id", pa.string()), ("text", pa.string()), ("member", pa.bool_())]))])
    truth = json.loads(Path(org.truth_path).read_text())

    spec_dp = TrainSpec.from_plan(plan)
    if args.steps is not None:
        spec_dp = dataclasses.replace(spec_dp, steps=int(args.steps))
    # Non-private: Poisson records at the rate that gives the same expected records per step as the
    # plan's ULS (q users x min(G, n_u) records each), so both runs see the same amount of data.
    counts = pa.table({"u": train_data["user_id"]}).group_by("u").aggregate([("u", "count")])["u_count"].to_numpy()
    per_step = spec_dp.sampling_rate * float(np.minimum(counts, G).sum())
    spec_np = dataclasses.replace(spec_dp, mechanism="nonprivate", noise_multiplier=0.0,
                                  sampling_rate=min(1.0, per_step / train_data.num_rows),
                                  steps=int(args.nonprivate_steps or spec_dp.steps),
                                  learning_rate=float(args.nonprivate_lr or spec_dp.learning_rate),
                                  lora=None if args.nonprivate_full else spec_dp.lora)
    from components.draws.annex import load_annex

    annex = load_annex(settings.private_dir, plan)      # the bench is the operator's view: exact counts
    out = {"setting": {"users": args.users, "trained_users": annex["counts"]["n_train_users"],
                       "held_out_users": len(annex["held_out_users"]), "steps": spec_dp.steps,
                       "q": spec_dp.sampling_rate, "q_records_nonprivate": spec_np.sampling_rate,
                       "nonprivate_steps": spec_np.steps, "nonprivate_lr": spec_np.learning_rate,
                       "nonprivate_full_finetune": spec_np.lora is None, "sigma": spec_dp.noise_multiplier, "clip": spec_dp.clip_norm,
                       "G": G, "lr": spec_dp.learning_rate, "canaries": len(can_users),
                       "canaries_injected": len(injected), "candidates": args.candidates,
                       "secrets_per_class": args.per_class, "device": "cpu", "torch_threads": torch.get_num_threads()},
           "runs": {}}
    wanted = {r.strip() for r in args.runs.split(",")}
    runs = [(lb, sp) for key, lb, sp in (("nonprivate", "non-private", spec_np), ("dp", "DP (plan)", spec_dp))
            if key in wanted]
    for label, spec in runs:
        t = time.perf_counter()
        _err(f"[bench] training {label}: {spec.mechanism}, {spec.steps} steps")
        model, tok = load_base(base_dir)
        res = train(spec, train_data, model, tok, home / "runs" / spec.mechanism, resume=False, progress=False)
        t_train = time.perf_counter() - t
        base, tok = load_base(base_dir)
        if res.adapter_dir:
            trained, ref = PeftModel.from_pretrained(base, res.adapter_dir).eval(), None
        else:
            trained, ref = load_base(res.model_dir)[0], base
        if spec.mechanism == "nonprivate":
            cert = {"privacy_unit": None, "sha256": f"bench-{spec.mechanism}"}
        else:
            cert = build_certificate(plan, res.to_dict()).to_dict()
        loaded = SimpleNamespace(model=trained, tokenizer=tok, certificate=cert, plan=plan)
        t = time.perf_counter()
        _err(f"[bench] auditing {label}")
        result = run_audit(loaded, snap.records, settings=settings, truth=truth, samples=samples,
                           canary_records=can, reference=ref, n_candidates=args.candidates,
                           max_secrets_per_class=args.per_class, progress=False)
        # the bench is an operator's evaluation: it reads the private report (exact values), not the
        # public section, and must not be logged anywhere public
        p = result.private
        s, ex, can = p["user_inference"], p["secret_exposure"], p["canaries"] or {}
        out["runs"][label] = {
            "epsilon": cert.get("epsilon") if spec.mechanism != "nonprivate" else None,
            "delta": cert.get("delta") if spec.mechanism != "nonprivate" else None,
            "auroc": s["auroc"], "auroc_std": s["auroc_std"], "auroc_ceiling": s["auroc_ceiling"],
            "auroc_interval": s["auroc_interval"], "verdict": result.verdict,
            "tpr_at_fpr": s["tpr_at_fpr"], "epsilon_lower_bound": s["epsilon_lower_bound"],
            "users_in": s["users_in"], "users_out": s["users_out"], "above_ceiling": s["above_ceiling"],
            "canary_auroc": can.get("auroc"),
            "canary_auroc_std": can.get("auroc_std"),
            "canary_mean_exposure_in": can.get("mean_exposure_in"),
            "canary_mean_exposure_out": can.get("mean_exposure_out"),
            "secret_max_exposure": ex["max_exposure"],
            "secret_max_excess_exposure": ex["max_excess_exposure"],
            "secret_exposure_by_class": ex["by_class"],
            "secrets_probed": ex["n_secrets"],
            "auroc_ceiling_pld": s.get("auroc_ceiling_pld"), "steps": spec.steps,
            "passed": result.passed, "failures": p["failures"],
            "final_loss": float(res.losses[-1]) if res.losses else None,
            "train_s": t_train, "audit_s": time.perf_counter() - t, "roc_png": str(result.private_plot_path),
        }
    timing["total_s"] = time.perf_counter() - t_all
    out["timing"] = timing
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        _print_table(out)
    return out


def _print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    runs = out["runs"]
    names = list(runs)
    t = Table(title="Audit evidence on the demo organization (same base, data, steps)")
    t.add_column("")
    for n in names:
        t.add_column(n, justify="right")

    def f(x, spec=".3f"):
        return "—" if x is None else format(x, spec)

    def row(label, fn):
        t.add_row(label, *[fn(runs[n]) for n in names])

    row("certified (ε, δ), user level", lambda r: "none" if r["epsilon"] is None else f"({r['epsilon']:.3g}, {r['delta']:.0e})")
    row("user-inference AUROC", lambda r: f"{r['auroc']:.3f} ± {r['auroc_std']:.3f}")
    row("steps", lambda r: str(r["steps"]))
    row("DP ceiling on AUROC: (ε, δ) / PLD", lambda r: f"{f(r['auroc_ceiling'])} / {f(r.get('auroc_ceiling_pld'))}")
    for k in ("0.001", "0.01", "0.1"):
        row(f"TPR @ FPR {k}", lambda r, k=k: f(r["tpr_at_fpr"][k]))
    row("empirical ε lower bound (95%)", lambda r: f(r["epsilon_lower_bound"], ".2f"))
    row("users in / out", lambda r: f"{r['users_in']} / {r['users_out']}")
    row("canary AUROC", lambda r: "—" if r["canary_auroc"] is None else f"{r['canary_auroc']:.3f} ± {r['canary_auroc_std']:.3f}")
    row("canary exposure in / out (bits)", lambda r: f"{f(r['canary_mean_exposure_in'], '.2f')} / {f(r['canary_mean_exposure_out'], '.2f')}")
    row("secrets probed", lambda r: str(r["secrets_probed"]))
    row("max secret exposure (bits)", lambda r: f(r["secret_max_exposure"], ".2f"))
    row("max excess over base (bits)", lambda r: f(r["secret_max_excess_exposure"], ".2f"))
    classes = sorted({c for r in runs.values() for c in r["secret_exposure_by_class"]})
    for c in classes:
        row(f"  {c}: mean / max exposure", lambda r, c=c: (lambda v: "—" if v is None else
                                                          f"{v['mean_exposure']:.2f} / {v['max_exposure']:.2f}")(
            r["secret_exposure_by_class"].get(c)))
    row("audit verdict (demo policy)", lambda r: str(r["verdict"]).upper())
    row("final train loss", lambda r: f(r["final_loss"]))
    row("train / audit seconds", lambda r: f"{r['train_s']:.0f} / {r['audit_s']:.0f}")
    from rich.console import Console

    Console().print(t)
    print(f"setting: {json.dumps(out['setting'])}")
    print(f"total: {out['timing']['total_s']:.0f} s (prepare {out['timing']['prepare_s']:.0f} s)")


if __name__ == "__main__":
    main()
