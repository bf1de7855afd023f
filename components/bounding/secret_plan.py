"""Secret-protection plans (seed 004): LP weights → Poisson rates → the smallest σ meeting every γ.

Secret ids hold the secrets' values ("credential:AKIA…"), and the plan is public: no secret id is
written into it. The plan carries per-class aggregates only; per-secret detail stays with the
catalog (`veil privacy secrets --plan` recomputes it from the plan's rates and the snapshot).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.core.errors import VeilError
from components.core.canonical import described, round_sig
from components.bounding.secret_lp import LPResult, sampling_rates, solve_secret_lp


@dataclass(frozen=True)
class SecretStructure:
    """The LP's input: which training rows hold which secrets (indices), and each secret's ρ."""
    rec: np.ndarray               # row index into the training table, one entry per (row, secret)
    sec: np.ndarray               # secret index
    rho: np.ndarray               # KL budget per secret
    secret_class: list[str]       # class per secret index
    n_rows: int
    ignored_classes: tuple[str, ...]


def secret_structure(policy, train: pa.Table, secret_spans: pa.Table) -> SecretStructure:
    from components.accounting.secrets import kl_budget  # startup

    prot = policy.secret_protection()
    spans = secret_spans.select(["record_id", "secret_id", "secret_class"])
    seen_classes = set(spans["secret_class"].to_pylist()) if spans.num_rows else set()
    ignored = tuple(sorted(seen_classes - set(prot)))
    spans = spans.filter(pc.is_in(spans["secret_class"], value_set=pa.array(sorted(prot), pa.string())))
    rows = pa.table({"record_id": train["record_id"], "_row": pa.array(np.arange(train.num_rows), pa.int64())})
    joined = rows.join(spans, "record_id", join_type="inner")
    ids = joined["secret_id"].to_pylist()
    uniq = sorted(set(ids))
    index = {s: i for i, s in enumerate(uniq)}
    cls_of: dict[str, str] = dict(zip(ids, joined["secret_class"].to_pylist()))
    classes = [cls_of[s] for s in uniq]
    rho_of = {c: kl_budget(p.kappa, p.gamma) for c, p in prot.items()}
    return SecretStructure(rec=joined["_row"].to_numpy(), sec=np.array([index[s] for s in ids], dtype=np.int64),
                           rho=np.array([rho_of[c] for c in classes], dtype=float), secret_class=classes,
                           n_rows=train.num_rows, ignored_classes=ignored)


def untagged_max_rate(train_rows: pa.Table, secret_spans: pa.Table, protected) -> float | None:
    """The largest Poisson rate among training rows holding no secret of a protected class (rows
    tagged only with an ignored class included): what an untagged record's record-level guarantee
    is computed at. None when training holds no such row (untagged records dropped)."""
    prot = sorted(protected)
    spans = secret_spans.filter(pc.is_in(secret_spans["secret_class"], value_set=pa.array(prot, pa.string())))
    tagged = pc.is_in(train_rows["record_id"], value_set=spans["record_id"].unique())
    rates = pc.filter(train_rows["rate"], pc.invert(tagged))
    rates = pc.filter(rates, pc.greater(rates, 0.0))
    return float(pc.max(rates).as_py()) if len(rates) else None


def solve_for_policy(policy, st: SecretStructure, *, c: float | None = None) -> LPResult:
    s = policy.spec.secrets
    return solve_secret_lp(st.rec, st.sec, st.rho, st.n_rows, c=s.lp.c if c is None else c,
                           untagged=s.untagged_records, time_limit_s=s.lp.time_limit_s)


def _class_table(st: SecretStructure, lp: LPResult, policy) -> dict:
    out = {}
    classes = np.array(st.secret_class, dtype=object)
    counts = np.bincount(st.sec, minlength=len(st.secret_class)) if st.sec.size else np.zeros(0)
    for cname, prot in policy.secret_protection().items():
        idx = np.flatnonzero(classes == cname) if classes.size else np.zeros(0, dtype=int)
        cap = float(policy.spec.secrets.lp.c) * (st.rho[idx] if idx.size else np.zeros(0))
        load = lp.secret_load[idx] if idx.size else np.zeros(0)
        out[cname] = {"kappa": prot.kappa, "gamma": prot.gamma, "rho": float(st.rho[idx][0]) if idx.size else None,
                      "n_secrets": int(idx.size), "n_record_tags": int(counts[idx].sum()) if idx.size else 0,
                      "n_binding": int(np.sum((load > 0) & (load >= cap * (1 - 1e-6) - 1e-9))) if idx.size else 0}
    return out


def plan_secret_rates(policy, train: pa.Table, secret_spans: pa.Table, *, expected_batch_size: int
                      ) -> tuple[dict, np.ndarray, pa.Table]:
    """LP weights and Poisson rates for `train`; returns (plan section, rates, rows with rate > 0)."""
    st = secret_structure(policy, train, secret_spans)
    lp = solve_for_policy(policy, st)
    # The LP's weights and the numpy sums behind the rates may differ in the last bits between CPUs;
    # the rates go into the train records file (its commitment is in the plan) and the LP's figures
    # into the plan, so both are rounded to DESCRIBED_DIGITS (components.core.canonical).
    rates = np.array([round_sig(r) for r in sampling_rates(lp.weights, expected_batch_size).tolist()], dtype=float)
    keep = np.flatnonzero(rates > 0)
    # the solver's wall time is not part of the plan: the plan's identity (its sha256) must depend on
    # its inputs alone, or a resumed retraining would re-plan under a new identity
    summary = {k: v for k, v in lp.summary().items() if k != "seconds"}
    section = described({**summary, "untagged_records": policy.spec.secrets.untagged_records,
               "classes": _class_table(st, lp, policy),
               "ignored_classes": list(st.ignored_classes),
               "rates": "per-record Poisson rates p_i = B·w_i/Σw in the train records file ('rate' column); "
                        "records with w_i = 0 are left out"})
    return section, rates[keep], train.take(pa.array(keep, pa.int64()))


def _targets(policy, train_tbl: pa.Table, secret_spans: pa.Table):
    from components.accounting.secrets import secret_targets  # startup

    return secret_targets(train_tbl, secret_spans, policy.secret_protection())


def calibrate_secret(policy, chosen: pa.Table, rates: np.ndarray, secret_spans: pa.Table, *, steps: int,
                     cache_dir: str | Path | None = None) -> tuple[dict, float, dict]:
    """(accounting section, σ, target) for a secret plan; no secret id leaves this function."""
    from components.accounting.secrets import calibrate_secrets  # startup

    train_tbl = chosen.select(["record_id", "user_id"]).append_column("rate", pa.array(rates, pa.float64()))
    targets = _targets(policy, train_tbl, secret_spans)
    if not targets:
        raise VeilError("secret plan: no record in the training data holds a secret of the policy's classes; "
                        "nothing to protect (check the catalog's tagging against the policy)")
    cal = calibrate_secrets(targets, steps=steps)
    return _secret_accounting(policy, cal), float(cal.noise_multiplier), _secret_target(policy)


def _secret_target(policy) -> dict:
    return {"epsilon": None, "delta": None,
            "secrets": {c: {"kappa": p.kappa, "gamma": p.gamma} for c, p in policy.secret_protection().items()}}


def _secret_accounting(policy, cal) -> dict:
    from components.accounting import LIBRARY_VERSION  # startup
    from components.accounting.secrets import published_bounds  # startup

    by_class: dict[str, dict] = {}
    cls_of = {}
    for r in cal.secrets:
        cls = r.secret_id.split(":", 1)[0]
        cls_of[r.secret_id] = cls
        d = by_class.setdefault(cls, {"n_secrets": 0, "max_gamma": 0.0, "max_kl": 0.0, "gamma_target": r.gamma_target,
                                      "kappa": r.kappa})
        d["n_secrets"] += 1
        d["max_gamma"] = max(d["max_gamma"], float(r.gamma))
        d["max_kl"] = max(d["max_kl"], float(r.kl))
    for d in by_class.values():   # as published: rounded up, machine-independent (core.canonical)
        _, d["max_kl"], d["max_gamma"] = published_bounds(d["max_kl"], cal.steps, d["kappa"])
    return {"epsilon": None, "delta": None, "mechanism": "secret", "dp_event": None,
            "accountant": cal.accountant, "library_version": LIBRARY_VERSION,
            "sensitivity": cal.sensitivity, "sensitivity_reason": cal.sensitivity_reason,
            "dominance": cal.dominance, "tolerance": cal.tolerance,
            "binding_class": cls_of.get(cal.binding_secret) if cal.binding_secret else None,
            "by_class": by_class}


def sweep_c(policy, train: pa.Table, secret_spans: pa.Table, cs: Sequence[float], *, expected_batch_size: int,
            steps: int) -> list[dict]:
    """For each C: retained weight and the σ that secret protection then needs (seed 004 Fig. 1)."""
    from components.accounting.secrets import calibrate_secrets  # startup

    st = secret_structure(policy, train, secret_spans)
    rows = []
    for c in cs:
        lp = solve_for_policy(policy, st, c=float(c))
        row = {"c": float(c), "retained_fraction": lp.retained_fraction, "objective": lp.objective,
               "n_binding": lp.n_binding, "n_zero_weight": int(np.sum(lp.weights <= 0)), "lp_seconds": lp.seconds}
        try:
            rates = sampling_rates(lp.weights, expected_batch_size)
        except VeilError as e:
            rows.append({**row, "noise_multiplier": None, "note": str(e)})
            continue
        keep = np.flatnonzero(rates > 0)
        chosen = train.take(pa.array(keep, pa.int64()))
        tbl = chosen.select(["record_id", "user_id"]).append_column("rate", pa.array(rates[keep], pa.float64()))
        targets = _targets(policy, tbl, secret_spans)
        sigma = calibrate_secrets(targets, steps=steps).noise_multiplier if targets else None
        rows.append({**row, "noise_multiplier": sigma,
                     # noise std on the averaged update, in clip-norm units: what the model actually feels
                     "noise_per_signal": (sigma / expected_batch_size) if sigma else None})
    return rows
