"""What every CLI module shares: settings from the environment, consoles, strict JSON output."""
from __future__ import annotations

import json
import logging
from pathlib import Path

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


_QUIET_MODULES = ("mlflow", "transformers", "peft", "torch", "pydantic", "huggingface_hub", "tokenizers",
                  "sqlalchemy", "alembic", "pandas", "setuptools", "pkg_resources")


class _ThirdPartyWarnings(logging.Filter):
    def __init__(self, paths: tuple[str, ...]):
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001
            return True
        return not any(p in text for p in self.paths)


def quiet_third_party() -> None:
    """The user's screen shows Veil's progress and summary, not libraries' advice to their own
    developers: MLflow's pickling and type-hint warnings, transformers' attention-mask and
    deprecation notices, torch/peft/pydantic deprecations. Errors still show (as Veil's one line)."""
    import os
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for module in _QUIET_MODULES:
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
    # MLflow re-enables its own UserWarnings (`filter_user_warnings_once` inserts a "once" filter in
    # front of ours): drop third-party warnings where they are shown, too — directly, or through
    # the `py.warnings` logger when Prefect captures warnings into logging.
    paths = tuple(f"{os.sep}{m}{os.sep}" for m in _QUIET_MODULES)
    shown = warnings.showwarning
    if not getattr(shown, "_veil_quiet", False):
        def showwarning(message, category, filename, lineno, file=None, line=None):
            if not any(p in str(filename) for p in paths):
                shown(message, category, filename, lineno, file, line)
        showwarning._veil_quiet = True
        warnings.showwarning = showwarning
    pyw = logging.getLogger("py.warnings")
    if not any(isinstance(f, _ThirdPartyWarnings) for f in pyw.filters):
        pyw.addFilter(_ThirdPartyWarnings(paths))
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    for name in ("mlflow", "transformers", "peft", "alembic", "huggingface_hub", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")  # read when mlflow configures its loggers
    try:  # every MLflow logger and its eprint()s ("Successfully registered model …") write to this stream;
        # its `enabled` flag is switched back on by MLflow's own log_model contexts, so mute the writes
        from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

        MLFLOW_LOGGING_STREAM.write = lambda text: None
        MLFLOW_LOGGING_STREAM.flush = lambda: None
    except ImportError:  # pragma: no cover - mlflow is a dependency
        pass
    try:  # transformers keeps its own verbosity (read from the env var only at its first import)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights" bars on every base-model load
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    quiet_prefect_console()


class _VeilConsole(logging.Filter):
    """See `quiet_prefect_console`."""

    OURS = tuple(str(Path(__file__).resolve().parents[2] / d) + "/" for d in ("flows", "components", "catalog"))

    def filter(self, record: logging.LogRecord) -> bool:
        from components.core.errors import VeilError

        exc = record.exc_info[1] if record.exc_info else None
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is shown as it is
            text = str(record.msg)
        if isinstance(exc, VeilError) or "VeilError" in text:
            return False
        if record.pathname.startswith(self.OURS):
            return True
        return record.levelno >= logging.WARNING or not record.name.startswith("prefect")


def quiet_prefect_console() -> None:
    """Prefect's console handler shows the engine's bookkeeping ("Beginning flow run", "Finished in
    state Completed()") and repeats a user error three times (task failed, task state, flow state),
    besides Veil's own one line. On the user's terminal keep Veil's own log lines (our flows' and
    library's) and Prefect's warnings and real errors; drop the engine's INFO chatter and every
    record of a VeilError. The API log handler is untouched: the server keeps the full run log."""
    try:
        import prefect.main  # noqa: F401 - configures Prefect's logging (its console handlers) on import
        from prefect.logging.handlers import PrefectConsoleHandler
    except ImportError:  # pragma: no cover - prefect is a dependency
        return
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    for logger in loggers:
        for h in getattr(logger, "handlers", []):
            if isinstance(h, PrefectConsoleHandler) and not any(isinstance(f, _VeilConsole) for f in h.filters):
                h.addFilter(_VeilConsole())
