"""Every field Veil publishes, declared once with its kind (components.publication.gate).

Reading guide. A PUBLIC field is a policy value, a constant, a hash of public inputs, or a quantity
that its release's neighbouring relation keeps fixed (`relation`: e.g. N under replace-one). A DP
field names its mechanism, its sensitivity, whom it counts and the ledger charge each of them gets;
its post-processings name it. An UNCOVERED field names its coarsening and the test bounding one
person's influence. docs/privacy/threat-model.md's table of published fields is generated from here
(`python -m components.publication --markdown`); tests/privacy/test_publication_gate.py checks it.
"""
from __future__ import annotations

from components.publication.gate import Field, Kind, channel, declare, declared, mirror

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
    ("mechanism", P, "policy (or `auto`'s choice, below)"), ("privacy_unit", P, _POLICY),
    ("neighbouring", P, _CONST), ("target.**", P, _POLICY), ("clip_norm", P, _POLICY),
    ("steps", P, _POLICY), ("records_per_user", P, _POLICY), ("selection", P, _POLICY),
    ("training.**", P, _POLICY), ("caveats", P, "fixed sentences filled with public values"),
    ("annex.**", P, _PUBHASH), ("policy.**", P, "the policy's name, path and sha256"),
    ("lifetime_budget", P, _POLICY), ("lifetime_budget.**", P, _POLICY), ("release.**", P, _POLICY),
    ("audit.**", P, "policy values and fixed wording"), ("evaluation.**", P, "policy values and fixed wording"),
    ("data.people.**", P, "policy-named exclusions only"),
    ("filter.**", P, _POLICY), ("decision.requested", P, _POLICY),
    ("utility_forecast.thresholds.**", P, _CONST), ("utility_forecast.measure", P, _CONST),
]
declare(*(Field("plan", p, k, w) for p, k, w in _PLAN_SHARED))
_COMMIT = "a salted commitment (sha256 of a private salt ‖ the private value): hiding without the salt"
_DIGEST = "the sha256 of this document's other fields"
# the snapshot's id and sha256 are content hashes (a membership test, issue 22): a commitment only
declare(Field("plan", "data.snapshot_commitment", P, _COMMIT, hiding=True),
        Field("plan", "data.train_records_commitment", P, _COMMIT, hiding=True),
        Field("plan", "annex.commitment", P, _COMMIT, hiding=True),
        Field("plan", "sha256", P, _DIGEST, digest=True))
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
    Field("plan", "utility_forecast.**", DP, "σ√d/B forecast and its hints from the plan's public fields",
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

# --- certificates --------------------------------------------------------------------------------------------
_CERT_PUBLIC = [
    ("schema", _CONST),
    ("created_at", "issue time"), ("code_version", "Veil's version"), ("mechanism", "the plan's"),
    ("supersedes", "hash of the pre-audit certificate"),
    ("privacy_unit", "the plan's"), ("neighbouring", "the plan's"), ("target.**", _POLICY),
    ("clip_norm", _POLICY), ("steps_planned", _POLICY), ("policy.**", "the policy's name and sha256"),
    ("contribution_bound.**", _POLICY),
    ("assumptions", _CONST), ("coverage", _CONST), ("ignored_classes", _POLICY), ("sampling", _CONST),

    ("run.base_model.**", "hashes of the public base model"), ("run.tokenizer.**", "hashes of the public tokenizer"),
    ("run.weights.kind", _CONST), ("run.device", "the operator's hardware"),
    ("run.precision", "the policy's training.precision or the operator's --precision, in fixed wording"),
    ("run.world_size", "the operator's hardware"),
    ("releases", "release ids of a multi-release certificate (public ledger ids)"),
    ("utility_forecast.thresholds.**", _CONST), ("utility_forecast.measure", _CONST),
    ("utility_forecast.source", _CONST), ("utility_forecast.trainable_parameters", "d of the public architecture"),
    ("filter.tau", _POLICY), ("filter.variant", _POLICY), ("filter.epsilon", _POLICY), ("filter.delta", _POLICY),
    ("secrets.*.kappa", _POLICY), ("secrets.*.gamma_target", _POLICY), ("untagged_records.policy", _POLICY),
]
declare(*(Field("certificate", p, P, w) for p, w in _CERT_PUBLIC))
declare(Field("certificate", "dataset.snapshot_commitment", P, _COMMIT, hiding=True),
        Field("certificate", "dataset.train_records_commitment", P, _COMMIT, hiding=True),
        Field("certificate", "run.train_records_commitment", P, _COMMIT, hiding=True),
        Field("certificate", "sha256", P, _DIGEST, digest=True),
        Field("certificate", "plan_sha256", P, "the plan's sha256 (a digest of the public plan)", digest=True))
_FROM_PLAN = "plan:data.population.estimate"
_DPSGD = ("the trained weights: DP-SGD at (q, σ, C, T) of the plan, charged by the training reservation to "
          "everyone it admits (ledger kind of the plan's unit)")
declare(
    Field("certificate", "dataset.population.estimate", DP, _NHAT, post_processing_of=_FROM_PLAN),
    Field("certificate", "dataset.population.*", P, "the estimate's mechanism, ε_N, scale and wording"),
    Field("certificate", "dataset.population.exact", P, "N, public under the release's relation",
          relation="secret substitution, or replace-one user (uls-filtered)"),
    *(Field("certificate", p, DP, w, post_processing_of=_FROM_PLAN) for p, w in [
        ("sampling_rate", "q = B/N̂"), ("noise_multiplier", "σ calibrated at q"),
        ("expected_batch_size", "B"), ("epsilon", "ε recomputed at (q, σ, T) plus ε_N"),
        ("delta", "δ: the policy's, or for a group guarantee (els-owners) (1 + e^ε_k)·δ_k at q"),
        ("epsilon_parts.**", "ε's parts"), ("accountant.**", "the accountant's values at (q, σ, T)"),
        ("dp_event.**", "the DpEvent at (q, σ, T)"), ("within_target", "ε ≤ target"),
        ("utility_forecast.**", "σ√d/B at the run's d"), ("steps", "steps run (≤ planned)"),
        ("run.steps_attempted", "steps attempted"), ("caveats", "sentences filled with N̂, q, σ and policy values"), ("secrets.**", "per-class KL and γ at the plan's σ and rates"),
        ("untagged_records.**", "record-level ε of untagged records at the plan's rates")]),
    Field("certificate", "run.weights.**", DP, "hashes of the trained weights", mechanism="DP-SGD",
          sensitivity="one unit's clipped gradient (C) per step", counts="every unit the reservation admits",
          charge=_DPSGD),
    Field("certificate", "filter.**", DP, "the filtered-ULS section (sparse vector and Gaussian parts)",
          post_processing_of=_FROM_PLAN),
)
mirror("certificate", "audit", "audit.public")

# --- the audit's public section ----------------------------------------------------------------------------
_AUDIT_Q = ("quantized on public grids (components/audit/public.py: count buckets of 10; the AUROC (moved at most "
            "Δ = 1/(n − 1) by one person) on the finest grid with Δ/w ≤ 10 %, its interval (ends moved at most 2Δ) on "
            "the finest with 2Δ/w ≤ 10 %, neither published when no grid qualifies; exposure grids chosen from public "
            "sizes; people needed from published values on the 1-2-5 ladder; verdicts at 95 % simultaneous "
            "intervals; checked on neighbours by tests/privacy/test_audit_public_neighbours.py); marked "
            "covered_by_certificate: false")
_AUDIT_T = "tests/privacy/test_audit_public_leak.py"
declare(
    *(Field("audit.public", p, P, w) for p, w in [
        ("schema", _CONST), ("covered_by_certificate", _CONST), ("quantization.**", _CONST),
        ("thresholds.**", _POLICY), ("attacker_samples_per_user", _POLICY), ("seq_len", _POLICY),
        ("reference", "the public reference model's name"), ("created_at", "audit time"),
        ("audit_id", "hash of the audit's public inputs"), ("coverage_note", _CONST), ("ceiling_basis", _CONST),
        ("epsilon", "the certificate's ε"), ("delta", "the certificate's δ"),
        ("auroc_ceiling", "f(ε, δ) of the certificate"), ("auroc_ceiling_pld", "f(PLD) of the certificate"),
        ("user_inference.binding_ceiling", "the certificate's ceiling"), ("user_inference.threshold", _POLICY),
        ("user_inference.confidence", _CONST), ("secret_exposure.limit_bits", _POLICY),
        ("secret_exposure.n_candidates", _POLICY), ("canaries", _POLICY)]),
    Field("audit.public", "**", U, "the audit's measured verdicts and aggregates", coarsening=_AUDIT_Q,
          test=_AUDIT_T),
)

# --- the registry (MLflow tags, params, metrics) --------------------------------------------------------------
declare(
    *(Field("registry.tag", p, P, w) for p, w in [
        ("privacy.schema", _CONST),
        ("privacy.unit", "the plan's"), ("privacy.neighbouring", "the plan's"), ("privacy.mechanism", "the plan's"),
        ("privacy.clip_norm", _POLICY), ("privacy.accountant", _CONST),
        ("privacy.policy_sha256", "the policy's hash"), ("privacy.signing_key", "the signer's key fingerprint"),
        ("privacy.ledger_release_id", "the ledger's release number (public sequence)"),
        ("privacy.lifetime_budget", _POLICY), ("privacy.delta", _POLICY), ("privacy.secret.*.kappa", _POLICY),
        ("privacy.token_budget", _POLICY), ("privacy.threat_model", _CONST), ("evaluation.caveat", _CONST),
        ("audit.covered_by_certificate", _CONST)]),
    *(Field("registry.tag", p, DP, w, post_processing_of=_FROM_PLAN) for p, w in [
        ("privacy.noise_multiplier", "σ"), ("privacy.sampling_rate", "q"), ("privacy.steps", "steps run"),
        ("privacy.epsilon", "the certificate's ε"), ("privacy.secret.*.max_gamma", "per-class γ")]),
    Field("registry.tag", "privacy.snapshot_commitment", P, _COMMIT, hiding=True),

    Field("registry.tag", "privacy.certificate_sha256", P, "the certificate's hash (the certificate is published in "
          "full with the model, on its own channel)", digest=True),
    Field("registry.tag", "audit.*", U, "the audit's verdict and buckets", coarsening=_AUDIT_Q, test=_AUDIT_T),
    *(Field("registry.param", p, P, w) for p, w in [
        ("mechanism", "the plan's"), ("clip_norm", _POLICY), ("delta", _POLICY), ("shards", _POLICY),
        ("subsample_rate", _POLICY), ("radius", _POLICY), ("token_budget", _POLICY)]),
    *(Field("registry.param", p, DP, w, post_processing_of=_FROM_PLAN) for p, w in [
        ("noise_multiplier", "σ"), ("sampling_rate", "q"), ("steps", "steps run")]),
    Field("registry.metric", "privacy_epsilon", DP, "the certificate's ε", post_processing_of=_FROM_PLAN),
    Field("registry.metric", "privacy_secret_max_gamma_*", DP, "per-class γ", post_processing_of=_FROM_PLAN),
    Field("registry.metric", "audit_*", U, "the audit's buckets and verdict code", coarsening=_AUDIT_Q,
          test=_AUDIT_T),
)

# --- seals ---------------------------------------------------------------------------------------------------
declare(
    *(Field("seal", p, P, w) for p, w in [
        ("schema", _CONST), ("public_key.**", "the signer's key"), ("signed_at", "signing time"),
        ("bindings.base_model", "hash of the public base"), ("bindings.tokenizer", "hash of the public tokenizer"),
        ("bindings.policy", "hash of the policy"),
        ("bindings.code", "hash of Veil's code"), ("bindings.ledger_entry", "the ledger's release number")]),
    Field("seal", "certificate_sha256", P, "the certificate's sha256", digest=True),
    Field("seal", "bindings.plan", P, "the plan's sha256", digest=True),
    Field("seal", "signature", P, "Ed25519 over the seal's other fields", digest=True),
    Field("seal", "bindings.weights", DP, "hash of the trained weights", mechanism="DP-SGD",
          sensitivity="one unit's clipped gradient (C) per step", counts="every unit the reservation admits",
          charge=_DPSGD),
)

# --- `veil models --json`, `veil verify --json` -----------------------------------------------------------------
declare(*(Field("cli.models", p, P, w) for p, w in [
    ("name", "the registered name"), ("version", "the registry's version number"), ("aliases", "registry aliases"),
    ("run_id", "MLflow's run id"), ("created_at_ms", "registration time"), ("certificate_status", _CONST),
    ("checks.*", "which verification checks passed"), ("certificate", "null when the release does not verify")]))
mirror("cli.models", "certificate", "certificate")
declare(*(Field("cli.verify", p, P, w) for p, w in [
    ("model_uri", "the name asked"), ("valid", "verification outcome"), ("checks.*", "which checks passed"),
    ("reason", "the first failed check, in words"), ("reasons.*", "failed checks, in words"),
    ("key_fingerprint", "the signer's key"), ("notes", _CONST), ("version", "the registry's version number"),
    ("name", "the registered name")]))
declare(
    Field("cli.verify", "epsilon", DP, "ε recomputed from the certificate", post_processing_of=_FROM_PLAN),
    Field("cli.verify", "gamma", DP, "γ recomputed per class", post_processing_of=_FROM_PLAN),
    Field("cli.verify", "gamma.*", DP, "γ recomputed per class", post_processing_of=_FROM_PLAN),
)
mirror("cli.verify", "certificate", "certificate")

# --- PMixED ----------------------------------------------------------------------------------------------------
_PMIXED_DP = dict(mechanism="PMixED (per-token mixture; components/prediction/mechanism.py)",
                  sensitivity="one person's shard model", counts="every person of the ensemble's snapshot",
                  charge="the ensemble's per-token Rényi budget, charged per private token (prediction ledger)")
declare(
    # the certificate's and manifest's other fields are declared one by one at the end (h-serve2)
    Field("pmixed.release", "certificate.ensemble.adapter_commitments", P, "sha256(private salt ‖ adapter hash) per "
          "shard: salted commitments (the salt stays in VEIL_HOME/private/pmixed)", hiding=True),
    Field("pmixed.release", "certificate.ensemble_id", P, "a hash of the policy's, the snapshot's and the base's hashes "
          "and of a hash of the private partition key: without the key it reveals nothing (random-oracle "
          "assumption)", hiding=True),
    Field("pmixed.release", "certificate.dataset.snapshot_commitment", P, _COMMIT, hiding=True),
    Field("pmixed.release", "certificate.sha256", P, "the certificate's own sha256", digest=True),
    Field("pmixed.response", "text", DP, "sampled tokens", **_PMIXED_DP),
    Field("pmixed.response", "tokens", P, "how many tokens were returned (a function of the request)"),
    Field("pmixed.response", "budget_remaining_tokens", P,
          "tokens left in the ensemble's budget: a function of the requests served, not of anyone's data"),
)

# --- studies ---------------------------------------------------------------------------------------------------
declare(
    Field("study", "tags.**", P, "the study's id, the grid's and policy's hashes, its caveat"),
    Field("study", "params.grid", P, "the grid's name"), Field("study", "params.points", P, "the grid's size"),
    Field("study", "point.*", P, "the point's policy values (mechanism, ε, selection, k, LoRA, steps)"),
    Field("study", "point.noise_multiplier", DP, "the point plan's σ", post_processing_of=_FROM_PLAN),
    Field("study", "point.sampling_rate", DP, "the point plan's q", post_processing_of=_FROM_PLAN),
    Field("study", "point.plan_sha256", DP, "the point plan's hash", post_processing_of=_FROM_PLAN),
    Field("study", "metrics.plan_epsilon", DP, "the point plan's ε", post_processing_of=_FROM_PLAN),
)

# --- Prefect (flow-run names, parameters, log lines; results are not persisted) -----------------------------------
declare(
    Field("prefect", "snapshot_commitment", P, "the prefix of the snapshot's salted commitment", hiding=True),
    Field("prefect", "certificate", P, "the certificate's hash prefix and its one-line guarantee (public values)"),
    Field("prefect", "registered", P, "model URI, plan and certificate hash prefixes"),
    Field("prefect", "promotion", P, "the promotion decision and its reason (public verdicts and policy fields)"),
    Field("prefect", "skipped", P, "why a retrain did nothing: unchanged data (snapshot commitment, model URI) or no "
          "budget left for anyone (a fact about the whole organization, from the ledger's public budget)"),
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
    Field("selection", "selection.composition.population_estimates.plan_sha256", P, "the sha256 of a published "
          "plan (plan channel): a digest of that document, which moves exactly when one of its leaves does, and "
          "those are declared and checked where the plan is published", digest=True),
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
# --- evaluation, PMixED responses, audit labels, ledger view (h-eval) ---
# Evaluation (issue 22, case 4): the registry gets eval_* only as the DP release of
# components.evaluation.dp / release; the exact figures stay on the operator's terminal.
_EVAL_MECH = ("Gaussian on the vector (Σ clipped per-person mean NLL, Σ per-person accuracy) per evaluated model "
              "and the count of counted people; noise multiplier m from the analytic Gaussian (Balle & Wang 2018) "
              "at the policy's evaluation.epsilon/delta; noise keyed on the evaluated models, ε, δ, the clip and the counted set")
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

# Multi-owner certificates: the group guarantee is computed from σ, T and q = B/N with N public under
# the fixed-graph replace relation (docs/privacy/multi-owner.md): public under that relation only.
declare(Field("certificate", "group_guarantee.**", P, "ELS's group-of-k guarantee recomputed from σ, T and q = B/N",
              relation="replace owned records, fixed graph (els-owners)"))
declare(Field("certificate", "ownership.**", P, "the multi-owner rule: ownership, k, order, the relation and fixed "
              "flags (policy values and constants; never a count of the data)"))
declare(Field("cli.verify", "certificate_sha256", P, "the checked certificate's sha256", digest=True))
# Certificates registered by a Veil before the snapshot commitment carried the snapshot's id and sha256.
# They are already public in the registry; `veil models --json` re-shows them unchanged (a consumer checks
# the certificate's hash over exactly those bytes). New certificates never carry them: the certificate
# channel refuses both fields.
_LEGACY = "a certificate registered before the snapshot commitment (already public, re-shown unchanged)"
declare(Field("cli.models", "certificate.dataset.snapshot_id", P, _LEGACY),
        Field("cli.models", "certificate.dataset.snapshot_sha256", P, _LEGACY))
# --- audits that decide (h-audit, issue 26) ---
# The plan's audit sizing: policy values and what they imply at N̂ and the plan's certified ε.
declare(
    Field("plan", "audit.sizing.**", DP, "the audit's sizes and whether each gate can settle, computed from the "
          "policy, N̂ and the certified ε at the plan's σ", post_processing_of="plan:data.population.estimate"),
    Field("plan", "audit.sizing.require", P, _POLICY),
    Field("plan", "audit.sizing.candidates_per_secret", P, "the policy's, or the ladder value its exposure limit gives"),
    Field("plan", "audit.sizing.candidates_source", P, _CONST),
    Field("plan", "audit.sizing.secrets_per_class", P, _POLICY),
    Field("plan", "audit.sizing.max_exposed_fraction", P, _POLICY),
    Field("plan", "audit.sizing.confidence", P, _CONST),
    Field("plan", "audit.sizing.design_point", P, _CONST),
)
_GATE_REASON = ("the audit's public reasons joined: verdicts, published count buckets, ladder-rounded needs and "
                "policy values — built from the public section only, never a per-person or per-secret value")
declare(
    *(Field("audit.public", p, P, w) for p, w in [
        ("gate.require", _POLICY), ("settings.**", "the plan's audit sizing (policy values; ladder values)"),
        ("secret_exposure.max_exposed_fraction", _POLICY), ("secret_exposure.statistic", _CONST),
        ("one_run.certified_epsilon", "the certificate's ε"), ("one_run.method", _CONST), ("one_run.grid", _CONST),
        ("one_run.confidence", _CONST), ("one_run.computed", "whether the plan's split allows it (plan values)"),
        ("one_run.why", _CONST)]),
    Field("audit.public", "gate.reason", U, _GATE_REASON, coarsening=_AUDIT_Q, test="tests/privacy/test_audit_gate_tags.py"),
    Field("audit.public", "one_run.epsilon_at_least", U, "the one-run ε lower bound (Steinke, Nasr & Jagielski 2023) "
          "over the audited people, rounded down to a 0.5 grid", coarsening=_AUDIT_Q + "; rounded down to 0.5",
          test="tests/privacy/test_audit_gate_tags.py"),
    Field("registry.tag", "audit.require", P, _POLICY),
    Field("registry.tag", "audit.reason", U, _GATE_REASON, coarsening=_AUDIT_Q, test="tests/privacy/test_audit_gate_tags.py"),
    Field("registry.tag", "audit.one_run_epsilon_at_least", U, "the one-run ε lower bound rounded down to 0.5",
          coarsening=_AUDIT_Q + "; rounded down to 0.5", test="tests/privacy/test_audit_gate_tags.py"),
    Field("prefect", "audit", U, "the audit's verdict, the policy's requirement, whether it is met and "
          "the public reasons (" + _GATE_REASON + ")", coarsening=_AUDIT_Q, test="tests/privacy/test_audit_gate_tags.py"),
)
# --- end of h-audit ---

# --- a budget that lasts the schedule (h-budget, issue 26) -----------------------------------------
# The policy's schedule on the plan, and the ledger's forecast of a plan's further releases for a person
# who has spent nothing: functions of the plan's public fields (q and σ post-process N̂), the lifetime
# budget and the ledger's grid and conversion. Per-person forecasts (min/median releases left over the
# plan's people, people the next release would retire) are administrators-only, never on a channel.
channel("cli.plan", "`veil plan --json` readers (the plan itself is on the plan channel)")
_SCHED_DP = "plan:noise_multiplier"
_FRESH = ("releases of the plan a person with the most rows it allows is admitted to from zero spend: the "
          "plan's q, σ, T and N̂ charge against the lifetime budget under the ledger's filter")
declare(
    Field("plan", "schedule.releases", P, _POLICY),
    Field("plan", "schedule.cadence", P, _POLICY),
    Field("plan", "schedule.target_epsilon", P, _POLICY),
    Field("plan", "schedule.lifetime_budget.*", P, _POLICY),
    Field("plan", "schedule.conversion", P, _CONST + " (the ledger's RDP conversion, fixed at its creation)"),
    Field("plan", "schedule.rule", P, _CONST),
    Field("plan", "schedule.lowered", DP, "whether the schedule lowered σ's target ε", post_processing_of=_SCHED_DP),
    Field("plan", "schedule.epsilon_per_release", DP, "the release's ε (= accounting.epsilon)",
          post_processing_of=_SCHED_DP),
    Field("plan", "schedule.releases_for_a_new_person", DP, _FRESH, post_processing_of=_SCHED_DP),
    Field("cli.ledger", "conversion", P, _CONST + " (the ledger's RDP conversion, fixed at its creation)"),
    Field("cli.ledger", "forecast.plan_sha256", P, "the forecast plan's sha256 (published on the plan channel)",
          digest=True),
    Field("cli.ledger", "forecast.releases_for_a_new_person", DP, _FRESH, post_processing_of=_SCHED_DP),
    Field("cli.ledger", "forecast.definition", P, _CONST),
    Field("cli.plan", "forecast.releases_for_a_new_person", DP, _FRESH, post_processing_of=_SCHED_DP),
    Field("cli.plan", "forecast.definition", P, _CONST),
)
# --- end of h-budget ---

# --- issue 26: a CLI that talks (h-cli) ---------------------------------------------------------------------------
declare(
    # ε and γ in these sentences are the recomputed ones (`epsilon`, `gamma` above): the same DP post-processing
    Field("cli.verify", "promises", DP, "plain-language sentences built from the verified certificate's fields "
          "(unit, relation, recomputed ε/γ, δ, κ, coverage, audit verdict): nothing the certificate does not say",
          post_processing_of=_FROM_PLAN),
    Field("prefect", "step", P, "the name of a pipeline step that finished (a fixed word from flows.pipeline.STEPS)"),
)

# --- weekly retraining on a real corpus (h-real, issue 26) ---
declare(Field("prefect", "plan_audit", DP, "the plan's audit-sizing statement (what cannot pass, and why) and its "
              "schedule's ε per release: the plan's own published fields, post-processings of N̂ and policy values",
              post_processing_of="plan:data.population.estimate"))
# --- end of h-real ---
# --- PMixED sized as a product (issue 26: sizing, per-token private flags, per-key quotas) ---------------------
channel("pmixed.plan", "anyone: `veil pmixed plan --json` (and the sizing `veil pmixed build` shows first)")
_SIZING = "arithmetic on policy values (token_budget, max_tokens_per_request, key_quota_tokens) and --keys"
declare(
    Field("pmixed.plan", "policy.**", P, "the policy's name and sha256"),
    Field("pmixed.plan", "sizing.**", P, _SIZING),
    Field("pmixed.plan", "sizing.hints", P, "fixed sentences filled with " + _SIZING),
    Field("pmixed.plan", "epsilon", P, _POLICY), Field("pmixed.plan", "delta", P, _POLICY),
    Field("pmixed.plan", "shards", P, _POLICY), Field("pmixed.plan", "subsample_rate", P, _POLICY),
    Field("pmixed.plan", "when_exhausted", P, _POLICY),
    Field("pmixed.plan", "radius", P, "calibrated from the policy's ε, δ, q and token_budget (public)"),
    Field("pmixed.plan", "token_epsilon", P, "the per-token ε of the calibrated radius (public)"),
    Field("pmixed.plan", "tradeoff.**", P, "radii calibrated for multiples of the policy's token_budget (public)"),
    Field("pmixed.release", "manifest.key_quota_tokens", P, _POLICY),
    # Private tokens are a prefix of each answer: its length is min(tokens granted, tokens returned). The grant
    # is a function of the request and of the ensemble's and the key's counters, which count earlier answers'
    # private tokens; the answer's length is where the sampled EOS fell. All post-processing of the transcript.
    Field("pmixed.response", "private", DP, "per returned token, whether it was drawn from the private ensemble "
          "(a prefix of True): the durable counters' state and this answer's length",
          post_processing_of="pmixed.response:text"),
    Field("pmixed.response", "private_tokens", DP, "how many of the returned tokens were private (the prefix's "
          "length)", post_processing_of="pmixed.response:text"),
    Field("pmixed.response", "public_only_reason", DP, "which counter refused the first public-only token "
          "(the ensemble's budget or the key's quota), or null", post_processing_of="pmixed.response:text"),
    Field("pmixed.response", "key_quota_remaining_tokens", DP, "the policy's per-key quota minus the private tokens "
          "granted to this key so far (a function of its earlier answers), or null without a quota",
          post_processing_of="pmixed.response:text"),
)

# --- synthetic text (h-synth, issue 25) ------------------------------------------------------------------------
# A corpus sampled from a registered DP model with public prompts and public settings is post-processing of
# that model's release: its records (and every hash, count and scan of them) post-process the trained
# weights; its certificate restates the model certificate's guarantee. Nothing here reads private data.
channel("synthetic.records", "anyone: the corpus' records (records.jsonl / records.parquet, MLflow artifacts)")
channel("synthetic.certificate", "anyone: the corpus certificate (veil.certificate.synthetic/v1)")
channel("synthetic.seal", "anyone: the corpus seal (veil.seal.synthetic/v1)")
channel("cli.synthesize", "the operator and registry readers: `veil synthesize --json`")
_WEIGHTS = "certificate:run.weights.sha256"

_SYN_TEXT = "synthetic.records:records.text"
_SYN_SETTINGS = "a public sampling setting or the public prompts file (the operator's, published whole)"
_SYN_HASH = "sha256 of the corpus file (a function of the sampled records)"
_SYN_SCAN = ("records matched per detector class by the catalog's detectors (flows/synthetic.py): a function of "
             "the sampled records")
declare(
    Field("synthetic.records", "records.index", P, "the record's position (0 … N−1; N is the operator's --records)"),
    Field("synthetic.records", "records.control_code", P, "the public prompt's code the record was sampled under"),
    Field("synthetic.records", "records.text", DP, "text sampled from the DP model (the public prompt + its "
          "continuation)", post_processing_of=_WEIGHTS),
    *(Field("synthetic.certificate", p, P, w) for p, w in [
        ("schema", _CONST), ("created_at", "issue time"), ("code_version", "Veil's version"),
        ("model.name", "the registered name"), ("model.version", "the registry's version number"),
        ("model.run_id", "MLflow's run id"), ("model.uri", "the URI asked"),
        ("model.ledger_release_id", "the model's ledger release (its public run tag)"),
        ("model.seal_key_fingerprint", "the model signer's key"), ("model.certificate_schema", _CONST),
        ("inherits.privacy_unit", "the model certificate's"), ("inherits.neighbouring", "the model certificate's"),
        ("inherits.mechanism", "the model certificate's"), ("generation.**", _SYN_SETTINGS),
        ("corpus.records", "the operator's --records"), ("corpus.format", _CONST), ("corpus.columns", _CONST)]),
    Field("synthetic.certificate", "model.certificate_sha256", P, "the model certificate's sha256 (published whole on "
          "the certificate channel and beside the corpus)", digest=True),
    Field("synthetic.certificate", "inherits.epsilon", DP, "the model certificate's ε", post_processing_of="certificate:epsilon"),
    Field("synthetic.certificate", "inherits.delta", DP, "the model certificate's δ", post_processing_of="certificate:delta"),
    Field("synthetic.certificate", "inherits.secrets.**", DP, "the model certificate's per-class γ and κ",
          post_processing_of="certificate:secrets.c.max_gamma"),
    Field("synthetic.certificate", "corpus.sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("synthetic.certificate", "corpus.parquet_sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("synthetic.certificate", "statement", DP, "a fixed sentence filled with the model's name, version, "
          "certificate hash, unit and ε/δ (or γ)", post_processing_of="certificate:epsilon"),
    Field("synthetic.certificate", "sha256", P, _DIGEST, digest=True),
    *(Field("synthetic.seal", p, P, w) for p, w in [
        ("schema", _CONST), ("public_key.**", "the signer's key"), ("signed_at", "signing time"),
        ("bindings.prompts", "hash of the public prompts (or null)")]),
    Field("synthetic.seal", "certificate_sha256", P, "the corpus certificate's sha256", digest=True),
    Field("synthetic.seal", "signature", P, "Ed25519 over the seal's other fields", digest=True),
    Field("synthetic.seal", "bindings.model_certificate", P, "the model certificate's sha256", digest=True),
    Field("synthetic.seal", "bindings.model_seal", P, "sha256 of the model's seal (published whole)", digest=True),
    Field("synthetic.seal", "bindings.corpus_jsonl", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("synthetic.seal", "bindings.corpus_parquet", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    *(Field("cli.synthesize", p, P, w) for p, w in [
        ("model_uri", "the URI asked"), ("records", "the operator's --records"),
        ("corpus_dir", "where the corpus was written (under VEIL_HOME)"), ("uri", "the corpus run's runs:/ URI"),
        ("run_id", "MLflow's run id"), ("ledger_release_id", "the ledger's release number"),
        ("conditioning", _CONST), ("sampling.**", _SYN_SETTINGS)]),
    Field("cli.synthesize", "certificate_sha256", P, "the corpus certificate's sha256", digest=True),
    Field("cli.synthesize", "corpus_sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("cli.synthesize", "parquet_sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("cli.synthesize", "scan.*", DP, _SYN_SCAN, post_processing_of=_SYN_TEXT),
    Field("cli.synthesize", "statement", DP, "the certificate's statement", post_processing_of="certificate:epsilon"),
    *(Field("registry.tag", p, P, w) for p, w in [
        ("synthetic.records", "the operator's --records"), ("synthetic.model_uri", "the model version's URI"),
        ("synthetic.model_run_id", "MLflow's run id"), ("synthetic.conditioning", _CONST),
        ("synthetic.seed", _SYN_SETTINGS), ("synthetic.ledger_release_id", "the ledger's release number"),
        ("synthetic.corpus.*", "the run id of a corpus sampled from this version (lineage)")]),
    Field("registry.tag", "synthetic.certificate_sha256", P, "the corpus certificate's sha256", digest=True),
    Field("registry.tag", "synthetic.model_certificate_sha256", P, "the model certificate's sha256", digest=True),
    Field("registry.tag", "synthetic.corpus_sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("registry.tag", "synthetic.parquet_sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
    Field("registry.tag", "synthetic.scan.*", DP, _SYN_SCAN, post_processing_of=_SYN_TEXT),
    Field("registry.artifact", "synthetic", P, "the corpus folder's file names (" + _CONST + ")"),
    *(Field("cli.ledger", f"post_processing_releases.{p}", P, w) for p, w in [
        ("release_id", "the ledger's release number"), ("kind", _CONST), ("created_at", "when it was recorded"),
        ("of_release", "the model's ledger release number"), ("model", "the registered name"),
        ("model_version", "the registry's version number"), ("records", "the operator's --records")]),
    Field("cli.ledger", "post_processing_releases.certificate_sha256", P, "the corpus certificate's sha256",
          digest=True),
    Field("cli.ledger", "post_processing_releases.corpus_sha256", DP, _SYN_HASH, post_processing_of=_SYN_TEXT),
)
# `veil synthesize --json` repeats the certificate's inherited guarantee, declared as there
declare(*(Field("cli.synthesize", f.pattern, f.kind, f.what, post_processing_of=f.post_processing_of)
          for f in declared("synthetic.certificate") if f.pattern.startswith("inherits.")))
# --- end of h-synth ---
# --- the filter's order weights (h-price, issue 26) ---------------------------------------------------------------
# A weighted ledger's δ shares over its orders: components.renyi.rdp.order_weights of the lifetime budget (ε, δ)
# and the grid, both public; recorded when the budget is fixed. None under the older conversions.
declare(
    Field("cli.ledger", "order_weights", P, "a function of the lifetime budget (policy) and the ledger's order grid "
          "(a constant of its creation): components.renyi.rdp.order_weights"),
)
# --- end of h-price ---

# --- the endpoint's API keys and the PMixED certificate field by field (h-serve2, issues 28 and 22) ---------
channel("cli.keys", "the operator: `veil keys list|revoke --json`")
_KEYHASH = ("a 256-bit random API key's sha256 (and its 16-hex-digit prefix, the key's id): random, a function of "
            "no one's data; preimage-resistant, so it does not give the key")
declare(
    *(Field("cli.keys", f"{doc}.{leaf}", P, what)
      for doc in ("keys", "revoked")
      for leaf, what in [("id", _KEYHASH), ("sha256", _KEYHASH), ("created_at", "when `veil keys create` ran"),
                         ("revoked_at", "when `veil keys revoke` ran, or null")]),
    Field("cli.keys", "keys", P, "an empty list: no key was ever created"),
)

# The PMixED certificate and manifest field by field (issue 22): a field added to either is refused until it
# is declared here (components/prediction/release.py make_certificate / manifest_of, flows/pmixed.py build).
_PMX_CALIB = "calibrated from the policy's ε, δ, q and token_budget (components/prediction/mechanism.py): public"
_PMX_EXCL = ("counts of accounts the policy's patterns exclude: non-persons, so adding or removing a person leaves "
             "them unchanged (components/bounding/people.py)")
declare(*(Field("pmixed.release", f"certificate.{p}", P, w) for p, w in [
    ("schema", _CONST), ("mechanism", _CONST), ("paper", _CONST), ("threat_model", _CONST),
    ("privacy_unit", _CONST), ("neighbouring", _CONST), ("guarantee_covers", _CONST), ("caveats", _CONST),
    ("epsilon", "the token budget's ε at the calibrated radius (" + _PMX_CALIB + ")"), ("delta", _POLICY),
    ("token_budget", _POLICY), ("when_exhausted", _POLICY),
    ("per_token.epsilon_pure", "one private token's pure ε at the calibrated radius"),
    ("per_token.orders", _CONST + " (the Rényi orders)"),
    ("per_token.rdp", "one private token's Rényi curve at the calibrated radius"),
    ("accountant.name", _CONST),
    ("ensemble.shards", _POLICY), ("ensemble.subsample_rate", _POLICY), ("ensemble.radius", _PMX_CALIB),
    ("ensemble.temperature", _POLICY), ("ensemble.selection", _CONST), ("ensemble.decoding", _CONST),
    ("ensemble.adapters_released", _CONST),
    ("public_model.sha256", "the public base model's hash"),
    ("public_model.assumed_independent_of_private_data", _CONST),
    ("dataset.people.ownership", _POLICY), ("dataset.people.multi_owner_order", _POLICY),
    ("dataset.people.not_published", _CONST),
    ("dataset.people.excluded_accounts", _PMX_EXCL), ("dataset.people.excluded_records", _PMX_EXCL),
    ("dataset.people.excluded_accounts_by_pattern", _PMX_EXCL + "; an empty mapping when none matched"),
    ("dataset.people.excluded_accounts_by_pattern.*", _PMX_EXCL + ", per pattern of the policy"),
    ("policy.name", _POLICY), ("policy.sha256", "the policy file's sha256"),
    ("ledger", "null: built without the per-person ledger"),
    ("ledger.ledger_release_id", "the ledger's release counter (how many releases Veil made, not whom they counted)"),
    ("ledger.budget", "null: no lifetime budget in the policy"),
    ("ledger.budget.epsilon", _POLICY), ("ledger.budget.delta", _POLICY),
    ("created_at", "when the certificate was made")]))
declare(*(Field("pmixed.release", f"manifest.{p}", P, w) for p, w in [
    ("schema", _CONST), ("mechanism", _CONST),
    ("params.shards", _POLICY), ("params.q", _POLICY), ("params.radius", _PMX_CALIB), ("params.tokens", _POLICY),
    ("params.delta", _POLICY), ("params.temperature", _POLICY),
    ("base_sha256", "the public base model's hash"), ("max_tokens_per_request", _POLICY)]))
# What Prefect stores of Veil's flows (issue 22): flow-run parameters are public handles only — paths (whose
# contents stay in the private area), names, flags. Task parameters are the same handles (a list of person ids
# travels as the path of the private file holding it); results are never persisted (persist_result=False).
_PATH = "a path on the operator's host (its contents stay private; the path names no person)"
declare(*(Field("prefect", f"parameters.{p}", P, w) for p, w in [
    ("policy", "the policy file's path (public YAML)"), ("source", _PATH), ("fmt", "the source's format name"),
    ("home", "VEIL_HOME's path"), ("public_corpus", _PATH + " (a public corpus)"),
    ("base_model_dir", _PATH + " (a public base model)"), ("model_name", "the registered model's name"),
    ("mapping", "the source's field mapping (field names given on the command line); empty"),
    ("mapping.*", "the source's field mapping: field names given on the command line"),
    ("audit", "whether to audit (a flag)"), ("truth", _PATH + " (the demo's planted-secret list)"),
    ("alias", "the alias to promote to (a name)"), ("approval_poll_s", "seconds between approval polls")]))
# --- end of h-serve2 ---
# --- h-kill: kills, resume, registry (issue 28) -------------------------------------------------------------
declare(
    Field("registry.tag", "veil.plan_sha256", P, "the hash of the public plan the run registers (the plan is "
          "published in full with the model): how a registration killed after MLflow registered its version is "
          "found again instead of registered twice", digest=True),
    Field("prefect", "resuming", P, "a registered model URI and the step a killed retraining left undone "
          "(a fixed word: audit or promotion)"),
)
# --- h-fsdp: sharded full fine-tuning (issue 24) -----------------------------------------------------------
declare(Field("certificate", "run.sharding", P, "how the operator laid the model over its ranks (fsdp: the "
              "policy's setting, present only when the run was sharded over more than one rank)"))
# --- h-nb: a failed task or flow as Prefect sees it (issue 22; flows.prefect_boundary) -----------------------
declare(
    Field("prefect", "failure.step", P, "the name of the Veil task or flow that failed (a fixed name in flows/)"),
    Field("prefect", "failure.error", P, "the failure's exception type name (its message and traceback never: they "
          "may hold a person's id or an exact count, and go to the operator's terminal and the private area)"),
    Field("prefect", "failure.record", P, "the name of the private file holding the reason (the failure's UTC time "
          "and the step's name), or null when no private area was found"),
)
# --- end of h-nb ---
# --- issue 24: the training precision as a flow parameter ----------------------------------------------------
declare(Field("prefect", "parameters.precision", P, "the operator's training precision override (fp32, bf16, "
              "fp16 or null: a public setting, recorded on the certificate too)"))
# --- the canary echo audit of a synthetic corpus (h-echo, issue 25) ------------------------------------------
# `veil audit-synthetic`: the corpus against the plan's echo canaries (components/audit/echo.py). Measured on the
# private canary split after training, so uncovered: verdicts, count buckets and values on the audit's grids.
channel("cli.audit_synthetic", "the operator and registry readers: `veil audit-synthetic --json`")
_ECHO_Q = ("count buckets of 10; the AUROCs and the groups' mean echo fraction (each moved at most Δ = 1/(n − 1) by "
           "one canary) on the finest grid with Δ/w ≤ 10 %, the intervals (ends moved at most 2Δ) on the finest with "
           "2Δ/w ≤ 10 %, neither published when no grid qualifies (public.strict_auroc_grid); people needed from "
           "those published values on the 1-2-5 ladder; verdicts at 95 % simultaneous intervals; marked "
           "covered_by_certificate: false")
_ECHO_T = "tests/privacy/test_echo_public_leak.py"
declare(
    *(Field("cli.audit_synthetic", p, P, w) for p, w in [
        ("schema", _CONST), ("covered_by_certificate", _CONST), ("coverage_note", _CONST), ("statistics.**", _CONST),
        ("corpus.records", "the operator's --records"), ("model.name", "the registered name"),
        ("model.version", "the registry's version number"), ("epsilon", "the model certificate's ε"),
        ("delta", "the model certificate's δ"), ("threshold", _POLICY), ("confidence", _CONST),
        ("auroc_ceiling", "f(ε, δ) of the model certificate"), ("auroc_ceiling_pld", "f(PLD) of the model certificate"),
        ("binding_ceiling", "the model certificate's ceiling"),
        ("canary_kind", "whether the policy gave canary prefixes (a policy value)"),
        ("private_report", "the private report's path under VEIL_HOME/private (its contents stay there)")]),
    Field("cli.audit_synthetic", "corpus.certificate_sha256", P, "the corpus certificate's sha256", digest=True),
    Field("cli.audit_synthetic", "model.certificate_sha256", P, "the model certificate's sha256", digest=True),
    Field("cli.audit_synthetic", "**", U, "the echo audit's verdicts and quantized aggregates", coarsening=_ECHO_Q,
          test=_ECHO_T),
    Field("registry.tag", "synthetic.echo_audit.*", U, "the echo audit's verdict and AUROC bucket (as its --json)",
          coarsening=_ECHO_Q, test=_ECHO_T),
)
# --- end of h-echo ---
# --- synthetic text: PMixED-sourced corpora and downstream utility (h-synth2, issue 25) ------------------------
# bench/synthetic_quality.py --downstream releases, as ONE evaluation release (components.evaluation.release),
# the DP model's and each synthetic-trained fine-tune's scores on the evaluation people, logged on a run of
# the experiment `veil-bench-synthetic`.
declare(
    *(Field("registry.metric", f"eval_{m}_{w}", DP, f"{w.replace('_', ' ')} on the evaluation people of the public "
            f"base fine-tuned non-privately on the {m.replace('_', ' ')} corpus (bench/synthetic_quality.py "
            "--downstream): a post-processing (ratio over the DP count, clamp, exp) of the release",
            mechanism=_EVAL_MECH, sensitivity=_EVAL_SENS, counts=_EVAL_COUNTS, charge=_EVAL_CHARGE)
      for m in ("dp_synthetic", "nonprivate_synthetic", "base_synthetic") for w in ("perplexity", "next_token_accuracy")),
)
# A corpus drawn through a PMixED ensemble (`veil synthesize MODEL_URI --pmixed`): every record is PMixED output,
# each token charged to the ensemble's budget before it was drawn — part of the transcript its certificate covers.
channel("synthetic.pmixed.records", "anyone: a PMixED-sourced corpus' records (records.jsonl / records.parquet)")
channel("synthetic.pmixed.certificate", "anyone: a PMixED-sourced corpus' certificate (veil.certificate.synthetic/v1, "
        "source pmixed)")
_PMX_TEXT = "synthetic.pmixed.records:records.text"
_PMX_HASH = "sha256 of the corpus file (a function of the drawn records)"
_PMX_TOKENS = ("private tokens this corpus drew (each charged before its draw): where the drawn EOS fell in each "
               "record, and where a budget that concurrent serving spent first stopped the corpus")
_PMX_PUBLIC_CERT = ("the PMixED certificate's (published whole on pmixed.release, where it is declared public: "
                    "calibrated from the policy)")
declare(
    Field("synthetic.pmixed.records", "records.index", P, "the record's position (0 … n−1)"),
    Field("synthetic.pmixed.records", "records.control_code", P, "the public prompt's code the record was drawn under"),
    Field("synthetic.pmixed.records", "records.text", DP, "the public prompt + the ensemble's answer to it",
          post_processing_of="pmixed.response:text"),
    *(Field(**{**f.__dict__, "channel": "synthetic.pmixed.certificate"}) for f in declared("synthetic.certificate")
      if not f.pattern.startswith(("inherits.", "corpus.sha256", "corpus.parquet_sha256", "corpus.records",
                                   "statement"))),
    *(Field("synthetic.pmixed.certificate", p, P, w) for p, w in [
        ("source", _CONST), ("model.ensemble_id", "the PMixED certificate's ensemble id (declared hiding there)"),
        ("inherits.privacy_unit", _PMX_PUBLIC_CERT), ("inherits.neighbouring", _PMX_PUBLIC_CERT),
        ("inherits.mechanism", _PMX_PUBLIC_CERT), ("inherits.epsilon", _PMX_PUBLIC_CERT),
        ("inherits.delta", _PMX_PUBLIC_CERT), ("tokens.token_budget", _PMX_PUBLIC_CERT),
        ("tokens.charging", _CONST)]),
    Field("synthetic.pmixed.certificate", "tokens.charged", DP, _PMX_TOKENS, post_processing_of=_PMX_TEXT),
    Field("synthetic.pmixed.certificate", "corpus.records", DP, "records kept (fewer than asked only when the budget "
          "ran out mid-way)", post_processing_of=_PMX_TEXT),
    Field("synthetic.pmixed.certificate", "corpus.sha256", DP, _PMX_HASH, post_processing_of=_PMX_TEXT),
    Field("synthetic.pmixed.certificate", "corpus.parquet_sha256", DP, _PMX_HASH, post_processing_of=_PMX_TEXT),
    Field("synthetic.pmixed.certificate", "statement", DP, "a fixed sentence filled with the ensemble's name, version, "
          "certificate hash, id, unit, ε/δ, budget and the tokens charged", post_processing_of=_PMX_TEXT),
    *(Field("cli.synthesize", p, P, w) for p, w in [
        ("source", _CONST), ("ensemble_id", "the PMixED certificate's ensemble id (declared hiding there)")]),
    Field("cli.synthesize", "records_kept", DP, "records drawn (fewer than --records only when the budget ran out "
          "mid-way)", post_processing_of=_PMX_TEXT),
    Field("cli.synthesize", "tokens_charged", DP, _PMX_TOKENS, post_processing_of=_PMX_TEXT),
    Field("cli.synthesize", "stopped_by_budget", DP, "whether the ensemble's budget ran out before every record was "
          "drawn", post_processing_of=_PMX_TEXT),
    *(Field("registry.tag", p, P, w) for p, w in [
        ("synthetic.source", _CONST), ("synthetic.ensemble_id", "the PMixED certificate's ensemble id")]),
    Field("registry.tag", "synthetic.tokens_charged", DP, _PMX_TOKENS, post_processing_of=_PMX_TEXT),
    Field("cli.ledger", "post_processing_releases.source", P, _CONST),
    Field("cli.ledger", "post_processing_releases.tokens_charged", DP, _PMX_TOKENS, post_processing_of=_PMX_TEXT),
    Field("cli.ledger", "post_processing_releases.records_kept", DP, "records a PMixED-sourced corpus kept",
          post_processing_of=_PMX_TEXT),
)
# --- end of h-synth2 ---
# --- h-price2: the weighted conversion's rule (issue 26) -----------------------------------------------------
declare(Field("cli.ledger", "order_weights_rule", P, _CONST + " (the name of the rule a weighted ledger's order "
              "weights follow, fixed at its creation: components.renyi.rdp.WEIGHT_RULES; null under another "
              "conversion)"))
# --- s13-echo: the PMixED-sourced corpus' row of bench/synthetic_quality.py --downstream (issue 25) ----------------
declare(
    *(Field("registry.metric", f"eval_pmixed_synthetic_{w}", DP, f"{w.replace('_', ' ')} on the evaluation people of "
            "the public base fine-tuned non-privately on the PMixED-sourced corpus (bench/synthetic_quality.py "
            "--pmixed --downstream): a post-processing (ratio over the DP count, clamp, exp) of the release",
            mechanism=_EVAL_MECH, sensitivity=_EVAL_SENS, counts=_EVAL_COUNTS, charge=_EVAL_CHARGE)
      for w in ("perplexity", "next_token_accuracy")),
)
# --- end of s13-echo ---
