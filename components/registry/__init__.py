"""MLflow registry: every registered model version carries its privacy certificate.

`register_model` logs a pyfunc model (base + adapter + certificate), the certificate as a run
artifact, `privacy.*` tags and the metric `privacy_epsilon`, and registers a version.
The certificate is sealed (Ed25519 over its hash and the hashes of the weights, base, tokenizer,
plan, policy and ledger entry). `load_model`, the pyfunc's own `load_context`, `verify_model`
(`veil verify`) and `list_models` run the same named checks and refuse a release that fails one.
`load_synthetic(uri)` is the consumer's one call for a synthetic corpus (components.registry.synthetic).
"""
from components.registry.mlflow_registry import (
    LoadedModel,
    Registration,
    list_models,
    load_model,
    record_audit,
    record_evaluation,
    register_model,
    verify_model,
)
from components.registry.synthetic import SyntheticCorpus, load_synthetic, register_synthetic
from components.certificate.verify import ReleaseInvalid, Verification

__all__ = ["LoadedModel", "Registration", "ReleaseInvalid", "Verification", "list_models", "load_model",
           "record_audit", "record_evaluation", "register_model", "verify_model", "SyntheticCorpus", "load_synthetic",
           "register_synthetic"]
