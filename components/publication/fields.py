"""Every field Veil publishes, declared once with its kind (components.publication.gate).

Reading guide. A PUBLIC field is a policy value, a constant, a hash of public inputs, or a quantity
that its release's neighbouring relation keeps fixed (`relation`: e.g. N under replace-one). A DP
field names its mechanism, its sensitivity, whom it counts and the ledger charge each of them gets;
its post-processings name it. An UNCOVERED field names its coarsening and the test bounding one
person's influence. docs/privacy/threat-model.md's table of published fields is generated from here
(`python -m components.publication --markdown`); tests/privacy/test_publication_gate.py checks it.
"""
from __future__ import annotations

from components.publication.gate import Field, Kind, channel, declare

P, DP, U = Kind.PUBLIC, Kind.DP, Kind.UNCOVERED

# --- channels and their readers -------------------------------------------------------------------
channel("plan", "anyone: plans/<sha>.json, logged with every registered model")
channel("certificate", "anyone: the registry, the model package, `veil verify`")
channel("seal", "anyone: the registry and the model package")
channel("registry.tag", "every MLflow reader (run and version tags)")
channel("registry.param", "every MLflow reader (run params)")
channel("registry.metric", "every MLflow reader (run metrics)")
channel("registry.artifact", "every MLflow reader (artifact names under a run)")
channel("audit.public", "anyone: the certificate's audit section and the audit's tags/metrics")
channel("cli.models", "registry readers: `veil models --json`")
channel("cli.verify", "registry readers: `veil verify --json`")
channel("cli.ledger", "governance readers (not administrators): `veil ledger --json`")
channel("study", "study readers: the study's JSON, table, plot and MLflow parent/child runs")
channel("selection", "anyone: private selection's result (`veil study --private-selection --json`)")
channel("pmixed.release", "anyone: the PMixED certificate and manifest in the registry")
channel("pmixed.response", "API key holders: `POST /v1/generate` answers")
channel("prefect", "Prefect readers: flow-run names, parameters, results and log lines of Veil's flows")

# --- shared wording ---------------------------------------------------------------------------------
_POLICY = "a value of the policy (public YAML)"
_CONST = "a constant of this Veil version"
_PUBHASH = "a hash of public inputs or a salted commitment"
_NHAT = "the population estimate N̂ = N + Laplace(Δ/ε_N)"
_NHAT_COUNTS = "every unit the plan trains on (N): the plan's training people after hold-outs and exclusions"
_NHAT_CHARGE = ("ε_N as a pure-DP Rényi curve to each person counted, once per distinct N̂ (keyed on the counted "
                "population), at plan time — retired or not (ledger kind 'population')")

_PLAN_SHARED = [
    ("schema", P, _CONST), ("created_at", P, "the snapshot's creation time (public manifest)"),
    ("sha256", P, "hash of the plan's public body"),
    ("mechanism", P, "policy (or `auto`'s choice, below)"), ("privacy_unit", P, _POLICY),
    ("neighbouring", P, _CONST), ("target.**", P, _POLICY), ("clip_norm", P, _POLICY),
    ("steps", P, _POLICY), ("records_per_user", P, _POLICY), ("selection", P, _POLICY),
    ("training.**", P, _POLICY), ("caveats", P, "fixed sentences filled with public values"),
    ("annex.**", P, _PUBHASH), ("policy.**", P, "the policy's name, path and sha256"),
    ("lifetime_budget", P, _POLICY), ("lifetime_budget.**", P, _POLICY), ("release.**", P, _POLICY),
    ("audit.**", P, "policy values and fixed wording"), ("evaluation.**", P, "policy values and fixed wording"),
    ("data.snapshot_id", P, "the snapshot's id (public manifest)"),
    ("data.snapshot_sha256", P, "the snapshot's sha256 (public manifest)"),
    ("data.train_records_commitment", P, _PUBHASH), ("data.people.**", P, "policy-named exclusions only"),
    ("filter.**", P, _POLICY), ("decision.requested", P, _POLICY),
    ("utility_forecast.thresholds.**", P, _CONST), ("utility_forecast.measure", P, _CONST),
]
declare(*(Field("plan", p, k, w) for p, k, w in _PLAN_SHARED))
declare(
    Field("plan", "data.population.estimate", DP, _NHAT, mechanism="Laplace", sensitivity="Δ = 1 unit (a user; k "
          "records for els/group; one record for record)", counts=_NHAT_COUNTS, charge=_NHAT_CHARGE),
    Field("plan", "data.population.*", P, "the estimate's mechanism, ε_N, scale and wording (policy values)",
          ),
    Field("plan", "sampling_rate", DP, "q = B/N̂", post_processing_of="plan:data.population.estimate"),
    Field("plan", "expected_batch_size", P, _POLICY),
    Field("plan", "noise_multiplier", DP, "σ calibrated at q", post_processing_of="plan:data.population.estimate"),
    Field("plan", "accounting.**", DP, "the accountant's ε, δ and event at (q, σ, T)",
          post_processing_of="plan:data.population.estimate"),
    Field("plan", "decision.**", DP, "`auto`'s choice (seed 001's comparison at N̂ and public ratios)",
          post_processing_of="plan:data.population.estimate"),
    Field("plan", "utility_forecast.*", DP, "σ√d/B forecast from the plan's public fields",
          post_processing_of="plan:data.population.estimate"),
)

