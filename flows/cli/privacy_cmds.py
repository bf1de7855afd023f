"""`veil privacy …`: ε for a mechanism, σ for a target, per-secret KL and γ for a plan."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from components.core.errors import VeilError
from components.core.hashing import sha256_bytes
from components.core.settings import load_settings
from flows.cli.common import out, print_json as _print_json
from components.draws.annex import load_annex, plan_snapshot_ref
from components.mechanisms import get as get_mechanism


privacy = typer.Typer(help="Privacy accounting: ε for a mechanism, σ for a target, secrets' posterior bounds.",
                      no_args_is_help=True)

_MECH_HELP = "record | uls | els | group-naive | group-tight"


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
    from components.accounting import epsilon  # startup

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
    from components.accounting import calibrate  # startup

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


def _secret_ref(secret_id: str, show: bool) -> str:
    """Secret ids carry the secret's value ("credential:AKIA…"): print the class and a hash unless asked."""
    if show:
        return secret_id

    cls = secret_id.split(":", 1)[0]
    return f"{cls}:#{sha256_bytes(secret_id.encode())[:12]}"


@privacy.command("secrets")
def secrets_cmd(
    plan_path: Path = typer.Option(..., "--plan", help="plan JSON (veil.plan/v2; its annex must be in this Veil home)"),
    spans: Optional[Path] = typer.Option(None, "--spans", help="secret spans Parquet (default: the plan's snapshot)"),
    kappa: Optional[float] = typer.Option(None, "--kappa", help="prior κ for every secret (default: the policy's)"),
    gamma: Optional[float] = typer.Option(None, "--gamma", help="allowed posterior γ for every secret (default: the policy's)"),
    sensitivity: float = typer.Option(2.0, "--sensitivity", help="per-record sensitivity in clip norms (2: arbitrary change)"),
    top: int = typer.Option(20, "--top", help="rows in the table (JSON lists all)"),
    show_values: bool = typer.Option(False, "--show-values", help="print secret ids in clear (they hold the value)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document"),
) -> None:
    """Per-secret KL and posterior bound γ (seed 004, Lemma 3.2) at the plan's σ and T, worst first."""
    import pyarrow.parquet as pq

    from components.accounting.secrets import (DOMINANCE_NOTE, SENSITIVITY_REASON, SecretTarget, report_secrets,  # startup
                                               secret_rates)
    from components.planning.plan import load_plan  # startup

    from components.draws.data import train_rows  # startup


    plan = load_plan(plan_path).to_dict()
    annex = load_annex(load_settings().private_dir, plan)
    train = train_rows(annex)
    if spans is not None:
        if not spans.is_file():
            raise VeilError(f"--spans: {spans} does not exist")
        span_tbl = pq.read_table(spans)
    else:
        from catalog.snapshots import load_snapshot  # startup

        span_tbl = load_snapshot(load_settings(), plan_snapshot_ref(plan, annex)[0]).secret_spans

    per_user = get_mechanism(plan["mechanism"]).samples_users
    groups = secret_rates(train, span_tbl, sampling_rate=float(plan["sampling_rate"]), per_user=per_user)

    protection = None
    if kappa is None or gamma is None:
        pol_path = (plan.get("policy") or {}).get("path")
        if pol_path and Path(pol_path).is_file():
            from components.policy import load_policy  # startup

            secrets_spec = load_policy(pol_path).spec.secrets
            protection = secrets_spec.protection_of
    targets = []
    for sid, (cls, rates) in groups.items():
        k_, g_ = kappa, gamma
        if k_ is None or g_ is None:
            if protection is None:
                raise VeilError(f"{plan_path}: no policy file to read κ/γ from (policy.path); pass --kappa and --gamma")
            try:
                prot = protection(cls)
            except KeyError:
                raise VeilError(f"policy has no protection for secret class '{cls}'; pass --kappa and --gamma") from None
            k_ = prot.kappa if k_ is None else k_
            g_ = prot.gamma if g_ is None else g_
        targets.append(SecretTarget.make(sid, rates, k_, g_))
    reports = report_secrets(targets, float(plan["noise_multiplier"]), int(plan["steps"]), sensitivity)
    classes = {sid: cls for sid, (cls, _) in groups.items()}
    rows = [{**r.to_dict(), "secret_id": _secret_ref(r.secret_id, show_values), "secret_class": classes[r.secret_id]}
            for r in reports]
    doc = {"plan_sha256": plan["sha256"], "mechanism": plan["mechanism"],
           "unit": "user (ULS: a user's clipped mean gradient)" if per_user else "record",
           "noise_multiplier": float(plan["noise_multiplier"]), "steps": int(plan["steps"]),
           "sensitivity": sensitivity, "sensitivity_reason": SENSITIVITY_REASON, "dominance": DOMINANCE_NOTE,
           "n_secrets": len(rows), "n_missing_target": sum(1 for r in rows if r["meets_target"] is False),
           "secrets": rows}
    if json_out:
        _print_json(doc)
        return
    t = Table(title=f"Secrets at σ={doc['noise_multiplier']:.5g}, T={doc['steps']} (worst first; "
                    f"{doc['n_missing_target']} of {len(rows)} above target)")
    for col in ("secret", "units", "Σ rate", "KL", "γ", "γ target", "κ", "ok"):
        t.add_column(col)
    for r in rows[:top]:
        t.add_row(r["secret_id"], str(r["n_records"]), f"{r['expected_sampled']:.3g}", f"{r['kl']:.4g}",
                  f"{r['gamma']:.4g}", f"{r['gamma_target']:.4g}", f"{r['kappa']:.3g}",
                  "[green]yes[/]" if r["meets_target"] else "[red]no[/]")
    out.print(t)
    out.print(f"sensitivity {sensitivity:g} per {'user' if per_user else 'record'}: {SENSITIVITY_REASON}")


def register(app: typer.Typer) -> None:
    app.add_typer(privacy, name="privacy")
