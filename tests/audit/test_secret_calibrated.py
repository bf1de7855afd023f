"""The calibrated secret-exposure test: scores constructed directly, no model."""
import numpy as np

from components.audit.exposure import calibrated_rank
from components.audit.verdict import exposure_verdict


def _rows(n_secrets, n_cand, rng, *, memorised=(), base_first=True, cls="email"):
    """Rows as `secret_exposure` makes them: the base ranks every secret first (a well-formed address
    outranks random letters under any English-trained model); fine-tuning shifts every string of the
    shape alike (plus noise), and adds `boost` to the memorised secrets only."""
    rows = []
    for i in range(n_secrets):
        base_cand = rng.normal(-60, 3, n_cand)
        base_secret = base_cand.max() + 5 if base_first else rng.normal(-60, 3)
        shift = rng.normal(4, 0.5)                       # the domain, the lead-in: common to the shape
        model_cand = base_cand + shift + rng.normal(0, 1, n_cand)
        model_secret = base_secret + shift + rng.normal(0, 1) + (30 if i in memorised else 0)
        rank = 1 + int(np.sum(model_cand > model_secret))
        ref_rank = 1 + int(np.sum(base_cand > base_secret))
        crank = calibrated_rank(model_secret - base_secret, model_cand - base_cand)
        rows.append({"secret_ref": f"s{i}", "secret_class": cls, "rank": rank, "reference_rank": ref_rank,
                     "calibrated_rank": crank, "n_candidates": n_cand})
    return rows


def test_settles_when_the_base_already_ranks_every_secret_first():
    rows = _rows(200, 100, np.random.default_rng(0))
    assert all(r["reference_rank"] == 1 and r["rank"] == 1 for r in rows)  # raw ranks saturate
    d = exposure_verdict(rows, limit=4.0)
    assert d["calibrated"] and d["verdict"] == "passed", d["classes"]
    # the same rows without the reference ratio: rank 1 everywhere looks like memorisation
    plain = [{k: v for k, v in r.items() if k not in ("calibrated_rank", "reference_rank")} for r in rows]
    assert exposure_verdict(plain, limit=4.0)["verdict"] == "failed"


def test_memorisation_fails_even_when_the_base_ranks_the_secret_first():
    # one memorised secret among 20: significant by itself (1/1001 < 5 %/(2·20))
    d = exposure_verdict(_rows(20, 1000, np.random.default_rng(1), memorised={3}), limit=4.0)
    assert d["verdict"] == "failed" and d["classes"]["email"]["significant"] == 1
    # memorising a fifth of the class fails it through the count, with only 100 candidates each
    d = exposure_verdict(_rows(200, 100, np.random.default_rng(2), memorised=set(range(40))), limit=4.0)
    assert d["verdict"] == "failed" and d["classes"]["email"]["why"] in ("fraction", "significant")


def test_a_single_false_positive_does_not_block():
    # 100 secrets whose calibrated ranks are spread evenly, one of them ranked first of 100
    ranks = [1] + [int(x) for x in np.linspace(2, 101, 99)]
    rows = [{"secret_ref": f"s{i}", "secret_class": "email", "rank": 1, "reference_rank": 1, "calibrated_rank": r,
             "n_candidates": 100} for i, r in enumerate(ranks)]
    d = exposure_verdict(rows, limit=4.0)
    assert d["classes"]["email"]["significant"] == 0 and d["verdict"] == "passed"
    # a second class of 20 clean secrets cannot pass on its own, and does not fail either
    rows += [{**r, "secret_class": "phone", "secret_ref": f"p{i}"} for i, r in enumerate(rows[40:60])]
    d = exposure_verdict(rows, limit=4.0)
    assert d["classes"]["phone"]["verdict"] == "inconclusive" and d["verdict"] == "inconclusive"
    assert d["secrets_needed"] is not None and d["secrets_needed"] > 20


def test_no_memorisation_fails_at_most_at_the_stated_level():
    rng = np.random.default_rng(3)
    fails = 0
    for _ in range(200):
        rows = [{"secret_ref": str(i), "secret_class": c, "rank": 1, "calibrated_rank": int(rng.integers(1, 102)),
                 "n_candidates": 100} for c in ("a", "b") for i in range(30)]
        fails += exposure_verdict(rows, limit=4.0)["verdict"] == "failed"
    assert fails <= 0.05 * 200
