"""`run_audit`: the whole audit of one trained model, as one plain function (CLI and flow share it).

loaded model + snapshot texts + the plan's attacker reservations
  → user inference on real users (AUROC, TPR@FPR, bootstrap, DP ceiling, ε lower bound)
  → canary users, reported apart (their AUROC and substring exposure)
  → secret exposure for secrets with a known lead-in (truth.json, or the snapshot's tagged spans)
  → gate (policy thresholds + the ceiling rule) → aggregates, ROC PNG, private per-user Parquet.
"""
from __future__ import annotations

import datetime as _dt
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.audit.canaries import canary_probes, is_canary
from components.audit.ceiling import auroc_ceiling, certificate_ceilings
from components.audit.exposure import probes_from_spans, probes_from_truth, secret_exposure, exposure_summary
from components.audit.metrics import bootstrap_metrics
from components.audit.report import SECTION_SCHEMA, ref_key, roc_plot, secret_ref, write_private
from components.audit.user_inference import (_check_samples, aggregate_user_scores, auroc_by_m, score_samples,
                                            user_inference_report)
from components.core.errors import VeilError
from components.core.hashing import sha256_json

CONTRACT_KEYS = ("auroc", "auroc_std", "auroc_ceiling", "tpr_at_fpr", "users_in", "users_out", "passed")


@dataclass
class AuditResult:
    audit_id: str
    section: dict                      # the certificate's audit section: aggregates only
    plot_path: Path | None             # ROC PNG (aggregate; log it as an artifact)
    private_path: Path                 # per-user scores: catalog-private, never log it
    passed: bool
    timings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The aggregates for the certificate / MLflow (what `attach_audit` takes)."""
        return dict(self.section)

    def to_json(self) -> dict:
        """The `veil audit --json` document: the contract keys first, then the detail."""
        s = self.section
        return {**{k: s[k] for k in CONTRACT_KEYS}, **{k: v for k, v in s.items() if k not in CONTRACT_KEYS},
                "roc_png": str(self.plot_path) if self.plot_path else None}


def _user_pld(cert):
    """The certificate's user-level privacy-loss distribution for the ROC plot, or None."""
    from components.audit.ceiling import certificate_pld

    try:
        return certificate_pld(cert)
    except (KeyError, TypeError, ValueError):
        return None


def resolve_thresholds(policy_thresholds: Any, plan: Mapping) -> dict:
    """Policy audit thresholds from a policy's `spec.audit` (pydantic), a dict, or the plan's copy."""
    src: Any = policy_thresholds
    if src is None:
        src = (plan.get("audit") or {}).get("thresholds") or {}
    get = (lambda k: src.get(k)) if isinstance(src, Mapping) else (lambda k: getattr(src, k, None))
    out = {}
    for k in ("max_user_inference_auroc", "max_secret_exposure", "max_canary_auroc"):
        v = get(k)
        out[k] = None if v is None else float(v)
    return out


def user_level_guarantee(certificate: Mapping | None) -> tuple[float | None, float | None]:
    """The certificate's (ε, δ) when its privacy unit is the user; (None, None) otherwise."""
    if not certificate or certificate.get("privacy_unit") != "user":
        return None, None
    return float(certificate["epsilon"]), float(certificate["delta"])


def _annex(plan: Mapping, settings) -> dict:
    """The plan's private annex (held-out users, attacker/canary/train files), checked against the plan."""
    from components.planning.annex import load_annex

    return load_annex(settings.private_dir, plan)


def attacker_samples(plan: Mapping, snapshot_records: pa.Table, settings, annex: Mapping | None = None) -> pa.Table:
    """(user_id, text, member) for the plan's attacker records, texts joined from the snapshot (and the
    plan's canary records, if any). The files come from the plan's private annex, sha256-checked."""
    from components.planning.data import attacker_rows, plan_texts

    annex = _annex(plan, settings) if annex is None else annex
    att = attacker_rows(annex)
    texts = plan_texts(annex, snapshot_records)
    joined = att.join(texts, "record_id", join_type="left outer")
    missing = joined.filter(pc.is_null(joined["text"])).num_rows
    if missing:
        raise VeilError(f"audit: {missing} attacker record(s) of the plan are not in snapshot "
                        f"{plan['data']['snapshot_id']}")
    return joined.select(["user_id", "text", "member"]).sort_by([("user_id", "ascending")])


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"audit: {msg}", file=sys.stderr, flush=True)