# Secret-protection and filtered plans: counts the relation keeps fixed (secret substitution keeps every
# record; replace-one keeps the number of users). Neither release claims anything about adding or
# removing a person, and the ledger charges persons nothing for a secret release (issue 22, case 3).
_SECRET_REL = "secret substitution (one secret's value replaced; records and people unchanged)"
declare(
    Field("plan", "secret_lp.**", P, "the LP's counts and rates over masked texts", relation=_SECRET_REL),
    Field("plan", "data.population.exact", P, "N, public under the release's relation",
          relation="secret substitution, or replace-one user (uls-filtered)"),
)

# --- private selection, multi-owner, secret releases (h-select) ---
# Private selection (flows/private_selection.py, docs/privacy/private-selection.md). Nothing here may
# depend on K, the random number of trials: no duration, no trial list, no count of trials.
_SEL_MECH = ("best of K trials, K ~ the grid's hidden distribution (Papernot & Steinke 2022, Thm 2 / Thm 6); each "
             "trial trains a uniformly drawn point at its public plan and scores it with a Gaussian-noised sum")
_SEL_SENS = ("per person: Q's Rényi curve = max over the points of the person's training cost and, for an "
             "evaluation person, the score's λ/(2σ_s²) (one person moves the clipped score sum by ≤ B)")
_SEL_COUNTS = "every training person of every grid point's plan, and every evaluation person"
_SEL_CHARGE = ("the theorem's curve per person, ledger release 'private-selection' reserved before any trial; plus "
               "each distinct N̂ of the plans (ledger kind 'population', ε_N per counted person)")
declare(
    Field("selection", "study_id", P, "the grid's name, the start time and a random suffix (no data, no K)"),
    Field("selection", "mode", P, _CONST),
    Field("selection", "grid.**", P, "the grid file's name, sha256 and points (public YAML)"),
    Field("selection", "policy.**", P, "the policy's name and sha256"),
    Field("selection", "selected", DP, "A's output: the chosen point (None when K = 0, also A's output)",
          mechanism=_SEL_MECH, sensitivity=_SEL_SENS, counts=_SEL_COUNTS, charge=_SEL_CHARGE),
    Field("selection", "selected.**", DP, "A's output: the chosen point's hyper-parameters",
          post_processing_of="selection:selected"),
    Field("selection", "selected_noisy_score", DP, "A's output: the chosen trial's noisy score",
          post_processing_of="selection:selected"),
    Field("selection", "selection.*", P, "the grid's selection parameters (distribution, η, γ, μ, B, σ_s, records "
          "per person), the theorem's name, fixed wording"),
    Field("selection", "selection.expected_trials", P, "E[K], a function of the distribution's public parameters"),
    Field("selection", "selection.epsilon", DP, "ε of the worst person the public plans allow (k rows in every plan, "
          "and an evaluation person): a function of the plans' public fields (q = B/N̂, σ, T) and the grid's "
          "parameters, never of K or of who is in the data", post_processing_of="plan:data.population.estimate"),
    Field("selection", "selection.delta", P, _POLICY),
    Field("selection", "selection.order", DP, "the Rényi order reaching selection.epsilon (same inputs)",
          post_processing_of="plan:data.population.estimate"),
    Field("selection", "selection.ledger_release_id", P, "the ledger's release number (a count of releases)"),
    Field("selection", "selection.composition.rule", P, "fixed wording"),
    Field("selection", "selection.composition.selection_release_id", P, "the ledger's release number"),
    Field("selection", "selection.composition.population_estimates.*", P, "each distinct N̂ of the plans: the "
          "plan's sha256, its ε_N (policy value) and the ledger release that charged it"),
    Field("selection", "covered_by_certificate", P, _CONST),
    Field("selection", "caveat", P, "fixed wording"),
    Field("selection", "note", P, "fixed wording (said only when K = 0 drew nothing: A's output ⊥)"),
    Field("selection", "dir", P, "the study folder's path (VEIL_HOME and the study id)"),
)

# Multi-owner (issue 22, case 6): the unit is "owner"; the certificate and `veil verify` say what is not
# protected (presence, the attribution graph). The rule is public; no count of the data is.
declare(
    Field("plan", "ownership.**", P, "the multi-owner rule: ownership, k, order, the relation and fixed flags "
          "(policy values and constants; never a count of the data)"),
    Field("certificate", "coverage", P, "fixed wording from the mechanism: what its guarantee does and does not "
          "protect (els-owners: content protected, presence and the attribution graph not; secret: tagged "
          "occurrences only, persons and untagged records not covered)"),
    Field("cli.verify", "notes", P, "fixed sentences: the registry checks skipped, and the certificate's "
          "coverage as its mechanism states it"),
)

# Secret-protection releases (issue 22, case 3): no person-level claim; untagged records get no certified ε.
declare(
    Field("certificate", "untagged_records.*", P, "the policy's untagged rule, whether untagged records were "
          "trained, their largest LP rate and fixed wording (ε and δ are None: nothing is certified)",
          relation=_SECRET_REL),
    Field("cli.ledger", "persons_not_covered.releases", P, "how many releases make no person-level claim (a count "
          "of releases, which ledger readers see anyway; not of people)"),
    Field("cli.ledger", "persons_not_covered.statement", P, "fixed wording filled with that count"),
)
# --- end of h-select ---
