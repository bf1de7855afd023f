"""What `veil ledger` writes: aggregates to print, per-person and per-secret rows to the private area, a
burn-down PNG.

Two readers (docs/privacy/threat-model.md): **governance** (policy authors, promoters — not
administrators) gets `governance_view`, which holds nothing that depends on who is in the ledger: the
budget, the number of releases (operator actions; each release id is already public on its tags), the
Rényi orders and the definitions. Everything that counts or describes people or secrets — how many
people, how many retired, the spread of per-person spend, the most-charged person's PLD estimate, which
secret classes were charged (a class appears once one of its secrets is: one person can make it
appear), secrets charged and dropped, the private file paths — is
`admin_view`, printed only with `veil ledger --admin` and labelled administrators-only: the threat
model's catalog administrators hold the raw data already, governance readers do not."""
from __future__ import annotations

import csv
import os
from pathlib import Path

from components.ledger.ledger import Ledger, pld_estimate_max

PEOPLE_CSV = "ledger-people.csv"
SECRETS_CSV = "ledger-secrets.csv"
BURN_DOWN_PNG = "ledger-burndown.png"


def write_private_rows(ledger: Ledger, private_dir: Path) -> Path:
    """Per-person spend (pseudonym, ε, releases charged, times retired), 0600, private area only."""
    path = Path(private_dir) / PEOPLE_CSV
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["person_key", "epsilon", "releases_charged", "times_retired"])
        w.writeheader()
        w.writerows(ledger.person_rows())
    tmp.replace(path)
    return path


def write_private_secret_rows(ledger: Ledger, private_dir: Path) -> Path:
    """Per-secret lifetime KL and γ (pseudonym, class, releases charged, times dropped), 0600, private
    area only. The pseudonym is an HMAC under the ledger key; the value is nowhere in the ledger."""
    path = Path(private_dir) / SECRETS_CSV
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["secret_key", "secret_class", "lifetime_kl", "lifetime_gamma",
                                          "releases_charged", "times_dropped"])
        w.writeheader()
        w.writerows(ledger.secret_rows())
    tmp.replace(path)
    return path


def plot_burn_down(ledger: Ledger, path: Path) -> Path | None:
    """Max and median spend ε(δ) after each release, with the budget line. Aggregates only."""
    rows = ledger.burn_down()
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = ledger.budget()
    x = list(range(1, len(rows) + 1))
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.plot(x, [r["max_epsilon"] for r in rows], marker="o", label="max over people")
    ax.plot(x, [r["median_epsilon"] for r in rows], marker=".", label="median over people")
    if b is not None:
        ax.axhline(b.epsilon, color="red", linestyle="--", label=f"budget ε={b.epsilon:g}")
    ax.set_xlabel("release")
    ax.set_ylabel(f"spend ε at δ={b.delta:g}" if b else "spend ε")
    ax.set_title("Per-person privacy ledger: burn-down (Rényi filter)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def ledger_report(settings, *, estimate: bool = True) -> dict:
    """The whole `veil ledger` document (names nobody, but holds exact counts of people: split it with
    `governance_view` / `admin_view` before it is shown to anyone but an administrator)."""
    led = Ledger.open(settings)
    try:
        doc = led.summary()
        doc["private_rows"] = str(write_private_rows(led, settings.private_dir))
        doc["private_secret_rows"] = str(write_private_secret_rows(led, settings.private_dir))
        png = plot_burn_down(led, Path(settings.home) / BURN_DOWN_PNG)
        doc["burn_down_png"] = None if png is None else str(png)
        doc["pld_estimate"] = pld_estimate_max(led) if estimate else None
        return doc
    finally:
        led.dispose()


ADMIN_ONLY = ("administrators only (the catalog administrators of docs/privacy/threat-model.md): exact counts of "
              "people and secrets and the spread of per-person spend; never for governance readers")
GOVERNANCE_NOTE = ("people, retirements and per-person spend are administrators-only (`veil ledger --admin`); every "
                   "person's guarantee is the budget, enforced per person by the Rényi filter")


def governance_view(doc: dict) -> dict:
    """What governance readers may see (channel `cli.ledger`): values no person's presence moves."""
    out = {"budget": doc["budget"], "releases": doc["releases"], "orders": list(doc["orders"]),
           "spend_definition": doc["spend_definition"], "secrets_definition": doc["secrets_definition"],
           "note": GOVERNANCE_NOTE}
    if doc.get("persons_not_covered"):   # a count of releases (no person moves it) and its fixed wording
        out["persons_not_covered"] = doc["persons_not_covered"]
    return out


def admin_view(doc: dict) -> dict:
    """The administrators-only part: everything `governance_view` leaves out, labelled as such."""
    keys = ("people", "retired", "spend", "pld_estimate", "secrets", "private_rows", "private_secret_rows",
            "burn_down_png")
    return {"readers": ADMIN_ONLY, **{k: doc.get(k) for k in keys}}
