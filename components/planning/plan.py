"""The plan document: one hashed JSON file holding everything training, certificate and audit need.

A plan is public: policy values, DP estimates and salted commitments only. Who is held out, which
records train, the files that say so and every exact private count live in its private annex
(components.draws.annex), which the plan commits to (`annex.commitment`). `assert_public` refuses
a document that carries annex fields, so a registry cannot log one by mistake.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from components.core.errors import VeilError
from components.core.hashing import sha256_json
from components.publication import publish
from components.mechanisms import get as get_mechanism
from components.planning.forecast import describe

SCHEMA = "veil.plan/v2"   # v2: public part + private annex (v1 plans listed who was held out)
REQUIRED_KEYS = (
    "schema", "created_at", "sha256", "mechanism", "privacy_unit", "neighbouring", "target", "sampling_rate",
    "noise_multiplier", "steps", "expected_batch_size", "clip_norm", "records_per_user", "selection",
    "training", "accounting", "data", "audit", "policy", "annex",
)
# Keys that name people or records, or give exact private counts: annex only, never in a public plan.
PRIVATE_KEYS = frozenset({
    "held_out_users", "canary_users", "train_records_file", "train_records_sha256", "attacker_records_file",
    "attacker_records_sha256", "canary_records_file", "canary_records_sha256", "n_train_users", "n_train_records",
    "n_attacker_records", "n_audit_eligible_users", "candidates", "user_grad_ratio", "salt",
    "eval_users", "eval_records_file", "eval_records_sha256", "n_eval_users", "n_eval_records",
    # counts of persons from the policy's `people` section (components.bounding.people.people_sections)
    "n_accounts", "n_people", "n_merged_accounts", "n_people_records", "n_records_several_owners",
})


def assert_public(doc: dict, where: str = "plan") -> None:
    """Refuse a plan document that holds any annex field (at any depth)."""
    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in PRIVATE_KEYS:
                    # the filtered mechanism's N is public under replace-one neighbouring
                    raise VeilError(f"{where}: '{path + k}' is private (it belongs in the plan's annex); "
                                    "refusing to publish it")
                walk(v, f"{path}{k}.")
        elif isinstance(x, list):
            for v in x:
                walk(v, path)
    walk(doc, "")


def seal(body: dict) -> dict:
    body = {k: v for k, v in body.items() if k != "sha256"}
    return {**body, "sha256": sha256_json(body)}


@dataclass(frozen=True)
class Plan:
    """A sealed plan document. `to_dict()` returns a copy; `sha256` covers every other key."""

    doc: dict

    def __post_init__(self):
        missing = [k for k in REQUIRED_KEYS if k not in self.doc]
        if missing:
            raise VeilError(f"plan: missing key(s) {', '.join(missing)}")
        if self.doc["schema"] != SCHEMA:
            raise VeilError(f"plan: schema {self.doc['schema']!r} is not {SCHEMA!r}"
                            + ("; v1 plans published membership: re-plan" if self.doc["schema"] == "veil.plan/v1"
                               else ""))
        actual = sha256_json({k: v for k, v in self.doc.items() if k != "sha256"})
        if actual != self.doc["sha256"]:
            raise VeilError(f"plan: sha256 mismatch (document says {str(self.doc['sha256'])[:12]}…, "
                            f"content hashes to {actual[:12]}…)")
        assert_public(self.doc)

    @property
    def sha256(self) -> str:
        return self.doc["sha256"]

    def __getitem__(self, key: str) -> Any:
        return self.doc[key]

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self.doc))

    def summary_rows(self, annex: Mapping | None = None) -> list[tuple[str, str]]:
        """(label, value) rows for a readable summary table. With the plan's private `annex` (the
        operator's own terminal) the snapshot row names the real snapshot; without it, its commitment."""
        d = self.doc
        data, audit = d["data"], d["audit"]
        acc = d["accounting"]
        target = d["target"]

        rows = [
            ("policy", f"{d['policy']['name']} ({d['policy']['sha256'][:12]}…)"),
            # the public plan carries a commitment only; the operator's terminal (`summary_rows(annex)`)
            # may show the real snapshot id
            ("snapshot", _snapshot_row(data, annex)),
            ("privacy unit", f"{d['privacy_unit']} · {d['neighbouring']}"),
            ("mechanism", d["mechanism"]),
        ]
        if target.get("epsilon") is not None:
            rows.append(("target", f"ε={target['epsilon']:g}, δ={target['delta']:g}"))
        rows += [
            ("sampling rate q", f"{d['sampling_rate']:.6g}"),
            ("noise multiplier σ", f"{d['noise_multiplier']:.6g}"),
            ("steps T", str(d["steps"])),
            ("expected batch", f"{d['expected_batch_size']} {get_mechanism(d['mechanism']).batch_unit()}/step"),
            ("clip norm C", f"{d['clip_norm']:g}"),
            ("records per user", f"{d['records_per_user']} ({d['selection']})" if d["records_per_user"] and d.get("selection")
             else f"{d['records_per_user']} per owner, sent and received (keyed greedy, "
                  f"{(d.get('ownership') or {}).get('order')} first)" if d.get("ownership") else
             str(d["records_per_user"]) if d["records_per_user"] else "—"),
        ]
        if acc.get("by_class"):
            for cls, v in acc["by_class"].items():
                rows.append((f"secret {cls}", f"{v['n_secrets']} secrets · worst γ {v['max_gamma']:.3g} ≤ "
                                              f"{v['gamma_target']:g} (κ={v['kappa']:g})"))
            if acc.get("binding_class"):
                rows.append(("σ set by", f"class {acc['binding_class']} (sensitivity {acc.get('sensitivity')} per record)"))
        if acc.get("epsilon") is not None:
            rows.append(("ε at this σ", f"{acc['epsilon']:.4g} (δ={acc['delta']:g}, {acc.get('accountant', '')})"))
        if d.get("schedule"):
            sc = d["schedule"]
            lb = sc["lifetime_budget"]
            fit = sc.get("releases_for_a_new_person")
            rows.append(("schedule", f"{sc['releases']} releases{' (' + sc['cadence'] + ')' if sc.get('cadence') else ''} "
                                     f"under lifetime ε={lb['epsilon']:g}, δ={lb['delta']:g}: ε per release "
                                     f"{sc['epsilon_per_release']:.4g}"
                                     + (f", lowered from the target {sc['target_epsilon']:g}" if sc.get("lowered") else
                                        f" (the target; the schedule does not bind)")
                                     + f"; a new person can take {'any number of' if fit is None else fit} releases"))
        pop = data.get("population") or {}
        if pop.get("estimate") is not None:
            rows.append(("training " + pop["unit"], f"≈{pop['estimate']:.1f} (DP estimate, ε_N={pop['epsilon']:.3g}; "
                                                   "the exact count is private)"))
        elif pop.get("exact") is not None:
            rows.append(("training " + pop["unit"], f"{pop['exact']} (public under {d['neighbouring']})"))
        rows += [
            ("held out", f"each user with probability {audit.get('holdout_probability', 0):g} "
                         "(who: private annex)"),
            ("attacker records", f"{audit.get('attacker_samples_per_user')} per audited user"
             if "attacker_record_rate" not in audit else f"each record with probability {audit['attacker_record_rate']:g}"),
        ]
        sz = audit.get("sizing")
        if sz:
            rows.append(("audit gate", f"requires '{sz['require']}' · {sz['candidates_per_secret']} candidates per secret "
                                       f"· up to {sz['secrets_per_class']} secrets per class"))
            rows.append(("audit sizing", sz["statement"] + "".join(f"\n  - {c}" for c in sz.get("cannot_pass", []))))
        if "secret_lp" in d:
            lp = d["secret_lp"]
            rows.append(("secret LP", f"C={lp['c']:g} · kept {lp['retained_fraction']:.1%} of records' weight · "
                                      f"{lp['n_binding']} binding secrets"))
        if d.get("evaluation"):
            f = d["evaluation"]["fraction"]
            rows.append(("evaluation", f"each person with probability {f:g}, never trained on (who: private annex)"
                         if f else "none (evaluation.fraction: 0): `veil evaluate` has nobody to evaluate on"))
        if d.get("utility_forecast"):
            rows.append(("utility forecast", describe(d["utility_forecast"])))
        if d.get("decision", {}).get("reason"):
            rows.append(("why", d["decision"]["reason"]))
        rows.append(("plan sha256", d["sha256"]))
        return rows


def save_plan(plan: Plan, plans_dir: str | Path) -> Path:
    """Write `<plans_dir>/<sha256>.json` (idempotent: the name is the content hash)."""
    plans_dir = Path(plans_dir)
    plans_dir.mkdir(parents=True, exist_ok=True)
    path = plans_dir / f"{plan.sha256}.json"
    publish("plan", plan.doc, subject=plan.sha256)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(plan.doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    if not path.is_file():
        raise VeilError(f"{path}: no such plan file")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VeilError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(doc, dict):
        raise VeilError(f"{path}: a plan is a JSON object")
    try:
        return Plan(doc)
    except VeilError as e:
        raise VeilError(f"{path}: {e}") from None


def _snapshot_row(data: Mapping, annex: Mapping | None) -> str:
    inputs = (annex or {}).get("plan_inputs") or {}
    sid, sha = inputs.get("snapshot_id") or data.get("snapshot_id"), inputs.get("snapshot_sha256") or data.get("snapshot_sha256")
    commit = data.get("snapshot_commitment")
    if sid and sha:
        return f"{sid} ({sha[:12]}…)" + (f" · commitment {commit[:12]}…" if commit else "")
    return f"commitment {commit[:12]}…" if commit else "?"
