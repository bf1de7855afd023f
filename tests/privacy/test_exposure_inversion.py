"""A planted secret must not be recoverable from the published audit section (issue 11, item 3).

The old section published, for each "worst" secret, its exposure, rank and `exposure_extrapolated` —
−log2 of a normal tail at log p(secret | context): invert it, score every number of the org's phone
block under the released model, and the true number is the one that reproduces the published value.

Here the released "model" has memorised a planted number a little (the deterministic scorer of
`_audit_stub`: a hash-seeded normal per string, plus a bonus for the planted one), so that the model
alone ranks it somewhere in the block but not first. The audit runs for real. The attacker holds the
model, the context, the block of 1000 numbers, the plan's seed and the public section, and inverts
every number the section publishes: for each candidate it recomputes what the audit computes for a
secret (`secret_exposure`, same seed and candidate count) and looks for candidates that reproduce a
published number. The true number must rank no better than it does under the model alone.
"""
import json

import numpy as np

import _audit_stub as stub
from _published import published_numbers
from components.audit.run import run_audit
from components.audit.exposure import SecretProbe, secret_exposure

BLOCK = [f"+1-555-013-{i:04d}" for i in range(4000, 5000)]    # the org's 10^3-number phone block
PLANTED = BLOCK[377]
N_CANDIDATES = 100


def _audit(monkeypatch, settings, planted, bonus):
    stub.install(monkeypatch, planted=planted, bonus=bonus)
    return run_audit(stub.loaded(2.0), stub.EMPTY_RECORDS, settings=settings, reference=stub.REFERENCE,
                     samples=stub.samples(40, 40, seed=3), truth=stub.truth(planted), bootstrap=10,
                     n_candidates=N_CANDIDATES, plot=False)


def test_published_section_does_not_locate_the_planted_secret(monkeypatch, settings):
    bonus = 2.0
    model_only = stub.model_logprob(stub.MODEL, BLOCK, PLANTED, bonus)
    rank_model_only = 1 + int(np.sum(model_only > model_only[BLOCK.index(PLANTED)]))
    assert 3 <= rank_model_only <= 500, rank_model_only     # the model alone narrows it down, no more

    res = _audit(monkeypatch, settings, PLANTED, bonus)
    published = published_numbers(res.summary())
    seed = 0   # the plan's training seed: public

    # the attacker: every candidate's own audit row, under the released model
    fields = []
    for c in BLOCK:
        row = secret_exposure(stub.MODEL, None, [SecretProbe(f"phone:{c}", "phone", c, stub.CTX)],
                              n_candidates=N_CANDIDATES, seed=seed, seq_len=64, reference=stub.REFERENCE,
                              ref_key=b"attacker")[0]
        fields.append([float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)])
    hits = np.zeros(len(BLOCK))
    for v in published:
        match = np.array([any(abs(f - v) <= 1e-9 * max(1.0, abs(v)) for f in fs) for fs in fields])
        if 0 < match.sum() <= len(BLOCK) // 100:      # a published number that singles out a few candidates
            hits += match / match.sum()   # rarer matches say more
    order = sorted(range(len(BLOCK)), key=lambda i: (-hits[i], -model_only[i]))
    rank_with_audit = 1 + order.index(BLOCK.index(PLANTED))
    assert rank_with_audit >= rank_model_only, (rank_with_audit, rank_model_only)


def test_public_section_is_the_same_whichever_secret_was_planted(monkeypatch, settings):
    """Two releases that memorised two different numbers equally: their public audit sections are
    identical (apart from the time stamp), so no function of the section tells the numbers apart."""
    docs = []
    for planted in (BLOCK[17], BLOCK[912]):
        s = _audit(monkeypatch, settings, planted, bonus=8.0).summary()
        s.pop("created_at", None)
        docs.append(json.dumps(s, sort_keys=True))
        assert planted not in docs[-1]
    assert docs[0] == docs[1]
