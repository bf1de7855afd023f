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

import numpy as np

from components.ledger.ledger import Ledger, pld_estimate_max
from components.core.errors import VeilError
from components.draws.annex import load_annex
from components.draws.data import train_rows
from components.ledger import store as st
from components.ledger.release import forecast_release, releases_for_fresh_person
from components.mechanisms import get as get_mechanism
from components.renyi.costs import Budget
from components.planning.plan import load_plan

PEOPLE_CSV = "ledger-people.csv"
SECRETS_CSV = "ledger-secrets.csv"
BURN_DOWN_PNG = "ledger-burndown.png"


def write_private_rows(ledger: Ledger, private_dir: Path) -> Path:
    """Per-person spend (pseudonym, ε, releases charged, times retired), 0600, private area only.

    The bytes `csv.writer` writes (QUOTE_MINIMAL, CRLF; a float as its repr), made faster for 10⁶ people:
    each distinct value is formatted once (people charged alike share their ε and counts), and lines are
    joined in chunks — unless some field would need quoting (then csv.writer itself writes the file)."""
    path = Path(private_dir) / PEOPLE_CSV
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    keys, eps, charges, retired = ledger.person_table()
    cols = [keys, [""] * len(keys) if eps is None else _formatted(eps, repr), _formatted(charges, str),
            _formatted(retired, str)]
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["person_key", "epsilon", "releases_charged", "times_retired"])
        if any(_needs_quoting(c) for c in cols):
            w.writerows(zip(*cols))
        else:
            line = "{},{},{},{}\r\n".format
            for i in range(0, len(keys), _CSV_CHUNK):
                f.write("".join(map(line, *(c[i:i + _CSV_CHUNK] for c in cols))))
    tmp.replace(path)
    return path


_CSV_CHUNK = 100_000


def _formatted(values, fmt) -> list[str]:
    """`fmt` of each value, computed once per distinct value (by its bits: -0.0 and 0.0 stay apart)."""
    a = np.asarray(values)
    if not len(a):
        return []
    bits = a.view(np.int64) if a.dtype == np.float64 else a.astype(np.int64)
    u, first, inv = np.unique(bits, return_index=True, return_inverse=True)
    text = [fmt(x) for x in a[first].tolist()]
    return [text[i] for i in np.asarray(inv).reshape(-1).tolist()]


