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

# --- evaluation, PMixED responses, audit labels, ledger view (h-eval) ---
# Evaluation (issue 22, case 4): the registry gets eval_* only as the DP release of
# components.evaluation.dp / release; the exact figures stay on the operator's terminal.
_EVAL_MECH = ("Gaussian on the vector (Σ clipped per-person mean NLL, Σ per-person accuracy) per evaluated model "
              "and the count of counted people; noise multiplier m from the analytic Gaussian (Balle & Wang 2018) "
              "at the policy's evaluation.epsilon/delta; noise keyed on the release and the counted set")
_EVAL_SENS = ("add/remove one evaluation person: ≤ evaluation.nll_clip per NLL sum, ≤ 1 per accuracy sum, 1 on the "
              "count: L2 √k over the range-scaled vector (k = 2 per model + 1)")
_EVAL_COUNTS = ("the plan's evaluation people with a scored token whom the ledger's filter admits (retired people are "
                "left out of the sums)")
_EVAL_CHARGE = ("α/(2m²) (Gaussian Rényi curve) to each counted person, once per release (ledger mechanism "
                "'evaluation'); re-evaluating the same model on the same people republishes the logged values "
                "without a new charge")
declare(
    *(Field("registry.metric", f"eval{m}_{w}", DP, f"{w.replace('_', ' ')} of the {m.strip('_') or 'fine-tuned'} "
            "model on the evaluation people: a post-processing (ratio over the DP count, clamp, exp) of the release",
            mechanism=_EVAL_MECH, sensitivity=_EVAL_SENS, counts=_EVAL_COUNTS, charge=_EVAL_CHARGE)
      for m in ("", "_base", "_reference") for w in ("perplexity", "next_token_accuracy")),
    Field("registry.tag", "evaluation.caveat", P, _CONST),
    Field("registry.tag", "evaluation.definition", P, _CONST),
    Field("registry.tag", "evaluation.mechanism", P, _CONST),
    Field("registry.tag", "evaluation.epsilon", P, _POLICY),
    Field("registry.tag", "evaluation.delta", P, _POLICY),
    Field("registry.tag", "evaluation.nll_clip", P, _POLICY),
    Field("registry.tag", "evaluation.noise_multiplier", P, "calibrated from the policy's ε, δ and the number of "
          "evaluated models (public)"),
    Field("registry.tag", "evaluation.ledger_release_id", P, "the ledger's release counter (how many releases "
          "Veil made, not whom they counted)"),
)

# `veil ledger --json` for governance readers (issue 22, case 7): nothing any person's presence moves.
# Exact counts of people, retirements, secrets and the spread of per-person spend are administrators-only
# (`veil ledger --admin`, labelled so), never on this channel.
declare(
    Field("cli.ledger", "budget", P, _POLICY),
    Field("cli.ledger", "budget.*", P, _POLICY),
    Field("cli.ledger", "releases", P, "how many releases were reserved: operator actions, each release id already "
          "public on its registry tags"),
    Field("cli.ledger", "orders", P, _CONST + " (the ledger's Rényi orders, fixed at its creation)"),
    Field("cli.ledger", "spend_definition", P, _CONST),
    Field("cli.ledger", "secrets_definition", P, _CONST),
    Field("cli.ledger", "note", P, _CONST),
)

# PMixED answers (`POST /v1/completions`): sampled tokens only, never probabilities, λ or the selection.
_PMIXED_MECH = ("PMixED per private token: Poisson selection of partition members at rate q, each member's "
                "distribution mollified into the D∞ ball of radius r around the public model's, their mixture sampled "
                "with a CSPRNG (docs/privacy/pmixed.md); public-only tokens are drawn from the public model alone")
declare(
    Field("pmixed.response", "text", DP, "the sampled tokens, decoded", mechanism=_PMIXED_MECH,
          sensitivity="add/remove one person changes at most one partition's member (people are partitioned)",
          counts="the people of the ensemble's partitions that the ledger admitted at build time",
          charge=("the ensemble's whole private-token budget as one Rényi curve per person, reserved at build time "
                  "(ledger mechanism 'pmixed'); the durable prepaid counter keeps answers within it")),
    Field("pmixed.response", "tokens", DP, "how many tokens the answer holds (where the sampled EOS fell)",
          post_processing_of="pmixed.response:text"),
    Field("pmixed.response", "budget_remaining_tokens", DP, "the private-token budget left: the build's public "
          "budget minus the private tokens drawn so far (a function of earlier answers)",
          post_processing_of="pmixed.response:text"),
)
