"""What a PMixED policy's token budget buys, in the units a product owner thinks in: requests and keys.

Everything here is a function of policy values only (T, the per-request cap, the per-key quota, an
optional number of keys the operator expects), so it is public and can be shown before anything is built.

Why it matters: T counts *tokens* for the endpoint's whole life, whoever asks (docs/privacy/pmixed.md). A
512-token budget with 64-token requests is 8 full private answers in total; after that every answer is
public-only. The sizing says so before a build, not after the 9th request.
"""
from __future__ import annotations

import math

from components.prediction import mechanism as mech

# The server commits private tokens in blocks of up to this many before drawing them (budget.prepaid): a
# request that stops early (EOS) leaves up to BLOCK − 1 granted tokens unused, and they stay spent.
BLOCK = 8
# Below this many full-length private requests in the endpoint's whole life, the plan says so loudly.
FEW_REQUESTS = 100


def sizing(*, token_budget: int, max_tokens_per_request: int, key_quota_tokens: int | None = None,
           keys: int | None = None) -> dict:
    """Private tokens per request, requests in total and per key, keys served at full quota."""
    T, m = int(token_budget), int(max_tokens_per_request)
    Q = None if key_quota_tokens is None else int(key_quota_tokens)
    per_request = min(m, T)
    out = {
        "token_budget": T,
        "max_tokens_per_request": m,
        "private_tokens_per_request": per_request,
        "full_private_requests": T // m,
        # the worst case of the block commit: every request stops after its first token
        "min_private_requests": math.ceil(T / min(BLOCK, m)),
        "key_quota_tokens": Q,
        "requests_per_key": None if Q is None else Q // m,
        "keys_at_full_quota": None if Q is None else T // Q,
        "keys": None if keys is None else int(keys),
        "private_tokens_per_key": Q,
    }
    if keys:
        share = T // int(keys) if Q is None else min(Q, T // int(keys))
        out["private_tokens_per_key"] = share
        out["requests_per_key"] = share // m
    out["hints"] = hints(out)
    return out


def hints(s: dict) -> list[str]:
    h = []
    if s["full_private_requests"] < FEW_REQUESTS:
        h.append(f"the whole endpoint gets {s['full_private_requests']} private answers of "
                 f"{s['max_tokens_per_request']} tokens for its lifetime, then public-only text: raise token_budget "
                 "(the radius shrinks: see the table) or lower max_tokens_per_request")
    if s["key_quota_tokens"] is None:
        h.append("no key_quota_tokens: the first key to ask can spend the whole budget")
    elif s["requests_per_key"] == 0:
        h.append(f"key_quota_tokens ({s['key_quota_tokens']}) is below max_tokens_per_request: no key gets one "
                 "full-length private answer")
    if s["keys"] and s["requests_per_key"] == 0 and s["key_quota_tokens"] is None:
        h.append(f"shared by {s['keys']} keys, the budget is {s['private_tokens_per_key']} private tokens per key: less "
                 "than one full-length private answer each")
    if s["keys"] and s["key_quota_tokens"] and s["keys"] > s["keys_at_full_quota"]:
        h.append(f"{s['keys']} keys at {s['key_quota_tokens']} tokens each need {s['keys'] * s['key_quota_tokens']} "
                 f"tokens; the budget has {s['token_budget']}: later keys get less than their quota")
    return h


def radius_table(*, epsilon: float, delta: float, q: float, token_budget: int,
                 factors=(0.5, 1, 2, 4)) -> list[dict]:
    """The privacy/utility trade: a larger T is more private answers, each closer to the public model
    (a smaller mollifier radius, in nats of log-probability each member may move)."""
    rows = []
    for f in factors:
        t = max(1, int(round(token_budget * f)))
        rows.append({"token_budget": t, "radius": mech.calibrate_radius(epsilon=epsilon, delta=delta, tokens=t, q=q)})
    return rows


def plan(spec, *, keys: int | None = None) -> dict:
    """The sizing view of a PredictionPolicy's spec: what `veil pmixed plan` shows and `build` prints first."""
    s = sizing(token_budget=spec.token_budget, max_tokens_per_request=spec.max_tokens_per_request,
               key_quota_tokens=spec.key_quota_tokens, keys=keys)
    radius = mech.calibrate_radius(epsilon=spec.target.epsilon, delta=spec.target.delta,
                                   tokens=spec.token_budget, q=spec.subsample_rate)
    return {"sizing": s, "epsilon": float(spec.target.epsilon), "delta": float(spec.target.delta),
            "shards": int(spec.shards), "subsample_rate": float(spec.subsample_rate), "radius": radius,
            "token_epsilon": mech.token_epsilon(spec.subsample_rate, radius),
            "when_exhausted": spec.when_exhausted,
            "tradeoff": radius_table(epsilon=spec.target.epsilon, delta=spec.target.delta, q=spec.subsample_rate,
                                     token_budget=spec.token_budget)}
