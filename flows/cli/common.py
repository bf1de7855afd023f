"""What every CLI module shares: settings from the environment, consoles, strict JSON output."""
from __future__ import annotations

import json

from components.core.device import resolve_device
from components.core.settings import Settings, load_settings


class _Console:
    """rich's Console, made on first use: a command's `--json` path prints one JSON document and
    needn't import rich (~0.05 CPU s of every command; bench/startup.py)."""

    def __init__(self, **kw):
        self._kw = kw
        self._console = None

    def __getattr__(self, name):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kw)
        return getattr(self._console, name)


out = _Console()
err = _Console(stderr=True)  # progress and messages: stdout stays one JSON document with --json


def settings() -> Settings:
    """Settings from VEIL_HOME / veil.toml / env, folders created, Prefect + HF pointed at them."""
    s = load_settings().ensure()
    s.apply_environment()
    return s


def settings_with_device() -> Settings:
    """`settings()` for a command that loads a model: the configured device must exist now — one
    line, exit 2 — not after minutes of ingest and model loading (issue 26: 49 s)."""
    s = settings()
    check_device_now(s)
    return s


def check_device_now(s: Settings) -> str:
    src = (s.sources or {}).get("device", "$VEIL_DEVICE")
    return resolve_device(s.device, "VEIL_DEVICE" if src == "$VEIL_DEVICE" else f"device in {src}")


def print_json(doc) -> None:
    """Exactly one JSON document on stdout (NaN/inf are refused: they are not JSON)."""
    print(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False, default=str))


# One place for third-party quiet (components.core.quiet): the CLI, the flows and the consumer's load share it.
from components.core.quiet import quiet_prefect_console, quiet_third_party  # noqa: E402,F401
