"""The audit's outputs: the private report and plots, the public plot.

Per-user scores, per-secret rows, the exact aggregates and the full ROC are membership and secret
evidence. They are written only under `settings.private_dir / "audit"` (owner-only permissions),
which replaced `VEIL_HOME/catalog-private/audits` (moved over on first use). What may be published
is built in `public`; the public plot here draws the certificate's ceilings and the quantized AUROC
band, never the measured curve.
"""
from __future__ import annotations

import hmac
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.audit.ceiling import tpr_ceiling, tpr_ceiling_from_pld
from components.audit.metrics import roc_from_groups
from components.audit.public import SECTION_SCHEMA  # noqa: F401  (re-exported for old imports)


def _private_root(settings) -> Path:
    root = getattr(settings, "private_dir", None)
    return Path(root) if root is not None else Path(settings.home) / "private"


def private_dir(settings) -> Path:
    """`<private_dir>/audit`, 0700, with anything left under the old `catalog-private/` moved in."""
    root = _private_root(settings)
    d = root / "audit"
    d.mkdir(parents=True, exist_ok=True)
    for p in (root, d):
        os.chmod(p, 0o700)
    old = Path(settings.home) / "catalog-private"
    if old.is_dir():
        if (old / "audit-ref.key").is_file() and not (d / "ref.key").exists():
            shutil.move(str(old / "audit-ref.key"), str(d / "ref.key"))
        if (old / "audits").is_dir():
            for f in (old / "audits").iterdir():
                if not (d / f.name).exists():
                    shutil.move(str(f), str(d / f.name))
        for sub in (old / "audits", old):
            try:
                sub.rmdir()
            except OSError:
                pass
    return d


def ref_key(settings) -> bytes:
    """This installation's key for naming secrets in reports (HMAC): a plain hash of a phone number
    could be inverted by trying all 10^7 numbers; a keyed one cannot without the key."""
    p = private_dir(settings) / "ref.key"
    if not p.is_file():
        tmp = p.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(os.urandom(32))
        tmp.replace(p)
    return p.read_bytes()


def secret_ref(key: bytes, secret_id: str) -> str:
    return hmac.new(key, secret_id.encode(), "sha256").hexdigest()[:12]


def write_private(settings, audit_id: str, scores: pa.Table, secrets: pa.Table | None = None,
                  report: dict | None = None) -> Path:
    """Per-user scores, per-secret rows and the exact report of one audit, readable by the owner only."""
    d = private_dir(settings)
    path = d / f"{audit_id}.parquet"
    _write(path, scores)
    if secrets is not None and secrets.num_rows:
        _write(d / f"{audit_id}.secrets.parquet", secrets)
    if report is not None:
        tmp = d / f"{audit_id}.json.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=_jsonable)
        tmp.replace(d / f"{audit_id}.json")
    return path


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _write(path: Path, table: pa.Table) -> None:
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def roc_plot(scores: np.ndarray, labels: np.ndarray, path: str | Path, *, epsilon: float | None,
             delta: float | None, title: str = "User inference", canary: tuple | None = None,
             pld=None) -> Path:
    """ROC (linear and log axes) with the (ε, δ)-DP ceiling 1 − f(FPR), the (tighter) ceiling from
    the certified mechanism's privacy-loss distribution when `pld` is given, and the chance line."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    y = np.asarray(labels, bool)
    s = np.asarray(scores, float)
    fpr, tpr, _ = roc_from_groups(s[y], s[~y])
    grid = np.logspace(-4, 0, 400)
    pld_curve = None
    if pld is not None:
        pld_curve = tpr_ceiling_from_pld(grid, pld)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), dpi=110)
    for ax, log in zip(axes, (False, True)):
        ax.plot(fpr, tpr, lw=1.8, label=f"real users ({y.sum()} in / {(~y).sum()} out)")
        if canary is not None:
            cs, cy = np.asarray(canary[0], float), np.asarray(canary[1], bool)
            if cy.any() and (~cy).any():
                cf, ct, _ = roc_from_groups(cs[cy], cs[~cy])
                ax.plot(cf, ct, lw=1.2, ls="--", label="canary users")
        if epsilon is not None and delta is not None:
            ax.plot(grid, tpr_ceiling(grid, epsilon, delta), color="crimson", lw=1.2,
                    label=f"DP ceiling (ε={epsilon:.3g}, δ={delta:.1g})")
        if pld_curve is not None:
            ax.plot(grid, pld_curve, color="darkorange", lw=1.2, label="ceiling of the certified mechanism (PLD)")
        _finish_roc_axes(ax, grid, log)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def ceiling_plot(path: str | Path, *, epsilon: float | None, delta: float | None, pld=None,
                 auroc_bucket=None, verdict: str | None = None, title: str = "User inference") -> Path:
    """The public plot: the certificate's TPR ceilings (from (ε, δ) and from the mechanism's PLD) and,
    for the published AUROC bucket [a, b], the band between the binormal ROCs of AUROC a and b
    (TPR = Φ(Φ⁻¹(FPR) + √2 Φ⁻¹(A))): an illustration of the quantized value, not the measured curve,
    which is a fine-grained function of private scores and stays in the private report."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from scipy.stats import norm

    grid = np.logspace(-4, 0, 400)
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), dpi=110)
    band = None
    if auroc_bucket is not None:
        def binormal(a):
            a = min(max(float(a), 1e-6), 1 - 1e-6)
            return norm.cdf(norm.ppf(grid) + np.sqrt(2) * norm.ppf(a))
        band = (binormal(auroc_bucket[0]), binormal(auroc_bucket[1]))
    for ax, log in zip(axes, (False, True)):
        if band is not None:
            ax.fill_between(grid, band[0], band[1], color="steelblue", alpha=0.3,
                            label=f"published AUROC bucket [{auroc_bucket[0]:g}, {auroc_bucket[1]:g}] "
                                  "(binormal illustration)")
        if epsilon is not None and delta is not None:
            ax.plot(grid, tpr_ceiling(grid, epsilon, delta), color="crimson", lw=1.2,
                    label=f"DP ceiling (ε={epsilon:.3g}, δ={delta:.1g})")
        if pld is not None:
            ax.plot(grid, tpr_ceiling_from_pld(grid, pld), color="darkorange", lw=1.2,
                    label="ceiling of the certified mechanism (PLD)")
        _finish_roc_axes(ax, grid, log)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{title}: {(verdict or 'not gated').upper()} (not covered by the certificate)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _finish_roc_axes(ax, grid, log: bool) -> None:
    """The chance line, scales, limits and labels both ROC plots share (linear and log panels)."""
    ax.plot(grid, grid, color="grey", lw=0.8, ls=":", label="chance")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-3, 1)
        ax.set_ylim(1e-3, 1.02)
    else:
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.grid(alpha=0.3)
