"""`run_audit`: the whole audit of one trained model, as one plain function (CLI and flow share it).

loaded model + snapshot texts + the plan's attacker reservations (`inputs.audit_reservations`)
  → user inference on real users (AUROC and its interval at every m, TPR@FPR, DP ceiling, ε bound)
  → canary users, reported apart (their AUROC and substring exposure)
  → secret exposure for secrets with a known lead-in (truth.json, or the snapshot's tagged spans)
  → verdicts (passed / failed / inconclusive, `verdict`) → the private report (exact values, per-user
    and per-secret rows, full ROC) and the public section (`public`: verdicts and quantized
    class-level aggregates, marked as not covered by the certificate) with its ceiling plot.
"""
from __future__ import annotations

import datetime as _dt
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.audit import public as pub
from components.audit.canaries import canary_probes, is_canary
from components.audit.ceiling import certificate_ceilings, certificate_pld
from components.audit.exposure import exposure_summary, probes_from_spans, probes_from_truth, secret_exposure
from components.audit.inputs import AuditReservations, audit_reservations
from components.audit.report import ceiling_plot, private_dir, ref_key, roc_plot, secret_ref, write_private
from components.audit.user_inference import (_check_samples, aggregate_user_scores, auroc_by_m, score_samples,
                                            user_inference_report)
from components.audit.verdict import (DEFAULT_EXPOSED_FRACTION, FAILED, INCONCLUSIVE, PASSED, combine,
                                      exposure_verdict, gate_decision)
from components.core.errors import VeilError
from components.draws.annex import snapshot_label, load_annex, prf_uniform
from components.core.hashing import sha256_file, sha256_json
from components.audit.metrics import balance_by_thinning, one_run_epsilon_lower_bound
from components.audit.verdict import candidates_for_limit
from components.draws.data import train_rows

LEGACY_MAX_CANDIDATES = 1000

# `veil audit --json` puts these first: what a caller checks before anything else.
CONTRACT_KEYS = ("verdict", "passed", "covered_by_certificate", "auroc", "auroc_interval", "auroc_ceiling",
                 "users_in", "users_out")


@dataclass
class AuditResult:
    audit_id: str
    section: dict                      # the public section: verdicts + quantized aggregates only
    plot_path: Path | None             # public plot: ceilings + the quantized AUROC band
    private_path: Path                 # per-user scores: settings.private_dir/audit, never log it
    passed: bool
    verdict: str = INCONCLUSIVE
    private: dict = field(default_factory=dict)        # exact aggregates (private report), never log it
    private_plot_path: Path | None = None               # the measured ROC: private
    timings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The public section, for the certificate / MLflow (what `record_audit` takes)."""
        return dict(self.section)

    def to_json(self) -> dict:
        """The `veil audit --json` document: the contract keys first, then the rest of the public section."""
        s = self.section
        return {**{k: s[k] for k in CONTRACT_KEYS}, **{k: v for k, v in s.items() if k not in CONTRACT_KEYS},
                "plot_png": str(self.plot_path) if self.plot_path else None,
                "private_report": str(self.private_path.with_suffix(".json"))}


def _user_pld(cert):
    """The certificate's user-level privacy-loss distribution for the plots, or None."""

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
    for k in ("max_user_inference_auroc", "max_secret_exposure", "max_canary_auroc", "max_exposed_fraction"):
        v = get(k)
        out[k] = None if v is None else float(v)
    if out["max_exposed_fraction"] is None:
        out["max_exposed_fraction"] = DEFAULT_EXPOSED_FRACTION
    return out


