"""Issue 16's utility target: at person-level ε = 8, does DP fine-tuning close at least half of the
perplexity gap between the public base and non-private fine-tuning?

    python bench/utility.py --results VEIL_HOME/studies/<id>/results.json [...] [--epsilon 8] [--json]
    python bench/utility.py --results RUN1/results.json RUN2/results.json ... --repeats   # mean ± sd
    VEIL_HOME=... python bench/utility.py --policy P --grid G --base-model DIR [--json]   # runs the study

Baseline = non-private fine-tuning (same data, steps, batch and learning rate, no clipping or noise);
ours = the DP point. `--repeats`: the same DP point trained again from the same plan (same people,
same evaluation texts; fresh private seeds for sampling and noise) in several studies — rows grouped by
the DP point's key and its evaluation texts (a point re-planned in another study folder gets another
plan sha256 — the plan records its policy file's path — but the same people and texts) and reported as
mean ± sample sd over the runs. ratio = (PPL_base − PPL_dp) / (PPL_base − PPL_nonprivate): 1 = as good as
non-private, 0 = no better than the base; the same in mean NLL (log-perplexity) beside it. Scores are
on the plan's evaluation people (never trained on): tuning numbers, not covered by any certificate.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET = 0.5


def rows_at(doc: dict, epsilon: float) -> list[dict]:
    out = []
    for g in doc.get("gap_closing", []):
        if g["epsilon"] is not None and abs(g["epsilon"] - epsilon) < 1e-9:
            row = next(r for r in doc["rows"] if r["key"] == g["key"])
            out.append({"study": doc["study_id"], "point": g["key"], "mechanism": g["mechanism"],
                        "privacy_unit": row.get("privacy_unit"), "epsilon": g["epsilon"],
                        "plan_epsilon": row.get("plan_epsilon"), "noise_multiplier": row.get("noise_multiplier"),
                        "base_ppl": g["base_perplexity"], "nonprivate_ppl": g["nonprivate_perplexity"],
                        "dp_ppl": g["dp_perplexity"], "ratio": g["ratio"], "ratio_nll": g["ratio_nll"],
                        "target_met": g["ratio"] is not None and g["ratio"] >= TARGET,
                        "plan_sha256": row.get("plan_sha256"), "eval_texts_sha256": row.get("eval_texts_sha256")})
    return out


def repeats(table: list[dict]) -> list[dict]:
    """Mean ± sample sd per DP point over repeated runs (grouped by point key and evaluation texts)."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in table:
        groups.setdefault((r["point"], r["eval_texts_sha256"]), []).append(r)
    out = []
    for (point, sha), rs in groups.items():
        row = {"point": point, "eval_texts_sha256": sha, "runs": len(rs), "studies": [r["study"] for r in rs],
               "plans": sorted({r["plan_sha256"] for r in rs})}
        for k in ("dp_ppl", "nonprivate_ppl", "base_ppl", "ratio", "ratio_nll"):
            v = [r[k] for r in rs if r[k] is not None]
            row[k] = {"mean": statistics.fmean(v) if v else None,
                      "sd": statistics.stdev(v) if len(v) > 1 else None,
                      "min": min(v) if v else None, "max": max(v) if v else None, "values": v}
        row["runs_meeting_target"] = sum(1 for r in rs if r["target_met"])
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", nargs="*", type=Path, default=[], help="study results.json files")
    ap.add_argument("--policy", type=Path)
    ap.add_argument("--grid", type=Path)
    ap.add_argument("--base-model", type=Path)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", action="store_true", help="mean ± sd per DP point over repeated runs of one plan")
    args = ap.parse_args()
    docs = [json.loads(p.read_text()) for p in args.results]
    if args.grid is not None:
        from components.core.settings import load_settings
        from flows.study import run_study

        if args.policy is None or args.base_model is None:
            ap.error("--grid needs --policy and --base-model")
        docs.append(run_study(load_settings().ensure(), args.policy, args.grid, base_dir=args.base_model,
                              use_prefect=False))
    if not docs:
        ap.error("give --results FILE… or --policy/--grid/--base-model to run a study")
    table = [r for d in docs for r in rows_at(d, args.epsilon)]
    out = {"epsilon": args.epsilon, "target_ratio": TARGET, "rows": table,
           "caveat": "measured on private evaluation people: not covered by any certificate"}
    if args.repeats:
        out["repeats"] = repeats(table)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    print(f"ε = {args.epsilon:g}: share of the base → non-private perplexity gap closed by DP (target ≥ {TARGET})")
    print(f"{'study':<34}{'point':<28}{'base':>8}{'non-priv':>10}{'DP':>8}{'ratio':>8}{'ratio(NLL)':>11}  met")
    for r in table:
        print(f"{r['study'][:33]:<34}{r['point'][:27]:<28}{r['base_ppl']:>8.1f}{r['nonprivate_ppl']:>10.1f}"
              f"{r['dp_ppl']:>8.1f}{(r['ratio'] if r['ratio'] is not None else float('nan')):>8.2f}"
              f"{(r['ratio_nll'] if r['ratio_nll'] is not None else float('nan')):>11.2f}  "
              f"{'yes' if r['target_met'] else 'no'}")
    for g in out.get("repeats", []):
        def ms(k):
            d = g[k]
            return f"{d['mean']:.2f} ± {d['sd']:.2f}" if d["sd"] is not None else f"{d['mean']:.2f}"
        print(f"repeats {g['point']} ({g['runs']} runs, eval texts {str(g['eval_texts_sha256'])[:12]}): DP PPL {ms('dp_ppl')}, non-private {ms('nonprivate_ppl')}, "
              f"ratio {ms('ratio')} (NLL {ms('ratio_nll')}), target met in {g['runs_meeting_target']}/{g['runs']}")


if __name__ == "__main__":
    main()
