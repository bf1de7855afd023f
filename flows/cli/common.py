"""What every CLI module shares: settings from the environment, consoles, strict JSON output."""
from __future__ import annotations

import json

from rich.console import Console

from components.core.settings import Settings, load_settings

out = Console()
err = Console(stderr=True)  # progress and messages: stdout stays one JSON document with --json


def settings() -> Settings:
    """Settings from VEIL_HOME / veil.toml / env, folders created, Prefect + HF pointed at them."""
    s = load_settings().ensure()
    s.apply_environment()
    return s


def print_json(doc) -> None:
    """Exactly one JSON document on stdout (NaN/inf are refused: they are not JSON)."""
    print(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False, default=str))


def quiet_third_party() -> None:
    """The user's screen shows Veil's progress and summary, not libraries' advice to their own
    developers: MLflow's pickling and type-hint warnings, transformers' attention-mask and
    deprecation notices, torch/peft/pydantic deprecations. Errors still show (as Veil's one line)."""
    import logging
    import os
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for module in ("mlflow", "transformers", "peft", "torch", "pydantic", "huggingface_hub", "tokenizers",
                   "sqlalchemy", "alembic", "pandas", "setuptools", "pkg_resources"):
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("mlflow", "transformers", "peft", "alembic", "huggingface_hub", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:  # transformers keeps its own verbosity (read from the env var only at its first import)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
