"""The `veil` command line. Each area registers its commands from its own module.

User errors (`VeilError`) print one line to stderr and exit 2, never a traceback.
"""
from __future__ import annotations

import sys

import click
import typer
from typer.core import TyperGroup

from components.core.errors import VeilError
from components.core.quiet import quiet_environment
from components.core.settings import private_umask
from flows.prefect_boundary import original_error

# Before any command imports Prefect, transformers or MLflow: some of their switches are read once, at import.
quiet_environment()


class _VeilGroup(TyperGroup):
    """Turns VeilError (and malformed-input errors we name) into one line + exit 2."""

    def invoke(self, ctx: click.Context):
        private_umask()  # everything written under VEIL_HOME is the owner's only, whatever the shell's umask
        try:
            return super().invoke(ctx)
        except VeilError as e:
            e = _for_the_operator(e)
            click.echo(f"error: {e}", err=True)
            _operator_detail(e)
            _release_native_objects(e)
            raise typer.Exit(2) from None
        except RuntimeError as e:
            said = prefect_unreachable(e)
            if said is None:
                raise
            click.echo(f"error: {said}", err=True)
            _release_native_objects(e)
            raise typer.Exit(2) from None


def prefect_unreachable(e: BaseException) -> str | None:
    """One line for Prefect's own start-up failures (a 70-line traceback otherwise, issue 28): the
    ephemeral server did not answer in time, or PREFECT_API_URL names a server that does not answer.
    None for any other error (a real bug keeps its traceback)."""
    import os

    text = str(e)
    if text.startswith("Timed out while attempting to connect to ephemeral Prefect API server"):
        waited = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "?")
        return (f"Prefect's temporary server did not start within PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="
                f"{waited} s (a loaded machine): raise that setting, or run a Prefect server (`prefect server start`) "
                "and point PREFECT_API_URL at it; nothing was started")
    if text.startswith("Failed to reach API at "):
        url = text[len("Failed to reach API at "):].strip()
        return (f"the Prefect server at PREFECT_API_URL={url} does not answer: start it, or unset PREFECT_API_URL to "
                "run on a temporary server")
    return None


def _for_the_operator(e: VeilError) -> VeilError:
    """What Prefect saw of a failed task or flow is a `StepFailed` that names the step only
    (flows.prefect_boundary); this terminal is the operator's: show the original error — re-raised with its
    traceback when it is a bug, as before."""
    orig = original_error(e)
    if orig is e or isinstance(orig, VeilError):
        return orig
    raise orig


def _operator_detail(e: VeilError) -> None:
    """The error's private detail (ids the operator needs to act on), on this terminal only."""
    detail = getattr(e, "operator_detail", None)
    if detail:
        click.echo(f"  for you only (never logged or published): {detail}", err=True)


def _release_native_objects(e: BaseException) -> None:
    """A failed flow keeps the exception (and, through its traceback, the frames holding DuckDB
    connections) in Prefect's state objects; freed only at interpreter exit, nanobind prints a
    "leaked instances" dump over the user's one-line error. Drop the frames and collect now."""
    import gc
    import traceback

    tb = e.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)
    e.__traceback__ = None
    gc.collect()


app = typer.Typer(
    name="veil",
    cls=_VeilGroup,
    help="Veil: fine-tune language models on your organization's text with provable privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Registration order is the order of `veil --help`.
from flows.cli import core_cmds, catalog_cmds, policy_cmds, privacy_cmds, audit_cmds, verify_cmds  # noqa: E402
from flows.cli import ledger_cmds, pmixed_cmds, serve_cmds, evaluate_cmds, study_cmds  # noqa: E402
from flows.cli import synthetic_cmds  # noqa: E402

for _module in (core_cmds, catalog_cmds, policy_cmds, privacy_cmds, audit_cmds, evaluate_cmds, synthetic_cmds,
                verify_cmds, ledger_cmds, pmixed_cmds, serve_cmds, study_cmds):
    _module.register(app)


def main() -> None:
    private_umask()
    try:
        app()
    except VeilError as e:  # raised outside a command (e.g. while loading settings)
        e = _for_the_operator(e)
        print(f"error: {e}", file=sys.stderr)
        _operator_detail(e)
        _release_native_objects(e)
        sys.exit(2)
    except RuntimeError as e:
        said = prefect_unreachable(e)
        if said is None:
            raise
        print(f"error: {said}", file=sys.stderr)
        sys.exit(2)
