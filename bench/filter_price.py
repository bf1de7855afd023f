"""The Rényi filter's price of a release against the release's own PLD ε (issue 26): the uniform
conversion (`union-hockey-stick`, δ/|A| per order) and the weighted one (`weighted-hockey-stick`, δ·w_α
with the weights `components.renyi.rdp.order_weights` fixes from the lifetime budget) under each weight
rule (`gaussian-centred/v1`, issue 26's first weighted ledgers; `/v2`, new ledgers) side by side.

    PYTHONPATH=. python bench/filter_price.py [--json] [--demo-users 240] [--debian-users 479]

Two tables.

1. Settings (those of docs/privacy/ledger.md, "Price of one release"): a release's RDP cost curve on the
   ledger's 20 orders; n of them composed. price = the smallest lifetime budget ε whose filter admits the
   n releases from zero (`rdp.filter_price`; for the weighted rule the weights are those of that budget),
   divided by dp-accounting's PLD ε of the same n-fold composition at the same δ. n = 1 is the price of
   one release; n > 1 what a schedule of n pays. Also the floor under any choice of weights: the
   single-order conversion at the whole δ, at the best order of a fine grid (`single_order_floor`).
   `--held-out N`: N random settings (seed 7; ULS and ELS, q 0.005–1, T 5–3000, σ 0.7–6, δ 1e-4–1e-7,
   n 1–52; PLD ε in [0.5, 40], PLD at a 5e-3 interval), for a rule chosen on the 21 above: the
   excess of each weight rule over the single-order floor, summarised.
2. Policies (the shipped `policies/debian-weekly.yaml`, schedule of 52, and `policies/demo.yaml`): the real
   planner (`make_plan`) on a synthetic snapshot of that many people, once under each conversion (the
   schedule is fitted under the ledger's own rule). Per rule: the plan's ε per release (certificate, at the
   target δ), the release's PLD ε at the lifetime δ (N̂'s Laplace and DP-SGD composed), the ledger's
   reported spend after that one release (at the lifetime budget's weights) and its ratio, how many
   releases a new person can take, and the schedule's price (filter ε of those releases / PLD ε of their
   composition).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import dp_accounting
import numpy as np
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from scipy.stats import binom

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "planning"))

from components.renyi import rdp as R  # noqa: E402

# (label, conversion, weight rule): the columns
RULES = ((R.HOCKEY_STICK, R.HOCKEY_STICK, None),
         (f"{R.WEIGHTED} {R.WEIGHT_RULE_V1.split('/')[-1]}", R.WEIGHTED, R.WEIGHT_RULE_V1),
         (f"{R.WEIGHTED} {R.WEIGHT_RULE.split('/')[-1]}", R.WEIGHTED, R.WEIGHT_RULE))
FINE = np.exp(np.linspace(np.log(1.02), np.log(512.0), 400))   # for the single-order floor
# (label, kind, q, T, σ, δ, k): ULS settings put the PLD ε near 8 or 2; ELS has k rows per person
SETTINGS = [("ULS q=0.2 T=40 σ=1.077 δ=1e-5", "uls", 0.2, 40, 1.077, 1e-5, 1),
            ("ULS q=0.05 T=1000 σ=1.272 δ=1e-6", "uls", 0.05, 1000, 1.272, 1e-6, 1),
            ("ULS q=1 T=10 σ=2.065 δ=1e-6", "uls", 1.0, 10, 2.065, 1e-6, 1),
            ("ULS q=0.01 T=2000 σ=1.246 δ=1e-6", "uls", 0.01, 2000, 1.246, 1e-6, 1),
            ("ULS q=0.2 T=40 σ=2.802 δ=1e-5", "uls", 0.2, 40, 2.802, 1e-5, 1),
            ("ELS k=2 q=0.1 T=100 σ=3.5 δ=1e-5", "els", 0.1, 100, 3.5, 1e-5, 2),
            ("ELS k=4 q=0.05 T=400 σ=2.0 δ=1e-6", "els", 0.05, 400, 2.0, 1e-6, 4)]
COMPOSE = (1, 2, 10)


def event(kind: str, q: float, T: int, sigma: float, k: int):
    if kind == "uls":
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), T)
    probs = [float(binom.pmf(j, k, q)) for j in range(k + 1)]
    return dp_accounting.SelfComposedDpEvent(MixtureOfGaussiansDpEvent(sigma, list(range(k + 1)), probs), T)


def pld_epsilon(ev, delta: float, n: int = 1, interval: float = 1e-3) -> float:
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
    acc.compose(ev, n)
    return float(acc.get_epsilon(delta))


def cost_curve(kind: str, q: float, T: int, sigma: float, k: int) -> np.ndarray:
    return R.sampled_gaussian_rdp(q, sigma, T) if kind == "uls" else R.rows_rdp([q] * k, sigma, T)


def settings_table() -> list[dict]:
    out = []
    for label, kind, q, T, sigma, delta, k in SETTINGS:
        c = cost_curve(kind, q, T, sigma, k)
        cf = cost_curve_on(kind, q, T, sigma, k, FINE)
        ev = event(kind, q, T, sigma, k)
        for n in COMPOSE:
            pld = pld_epsilon(ev, delta, n, interval=1e-3 if kind == "uls" else 5e-3)
            floor = float(np.min(n * cf + R._single_order_pad(delta, FINE)))  # noqa: SLF001
            row = {"setting": label, "releases": n, "delta": delta, "pld_epsilon": pld,
                   "single_order_floor": {"epsilon": floor, "ratio": floor / pld}}
            for name, conversion, rule in RULES:
                price = R.filter_price(n * c, delta, conversion=conversion, **({"rule": rule} if rule else {}))
                row[name] = {"filter_epsilon": price, "ratio": price / pld}
            out.append(row)
    return out


def cost_curve_on(kind: str, q: float, T: int, sigma: float, k: int, orders) -> np.ndarray:
    return R.sampled_gaussian_rdp(q, sigma, T, orders) if kind == "uls" else R.rows_rdp([q] * k, sigma, T, orders)


def held_out(count: int, seed: int = 7) -> dict:
    """Random settings the weight rules were not chosen on (module docstring): per setting the PLD ε, the
    single-order floor and each weighted rule's price; summarised over the 'regular' ones (floor < 1.15×:
    where the cost curve itself is not far from its PLD, so that what is left is the weights' doing)."""
    rng = np.random.default_rng(seed)
    rows = []
    while len(rows) < count:
        kind = "els" if rng.random() < 0.3 else "uls"
        q = float(np.exp(rng.uniform(np.log(0.005), 0.0)))
        if q > 0.5:
            q = 1.0 if kind == "uls" else 0.5
        T = int(np.exp(rng.uniform(np.log(5), np.log(3000))))
        sigma = float(np.exp(rng.uniform(np.log(0.7), np.log(6))))
        k = int(rng.integers(2, 7)) if kind == "els" else 1
        delta = float(rng.choice([1e-4, 1e-5, 1e-6, 1e-7]))
        n = int(rng.choice([1, 1, 2, 3, 5, 10, 26, 52]))
        pld = pld_epsilon(event(kind, q, T, sigma, k), delta, n, interval=5e-3)
        if not 0.5 <= pld <= 40:
            continue
        c = n * cost_curve(kind, q, T, sigma, k)
        floor = float(np.min(n * cost_curve_on(kind, q, T, sigma, k, FINE) + R._single_order_pad(delta, FINE)))  # noqa: SLF001
        row = {"kind": kind, "q": q, "steps": T, "sigma": sigma, "rows": k, "delta": delta, "releases": n,
               "pld_epsilon": pld, "single_order_floor": floor / pld}
        for name, conversion, rule in RULES[1:]:
            row[name] = R.filter_price(c, delta, conversion=conversion, rule=rule) / pld
        rows.append(row)
    summary = {}
    regular = [r for r in rows if r["single_order_floor"] < 1.15]
    for name, _, _ in RULES[1:]:
        ex = np.array([r[name] - r["single_order_floor"] for r in regular])
        summary[name] = {"regular": len(regular), "excess_mean": float(ex.mean()), "excess_median": float(np.median(ex)),
                         "excess_p90": float(np.quantile(ex, 0.9)), "ratio_max_regular": float(max(r[name] for r in regular))}
    a, b = (RULES[1][0], RULES[2][0])
    summary["v2_better"] = int(sum(r[b] < r[a] - 1e-4 for r in rows))
    summary["v2_worse"] = int(sum(r[b] > r[a] + 1e-4 for r in rows))
    summary["v2_worse_regular"] = int(sum(r[b] > r[a] + 1e-4 for r in regular))
    return {"settings": rows, "summary": summary}


