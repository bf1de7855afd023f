"""What a failed Veil task or flow shows Prefect (issue 22: Prefect readers are readers of what Veil publishes).

Prefect records a failure three times, all sent to its API: the task's log line `Task run failed with
exception: <repr>` with its traceback, the state message `Task run encountered an exception <Type>: <str>`,
and the same again for the flow. A bug's message and traceback hold whatever values it raised on — a
KeyError holds the missing key, a person's id — and a VeilError's message is written for the operator (it
may quote exact counts). So every Veil task and flow body runs under `prefect_safe`: whatever it raises
reaches Prefect as a `StepFailed` whose message is published through the gate (`prefect:failure`: the
step's name and the exception's type name, nothing else), and the reason goes to the operator only:

  * in this process, on the exception (`StepFailed.original`: the CLI prints the original message and
    its operator detail, or re-raises a bug with its traceback — the terminal reads as before);
  * on disk, in the private area (`<private_dir>/failures/<time>-<step>.txt`, owner-only) for a run with
    no terminal (a served deployment's worker).

A pickled copy (a Prefect state, a process pool's result) is a plain VeilError with the public message.
Prefect's own control-flow exceptions (pause, abort, cancellation) pass through untouched.
"""
from __future__ import annotations

import datetime as _dt
import functools
import traceback
from pathlib import Path

from components.core.errors import VeilError
from components.core.settings import load_settings, Settings
from components.publication import publish

FAILURES_DIR = "failures"


class StepFailed(VeilError):
    """A Veil task or flow failed; the message is the gate's `prefect:failure` (step and type only)."""

    def __init__(self, step: str, original: BaseException, record: str | None = None):
        failure = publish("prefect", {"failure": {"step": step, "error": type(original).__name__,
                                                  "record": record}})["failure"]
        where = (f"on the operator's terminal and in the private area ({FAILURES_DIR}/{failure['record']})"
                 if failure["record"] else "on the operator's terminal")
        super().__init__(f"{failure['step']} failed ({failure['error']}); the reason is for the operator only: "
                         f"{where}")
        self.original = original          # in this process only: never pickled, never logged
        self.exit_code = getattr(original, "exit_code", 1)

    def __reduce__(self):
        return (VeilError, (str(self),))


def original_error(e: BaseException) -> BaseException:
    """The exception a `StepFailed` stands for (itself otherwise): what the operator and the flow's own
    decisions read."""
    seen = 0
    while isinstance(e, StepFailed) and getattr(e, "original", None) is not None and seen < 8:
        e, seen = e.original, seen + 1
    return e


def _passes_through(e: BaseException) -> bool:
    """Prefect's control flow (pause timeouts, aborts, cancellations) and an already wrapped failure."""
    return isinstance(e, StepFailed) or type(e).__module__.split(".")[0] == "prefect"


def _private_dir(args, kwargs) -> Path | None:
    """The private area of the VEIL_HOME the task or flow works on (its `home`/`settings` argument, the
    first positional one of a task, or VEIL_HOME), or None when none can be found."""
    for cand in (kwargs.get("settings"), kwargs.get("home"), *(args[:1])):
        if isinstance(cand, Settings):
            return Path(cand.private_dir)
        if isinstance(cand, (str, Path)) and Path(cand).is_dir():
            try:
                return Path(load_settings(cand).private_dir)
            except Exception:  # noqa: BLE001 - a bad home: no file, the terminal still has the reason
                return None
    try:
        return Path(load_settings(kwargs.get("home")).private_dir)
    except Exception:  # noqa: BLE001
        return None


def _record(step: str, e: BaseException, args, kwargs) -> str | None:
    """Write the reason (message, operator detail, traceback) to the private area; its file name."""
    private = _private_dir(args, kwargs)
    if private is None or not private.is_dir():
        return None
    out = private / FAILURES_DIR
    try:
        out.mkdir(mode=0o700, exist_ok=True)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        name = f"{stamp}-{step}.txt"
        detail = getattr(e, "operator_detail", None)
        text = "".join([f"{type(e).__name__}: {e}\n", f"for the operator only: {detail}\n" if detail else "",
                        "".join(traceback.format_exception(type(e), e, e.__traceback__))])
        path = out / name
        path.touch(mode=0o600)
        path.write_text(text)
        return name
    except OSError:
        return None


def prefect_safe(step: str):
    """Run a task's or flow's body so that Prefect sees only `StepFailed` (see the module docstring)."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - every failure crosses into Prefect: none may carry data
                if _passes_through(e):
                    raise
                raise StepFailed(step, e, _record(step, e, args, kwargs)) from None
        wrapper.prefect_safe_step = step       # tests/privacy/test_prefect_failures.py finds every wrapped body
        return wrapper
    return deco
