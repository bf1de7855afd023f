"""The audit's outputs: ROC plot, private per-user evidence, and the certificate's audit section.

Per-user scores and secret ids are membership/secret evidence. They are written only to
`<home>/catalog-private/audits/<audit_id>*.parquet` (owner-only permissions). Everything else this
module produces — the section and the plot — is an aggregate.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from components.audit.ceiling import tpr_ceiling
from components.audit.metrics import roc_from_groups

SECTION_SCHEMA = "veil.audit/v1"


def private_dir(settings) -> Path:
    d = Path(settings.home) / "catalog-private" / "audits"
    d.mkdir(parents=True, exist_ok=True)
    for p in (d.parent, d):
        os.chmod(p, 0o700)
    return d


def ref_key(settings) -> bytes:
    """This installation's key for naming secrets in reports (HMAC): a plain hash of a phone number
    could be inverted by trying all 10^7 numbers; a keyed one cannot without the key."""
    p = private_dir(settings).parent / "audit-ref.key"
    if not p.is_file():
        tmp = p.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(os.urandom(32))
        tmp.replace(p)
    return p.read_bytes()


def secret_ref(key: bytes, secret_id: str) -> str:
    return hmac.new(key, secret_id.encode(), "sha256").hexdigest()[:12]


def write_private(settings, audit_id: str, scores: pa.Table, secrets: pa.Table | None = None) -> Path:
    """Per-user scores (and per-secret rows) of one audit, readable by the owner only."""
    d = private_dir(settings)
    path = d / f"{audit_id}.parquet"
    _write(path, scores)
    if secrets is not None and secrets.num_rows:
        _write(d / f"{audit_id}.secrets.parquet", secrets)
    return path


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
        from components.audit.ceiling import tpr_ceiling_from_pld

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
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
