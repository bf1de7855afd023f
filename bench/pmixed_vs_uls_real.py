"""PMixED vs DP-SGD (ULS) at the same person-level ε on a real corpus (issue 15's utility claim).

    VEIL_HOME=STUDY_HOME python bench/pmixed_vs_uls_real.py --study DIR --point uls-e8-random-k2-lora \\
        --pmixed-policy policies/debian-pmixed.yaml --pmixed-home DIR2 [--records 150] [--json]

DIR is a `veil study` folder whose ULS point trained on the corpus (its plan names the trained and the
evaluation people). PMixED is built in a separate VEIL_HOME (DIR2) from exactly that point's training
people's records (exported from the plan's train rows; `veil pmixed build` partitions all people of its
snapshot, so the evaluation people must not be in it), from the same public base. Both are then scored
on the same texts of the plan's evaluation people: the base, the ULS adapter, PMixED at its
certificate's radius (a Poisson selection per position from the OS CSPRNG, as served) and the ensemble
without mollifier (radius ∞, no privacy) — bench/pmixed_utility.py's scorers.

Honesty notes as in bench/pmixed_utility.py: far more positions are scored than the token budget
allows a deployment to answer (per-token quality at the calibrated radius); no budget is charged.
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


def export_training_people(settings, plan_doc: dict, out: Path) -> int:
    """The plan's training rows (all of each trained person's records in those rows) as JSONL."""
    from catalog.snapshots import load_snapshot
    from components.draws.annex import load_annex
    from components.draws.data import train_rows

    from components.draws.annex import plan_snapshot_ref

    annex = load_annex(settings.private_dir, plan_doc)
    rows = train_rows(annex)
    snap = load_snapshot(settings, plan_snapshot_ref(plan_doc, annex)[0])
    joined = rows.select(["record_id", "user_id"]).join(snap.records.select(["record_id", "text"]), keys="record_id")
    with open(out, "w") as f:
        for u, t in zip(joined.column("user_id").to_pylist(), joined.column("text").to_pylist()):
            f.write(json.dumps({"user": u, "text": t}) + "\n")
    os.chmod(out, 0o600)
    return joined.num_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", required=True, type=Path)
    ap.add_argument("--point", required=True)
    ap.add_argument("--pmixed-policy", required=True, type=Path)
    ap.add_argument("--pmixed-home", required=True, type=Path)
    ap.add_argument("--records", type=int, default=150)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pmixed_utility import encode, pmixed_ppl, single_ppl

    from components.core.settings import load_settings
    from components.modeling import load_base
    from components.modeling.base import load_finetuned
    from components.planning import load_plan
    from flows import pmixed as pmixed_flow
    from flows.study import eval_texts

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    s = load_settings().ensure()
    res = json.loads((args.study / "results.json").read_text())
    row = next(r for r in res["rows"] if r["key"] == args.point)
    base_dir = res["base_model"]
    plan_doc = load_plan(next(p for p in s.plans_dir.glob("*.json") if p.stem == row["plan_sha256"]
                              or p.name.startswith(row["plan_sha256"][:12]))).to_dict()
    _, texts = eval_texts(s, plan_doc, args.records)

    # PMixED on the ULS point's training people only, in its own home
    ph = load_settings(args.pmixed_home).ensure()
    src = args.pmixed_home / "train-people.jsonl"
    n_rows = export_training_people(s, plan_doc, src)
    from flows import stages

    stages.ingest(ph, src, "jsonl")
    built = pmixed_flow.build(ph, args.pmixed_policy, base_dir=base_dir, use_prefect=False)
    from components.prediction.release import open_ensemble, resolve

    r = resolve(ph, built["model_uri"])
    ens = open_ensemble(ph, r)
    cert = r["certificate"]

    base, tok = load_base(base_dir)
    seq_len = int(plan_doc["training"]["seq_len"])
    seqs = encode(tok, texts, seq_len)
    uls, _ = load_finetuned(base_dir, adapter_dir=Path(args.study) / "runs" / args.point / "adapter")
    doc = {
        "eval": {"records": len(seqs), "tokens": int(sum(len(x) - 1 for x in seqs)),
                 "source": "the ULS plan's evaluation people (never trained on by either)"},
        "pmixed_training_rows": n_rows,
        "public_base_ppl": single_ppl(base, seqs),
        "uls_dp_sgd_ppl": single_ppl(uls.eval(), seqs), "uls_epsilon": row["plan_epsilon"], "uls_delta": row["delta"],
        "pmixed_ppl": pmixed_ppl(ens, seqs, cert["ensemble"]["radius"]),
        "pmixed_epsilon": cert["epsilon"], "pmixed_delta": cert["delta"], "pmixed_token_budget": cert["token_budget"],
        "pmixed_radius": cert["ensemble"]["radius"], "shards": cert["ensemble"]["shards"],
        "q": cert["ensemble"]["subsample_rate"],
        "ensemble_no_privacy_ppl": pmixed_ppl(ens, seqs, 1e6),
    }
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    print(f"eval: {doc['eval']['records']} records of evaluation people, {doc['eval']['tokens']} tokens")
    print(f"{'model':<44}{'privacy':>28}{'PPL':>9}")
    print(f"{'public base':<44}{'none needed':>28}{doc['public_base_ppl']:>9.2f}")
    print(f"{'DP-SGD (ULS), weights released':<44}{'(%.2f, %g) per person' % (doc['uls_epsilon'], doc['uls_delta']):>28}"
          f"{doc['uls_dp_sgd_ppl']:>9.2f}")
    print(f"{'PMixED, %d private tokens, r=%.3f' % (doc['pmixed_token_budget'], doc['pmixed_radius']):<44}"
          f"{'(%.2f, %g) per person' % (doc['pmixed_epsilon'], doc['pmixed_delta']):>28}{doc['pmixed_ppl']:>9.2f}")
    print(f"{'ensemble, no mollifier':<44}{'none (ε = ∞)':>28}{doc['ensemble_no_privacy_ppl']:>9.2f}")


if __name__ == "__main__":
    main()
