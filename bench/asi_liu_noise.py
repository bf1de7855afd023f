"""Does Asi & Liu's filtered ULS (seed 000 Alg. 3) add less noise than plain ULS? Seed 000 §5.3 /
Fig. 3 says only when τ/C < 0.1. This script recomputes that comparison and, with --measure,
measures τ*/C on the demo org (τ*: the smallest τ that passes the concentration test).

Noise is the per-coordinate std on the averaged gradient:
    ULS                 σ_ULS(ε, δ, q = n/N, T) · C / n
    Alg. 3, paper       sqrt(8 log(e^ε T/δ)) · τ · σ(ε/2, δ/2, q = 1, T) / N     (not certifiable)
    Alg. 3, Veil bound  60 τ / W_min · σ(ε/2, δ/2, q = 1, T)                      (certified)
The crossover τ/C is where the Alg. 3 noise equals ULS's.

    python bench/asi_liu_noise.py [--json] [--measure]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def noise_rows(epsilons, users, batch, steps, delta):
    from components.accounting import calibrate
    from components.accounting.filtered import calibrate_filtered, filtered_noise, min_users

    rows = []
    for N in users:
        for eps in epsilons:
            q = batch / N
            s_uls = calibrate("uls", epsilon=eps, delta=delta, sampling_rate=q, steps=steps).noise_multiplier
            s_al = calibrate_filtered(epsilon=eps, delta=delta, steps=steps).noise_multiplier
            uls = s_uls / batch                        # × C
            paper = math.sqrt(8 * (eps + math.log(steps / delta))) * s_al / N   # × τ
            try:
                veil = filtered_noise(epsilon=eps, delta=delta, steps=steps, n_users=N, tau=1.0,
                                      noise_multiplier=s_al).std                # × τ
            except Exception:  # too few users for the certified bound
                veil = None
            rows.append({"users": N, "epsilon": eps, "uls_noise_over_C": uls, "paper_noise_over_tau": paper,
                         "veil_noise_over_tau": veil, "crossover_tau_over_C_paper": uls / paper,
                         "crossover_tau_over_C_veil": (uls / veil) if veil else None,
                         "min_users_certified": min_users(eps, delta, steps)})
    return rows


def measure(args) -> dict:
    import torch

    from catalog.demo import write_demo_org
    from components.core.settings import load_settings
    from components.modeling import load_base
    from components.dpsgd.filtered import concentration_profile
    from flows import stages

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    home = Path(tempfile.mkdtemp(prefix="veil-al-bench-"))
    settings = load_settings(home).ensure()
    settings.apply_environment()
    org = write_demo_org(home / "demo-org", seed=0)
    stages.ingest(settings, org.messages_path, "jsonl", policy=stages.DEMO_POLICY)
    base_dir = stages.base_model(settings, public_corpus=org.corpus_path, progress=False)
    plan = stages.plan(settings, stages.DEMO_POLICY)["plan"]
    data = stages.training_data(settings, plan)
    model, tok = load_base(base_dir)
    lora = (plan.get("training") or {}).get("lora")  # LoRA's B starts at 0: only B has a gradient at init
    prof = concentration_profile(model, tok, data, records_per_user=int(plan["records_per_user"]),
                                 seq_len=int(plan["training"]["seq_len"]), clip_norm=float(plan["clip_norm"]),
                                 lora=lora, max_users=args.max_users)
    return prof


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="1,3,8")
    ap.add_argument("--users", default="1000,10000,100000")
    ap.add_argument("--batch", type=int, default=256, help="ULS expected users per step")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--measure", action="store_true", help="also measure τ*/C on the demo org (~1 min)")
    ap.add_argument("--max-users", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = noise_rows([float(x) for x in args.epsilons.split(",")], [int(x) for x in args.users.split(",")],
                      args.batch, args.steps, args.delta)
    out = {"config": {"batch": args.batch, "steps": args.steps, "delta": args.delta}, "rows": rows}
    if args.measure:
        out["demo_concentration"] = measure(args)
    out["seconds"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Alg. 3 vs ULS noise (T={args.steps}, δ={args.delta:g}, ULS batch {args.batch})")
    for c in ("users", "ε", "ULS noise /C", "paper noise /τ", "Veil noise /τ", "crossover τ/C (paper)",
              "crossover τ/C (Veil)", "min users (Veil)"):
        t.add_column(c, justify="right")
    f = lambda x, p=4: "—" if x is None else f"{x:.{p}g}"  # noqa: E731
    for r in rows:
        t.add_row(str(r["users"]), f"{r['epsilon']:g}", f(r["uls_noise_over_C"]), f(r["paper_noise_over_tau"]),
                  f(r["veil_noise_over_tau"]), f(r["crossover_tau_over_C_paper"], 3),
                  f(r["crossover_tau_over_C_veil"], 3), str(r["min_users_certified"]))
    Console().print(t)
    if "demo_concentration" in out:
        d = out["demo_concentration"]
        Console().print(f"demo org ({d['n_users']} users, d={d['dimension']}): τ*/C = {d['tau_star_over_C']:.3g}; "
                        f"median pairwise distance/C = {d['pairwise_distance_over_C'][0.5]:.3g}; "
                        f"median user gradient norm/C = {d['user_grad_norm_median_over_C']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
