"""`veil privacy …`: ε for a mechanism, σ for a target, per-secret KL and γ for a plan."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from components.core.errors import VeilError

out = Console()

privacy = typer.Typer(help="Privacy accounting: ε for a mechanism, σ for a target, secrets' posterior bounds.",
                      no_args_is_help=True)

_MECH_HELP = "record | uls | els | group-naive | group-tight"


def _print_json(doc) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False))


def _fmt(x: Optional[float], spec: str = ".6g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "∞"
    return format(x, spec)


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    return t


@privacy.command("epsilon")
def epsilon_cmd(
    mechanism: str = typer.Option(..., "--mechanism", help=_MECH_HELP),
    sampling_rate: float = typer.Option(..., "--sampling-rate", help="Poisson sampling rate q ∈ (0, 1]"),
    noise_multiplier: float = typer.Option(..., "--noise-multiplier", help="σ, in units of the clip norm"),
    steps: int = typer.Option(..., "--steps", help="number of DP-SGD steps T"),
    delta: float = typer.Option(..., "--delta", help="δ ∈ (0, 1)"),
    k: int = typer.Option(1, "--k", help="records per user (els, group-*)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """ε at δ for T steps of a mechanism (pessimistic PLD, add/remove neighbouring)."""
    from components.accounting import epsilon

    res = epsilon(mechanism, sampling_rate=sampling_rate, noise_multiplier=noise_multiplier, steps=steps,
                  delta=delta, k=k)
    if json_out:
        _print_json(res.to_dict())
        return
    rows = [("mechanism", res.mechanism), ("ε", _fmt(res.epsilon)), ("δ", f"{res.delta:g}"),
            ("q", f"{res.sampling_rate:g}"), ("σ", f"{res.noise_multiplier:g}"), ("T", str(res.steps)),
            ("k", str(res.k)), ("neighbouring", res.neighbouring),
            ("accountant", f"PLD (dp-accounting {res.library_version}), pessimistic, Δ={res.discretization:g}"),
            ("time", f"{res.seconds:.2f} s")]
    rows += [("note", n) for n in res.notes]
    out.print(_kv_table("privacy epsilon", rows))


@privacy.command("calibrate")
def calibrate_cmd(
    mechanism: str = typer.Option(..., "--mechanism", help=_MECH_HELP),
    epsilon: float = typer.Option(..., "--epsilon", help="target ε"),
    delta: float = typer.Option(..., "--delta", help="δ ∈ (0, 1)"),
    sampling_rate: float = typer.Option(..., "--sampling-rate", help="Poisson sampling rate q ∈ (0, 1]"),
    steps: int = typer.Option(..., "--steps", help="number of DP-SGD steps T"),
    k: int = typer.Option(1, "--k", help="records per user (els, group-*)"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not read or write the calibration cache"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """The smallest noise multiplier σ meeting a target (ε, δ); cached under VEIL_HOME/cache."""
    from components.accounting import calibrate
    from components.core.settings import load_settings

    cache_dir = None if no_cache else load_settings().cache_dir / "accounting"
    cal = calibrate(mechanism, epsilon=epsilon, delta=delta, sampling_rate=sampling_rate, steps=steps, k=k,
                    cache_dir=cache_dir)
    if json_out:
        _print_json(cal.to_dict())
        return
    out.print(_kv_table("privacy calibrate", [
        ("mechanism", cal.mechanism), ("σ (noise multiplier)", f"{cal.noise_multiplier:.6g}"),
        ("ε achieved / target", f"{_fmt(cal.epsilon)} / {cal.target_epsilon:g}"), ("δ", f"{cal.delta:g}"),
        ("q", f"{cal.sampling_rate:g}"), ("T", str(cal.steps)), ("k", str(cal.k)),
        ("accountant", f"PLD (dp-accounting {cal.library_version}), pessimistic, Δ={cal.discretization:g}"),
        ("time", f"{cal.seconds:.2f} s" + (" (cached)" if cal.cached else "")),
    ]))


def register(app: typer.Typer) -> None:
    app.add_typer(privacy, name="privacy")
