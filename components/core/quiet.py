"""One place that keeps third-party noise off the operator's screen and out of Prefect's logs.

Libraries write advice to their own developers: transformers' FutureWarnings and its tokenizer
length notice, MLflow's pickling and type-hint warnings (with raw ANSI colour codes in a log), its
"Downloading artifacts" progress bars, the Hugging Face hub's bars, Prefect's telemetry. None of it
is for the person running Veil. Called at the CLI's start, at the import of every Prefect flow
module (a worker's flow-run process imports the entrypoint: the same filters apply there), and
where a consumer's plain `mlflow.pyfunc.load_model` enters Veil's code (the pyfunc's load_context).

What is *not* silenced: errors, and warnings raised by Veil's own code (components/, flows/,
catalog/) — privacy notices among them: filters here are scoped to third-party modules, except
Deprecation/FutureWarnings, which are notices for library developers by definition.

`quiet_environment()` sets environment variables only (cheap, no import: safe before Prefect,
transformers or MLflow are imported, which read some of them once at import). `quiet_third_party()`
also configures the libraries' loggers and warning filters (imports them: call it where they are
used anyway).
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from components.core.errors import VeilError

# env var → value; `setdefault`: an operator who wants a library's output back can still set it
ENVIRONMENT = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",        # the "process just got forked" notice (training forks data workers)
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",   # hundreds of "Downloading artifacts" bars per load
    "MLFLOW_LOGGING_LEVEL": "ERROR",           # read when mlflow configures its loggers
    # Prefect: no telemetry heartbeat from a temporary server (its SQLite write raced the flow's and
    # printed a "database is locked" traceback), no client analytics.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}

# Not noise, but read once at Prefect's import like the above: an ephemeral Prefect server (no
# PREFECT_API_URL) gets 3 minutes to start instead of Prefect's 20 s, which a loaded host (load ~13 on 2
# cores, a cron'd retrain among other jobs) exceeds (issue 28). Prefect counts this in polling rounds
# of ~0.1 s, so under load the real wait is longer still. An operator's own value wins (setdefault).
PREFECT_STARTUP = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}

THIRD_PARTY = ("mlflow", "transformers", "peft", "torch", "pydantic", "huggingface_hub", "tokenizers",
               "sqlalchemy", "alembic", "pandas", "setuptools", "pkg_resources", "opacus", "dask", "distributed")


def quiet_environment() -> None:
    for k, v in {**ENVIRONMENT, **PREFECT_STARTUP}.items():
        os.environ.setdefault(k, v)


class _ThirdPartyWarnings(logging.Filter):
    """Drops `py.warnings` records (warnings routed into logging, as Prefect does) from third-party files."""

    def __init__(self, paths: tuple[str, ...]):
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001
            return True
        return not any(p in text for p in self.paths)


def _paths() -> tuple[str, ...]:
    return tuple(f"{os.sep}{m}{os.sep}" for m in THIRD_PARTY)


def quiet_third_party(*, prefect: bool = True) -> None:
    """Environment, warning filters, library loggers, and (with `prefect`) Prefect's console (see
    module doc). A consumer's model load passes prefect=False: it need not import Prefect at all."""
    quiet_environment()
    for module in THIRD_PARTY:
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
    # MLflow re-enables its own UserWarnings (`filter_user_warnings_once` inserts a "once" filter in
    # front of ours) and colours them (`color_warning`: raw ANSI codes in a Prefect log): drop
    # third-party warnings where they are shown, too — directly, or through the `py.warnings`
    # logger when Prefect captures warnings into logging.
    paths = _paths()
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
    for name in ("mlflow", "transformers", "peft", "alembic", "huggingface_hub", "torch", "opacus",
                 "prefect._internal.analytics", "prefect.server.services.telemetry"):
        logging.getLogger(name).setLevel(logging.ERROR)
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
    if prefect:
        quiet_prefect_console()


class _VeilConsole(logging.Filter):
    """See `quiet_prefect_console`."""

    OURS = tuple(str(Path(__file__).resolve().parents[2] / d) + "/" for d in ("flows", "components", "catalog"))

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is shown as it is
            text = str(record.msg)
        if isinstance(exc, VeilError) or "VeilError" in text or "StepFailed" in text:
            return False
        if getattr(record, "veil_console", True) is False:   # meant for the run's log only (flows.pipeline.log_step)
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