def _policy(name: str, tmp: Path) -> Path:
    text = (ROOT / "policies" / name).read_text()
    # the synthetic snapshot's ids match none of the policy's real aliases or exclusions
    text = re.sub(r"\n  people:\n(    .*\n|      .*\n|\s*#.*\n)*", "\n", text)
    p = tmp / name
    p.write_text(text)
    return p


def policy_rows(policy: str, users: int) -> list[dict]:
    from _planning_fixtures import make_snapshot

    from components.renyi.costs import Budget
    from components.ledger.release import fresh_person_cost, releases_for_fresh_person
    from components.planning import make_plan
    from components.policy import load_policy

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pol = load_policy(_policy(policy, tmp))
        life = Budget.parse(pol.spec.lifetime_budget.model_dump())
        snap = make_snapshot(users, seed=3)
        for name, conversion, rule in RULES:
            # one private area for every rule: the same planner key, so the same N̂ draw and q
            plan = make_plan(pol, snap, private_dir=tmp / "private", created_at="2026-01-01T00:00:00+00:00",
                             ledger_filter=(R.ORDERS, conversion, rule)).to_dict()
            c = fresh_person_cost(plan)
            w = R.order_weights(life.epsilon, life.delta, rule=rule) if rule else None
            eps_n = float(plan["data"]["population"]["epsilon"])
            k = max(1, int(plan.get("records_per_user") or 1))
            sgd = event("uls", float(plan["sampling_rate"]), int(plan["steps"]), float(plan["noise_multiplier"]), k) \
                if plan["mechanism"] == "uls" else \
                event("els", float(plan["sampling_rate"]), int(plan["steps"]), float(plan["noise_multiplier"]), k)
            ev = dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(1.0 / eps_n), sgd]) if eps_n else sgd
            pld1 = pld_epsilon(ev, life.delta)
            one = R.epsilon_of_spend(c, life.delta, conversion=conversion, weights=w)
            fit = releases_for_fresh_person(plan, life, conversion=conversion, weights=w)
            n = int(min(fit, 200))
            pld_n = pld_epsilon(ev, life.delta, n) if n else float("nan")
            sched = R.epsilon_of_spend(n * c, life.delta, conversion=conversion, weights=w) if n else float("nan")
            out.append({"policy": policy, "people": users, "rule": name,
                        "lifetime_budget": {"epsilon": life.epsilon, "delta": life.delta},
                        "schedule_releases": None if pol.spec.schedule is None else int(pol.spec.schedule.releases),
                        "epsilon_per_release": float(plan["accounting"]["epsilon"]),
                        "target_delta": float(plan["target"]["delta"]),
                        "noise_multiplier": float(plan["noise_multiplier"]),
                        "release_pld_epsilon_at_lifetime_delta": pld1,
                        "ledger_spend_after_one_release": one, "one_release_ratio": one / pld1,
                        "releases_for_a_new_person": fit,
                        "schedule_filter_epsilon": sched, "schedule_pld_epsilon": pld_n,
                        "schedule_ratio": sched / pld_n if n else float("nan")})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--demo-users", type=int, default=240)
    ap.add_argument("--debian-users", type=int, default=479)
    ap.add_argument("--no-policies", action="store_true", help="the settings table only (about a minute)")
    ap.add_argument("--held-out", type=int, default=0, metavar="N", help="also N random settings (minutes)")
    a = ap.parse_args(argv)
    doc = {"weight_rule": R.WEIGHT_RULE, "orders": list(R.ORDERS), "settings": settings_table()}
    if a.held_out:
        doc["held_out"] = held_out(a.held_out)
    if not a.no_policies:
        doc["policies"] = policy_rows("debian-weekly.yaml", a.debian_users) + policy_rows("demo.yaml", a.demo_users)
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"filter price: new ledgers' weight rule {R.WEIGHT_RULE}, {len(R.ORDERS)} orders\n")
    names = [name for name, _, _ in RULES]
    print("| setting | n | PLD ε | single-order floor | " + " | ".join(names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for r in doc["settings"]:
        cells = " | ".join(f"{r[x]['filter_epsilon']:.2f} ({r[x]['ratio']:.3f}×)" for x in names)
        print(f"| {r['setting']} | {r['releases']} | {r['pld_epsilon']:.2f} | "
              f"{r['single_order_floor']['ratio']:.3f}× | {cells} |")
    for n in COMPOSE:
        for name in names:
            rs = [r[name]["ratio"] for r in doc["settings"] if r["releases"] == n]
            print(f"  n={n:<3} {name:<25} {min(rs):.3f}–{max(rs):.3f}×")
    for name in names:
        rs = [r[name]["ratio"] for r in doc["settings"]]
        print(f"  all  {name:<25} {min(rs):.3f}–{max(rs):.3f}×, {sum(x <= 1.15 for x in rs)} of {len(rs)} ≤ 1.15×")
    if "held_out" in doc:
        sm = doc["held_out"]["summary"]
        print(f"\nheld-out: {len(doc['held_out']['settings'])} random settings; excess over the single-order floor "
              f"on the {sm[names[1]]['regular']} whose floor is < 1.15×:")
        for name in names[1:]:
            x = sm[name]
            print(f"  {name:<25} mean {x['excess_mean']:.4f}, median {x['excess_median']:.4f}, "
                  f"p90 {x['excess_p90']:.4f}, worst ratio {x['ratio_max_regular']:.3f}×")
        print(f"  v2 below v1 in {sm['v2_better']}, above in {sm['v2_worse']} ({sm['v2_worse_regular']} of them regular)")
    if "policies" in doc:
        print("\n| policy | rule | ε/release (cert) | PLD ε @δ_life | spend after 1 | ratio | releases fit "
              "| schedule filter ε / PLD ε |")
        print("|---|---|---|---|---|---|---|---|")
        for r in doc["policies"]:
            print(f"| {r['policy']} ({r['people']} people) | {r['rule']} | {r['epsilon_per_release']:.3f} | "
                  f"{r['release_pld_epsilon_at_lifetime_delta']:.3f} | {r['ledger_spend_after_one_release']:.3f} | "
                  f"{r['one_release_ratio']:.3f}× | {r['releases_for_a_new_person']:g} | "
                  f"{r['schedule_filter_epsilon']:.2f} / {r['schedule_pld_epsilon']:.2f} = {r['schedule_ratio']:.3f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