def _needs_quoting(col: list[str]) -> bool:
    """Whether csv.writer (QUOTE_MINIMAL) would quote or escape some field of `col`."""
    joined = "".join(col)
    return any(c in joined for c in (",", '"', "\r", "\n"))


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
    """Max, median and min spend ε(δ) over people after each release (releases counted 1, 2, … on the x
    axis, integers only), from 0 up to above the lifetime budget's line. Aggregates only."""
    rows = ledger.burn_down()
    if not rows:
        return None
    import matplotlib.pyplot as plt

    fig = burn_down_figure(rows, ledger.budget())
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def burn_down_figure(rows: list[dict], b):
    """The burn-down figure of `Ledger.burn_down()` rows under budget `b` (None: no budget line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x = list(range(1, len(rows) + 1))
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.plot(x, [r["max_epsilon"] for r in rows], marker="o", label="max over people")
    ax.plot(x, [r["median_epsilon"] for r in rows], marker=".", label="median over people")
    ax.plot(x, [r["min_epsilon"] for r in rows], marker="v", label="min over people")
    top = max(r["max_epsilon"] for r in rows)
    if b is not None:
        ax.axhline(b.epsilon, color="red", linestyle="--", label=f"lifetime budget ε={b.epsilon:g}")
        top = max(top, b.epsilon)
    ax.set_ylim(0.0, 1.08 * top if top > 0 else 1.0)
    ax.set_xlim(0.5, len(rows) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("release (in the order charged)")
    ax.set_ylabel(f"spend ε at δ={b.delta:g}" if b else "spend ε")
    ax.set_title("Per-person privacy ledger: burn-down (Rényi filter)")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return fig


def latest_plan(settings, led: Ledger) -> Path | None:
    """The plan file of the ledger's most recent release that has one under plans_dir (what the next
    release of a retraining will most resemble); None when there is none."""
    import json as _json

    from sqlalchemy import select


    with st.read_only(led.engine) as conn:
        rows = conn.execute(select(st.releases.c.plan_sha256, st.releases.c.kind)
                            .order_by(st.releases.c.id.desc())).all()
    for r in rows:
        if r.plan_sha256 and r.kind != "population":
            path = Path(settings.plans_dir) / f"{r.plan_sha256}.json"
            if path.is_file():
                try:
                    _json.loads(path.read_text())
                except ValueError:
                    continue
                return path
    return None


def plan_forecast(settings, led: Ledger, plan_doc: dict) -> dict | None:
    """What the ledger says about more releases of this plan (issue 26), in two parts:

    `public`: how many releases of it a person who has spent nothing can take — a function of the plan's
    public fields, the budget and the ledger's grid and conversion (no person moves it);
    `people` (PRIVATE, administrators only): over the plan's people, the min and median of the releases of
    it each can still take, and how many people its next reservation would retire — priced and filtered
    exactly as the reservation does (Ledger.forecast). None without a budget."""


    budget = led.budget() or Budget.parse(plan_doc.get("lifetime_budget"))
    if budget is None or not get_mechanism(str(plan_doc.get("mechanism"))).ledger_curve:
        return None         # nobody is ever retired / a mechanism the ledger prices by other means
    # the recorded shares, or (no budget fixed yet) the ledger's rule by name: its shares for this budget
    fresh = releases_for_fresh_person(plan_doc, budget, led.orders, led.conversion, led.filter_spec()[2])
    annex = load_annex(settings.private_dir, plan_doc)
    people = forecast_release(settings, plan_doc, train_rows(annex), ledger=led,
                              population_release_key=(annex.get("population") or {}).get("release_key"))
    return {"plan_sha256": plan_doc["sha256"], "mechanism": plan_doc["mechanism"],
            "public": {"releases_for_a_new_person": None if fresh == float("inf") else int(fresh)},
            "people": people}


def ledger_report(settings, *, estimate: bool = True, plan: Path | None = None) -> dict:
    """The whole `veil ledger` document (names nobody, but holds exact counts of people: split it with
    `governance_view` / `admin_view` before it is shown to anyone but an administrator). `plan`: the plan
    whose further releases are forecast (default: the latest release's plan, when its file is here)."""
    led = Ledger.open(settings)
    try:
        doc = led.summary()
        doc["post_processing_releases"] = led.post_processing_releases()
        path = Path(plan) if plan is not None else latest_plan(settings, led)
        doc["forecast"] = None
        if path is not None:
            try:
                doc["forecast"] = plan_forecast(settings, led, load_plan(path).to_dict())
            except VeilError:
                if plan is not None:       # asked for: say why not; the default plan is a best effort
                    raise
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


FORECAST_DEFINITION = ("releases of the forecast plan, one after the other, that a person who has spent nothing "
                       "is admitted to by the Rényi filter (the most rows the plan allows, its population estimate "
                       "included); null: any number. Per-person forecasts are administrators-only")


def governance_view(doc: dict) -> dict:
    """What governance readers may see (channel `cli.ledger`): values no person's presence moves."""
    out = {"budget": doc["budget"], "releases": doc["releases"], "orders": list(doc["orders"]),
           "conversion": doc["conversion"], "order_weights": doc.get("order_weights"),
           "order_weights_rule": doc.get("order_weights_rule"),
           "spend_definition": doc["spend_definition"], "secrets_definition": doc["secrets_definition"],
           "note": GOVERNANCE_NOTE}
    if doc.get("post_processing_releases"):   # synthetic corpora: what left, from which release (no charge)
        out["post_processing_releases"] = doc["post_processing_releases"]
    if doc.get("persons_not_covered"):   # a count of releases (no person moves it) and its fixed wording
        out["persons_not_covered"] = doc["persons_not_covered"]
    fc = doc.get("forecast")
    if fc:      # the plan's public fields, the budget and the grid only: what a new person can take
        out["forecast"] = {"plan_sha256": fc["plan_sha256"], **fc["public"],
                           "definition": FORECAST_DEFINITION}
    return out


def admin_view(doc: dict) -> dict:
    """The administrators-only part: everything `governance_view` leaves out, labelled as such."""
    keys = ("people", "retired", "spend", "pld_estimate", "secrets", "private_rows", "private_secret_rows",
            "burn_down_png")
    fc = doc.get("forecast") or {}
    return {"readers": ADMIN_ONLY, **{k: doc.get(k) for k in keys},
            "forecast": None if not fc else {"plan_sha256": fc["plan_sha256"], **(fc.get("people") or {})}}
