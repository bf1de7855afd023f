"""A study's outputs: the results table (CSV/JSON, rich), the privacy–utility plot, the gap-closing
ratios, and the MLflow parent run with one child run per point."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from components.core.settings import Settings
from components.publication import publish

COLUMNS = ("key", "mechanism", "privacy_unit", "epsilon", "plan_epsilon", "selection", "k", "lora",
           "noise_multiplier", "sampling_rate", "steps", "perplexity", "next_token_accuracy", "base_perplexity",
           "train_seconds")


def _nonprivate_for(rows: list[dict], lora: bool) -> dict | None:
    nps = [r for r in rows if r["mechanism"] == "non-private"]
    same = [r for r in nps if r["lora"] == lora]
    pick = same or nps
    return min(pick, key=lambda r: r["perplexity"]) if pick else None


def gap_closing(rows: list[dict]) -> list[dict]:
    """For every private point: the share of the base → non-private gap it closes,
    (PPL_base − PPL_dp) / (PPL_base − PPL_nonprivate), and the same in mean NLL (log-perplexity).
    The non-private reference is the one with the same LoRA/full setting when the grid has it."""
    out = []
    for r in rows:
        if r["mechanism"] == "non-private":
            continue
        ref = _nonprivate_for(rows, r["lora"])
        if ref is None:
            continue
        gap = r["base_perplexity"] - ref["perplexity"]
        gap_nll = r["base_mean_nll"] - ref["mean_nll"]
        out.append({"key": r["key"], "mechanism": r["mechanism"], "epsilon": r["epsilon"], "lora": r["lora"],
                    "base_perplexity": r["base_perplexity"], "dp_perplexity": r["perplexity"],
                    "nonprivate_perplexity": ref["perplexity"], "nonprivate_key": ref["key"],
                    "ratio": (r["base_perplexity"] - r["perplexity"]) / gap if gap > 0 else None,
                    "ratio_nll": (r["base_mean_nll"] - r["mean_nll"]) / gap_nll if gap_nll > 0 else None})
    return out


def write_tables(doc: dict, out: Path) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS) + ["next_token_accuracy_base"], extrasaction="ignore")
        w.writeheader()
        for r in doc["rows"]:
            w.writerow({**r, "next_token_accuracy_base": r.get("base_next_token_accuracy")})


def rich_table(doc: dict):
    from rich.table import Table

    t = Table(title=f"study {doc['study_id']} — not covered by any certificate")
    for c in ("point", "unit", "ε", "σ", "q", "steps", "PPL", "acc", "base PPL", "gap closed"):
        # a point's key is long (mechanism, ε, selection, k, LoRA): it folds onto more lines, never "…";
        # numbers stay whole on one line
        if c == "point":
            t.add_column(c, justify="left", overflow="fold")
        else:   # short cells; headers may wrap ("base / PPL") before a number is folded
            t.add_column(c, justify="left" if c == "unit" else "right", overflow="fold")
    ratio = {g["key"]: g["ratio"] for g in doc.get("gap_closing", [])}
    for r in sorted(doc["rows"], key=lambda r: (r["mechanism"], r["epsilon"] or 0.0, r["key"])):
        t.add_row(r["key"], r.get("privacy_unit") or "", "∞" if r["epsilon"] is None else f"{r['epsilon']:g}",
                  f"{r['noise_multiplier']:.3f}" if r["noise_multiplier"] is not None else "",
                  f"{r['sampling_rate']:.4f}" if r["sampling_rate"] is not None else "", str(r["steps"]),
                  f"{r['perplexity']:.2f}", f"{r['next_token_accuracy']:.3f}", f"{r['base_perplexity']:.2f}",
                  "" if ratio.get(r["key"]) is None else f"{ratio[r['key']]:.2f}")
    return t


def plot_study(doc: dict, path: Path) -> Path:
    """Perplexity against ε, one line per (mechanism, selection, k, LoRA/full); the base and each
    non-private reference as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(7.0, 4.4), dpi=120)
    lines: dict[str, list[dict]] = {}
    for r in rows:
        if r["epsilon"] is None:
            continue
        label = r["mechanism"]
        extra = [x for x in ((r["selection"] or ""), (f"k={r['k']}" if r["k"] else ""),
                             ("" if r["lora"] else "full FT")) if x]
        if extra:
            label += " (" + ", ".join(extra) + ")"
        lines.setdefault(label, []).append(r)
    for label, pts in sorted(lines.items()):
        pts = sorted(pts, key=lambda r: r["epsilon"])
        ax.plot([p["epsilon"] for p in pts], [p["perplexity"] for p in pts], marker="o", label=label)
    if rows:
        base = rows[0]["base_perplexity"]
        ax.axhline(base, color="grey", linestyle="--", label=f"public base ({base:.1f})")
    for r in rows:
        if r["mechanism"] == "non-private":
            ax.axhline(r["perplexity"], color="black", linestyle=":",
                       label=f"non-private{'' if r['lora'] else ' full FT'} ({r['perplexity']:.1f})")
    if lines:
        ax.set_xscale("log")
        eps = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
        ax.set_xticks(eps)
        ax.set_xticklabels([f"{e:g}" for e in eps])
        from matplotlib.ticker import NullFormatter

        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("ε (target per release; person-level for user units, per record for 'record')")
    ax.set_ylabel("perplexity on evaluation people (lower is better)")
    ax.set_title(f"privacy–utility: {doc['grid']['name']}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(True, alpha=0.3)
    fig.text(0.01, 0.005, "Tuning on private data: not covered by any certificate.", fontsize=6, color="dimgray")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def log_study(settings: Settings, doc: dict, out: Path) -> dict:
    """One parent run (the study), one child run per point, each with the point's public settings and
    its plan's DP values. The measured utility (perplexity, accuracy, gap-closing ratios, the table and
    the plot) is computed exactly on the evaluation people's private text: it stays in the study's
    folder and on the operator's terminal, never in the registry (issue 22: MLflow readers would get a
    near-exact NLL of every evaluation person). Everything logged passes the publication gate."""
    from components.registry.mlflow_registry import _client, _experiment  # startup

    client = _client(settings)
    exp = _experiment(settings, "veil-studies")
    tags = {"veil.kind": "study", "veil.study.id": doc["study_id"], "veil.study.grid_sha256": doc["grid"]["sha256"],
            "veil.study.policy_sha256": doc["policy"]["sha256"], "veil.study.covered_by_certificate": "false",
            "veil.study.caveat": doc["caveat"][:5000]}
    publish("study", {"tags": tags}, subject=doc["study_id"])
    parent = client.create_run(exp, tags=tags, run_name=f"study {doc['study_id']}")
    pid = parent.info.run_id
    params = publish("study", {"params": {"grid": doc["grid"]["name"], "points": len(doc["rows"])}},
                     subject=doc["study_id"])["params"]
    for k, v in params.items():
        client.log_param(pid, k, v)
    children = []
    for r in doc["rows"]:
        point = {k: ("" if r.get(k) is None else str(r.get(k)))
                 for k in ("mechanism", "privacy_unit", "epsilon", "selection", "k", "lora", "noise_multiplier",
                           "sampling_rate", "steps", "plan_sha256")}
        metrics = {"plan_epsilon": float(r["plan_epsilon"])} if r.get("plan_epsilon") is not None else {}
        publish("study", {"point": point, **({"metrics": metrics} if metrics else {})}, subject=doc["study_id"])
        child = client.create_run(exp, tags={"mlflow.parentRunId": pid, "veil.kind": "study-point",
                                             "veil.study.id": doc["study_id"],
                                             "veil.study.covered_by_certificate": "false"},
                                  run_name=r["key"])
        cid = child.info.run_id
        for k, v in point.items():
            client.log_param(cid, k, v)
        for k, v in metrics.items():
            client.log_metric(cid, k, v)
        client.set_terminated(cid)
        children.append(cid)
    client.set_terminated(pid)
    settings.make_private(settings.mlflow_artifacts_dir)
    return {"experiment_id": exp, "parent_run_id": pid, "child_run_ids": children}
