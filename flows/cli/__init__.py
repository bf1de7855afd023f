"""The `veil` command line. Each area registers its commands from its own module (flows/cli/*_cmds.py).

User errors (`VeilError`) print one line to stderr and exit 2, never a traceback.

A command pays only for its own module (issue 23: `veil --help` ≤ 0.5 s). `COMMANDS` below names each
command, the module that registers it and the first paragraph of its help; the top-level group imports a
module when one of its commands is looked up (to run it, or to print its own --help), and `veil --help`
is drawn from the table (flows.cli.top_help) without importing any. tests/core/test_cli_startup.py checks
the table against what the modules register, and the drawing against typer's.
"""
from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import typer
import typer.core
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_command_name, get_group_from_info

from components.core.errors import VeilError
from components.core.quiet import quiet_environment
from components.core.settings import private_umask
from flows.cli import top_help
from flows.prefect_boundary import original_error

# Before any command imports Prefect, transformers or MLflow: some of their switches are read once, at import.
quiet_environment()


@dataclass(frozen=True)
class _AsGiven(RuntimeParam):
    """A `str` or `bool` parameter's conversion when the value already is one (what the shell gives a
    str argument, and a flag its bool): that value, unchanged, which is what typer's own conversion
    returns for it. typer (0.29) converts every value through a pydantic TypeAdapter, built on the
    parameter's first use — `--help`'s included: importing pydantic and building them is ~0.2 CPU s,
    a tenth of `veil verify`. Any other value (a default of another type) goes to typer's conversion.
    tests/core/test_cli_startup.py checks the two agree, and that typer still converts this way."""

    def _coerce_value(self, value, param, ctx):
        if type(value) is self.annotation:
            return value
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)


def _runtime_param(d: TypeDescriptor) -> RuntimeParam:
    if d.annotation in (str, bool) and d.file_annotation is None and d.parameter_info.parser is None:
        return _AsGiven(parameter_info=d.parameter_info, annotation=d.annotation)
    return build_runtime_param(d)


typer.core.build_runtime_param = _runtime_param   # where typer's parameters look it up (typer.core's module top)

# (command, module in flows/cli that registers it, first paragraph of its help), in `veil --help`'s order:
# a module's commands in the order it registers them, the groups (sub-typers) last, as typer lists them.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("demo", "core_cmds", "The whole run on the demo organization: data → ingest → plan → DP fine-tune → certify → "
                          "register → audit."),
    ("approve", "core_cmds", "Answer a retraining paused for a promoter's approval (the Prefect UI's Resume form does "
                             "the same).\nA name not in the policy's release.promoters is refused by the run, which "
                             "waits on."),
    ("demo-data", "core_cmds", "Write the deterministic synthetic organization (messages, public corpus, planted-secret "
                               "truth)."),
    ("base-model", "core_cmds", "Train a tokenizer and a small causal LM from config on public text, with progress "
                                "(cached by corpus and\noptions). A tiny base limits every model built on it: "
                                "`--layers 4 --width 256 --steps 2000` on `system`\ntext is a stronger start than the "
                                "2×128, 200-step default (see `veil plan`'s hints and the run summary)."),
    ("run", "core_cmds", "The whole pipeline on your own data, through Prefect (or, with --no-prefect, in this "
                         "process)."),
    ("retrain", "core_cmds", "One retraining, through the flow the schedule runs: skipped (no spend) when the data "
                             "eligible for\ntraining did not change; else train, certify, register, audit, and promote "
                             "to `production` only on a\npassed audit (and, when the policy names release.promoters, "
                             "once one of them approved the paused run)."),
    ("train", "core_cmds", "Run a plan: DP fine-tuning exactly as planned (resumes from its last checkpoint)."),
    ("register", "core_cmds", "Register a trained run of PLAN in MLflow with its certificate (refused if ε exceeds the "
                              "policy's)."),
    ("models", "core_cmds", "Registered model versions with their certificates; `verified` only when every check "
                            "passes."),
    ("ingest", "catalog_cmds", "Ingest a source into the catalog: users, secrets, quarantine, and a new immutable "
                               "snapshot."),
    ("secrets", "catalog_cmds", "List tagged secrets with the number of records and users each appears in."),
    ("plan", "policy_cmds", "Turn a policy and a snapshot into a plan: sampling rate, calibrated σ, bounded data, audit "
                            "split;\nand what the per-person ledger says about releasing it: how many releases of it a "
                            "person can still\ntake, and how many people its release would retire."),
    ("audit", "audit_cmds", "Audit a registered model: user inference vs the DP ceiling, canaries, secret exposure."),
    ("evaluate", "evaluate_cmds", "Perplexity and next-token accuracy of a registered model and its base on the "
                                  "evaluation people\n(reserved at plan time, never trained on): exact here, for you; a "
                                  "DP release on the model's run."),
    ("synthesize", "synthetic_cmds", "Sample a synthetic corpus from a registered, verified model: certified (it "
                                     "inherits the model's\nguarantee), sealed, scanned for secrets, recorded in the "
                                     "ledger (no extra charge) and registered."),
    ("audit-synthetic", "synthetic_cmds", "The canary echo audit of a synthetic corpus: how much of each trained "
                                          "canary's random suffix the\ncorpus echoes, against held-out canaries and the "
                                          "certificate's ceiling. Reads the corpus, never the model."),
    ("verify", "verify_cmds", "Verify a registered model: signature, hashes, ε recomputed, weights/base/tokenizer/plan, "
                              "tags."),
    ("signing-key", "verify_cmds", "The signing key's public half and fingerprint (create it if needed), and the "
                                   "trusted keys."),
    ("ledger", "ledger_cmds", "Budget, releases and the Rényi orders (for governance readers); with --admin, for "
                              "administrators\nonly, the number of people and retirements, the spread of per-person "
                              "spend and per secret class the\nsecrets charged and their max lifetime KL and γ. "
                              "Per-person and per-secret rows go only to the private\narea, a burn-down plot to "
                              "VEIL_HOME."),
    ("serve", "serve_cmds", 'Serve a PMixED ensemble: POST /v1/completions {"prompt", "max_tokens"} with '
                            "Authorization: Bearer KEY."),
    ("study", "study_cmds", "Train and evaluate every point of GRID (mechanism, ε, selection, k, LoRA/full) as tuning "
                            "runs:\nnothing is charged, certified or registered. Tuning on private data is not covered "
                            "by any certificate."),
    ("catalog", "catalog_cmds", "Inspect the catalog: statistics, snapshots, quarantine."),
    ("policy", "policy_cmds", "Check and inspect privacy policies (YAML, see policies/README.md)."),
    ("privacy", "privacy_cmds", "Privacy accounting: ε for a mechanism, σ for a target, secrets' posterior bounds."),
    ("pmixed", "pmixed_cmds", "Private prediction: an ensemble served token by token under a token budget."),
    ("keys", "serve_cmds", "API keys for `veil serve` (stored hashed)."),
)
_MODULE = {name: module for name, module, _ in COMMANDS}


