"""A deterministic scorer around the real audit code path, for privacy tests that need many audits.

`install` replaces only the two functions that run a language model — the per-sample log-likelihood
ratio (`run.score_samples`) and log p(continuation | context) (`exposure.continuation_logprobs`) —
so everything the audit computes from those numbers (statistics, verdicts, the public section, the
registry records) is the real code. The "model" scores a string by a hash-seeded standard normal,
plus `bonus` for the planted secret: a model that has memorised that one string that much.
"""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

MODEL = SimpleNamespace(name="fine-tuned")
REFERENCE = SimpleNamespace(name="base")
CTX = "you can reach me on "


def hash_normal(strings) -> np.ndarray:
    from scipy.stats import norm

    u = [(int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "big") + 0.5) / 2 ** 64 for s in strings]
    return norm.ppf(np.asarray(u))


def model_logprob(model, strings, planted: str | None, bonus: float) -> np.ndarray:
    base = hash_normal(strings)
    if model is MODEL and planted is not None:
        base = base + bonus * np.array([s == planted for s in strings], dtype=float)
    return base


def install(monkeypatch, *, planted: str | None = None, bonus: float = 0.0) -> None:
    import components.audit.exposure as exposure
    import components.audit.run as run

    def continuation_logprobs(model, tokenizer, ctxs, conts, **kw):
        return model_logprob(model, list(conts), planted, bonus)

    def score_samples(model, tokenizer, texts, **kw):
        return np.array([float(t.split("|")[1]) for t in texts])

    monkeypatch.setattr(exposure, "continuation_logprobs", continuation_logprobs)
    monkeypatch.setattr(run, "score_samples", score_samples)


def samples(n_in: int, n_out: int, *, m: int = 2, shift: float = 0.0, seed: int = 0) -> pa.Table:
    """(user_id, text, member): text carries the sample's log-likelihood ratio (N(shift, 1) for members)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_in + n_out):
        member = i < n_in
        u = f"person{i:04d}@people.example"
        for j in range(m):
            rows.append({"user_id": u, "text": f"s{j}|{rng.normal(shift if member else 0.0, 1.0)!r}",
                         "member": member})
    return pa.Table.from_pylist(rows)


def loaded(epsilon: float | None = 2.0, delta: float = 1e-5, thresholds: dict | None = None):
    cert = ({"privacy_unit": "user", "epsilon": epsilon, "delta": delta, "sha256": "c" * 64} if epsilon is not None
            else {"privacy_unit": "record", "epsilon": 1.0, "delta": delta, "sha256": "c" * 64})
    plan = {"sha256": "p" * 64, "training": {"seq_len": 64, "seed": 0}, "data": {"snapshot_id": "snap-1"},
            "audit": {"thresholds": thresholds or {"max_user_inference_auroc": 0.65, "max_secret_exposure": 6.0}}}
    return SimpleNamespace(model=MODEL, tokenizer=None, certificate=cert, plan=plan)


EMPTY_RECORDS = pa.table({"record_id": pa.array([], pa.string()), "text": pa.array([], pa.string())})


def truth(*values: str) -> dict:
    return {"secrets": [{"secret_id": f"phone:{v}", "class": "phone", "value": v, "context": CTX} for v in values]}
