"""Privacy accounting speed and tightness: Veil's accountant next to dp-accounting's reference, one process.

Reference = dp-accounting 0.6.0 `PLDAccountant(value_discretization_interval=1e-4)` (pessimistic) on the
same DpEvent — for ELS/group the MixtureOfGaussiansDpEvent of Charles et al. Thm 1.

    python bench/accounting.py                 # issue setting: ELS k=8, q=0.0128, σ=1, T=2000, δ=1e-6
    python bench/accounting.py --json
    python bench/accounting.py --full          # also the reference calibration (5–10 minutes)
    python bench/accounting.py --quick         # skip the reference entirely (ours only)

Targets (issue 3): for k ≤ 64, T ≤ 1e5 one ε ≤ 2 s and one calibration ≤ 15 s; reported ε never below
the reference and ≤ 1 % above it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _reference_event(mechanism, q, sigma, T, k):
    import dp_accounting
    from scipy import stats

    if mechanism in ("els", "group-tight"):
        sens = list(range(k + 1))
        step = dp_accounting.dp_event.MixtureOfGaussiansDpEvent(sigma, sens, [float(p) for p in stats.binom.pmf(sens, k, q)])
    else:
        step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return dp_accounting.SelfComposedDpEvent(step, T)


def reference_epsilon(mechanism, q, sigma, T, delta, k):
    from dp_accounting.pld import PLDAccountant

    t0 = time.perf_counter()
    acc = PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(_reference_event(mechanism, q, sigma, T, k))
    return acc.get_epsilon(delta), time.perf_counter() - t0


def reference_calibration(mechanism, q, target, T, delta, k):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    t0 = time.perf_counter()
    sigma = dp_accounting.calibrate_dp_mechanism(
        lambda: PLDAccountant(value_discretization_interval=1e-4),
        lambda s: _reference_event(mechanism, q, s, T, k), target, delta,
        dp_accounting.LowerEndpointAndGuess(0.1, 1.0), tol=1e-3)
    return sigma, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", default="els")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--q", type=float, default=0.0128)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--target-epsilon", type=float, default=8.0, help="calibration target")
    ap.add_argument("--full", action="store_true", help="also run the reference calibration (minutes)")
    ap.add_argument("--quick", action="store_true", help="skip every reference computation")
    ap.add_argument("--no-stress", action="store_true", help="skip the k=64 / T=1e5 rows")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from components.accounting import calibrate, epsilon

    err = Console(stderr=True)
    m, k, q, s, T, d = args.mechanism, args.k, args.q, args.sigma, args.steps, args.delta
    rows = []

    def add(what, ours_eps, ours_s, ref_eps=None, ref_s=None, extra=None):
        row = {"what": what, "ours_epsilon": ours_eps, "ours_seconds": ours_s,
               "reference_epsilon": ref_eps, "reference_seconds": ref_s}
        if ref_eps is not None and ours_eps is not None:
            row["ratio"] = ours_eps / ref_eps
            row["never_below"] = ours_eps >= ref_eps
            row["within_1pct"] = ours_eps <= 1.01 * ref_eps
        if ref_s and ours_s:
            row["speedup"] = ref_s / ours_s
        row.update(extra or {})
        rows.append(row)

    err.print(f"[bold]ε[/]: {m} k={k} q={q} σ={s} T={T} δ={d}")
    ours = epsilon(m, sampling_rate=q, noise_multiplier=s, steps=T, delta=d, k=k)
    ref = (None, None) if args.quick else reference_epsilon(m, q, s, T, d, k)
    add(f"ε  {m} k={k} q={q} σ={s} T={T}", ours.epsilon, ours.seconds, *ref,
        extra={"discretization": ours.discretization})

    err.print(f"[bold]calibration[/]: target ε={args.target_epsilon}")
    cal = calibrate(m, epsilon=args.target_epsilon, delta=d, sampling_rate=q, steps=T, k=k)
    extra = {"noise_multiplier": cal.noise_multiplier, "discretization": cal.discretization}
    ref_eps = ref_s = None
    if not args.quick:
        # the reference's own ε at our σ: must meet the target (and our σ must be the smallest to 0.1 %)
        ref_eps, _ = reference_epsilon(m, q, cal.noise_multiplier, T, d, k)
        ref_below, _ = reference_epsilon(m, q, cal.noise_multiplier * (1 - 2e-3), T, d, k)
        extra.update(reference_epsilon_at_our_sigma=ref_eps, reference_meets_target=ref_eps <= args.target_epsilon,
                     reference_epsilon_at_sigma_minus_0_2pct=ref_below)
    if args.full:
        ref_sigma, ref_s = reference_calibration(m, q, args.target_epsilon, T, d, k)
        extra["reference_noise_multiplier"] = ref_sigma
    add(f"calibrate {m} k={k} to ε={args.target_epsilon}", cal.epsilon, cal.seconds, ref_eps, ref_s, extra)

    if not args.no_stress:
        for (sm, sk, sq, ss, sT, target) in (("els", 64, 0.001, 2.0, 100_000, 30.0),
                                             ("els", 64, 0.0005, 1.0, 100_000, 30.0),
                                             ("uls", 1, 0.01, 1.0, 100_000, 8.0)):
            err.print(f"[bold]stress[/]: {sm} k={sk} q={sq} σ={ss} T={sT}")
            r = epsilon(sm, sampling_rate=sq, noise_multiplier=ss, steps=sT, delta=d, k=sk)
            add(f"ε  {sm} k={sk} q={sq} σ={ss} T={sT}", r.epsilon, r.seconds,
                extra={"discretization": r.discretization, "reference": "not run (minutes to hours)"})
            c = calibrate(sm, epsilon=target, delta=d, sampling_rate=sq, steps=sT, k=sk)
            add(f"calibrate {sm} k={sk} q={sq} T={sT} to ε={target}", c.epsilon, c.seconds,
                extra={"noise_multiplier": c.noise_multiplier, "discretization": c.discretization})

    doc = {"rows": rows, "delta": d, "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                                 "platform": platform.platform()}}
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    t = Table(title="Privacy accounting: Veil vs dp-accounting reference (PLD, Δ=1e-4, pessimistic)")
    for c in ("what", "ours ε", "ours s", "ref ε", "ref s", "ours/ref", "speed-up", "notes"):
        t.add_column(c)
    for r in rows:
        note = []
        if "noise_multiplier" in r:
            note.append(f"σ={r['noise_multiplier']:.5g}")
        if "reference_epsilon_at_our_sigma" in r:
            note.append(f"ref ε at our σ={r['reference_epsilon_at_our_sigma']:.5g}, "
                        f"at σ−0.2%={r['reference_epsilon_at_sigma_minus_0_2pct']:.5g}")
        if "discretization" in r:
            note.append(f"Δ={r['discretization']:g}")
        t.add_row(r["what"], f"{r['ours_epsilon']:.6g}", f"{r['ours_seconds']:.2f}",
                  "" if r["reference_epsilon"] is None else f"{r['reference_epsilon']:.6g}",
                  "" if r["reference_seconds"] is None else f"{r['reference_seconds']:.1f}",
                  f"{r['ratio']:.6f}" if "ratio" in r else "", f"{r['speedup']:.0f}×" if "speedup" in r else "",
                  "; ".join(note))
    Console(width=max(160, Console().width)).print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
