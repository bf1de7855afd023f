"""Helpers the published-section leak tests share: the numbers a published document holds, and an
independent computation of the audit's AUROC interval ends (Newcombe's, by bisection on the Hanley–McNeil
variance: not components.audit.verdict.auroc_interval's code)."""
from __future__ import annotations

import numpy as np

from components.audit.verdict import hm_variance


def published_numbers(doc, out: list | None = None) -> list[float]:
    """Every number in a published JSON-like document (booleans, None and strings are not numbers)."""
    out = [] if out is None else out
    if isinstance(doc, bool) or doc is None or isinstance(doc, str):
        return out
    if isinstance(doc, (int, float)):
        out.append(float(doc))
    elif isinstance(doc, dict):
        for v in doc.values():
            published_numbers(v, out)
    else:
        for v in doc:
            published_numbers(v, out)
    return out


def newcombe_ends(a_hat: np.ndarray, n_in: int, n_out: int, z: float, iters: int = 60) -> list[np.ndarray]:
    """[lower ends, upper ends] of Newcombe's interval, vectorised over Â: for each edge, the point nearest
    that edge still inside {a : (a − Â)² ≤ z² · HM-variance(a)}, by bisection."""
    out = []
    for edge in (0.0, 1.0):
        inside, outside = a_hat.copy(), np.full_like(a_hat, edge)
        f = lambda a: (a - a_hat) ** 2 - z * z * hm_variance(a, n_in, n_out)  # noqa: E731
        at_edge = f(outside) <= 0
        for _ in range(iters):
            mid = (inside + outside) / 2
            ok = f(mid) <= 0
            inside, outside = np.where(ok, mid, inside), np.where(ok, outside, mid)
        out.append(np.where(at_edge, edge, inside))
    return out
