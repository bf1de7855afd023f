"""Progress for every step that takes more than a few seconds, on stderr (stdout stays --json's).

On a terminal: a rich bar (label, bar, done/total, time left, and live fields such as the loss).
Elsewhere (a pipe, CI, a Prefect worker's log): plain lines, one when the step starts, one every
`VEIL_PROGRESS_SECONDS` (default 30) and one when it ends — never carriage-return bars, which a log
shows as hundreds of lines. `VEIL_PROGRESS=0` turns both off.

Only counts the operator would see anyway (steps, batches, texts) go through here; callers print
nothing private in `fields` (stderr is the operator's terminal, but a worker's log may be shipped).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator


def enabled() -> bool:
    return os.environ.get("VEIL_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("VEIL_PROGRESS_SECONDS", "30")))
    except ValueError:
        return 30.0


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@contextlib.contextmanager
def progress(label: str, total: int | None, *, on: bool = True, transient: bool = False,
             stream=None) -> Iterator[Callable[..., None]]:
    """`with progress("evaluate", n) as advance: … advance(k, loss="1.23")`. `on=False` (or
    VEIL_PROGRESS=0): a no-op. `fields` are shown after the count (plain text)."""
    if not (on and enabled()):
        yield lambda k=1, **fields: None
        return
    stream = sys.stderr if stream is None else stream
    if getattr(stream, "isatty", lambda: False)():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
        with Progress(*cols, console=Console(file=stream), transient=transient) as p:
            task = p.add_task(label, total=total, info="")

            def advance(k: int = 1, **fields) -> None:
                p.update(task, advance=k, info=" ".join(f"{a} {b}" for a, b in fields.items()))
            yield advance
        return
    t0 = time.monotonic()
    state = {"done": 0, "last": t0, "fields": {}}
    every = _interval()

    def line(word: str) -> None:
        done, el = state["done"], time.monotonic() - t0
        count = f"{done}/{total}" if total else f"{done}"
        eta = ""
        if total and 0 < done < total and word == "…":
            eta = f", about {_clock(el / done * (total - done))} left"
        extra = "".join(f" · {a} {b}" for a, b in state["fields"].items())
        print(f"{label}: {count} {word} ({_clock(el)} elapsed{eta}){extra}", file=stream, flush=True)

    print(f"{label}: started ({total} to do)" if total else f"{label}: started", file=stream, flush=True)

    def advance(k: int = 1, **fields) -> None:
        state["done"] += k
        state["fields"].update(fields)
        now = time.monotonic()
        if every and now - state["last"] >= every:
            state["last"] = now
            line("…")
    yield advance       # an exception propagates from here: no "done" line for a step that failed
    line("done")


@contextlib.contextmanager
def step(label: str, *, on: bool = True, stream=None) -> Iterator[None]:
    """A step with no count (registration, loading a model): a spinner on a terminal, else a start
    and an end line with the time it took."""
    if not (on and enabled()):
        yield
        return
    stream = sys.stderr if stream is None else stream
    t0 = time.monotonic()
    if getattr(stream, "isatty", lambda: False)():
        from rich.console import Console

        console = Console(file=stream)
        with console.status(f"{label}…", spinner="dots"):
            yield
        console.print(f"{label}: done ({_clock(time.monotonic() - t0)})", highlight=False)
        return
    print(f"{label}: started", file=stream, flush=True)
    yield
    print(f"{label}: done ({_clock(time.monotonic() - t0)})", file=stream, flush=True)
