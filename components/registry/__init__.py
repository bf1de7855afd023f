"""MLflow registry: every registered model version carries its privacy certificate.

`register_model` logs a pyfunc model (base + adapter + certificate), the certificate as a run
artifact, `privacy.*` tags and the metric `privacy_epsilon`, and registers a version.
`load_model` is the consumer path: it refuses a model whose certificate does not verify.
"""
from components.registry.mlflow_registry import (
    LoadedModel,
    Registration,
    list_models,
    load_model,
    record_audit,
    register_model,
)

__all__ = ["LoadedModel", "Registration", "list_models", "load_model", "record_audit", "register_model"]
