"""Seed 004 on a real corpus: LP-weighted sampling against uniform DP-SGD at the same secret-level γ.

    VEIL_HOME=HOME python bench/secret_lp_real.py --policy policies/debian-changelogs.yaml --base-model BASE \\
        [--c 1 10 100] [--train uniform 10] [--steps 40] [--batch 48] [--json]

HOME holds the corpus (`veil ingest /usr/share/doc --format debian-changelog --policy P`); the policy's
secret classes (Debian: e-mail addresses written in an entry's text, κ = 0.01, γ = 0.2) are what is
protected. Each point is the `secret` mechanism (components/mechanisms/secret.py) planned on that
policy with a different LP constant C (`spec.secrets.lp.c`, Σ_{i∋s} w_i ≤ C·ρ_s):

* **uniform** (baseline) — C so large that no constraint can bind: every record keeps w = 1, so every
  record is Poisson-sampled at the same rate B/N — plain DP-SGD — and σ is calibrated (the same
  per-secret KL accountant) until every secret's posterior is ≤ γ.
* **LP, C = c** (ours, seed 004) — records holding a secret are down-weighted (w < 1, or dropped) so
  that no secret is sampled too often; σ is then calibrated for the same γ.

Every point plans (LP + σ, cheap); the points named by `--train` are also trained as tuning runs
(`stages.train(release=False)`: not charged, not certified) with the same steps, expected batch and
learning rate, and scored on the plan's evaluation people (perplexity; the same texts for every point).
Reported: σ, the records kept, the retained weight Σw/n, the largest γ over the class's secrets (the
secret-level guarantee; ≤ the target by construction), the record-level ε an untagged record gets, and
perplexity. Tuning numbers on private data: not covered by any certificate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

UNIFORM_C = 1e12   # no secret's constraint Σ w ≤ C·ρ can bind: every w = 1 (uniform Poisson sampling)


def secret_policy(base_policy: Path, c: float, training: dict, out: Path) -> Path:
    """The base policy with the secret mechanism, LP constant C and the training overrides."""
    import yaml

    from components.policy import load_policy

    doc = yaml.safe_load(base_policy.read_text())
    spec = doc["spec"]
    spec["privacy_unit"] = "secret"
    spec["mechanism"] = "secret"
    for k in ("target", "contribution", "lifetime_budget"):
        spec.pop(k, None)
    secrets = dict(spec.get("secrets") or {})
    secrets["lp"] = {**(secrets.get("lp") or {}), "c": float(c)}
    secrets.setdefault("untagged_records", "keep")
    spec["secrets"] = secrets
    tr = dict(spec.get("training") or {})
    lora_r = training.pop("lora_r", None)
    tr.update(training)
    if lora_r is not None and tr.get("lora"):
        scale = float(tr["lora"].get("alpha", 16)) / float(tr["lora"].get("r", 8))
        tr["lora"] = {**tr["lora"], "r": int(lora_r), "alpha": float(scale * int(lora_r))}
    spec["training"] = tr
    name = "uniform" if c >= UNIFORM_C else f"c{c:g}"
    doc["metadata"]["name"] = f"{doc['metadata']['name']}-secret-{name}"[:63].lower().replace(".", "-")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    load_policy(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, required=True)
    ap.add_argument("--base-model", type=Path, required=True)
    ap.add_argument("--c", type=float, nargs="*", default=[1.0, 10.0, 100.0], help="LP constants to plan")
    ap.add_argument("--train", nargs="*", default=["uniform", "10"],
                    help="points to train: 'uniform' and/or C values among --c")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="expected records per step")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--lora-r", type=int, default=None)
    ap.add_argument("--eval-records", type=int, default=600)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from components.evaluation import evaluate_texts
    from components.core.settings import load_settings
    from components.mechanisms.secret import untagged_section
    from components.modeling import load_base
    from components.modeling.base import load_finetuned
    from components.planning import load_plan
    from flows import stages
    from flows.study import eval_texts, texts_sha

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t_start = time.perf_counter()
    s = load_settings().ensure()
    work = args.workdir or (s.home / "bench-secret-lp" / time.strftime("%Y%m%dT%H%M%S"))
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    base_dir = Path(stages.base_model(s, base_model_dir=args.base_model))
    training = {k: v for k, v in (("steps", args.steps), ("expected_batch_size", args.batch),
                                  ("learning_rate", args.lr), ("lora_r", args.lora_r)) if v is not None}
    train_names = {str(t) for t in args.train}
    points = [("uniform", UNIFORM_C)] + [(f"{c:g}", float(c)) for c in args.c]
    base = btok = ev0 = None
    rows = []
    for name, c in points:
        pol = secret_policy(args.policy, c, dict(training), work / f"policy-{name}.yaml")
        t0 = time.perf_counter()
        planned = stages.plan(s, pol, base_dir=base_dir)
        plan = load_plan(planned["plan_path"]).to_dict()
        lp = plan.get("secret_lp") or {}
        acc = plan["accounting"]
        steps = int(plan["steps"])
        urate = stages.untagged_rate(s, plan)
        untagged = untagged_section(plan, urate, steps)
        row = {"point": name, "c": None if c >= UNIFORM_C else c, "noise_multiplier": plan["noise_multiplier"],
               "mean_rate": plan["sampling_rate"], "expected_batch": plan["expected_batch_size"], "steps": steps,
               "retained_fraction": lp.get("retained_fraction"), "zero_weight_records": lp.get("n_zero_weight"),
               "classes": {k: {"max_gamma": v["max_gamma"], "gamma_target": v["gamma_target"], "kappa": v["kappa"],
                               "n_secrets": v["n_secrets"], "max_kl": v["max_kl"]}
                           for k, v in (acc.get("by_class") or {}).items()},
               "untagged_epsilon": untagged.get("epsilon"), "untagged_delta": untagged.get("delta"),
               "untagged_max_rate": untagged.get("max_rate"),
               "plan_seconds": round(time.perf_counter() - t0, 1), "perplexity": None}
        if name in train_names:
            t1 = time.perf_counter()
            tr = stages.train(s, planned["plan_path"], base_dir, progress=False, release=False,
                              out_dir=work / "runs" / name)
            row["train_seconds"] = round(time.perf_counter() - t1, 1)
            _, texts = eval_texts(s, plan, args.eval_records)
            seq_len = int(plan["training"]["seq_len"])
            model, tok = load_finetuned(base_dir, adapter_dir=tr.get("adapter_dir"), model_dir=tr.get("model_dir"))
            ev = evaluate_texts(model, tok, texts, max_length=seq_len, batch_size=32)
            if base is None:
                base, btok = load_base(base_dir)
            ev0 = evaluate_texts(base, btok, texts, max_length=seq_len, batch_size=32)
            row.update({"perplexity": ev.perplexity, "base_perplexity": ev0.perplexity, "eval_records": ev.records,
                        "eval_tokens": ev.tokens, "eval_texts_sha256": texts_sha(texts),
                        "steps_run": tr.get("steps_run")})
        rows.append(row)
        print(f"[{name}] σ {row['noise_multiplier']:.3f} retained {row['retained_fraction']} "
              f"ppl {row['perplexity']}", file=sys.stderr, flush=True)
    shas = {r["eval_texts_sha256"] for r in rows if r.get("eval_texts_sha256")}
    doc = {"rows": rows, "same_eval_texts": len(shas) <= 1, "training": training or "the policy's",
           "seconds": round(time.perf_counter() - t_start, 1),
           "caveat": "measured on private evaluation people: tuning numbers, not covered by any certificate; "
                     "the secret guarantee covers tagged occurrences only"}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return
    print(f"{'point':<10}{'σ':>8}{'kept Σw/n':>11}{'w=0':>6}{'max γ (target)':>18}{'untagged ε':>12}{'PPL':>9}")
    for r in rows:
        g = "; ".join(f"{v['max_gamma']:.3f} ({v['gamma_target']:g})" for v in r["classes"].values())
        ue = "—" if r["untagged_epsilon"] is None else f"{r['untagged_epsilon']:.2f}"
        ppl = "—" if r["perplexity"] is None else f"{r['perplexity']:.1f}"
        rf = "—" if r["retained_fraction"] is None else f"{r['retained_fraction']:.4f}"
        print(f"{r['point']:<10}{r['noise_multiplier']:>8.3f}{rf:>11}{str(r['zero_weight_records']):>6}{g:>18}"
              f"{ue:>12}{ppl:>9}")


if __name__ == "__main__":
    main()