class _VeilGroup(TyperGroup):
    """Turns VeilError (and malformed-input errors we name) into one line + exit 2."""

    def invoke(self, ctx: typer.Context):
        private_umask()  # everything written under VEIL_HOME is the owner's only, whatever the shell's umask
        try:
            return super().invoke(ctx)
        except VeilError as e:
            e = _for_the_operator(e)
            typer.echo(f"error: {e}", err=True)
            _operator_detail(e)
            _release_native_objects(e)
            raise typer.Exit(2) from None
        except RuntimeError as e:
            said = prefect_unreachable(e)
            if said is None:
                raise
            typer.echo(f"error: {said}", err=True)
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
        typer.echo(f"  for you only (never logged or published): {detail}", err=True)


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


@functools.cache
def registered(module: str) -> typer.Typer:
    """A Typer holding what flows/cli/<module>.py registers (imported on first use, once per process)."""
    t = typer.Typer()
    importlib.import_module(f"flows.cli.{module}").register(t)
    return t


class _Commands(Mapping):
    """The top-level group's commands by name: the names from COMMANDS; a command built, as typer builds
    it, from its module's registration the first time it is looked up."""

    def __init__(self, group: TyperGroup):
        self._group = group
        self._built: dict = {}

    def __iter__(self):
        return iter(_MODULE)

    def __len__(self) -> int:
        return len(_MODULE)

    def __contains__(self, name) -> bool:
        return name in _MODULE

    def __getitem__(self, name: str):
        if name not in self._built:
            self._built[name] = _build(registered(_MODULE[name]), name, self._group)
        return self._built[name]


def _build(t: typer.Typer, name: str, group: TyperGroup):
    kw = dict(pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=group.rich_markup_mode)
    for info in t.registered_commands:
        if (info.name or get_command_name(info.callback.__name__)) == name:
            return get_command_from_info(info, **kw)
    for info in t.registered_groups:
        sub = get_group_from_info(info, suggest_commands=group.suggest_commands, **kw)
        if sub.name == name:
            return sub
    raise LookupError(f"flows.cli.COMMANDS names `{name}` in flows/cli/{_MODULE[name]}.py, which does not register it")


class _LazyGroup(_VeilGroup):
    """`veil`: its commands are COMMANDS, each module imported when one of its commands is looked up."""

    def __init__(self, *, commands=None, **kw):
        if commands:
            raise TypeError(f"register {', '.join(commands)} in flows.cli.COMMANDS, not on the app")
        super().__init__(**kw)
        self.commands = _Commands(self)

    def format_help(self, ctx, formatter) -> None:
        if self.rich_markup_mode is None:   # typer's plain drawing (no rich): it lists every command
            return super().format_help(ctx, formatter)
        top_help.draw(self, ctx, [(name, help_) for name, _, help_ in COMMANDS])


app = typer.Typer(
    name="veil",
    cls=_LazyGroup,
    help="Veil: fine-tune language models on your organization's text with provable privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


# typer builds a group only for an app with a callback or registered commands; this app's commands come from
# COMMANDS, so it has a callback that does nothing (no docstring: the app's help is the one above).
@app.callback()
def _veil() -> None:
    pass


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