def audit_settings(policy_audit: Any, plan: Mapping) -> dict:
    """What the audit runs with: the plan's sizing (`audit.sizing`, sized by the planner from the
    policy, N̂ and the certified ε), else the given policy's values, else the defaults. The scheduled
    flow and `veil run` pass nothing else: no verdict depends on a CLI-only knob."""

    sz = (plan.get("audit") or {}).get("sizing") or {}
    get = ((lambda k: policy_audit.get(k)) if isinstance(policy_audit, Mapping)
           else (lambda k: getattr(policy_audit, k, None)))
    req = sz.get("require") or get("require") or "passed"
    cand = sz.get("candidates_per_secret") or get("candidates_per_secret")
    if cand in (None, "auto"):
        # a plan made before audit sizing: the planner's rule, capped where an old plan's limit is past
        # any affordable audit (the verdict then says how many it would need)
        lim = resolve_thresholds(policy_audit, plan)["max_secret_exposure"]
        cand = candidates_for_limit(lim) if lim is not None else 100
        cand = cand if cand <= LEGACY_MAX_CANDIDATES else 100
    per_class = sz.get("secrets_per_class") or get("secrets_per_class") or 100
    return {"require": str(req), "n_candidates": int(cand), "max_secrets_per_class": int(per_class)}


def user_level_guarantee(certificate: Mapping | None) -> tuple[float | None, float | None]:
    """The certificate's (ε, δ) when its privacy unit is the user; (None, None) otherwise."""
    if not certificate or certificate.get("privacy_unit") != "user":
        return None, None
    return float(certificate["epsilon"]), float(certificate["delta"])


def _resolve_file(path: str, settings) -> Path:
    p = Path(path)
    if not p.is_absolute():
        bases = [Path(settings.home), Path(settings.home) / "plans"]
        if getattr(settings, "private_dir", None) is not None:
            bases.append(Path(settings.private_dir))
        for base in bases:
            if (base / p).is_file():
                return base / p
    return p


def attacker_samples(plan: Mapping, snapshot_records: pa.Table, settings,
                     reservations: AuditReservations | None = None) -> pa.Table:
    """(user_id, text, member) for the plan's attacker records, texts joined from the snapshot (and the
    plan's canary records, if any). The attacker file must match its recorded sha256."""
    res = reservations or audit_reservations(plan)
    if not res.attacker_records_file:
        raise VeilError("plan: audit.attacker_records_file is missing, so this release cannot be audited; set "
                        "audit.holdout_users > 0 for the next release (a new plan of the same data is a new release, "
                        "charged again)")
    f = _resolve_file(res.attacker_records_file, settings)
    if not f.is_file():
        raise VeilError(f"plan: audit.attacker_records_file {f} not found")
    if res.attacker_records_sha256 and sha256_file(f) != res.attacker_records_sha256:
        raise VeilError(f"plan: audit.attacker_records_file {f} does not match its sha256 in the plan")
    att = pq.read_table(f)
    texts = snapshot_records.select(["record_id", "text"])
    cf = _canary_file(res, settings)
    if cf is not None:
        texts = pa.concat_tables([texts, pq.read_table(cf).select(["record_id", "text"]).cast(texts.schema)])
    joined = att.join(texts, "record_id", join_type="left outer")
    missing = joined.filter(pc.is_null(joined["text"])).num_rows
    if missing:
        raise VeilError(f"audit: {missing} attacker record(s) of the plan are not in snapshot "
                        f"{snapshot_label(plan)}")
    return joined.select(["user_id", "text", "member"]).sort_by([("user_id", "ascending")])


def _canary_file(res: AuditReservations, settings) -> Path | None:
    if not res.canary_records_file:
        return None
    cf = _resolve_file(res.canary_records_file, settings)
    if not cf.is_file():
        raise VeilError(f"plan: audit.canary_records_file {cf} not found")
    if res.canary_records_sha256 and sha256_file(cf) != res.canary_records_sha256:
        raise VeilError(f"plan: audit.canary_records_file {cf} does not match its sha256 in the plan")
    return cf


def canary_records_table(res: AuditReservations, settings) -> pa.Table | None:
    """The plan's canary records (every canary, trained and held out; checked against the plan's sha256),
    or None when the plan has none. Private: the substrings are in `metadata`."""
    cf = _canary_file(res, settings)
    return None if cf is None else pq.read_table(cf)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"audit: {msg}", file=sys.stderr, flush=True)