def run_audit(loaded, snapshot_records: pa.Table, *, policy_thresholds: Any = None, settings,
              truth: Mapping | None = None, secret_spans: pa.Table | None = None, samples: pa.Table | None = None,
              canary_records: pa.Table | None = None, reference=None, bootstrap: int = 100, seed: int | None = None,
              n_candidates: int = 100, max_secrets_per_class: int = 20, batch_size: int = 16,
              plot: bool = True, progress: bool = False) -> AuditResult:
    """Audit one trained model. `loaded` has .model (eval; a peft model unless `reference` is given),
    .tokenizer, .certificate (dict), .plan (dict).

    Secret probes come from `truth` (demo truth.json) when given, else from `secret_spans` (restricted
    to the plan's training records). `samples` (user_id, text, member) overrides the plan's attacker
    file (for tests and benches); `canary_records` supplies canary texts with their substrings.
    """
    import time

    t0 = time.perf_counter()
    plan, cert = dict(loaded.plan), dict(loaded.certificate or {})
    seq_len = int(plan["training"]["seq_len"])
    seed = int(plan["training"].get("seed", 0)) if seed is None else int(seed)
    thresholds = resolve_thresholds(policy_thresholds, plan)
    eps, delta = user_level_guarantee(cert)
    ceilings = certificate_ceilings(cert) if eps is not None else {"auroc_ceiling": 1.0, "auroc_ceiling_pld": None}
    key = ref_key(settings)
    audit_id = sha256_json({"certificate": cert.get("sha256"), "plan": plan.get("sha256"), "seed": seed,
                            "bootstrap": bootstrap, "n_candidates": n_candidates,
                            "max_secrets_per_class": max_secrets_per_class})[:16]
    timings: dict[str, float] = {}

    # --- user inference -------------------------------------------------------------------------
    annex = _annex(plan, settings) if samples is None or (secret_spans is not None and truth is None) else None
    if samples is None:
        samples = attacker_samples(plan, snapshot_records, settings, annex)
    canary_ids = set((annex or {}).get("canary_users") or [])
    _say(progress, f"scoring {samples.num_rows} attacker samples of {len(set(samples['user_id'].to_pylist()))} users")
    _check_samples(samples)
    ratios = score_samples(loaded.model, loaded.tokenizer, samples["text"].to_pylist(), reference=reference,
                           seq_len=seq_len, batch_size=batch_size, progress=progress)
    scores = aggregate_user_scores(samples, ratios)
    timings["user_inference_s"] = time.perf_counter() - t0
    canary_mask = pa.array([is_canary(u) or u in canary_ids for u in scores["user_id"].to_pylist()])
    real = scores.filter(pc.invert(canary_mask))
    canary = scores.filter(canary_mask)
    ui = user_inference_report(real, eps, delta, bootstrap=bootstrap, seed=seed,
                               max_auroc=thresholds["max_user_inference_auroc"],
                               auroc_ceiling_pld=ceilings["auroc_ceiling_pld"])
    failures = list(ui["failures"])
    m = real["m"].to_pylist()
    real_rows = pc.invert(pa.array([is_canary(u) or u in canary_ids for u in samples["user_id"].to_pylist()]))
    sweep = auroc_by_m(samples.filter(real_rows), ratios[real_rows.to_numpy(zero_copy_only=False)],
                       [x for x in (1, 2, 4, 8, 16) if x < max(m or [1])] + [max(m or [1])],
                       bootstrap=bootstrap, seed=seed)

    # --- canaries ----------------------------------------------------------------------------------
    if canary_records is None and annex is not None and annex.get("canary_records_file"):
        from components.planning.annex import annex_file

        canary_records = pq.read_table(annex_file(annex, "canary_records"))
    canary_section = None
    canary_rows = []
    if canary.num_rows:
        cs = canary["score"].to_numpy(zero_copy_only=False)
        cy = canary["member"].to_numpy(zero_copy_only=False).astype(bool)
        canary_section = {"users_in": int(cy.sum()), "users_out": int((~cy).sum())}
        if cy.any() and (~cy).any():
            cb = bootstrap_metrics(cs, cy, n_boot=bootstrap, seed=seed)
            ceiling = auroc_ceiling(eps, delta) if eps is not None else 1.0
            if ceilings["auroc_ceiling_pld"] is not None:
                ceiling = min(ceiling, ceilings["auroc_ceiling_pld"])
            over = cb["auroc"] - 2 * cb["auroc_std"] > ceiling
            canary_section.update({"auroc": cb["auroc"], "auroc_std": cb["auroc_std"], "auroc_ceiling": ceiling,
                                   "tpr_at_fpr": cb["tpr_at_fpr"], "above_ceiling": bool(over)})
            if over:
                failures.append(f"canary auroc {cb['auroc']:.4f} - 2 std > DP ceiling {ceiling:.4f}: "
                                "treat as a bug in training, accounting or the privacy unit")
            lim = thresholds["max_canary_auroc"]
            if lim is not None and cb["auroc"] > lim:
                failures.append(f"canary auroc {cb['auroc']:.4f} > policy max {lim}")
        if canary_records is not None:
            member_of = dict(zip(canary["user_id"].to_pylist(), cy.tolist()))
            pairs = [(u, p) for u, p in canary_probes(canary_records) if u in member_of]
            if pairs:
                _say(progress, f"canary exposure for {len(pairs)} canaries")
                rows = secret_exposure(loaded.model, loaded.tokenizer, [p for _, p in pairs],
                                       n_candidates=n_candidates, seed=seed, seq_len=seq_len,
                                       batch_size=2 * batch_size, reference=reference, ref_key=key,
                                       progress=progress)
                by_ref = {secret_ref(key, p.secret_id): member_of[u] for u, p in pairs}
                for r in rows:
                    r["member"] = by_ref[r["secret_ref"]]
                canary_rows = rows
                ex_in = [r["exposure"] for r in rows if r["member"]]
                ex_out = [r["exposure"] for r in rows if not r["member"]]
                canary_section.update({
                    "n_candidates": max(r["n_candidates"] for r in rows),
                    "max_exposure": max(r["exposure"] for r in rows),
                    "mean_exposure_in": statistics.fmean(ex_in) if ex_in else None,
                    "mean_exposure_out": statistics.fmean(ex_out) if ex_out else None})
    timings["canaries_s"] = time.perf_counter() - t0 - timings["user_inference_s"]

    # --- secret exposure --------------------------------------------------------------------------
    t1 = time.perf_counter()
    probes = []
    if truth is not None:
        probes = probes_from_truth(truth)
    elif secret_spans is not None and secret_spans.num_rows:
        from components.planning.data import train_rows

        train_ids = train_rows(annex)["record_id"].to_pylist()
        probes = probes_from_spans(snapshot_records, secret_spans, record_ids=train_ids)
    probes = _cap_per_class(probes, max_secrets_per_class, key)
    secret_rows = []
    if probes:
        _say(progress, f"secret exposure for {len(probes)} secrets x {n_candidates} candidates")
        secret_rows = secret_exposure(loaded.model, loaded.tokenizer, probes, n_candidates=n_candidates,
                                      seed=seed, seq_len=seq_len, batch_size=2 * batch_size, reference=reference,
                                      ref_key=key, progress=progress)
    exposure = exposure_summary(secret_rows)
    gate_key = "max_excess_exposure" if exposure.get("max_excess_exposure") is not None else "max_exposure"
    lim = thresholds["max_secret_exposure"]
    if lim is not None and exposure.get(gate_key) is not None and exposure[gate_key] > lim:
        failures.append(f"secret {gate_key.removeprefix('max_')} {exposure[gate_key]:.2f} bits > policy max {lim}")
    exposure["gated_on"] = gate_key.removeprefix("max_")
    timings["secret_exposure_s"] = time.perf_counter() - t1

    # --- private evidence, plot, section ------------------------------------------------------------
    private = write_private(settings, audit_id, scores.append_column("canary", canary_mask),
                            _secret_table(probes, secret_rows + canary_rows, key, canary_records))
    plot_path = None
    if plot:
        plot_path = roc_plot(real["score"].to_numpy(zero_copy_only=False),
                             real["member"].to_numpy(zero_copy_only=False), Path(settings.home) / "audits" /
                             f"{audit_id}-roc.png", epsilon=eps, delta=delta, pld=_user_pld(cert),
                             title=f"User inference: AUROC {ui['auroc']:.3f} ± {ui['auroc_std']:.3f} " + (
                                 "(no user-level DP guarantee, no ceiling)" if eps is None else
                                 f"(DP ceiling {ui['auroc_ceiling']:.3f} from (ε, δ)"
                                 + (f", {ui['auroc_ceiling_pld']:.3f} from the mechanism's PLD)"
                                    if ui["auroc_ceiling_pld"] is not None else ")")),
                             canary=(canary["score"].to_numpy(zero_copy_only=False),
                                     canary["member"].to_numpy(zero_copy_only=False)) if canary.num_rows else None)
    passed = not failures
    section = {
        **{k: ui[k] for k in CONTRACT_KEYS if k != "passed"},
        "passed": passed,
        "schema": SECTION_SCHEMA,
        "audit_id": audit_id,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "auroc_ceiling_pld": ui["auroc_ceiling_pld"],
        "auroc_point": ui["auroc_point"],
        "auroc_ci95": ui["auroc_ci95"],
        "tpr_at_fpr_std": ui["tpr_at_fpr_std"],
        "tpr_at_fpr_ceiling": ui["tpr_at_fpr_ceiling"],
        "tpr_at_fpr_resolved": ui["tpr_at_fpr_resolved"],
        "fpr_resolution": ui["fpr_resolution"],
        "epsilon_lower_bound": ui["epsilon_lower_bound"],
        "above_ceiling": bool(ui["above_ceiling"] or (canary_section or {}).get("above_ceiling", False)),
        "ceiling_basis": ("user-level (ε, δ) of the certificate" if eps is not None else
                          f"none: the certificate's privacy unit is {cert.get('privacy_unit')!r}, not the user"),
        "epsilon": eps, "delta": delta,
        "n_bootstrap": ui["n_bootstrap"], "bootstrap_seed": ui["bootstrap_seed"],
        "statistic": "mean over a user's attacker samples of log p_model(x) - log p_ref(x) (token-summed)",
        "reference": "given reference model" if reference is not None else "same model, adapter disabled",
        "seq_len": seq_len,
        "attacker_samples_per_user": {"min": min(m), "median": float(np.median(m)), "max": max(m)},
        "auroc_by_m": sweep,   # seed 003's ablation: the attack with fewer samples per user
        "secret_exposure": exposure,
        "canaries": canary_section,
        "thresholds": thresholds,
        "failures": failures,
    }
    timings["total_s"] = time.perf_counter() - t0
    return AuditResult(audit_id=audit_id, section=section, plot_path=plot_path, private_path=private,
                       passed=passed, timings=timings)


def _cap_per_class(probes, cap: int, key: bytes):
    """At most `cap` probes per class, chosen by keyed hash (deterministic, unrelated to exposure)."""
    if cap is None or cap <= 0:
        return list(probes)
    by: dict[str, list] = {}
    for p in sorted(probes, key=lambda p: secret_ref(key, p.secret_id)):
        lst = by.setdefault(p.secret_class, [])
        if len(lst) < cap:
            lst.append(p)
    return [p for c in sorted(by) for p in by[c]]


def _secret_table(probes, rows, key, canary_records) -> pa.Table:
    ids = {secret_ref(key, p.secret_id): p.secret_id for p in probes}
    if canary_records is not None:
        for u in set(canary_records["user_id"].to_pylist()):
            ids[secret_ref(key, f"canary:{u}")] = f"canary:{u}"
    out = [{"secret_id": ids.get(r["secret_ref"]), **{k: (float(v) if isinstance(v, float) else v)
                                                       for k, v in r.items() if k != "member"}}
           for r in rows]
    return pa.Table.from_pylist(out) if out else pa.table({"secret_id": pa.array([], pa.string())})