def run_audit(loaded, snapshot_records: pa.Table, *, policy_thresholds: Any = None, settings,
              truth: Mapping | None = None, secret_spans: pa.Table | None = None, samples: pa.Table | None = None,
              canary_records: pa.Table | None = None, reference=None, bootstrap: int = 100, seed: int | None = None,
              n_candidates: int | None = None, max_secrets_per_class: int | None = None, batch_size: int = 16,
              plot: bool = True, progress: bool = False, annex: Mapping | None = None) -> AuditResult:
    """Audit one trained model. `loaded` has .model (eval; a peft model unless `reference` is given),
    .tokenizer, .certificate (dict), .plan (dict). `annex`: the plan's private annex, when its
    membership reservations live there (`inputs.audit_reservations`).

    Secret probes come from `truth` (demo truth.json) when given, else from `secret_spans` (restricted
    to the plan's training records). `samples` (user_id, text, member) overrides the plan's attacker
    file (for tests and benches); `canary_records` supplies canary texts with their substrings.
    """
    import time

    t0 = time.perf_counter()
    plan, cert = dict(loaded.plan), dict(loaded.certificate or {})
    if annex is None and plan.get("annex"):
        # A public plan: its membership reservations are in the private annex, checked against the
        # plan's commitment.

        annex = load_annex(settings.private_dir, plan)
    res = audit_reservations(plan, annex)
    seq_len = int(plan["training"]["seq_len"])
    seed = int(plan["training"].get("seed", 0)) if seed is None else int(seed)
    thresholds = resolve_thresholds(policy_thresholds, plan)
    sized = audit_settings(policy_thresholds, plan)
    n_candidates = sized["n_candidates"] if n_candidates is None else int(n_candidates)
    max_secrets_per_class = sized["max_secrets_per_class"] if max_secrets_per_class is None else int(max_secrets_per_class)
    eps, delta = user_level_guarantee(cert)
    ceilings = certificate_ceilings(cert) if eps is not None else {"auroc_ceiling": 1.0, "auroc_ceiling_pld": None}
    key = ref_key(settings)
    audit_id = sha256_json({"certificate": cert.get("sha256"), "plan": plan.get("sha256"), "seed": seed,
                            "bootstrap": bootstrap, "n_candidates": n_candidates,
                            "max_secrets_per_class": max_secrets_per_class})[:16]
    timings: dict[str, float] = {}
    canary_ids = set(res.canary_users)

    def canary_user(u: str) -> bool:
        return is_canary(u) or u in canary_ids

    # --- user inference -------------------------------------------------------------------------
    if samples is None:
        samples = attacker_samples(plan, snapshot_records, settings, res)
    _say(progress, f"scoring {samples.num_rows} attacker samples of {len(set(samples['user_id'].to_pylist()))} users")
    _check_samples(samples)
    ratios = score_samples(loaded.model, loaded.tokenizer, samples["text"].to_pylist(), reference=reference,
                           seq_len=seq_len, batch_size=batch_size, progress=progress)
    scores = aggregate_user_scores(samples, ratios)
    timings["user_inference_s"] = time.perf_counter() - t0
    canary_mask = pa.array([canary_user(u) for u in scores["user_id"].to_pylist()], pa.bool_())
    real = scores.filter(pc.invert(canary_mask))
    canary = scores.filter(canary_mask)
    m = real["m"].to_pylist()
    real_rows = pc.invert(pa.array([canary_user(u) for u in samples["user_id"].to_pylist()], pa.bool_()))
    sweep = auroc_by_m(samples.filter(real_rows), ratios[real_rows.to_numpy(zero_copy_only=False)],
                       [x for x in (1, 2, 4, 8, 16) if x < max(m or [1])] + [max(m or [1])], seed=seed)
    ui = user_inference_report(real, eps, delta, bootstrap=bootstrap, seed=seed,
                               max_auroc=thresholds["max_user_inference_auroc"],
                               auroc_ceiling_pld=ceilings["auroc_ceiling_pld"], by_m=sweep)
    failures = list(ui["failures"])
    one_run = _one_run(scores, canary_mask, plan, res, key, eps, delta, seed)

    # --- canaries ----------------------------------------------------------------------------------
    if canary_records is None:
        cf = _canary_file(res, settings)
        if cf is not None:
            canary_records = pq.read_table(cf)
    canary_private, canary_rows = None, []
    if canary.num_rows:
        cs = canary["score"].to_numpy(zero_copy_only=False)
        cy = canary["member"].to_numpy(zero_copy_only=False).astype(bool)
        canary_private = {"users_in": int(cy.sum()), "users_out": int((~cy).sum())}
        if cy.any() and (~cy).any():
            cr = user_inference_report(canary, eps, delta, bootstrap=bootstrap, seed=seed,
                                       max_auroc=thresholds["max_canary_auroc"],
                                       auroc_ceiling_pld=ceilings["auroc_ceiling_pld"])
            canary_private.update(cr)
            failures += [f"canary {f}" for f in cr["failures"]]
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
                canary_private.update({
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
        train_ids = None
        if annex is not None and annex.get("train_records_file"):
            train_ids = train_rows(annex)["record_id"].to_pylist()
        else:
            tf = plan.get("data", {}).get("train_records_file")
            if tf and _resolve_file(tf, settings).is_file():
                train_ids = pq.read_table(_resolve_file(tf, settings), columns=["record_id"])["record_id"].to_pylist()
        probes = probes_from_spans(snapshot_records, secret_spans, record_ids=train_ids)
    probes = _cap_per_class(probes, max_secrets_per_class, key)
    secret_rows = []
    if probes:
        _say(progress, f"secret exposure for {len(probes)} secrets x {n_candidates} candidates")
        secret_rows = secret_exposure(loaded.model, loaded.tokenizer, probes, n_candidates=n_candidates,
                                      seed=seed, seq_len=seq_len, batch_size=2 * batch_size, reference=reference,
                                      ref_key=key, progress=progress)
    lim = thresholds["max_secret_exposure"]
    ev = exposure_verdict(secret_rows, limit=lim, max_exposed_fraction=thresholds["max_exposed_fraction"])
    exposure_private = {**exposure_summary(secret_rows), **ev}
    for sv in ev["secrets"]:
        if sv["significant"]:
            failures.append(f"secret {sv['secret_ref']} ({sv['secret_class']}) ranks above its candidates at "
                            f"p={sv['p_value']:.2g}: memorised beyond chance")
    for c, cv in ev["classes"].items():
        if cv["verdict"] == FAILED and cv.get("why") == "fraction":
            failures.append(f"secret class {c}: {cv['exceeding']} of {cv['n']} secrets above {lim} bits; exposed "
                            f"fraction beyond chance at least {cv['exposed_fraction'][0]:.3f}")
    timings["secret_exposure_s"] = time.perf_counter() - t1

    # --- verdict, private report, plots, public section ---------------------------------------------
    if one_run.get("exceeds_certified"):
        failures.append(f"one-run empirical epsilon lower bound {one_run['epsilon_lower_bound']:.3f} > certified "
                        f"epsilon {eps}: the certificate or the code is wrong")
    verdict = combine([ui["verdict"], (canary_private or {}).get("verdict"), ev["verdict"],
                       FAILED if one_run.get("exceeds_certified") else None])
    if verdict is None:  # nothing to compare with: say so rather than pass
        verdict = INCONCLUSIVE
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    private = {
        "audit_id": audit_id, "created_at": created, "verdict": verdict, "user_inference": ui,
        "auroc_by_m": sweep, "attacker_samples_per_user": {"min": min(m), "median": float(np.median(m)),
                                                          "max": max(m)},
        "canaries": canary_private, "secret_exposure": exposure_private, "thresholds": thresholds,
        "one_run": one_run, "settings": {**sized, "n_candidates": n_candidates,
                                         "max_secrets_per_class": max_secrets_per_class},
        "failures": failures, "n_bootstrap": bootstrap, "seed": seed}
    private_path = write_private(settings, audit_id, scores.append_column("canary", canary_mask),
                                 _secret_table(probes, secret_rows + canary_rows, key, canary_records), private)
    section = _public_section(audit_id, created, verdict, ui, canary_private, canary_rows, secret_rows, ev,
                              thresholds, cert, eps, delta, reference, seq_len, max(m), n_candidates)
    section["one_run"] = pub.public_one_run(one_run, eps)
    if one_run.get("exceeds_certified"):
        section["reasons"].append(f"one-run audit: at {one_run['confidence']:.0%} confidence ε is at least "
                                  f"{section['one_run']['epsilon_at_least']:g}, above the certified {eps:g}: "
                                  "THE CERTIFICATE OR THE CODE IS WRONG; do not release")
        section["above_ceiling"] = True
    section["gate"] = gate_decision(verdict, sized["require"], section["reasons"])
    section["settings"] = {"require": sized["require"], "n_candidates": n_candidates,
                           "max_secrets_per_class": max_secrets_per_class,
                           "source": "the plan's audit sizing" if (plan.get("audit") or {}).get("sizing")
                           else "the policy (the plan has no audit sizing)"}
    plot_path = private_plot = None
    if plot:
        private_plot = roc_plot(real["score"].to_numpy(zero_copy_only=False),
                                real["member"].to_numpy(zero_copy_only=False),
                                private_dir(settings) / f"{audit_id}-roc.png", epsilon=eps, delta=delta,
                                pld=_user_pld(cert), title=f"PRIVATE — user inference: AUROC {ui['auroc']:.3f} "
                                f"[{ui['auroc_interval'][0]:.3f}, {ui['auroc_interval'][1]:.3f}], {verdict}",
                                canary=(canary["score"].to_numpy(zero_copy_only=False),
                                        canary["member"].to_numpy(zero_copy_only=False)) if canary.num_rows else None)
        os.chmod(private_plot, 0o600)
        plot_path = ceiling_plot(Path(settings.home) / "audits" / f"{audit_id}-ceilings.png", epsilon=eps,
                                 delta=delta, pld=_user_pld(cert), auroc_bucket=section["auroc"], verdict=verdict)
    timings["total_s"] = time.perf_counter() - t0
    return AuditResult(audit_id=audit_id, section=section, plot_path=plot_path, private_path=private_path,
                       passed=verdict == PASSED, verdict=verdict, private=private, private_plot_path=private_plot,
                       timings=timings)


def _where(m) -> str:
    return "all samples" if m is None else f"m={m}"


def _public_section(audit_id, created, verdict, ui, canary_private, canary_rows, secret_rows, ev, thresholds,
                    cert, eps, delta, reference, seq_len, m_max, n_candidates) -> dict:
    """Verdicts and quantized class-level aggregates only (see `public`): built from the exact values
    without copying any of them."""
    q = pub.public_auroc(ui["auroc"], ui["auroc_interval"], ui["users_in"], ui["users_out"])
    need, need_basis = _public_need(ui, q)
    reasons = _ui_reasons("user inference", ui, q, need)
    canaries = None
    if canary_private is not None:
        canaries = {"users_in": pub.count_bucket(canary_private["users_in"]),
                    "users_out": pub.count_bucket(canary_private["users_out"]), "verdict": canary_private.get("verdict")}
        if "auroc" in canary_private:
            cq = pub.public_auroc(canary_private["auroc"], canary_private["auroc_interval"],
                                  canary_private["users_in"], canary_private["users_out"])
            canaries.update({k: cq[k] for k in ("auroc", "auroc_interval", "auroc_grid", "interval_grid")})
            canaries["above_ceiling"] = bool(canary_private["above_ceiling"])
            reasons += _ui_reasons("canaries", canary_private, cq, _public_need(canary_private, cq)[0])
        if canary_rows:
            canaries["exposure"] = pub.public_exposure_class(canary_rows, None, n_candidates)
    by_class: dict[str, list] = {}
    for r in secret_rows:
        by_class.setdefault(r["secret_class"], []).append(r)
    classes = ev.get("classes") or {}
    exposure = {"verdict": ev["verdict"], "limit_bits": thresholds["max_secret_exposure"],
                "max_exposed_fraction": thresholds["max_exposed_fraction"],
                "n_candidates": max((r["n_candidates"] for r in secret_rows), default=None),
                "excess_over_reference": bool(ev.get("excess_over_reference")),
                "statistic": ("calibrated: each secret's log-likelihood ratio (model over reference) placed among its "
                              "candidates' ratios; per class a one-sided Clopper–Pearson bound on the fraction above "
                              "the limit beyond chance" if ev.get("calibrated") else
                              "the model's own ordering of secret and candidates (no reference model)"),
                "by_class": {c: pub.public_exposure_class(rows, (classes.get(c) or {}).get("verdict"),
                                                          max(r["n_candidates"] for r in rows))
                             for c, rows in sorted(by_class.items())},
                "candidates_needed": ev["candidates_needed"],
                "secrets_needed": pub.round_up_ladder(ev.get("secrets_needed"))}
    for c, v in exposure["by_class"].items():
        why = (classes.get(c) or {}).get("why")
        lim = f"{thresholds['max_secret_exposure']:g} bits"
        if v["verdict"] == FAILED and why == "significant":
            reasons.append(f"secret exposure: class {c}: a secret outscores its candidates beyond chance "
                           f"(Bonferroni over every secret): memorised")
        elif v["verdict"] == FAILED:
            reasons.append(f"secret exposure: class {c}: more of its secrets lie above {lim} than chance and the "
                           f"policy's tolerance {thresholds['max_exposed_fraction']:g} allow")
        elif v["verdict"] == INCONCLUSIVE and why == "candidates":
            reasons.append(f"secret exposure: class {c}: {exposure['n_candidates']} candidates per secret cannot show "
                           f"{lim}; set audit.candidates_per_secret: {ev['candidates_needed']} (or auto) in the policy")
        elif v["verdict"] == INCONCLUSIVE:
            need = exposure["secrets_needed"]
            reasons.append(f"secret exposure: class {c}: {v['n_secrets'][0]}+ secrets cannot show that fewer than "
                           f"{thresholds['max_exposed_fraction']:g} of the class lie above {lim}; needs about "
                           f"{need or 'more than 1000000'} secrets per class (audit.secrets_per_class), or "
                           "audit.require: not_failed")
    binding = ui.get("binding_ceiling")
    return {
        "schema": pub.SECTION_SCHEMA,
        "verdict": verdict,
        "passed": verdict == PASSED,
        "covered_by_certificate": False,
        "coverage_note": pub.COVERAGE_NOTE,
        **q,
        "auroc_ceiling": ui["auroc_ceiling"],
        "auroc_ceiling_pld": ui["auroc_ceiling_pld"],
        "above_ceiling": bool(ui["above_ceiling"] or (canaries or {}).get("above_ceiling", False)),
        "audit_id": audit_id,
        "created_at": created,
        "reasons": reasons,
        "user_inference": {
            "verdict": ui["verdict"],
            "threshold": ui["threshold"],
            "binding_ceiling": binding,
            "by_m": [{"m": c["m"] if c["m"] is not None else "all", "verdict": c["verdict"]} for c in ui["curves"]],
            "people_needed": need,
            "people_needed_basis": need_basis,
            "empirical_epsilon_exceeds_certified": bool(ui["epsilon_lower_bound_exceeds"]),
            "confidence": ui["confidence"],
            "interval": f"Newcombe score interval (Hanley–McNeil variance), simultaneous over "
                        f"{ui['simultaneous_over']} AUROC estimate(s) (Bonferroni)",
        },
        "secret_exposure": exposure,
        "canaries": canaries,
        "quantization": {"count_grid": pub.COUNT_GRID, "move_probability": pub.MOVE_PROBABILITY,
                         "auroc_grids": list(pub.AUROC_GRIDS), "interval_spread": pub.INTERVAL_SPREAD,
                         "exposure_grids_bits": list(pub.EXPOSURE_GRIDS)},
        "ceiling_basis": ("user-level (ε, δ) of the certificate" if eps is not None else
                          f"none: the certificate's privacy unit is {cert.get('privacy_unit')!r}, not the user"),
        "epsilon": eps, "delta": delta,
        "thresholds": thresholds,
        "statistic": "mean over a user's attacker samples of log p_model(x) - log p_ref(x) (token-summed)",
        "reference": "given reference model" if reference is not None else "same model, adapter disabled",
        "seq_len": seq_len,
        "attacker_samples_per_user": int(m_max),
    }


def _one_run(scores: pa.Table, canary_mask, plan: Mapping, res: AuditReservations, key: bytes,
             eps: float | None, delta: float | None, seed: int) -> dict:
    """The one-run ε lower bound (metrics.one_run_epsilon_lower_bound) over the plan's audited people:
    real people thinned to fair coins (each was held out by an independent keyed draw with the plan's
    probability p; `balance_by_thinning` with a keyed uniform per person). Canaries are left out: exactly
    half of them are held out, and a fixed-size split is not the independent draws the theorem needs.
    Private: counts of guesses; `public.public_one_run` rounds it."""

    audit = plan.get("audit") or {}
    p = float(audit.get("holdout_probability") or 0.0)
    out = {"computed": False, "confidence": 0.95, "certified_epsilon": eps}
    if "attacker_record_rate" in audit:
        out["why"] = "per-record audit split: membership is not one independent draw per person"
        return out
    if not 0 < p < 1:
        out["why"] = "nobody held out"
        return out
    users = scores["user_id"].to_pylist()
    y = scores["member"].to_numpy(zero_copy_only=False).astype(bool)
    s = scores["score"].to_numpy(zero_copy_only=False)
    is_canary = np.asarray(canary_mask.to_pylist(), dtype=bool)
    u = np.array([prf_uniform(key, "one-run-thinning", int(seed), x) for x in users])
    keep = ~is_canary & balance_by_thinning(y, 1 - p, u)
    r = one_run_epsilon_lower_bound(s[keep], y[keep], float(delta or 0.0), confidence=0.95)
    out.update(r, computed=True, people=int(keep.sum()))
    out["exceeds_certified"] = bool(eps is not None and r["epsilon_lower_bound"] > eps)
    return out


def _public_need(r: Mapping, q: Mapping) -> tuple[dict | str | None, str | None]:
    """People needed for an inconclusive gate, from its published values only (`public.published_people_needed`:
    the AUROC bucket's midpoint, the count buckets, the policy's threshold, the certificate's ceiling, and z
    from the public number of simultaneous estimates). None, None for a gate that is not inconclusive."""
    if r.get("verdict") != INCONCLUSIVE:
        return None, None
    return pub.published_people_needed(q["auroc"], q["users_in"], q["users_out"], r["z"], threshold=r["threshold"],
                                       ceiling=r["binding_ceiling"])


def _ui_reasons(what: str, r: Mapping, q: Mapping, need) -> list[str]:
    """Public one-line reasons, from verdicts and public values only (`q`: the published AUROC fields,
    `need`: the published people needed)."""
    out = []
    if q["auroc"] is None:
        who = "canaries" if what == "canaries" else "people"
        out.append(f"{what}: too few {who} for a public AUROC (one would move its coarsest bucket more than "
                   f"{pub.MOVE_PROBABILITY:.0%} of the time): verdicts and counts only")
    elif q["auroc_interval"] is None:
        out.append(f"{what}: too few {'canaries' if what == 'canaries' else 'people'} for a public interval (one "
                   f"would move its ends' coarsest bucket more than {pub.MOVE_PROBABILITY:.0%} of the time)")
    for c in r.get("curves", []):
        if c["above_ceiling"]:
            out.append(f"{what}: at {_where(c['m'])} the {r['confidence']:.0%} interval of AUROC lies above the "
                       f"certified ceiling {r['binding_ceiling']:.3f}: THE CERTIFICATE OR THE CODE IS WRONG "
                       "(training, accounting or the privacy unit); do not release")
        elif c["verdict"] == FAILED:
            out.append(f"{what}: at {_where(c['m'])} the {r['confidence']:.0%} interval of AUROC lies above the "
                       f"policy's maximum {r['threshold']:g}")
    if r.get("epsilon_lower_bound_exceeds"):
        out.append(f"{what}: the attack's ROC forces (95 %) an ε above the certified {r['epsilon']:g}: "
                   "THE CERTIFICATE OR THE CODE IS WRONG; do not release")
    if r.get("verdict") == INCONCLUSIVE:
        need_s = (f"about {need['in']} in and {need['out']} out" if isinstance(need, dict) else str(need))
        bad = [_where(c["m"]) for c in r["curves"] if c["verdict"] == INCONCLUSIVE]
        out.append(f"{what}: INCONCLUSIVE — too few people to decide "
                   f"({q['users_in'][0]}+ in, {q['users_out'][0]}+ out; "
                   f"undecided at {', '.join(bad)}); needs {need_s}")
    return out


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
