"""The PMixED HTTP endpoint (FastAPI): POST /v1/completions with a bearer key.

    request  {"prompt": str, "max_tokens": int ≥ 1}        (any other field → 422: no seeds, no logprobs)
    response {"text", "tokens",
              "private": [bool per returned token: drawn from the private ensemble, or from the public model],
              "private_tokens", "public_only_reason": null | "budget_spent" | "key_quota_spent",
              "budget_remaining_tokens", "key_quota_remaining_tokens": int | null (no quota)}

401 without a valid (unrevoked) key; 413 for a body over `max_body_bytes` (from its Content-Length, or while it
streams in, before anything is parsed); 422 with one line naming the field on a malformed body, a prompt longer
than the model's positions could hold (checked in characters before tokenising: `Ensemble.check_prompt`) or one
that is not valid Unicode (a lone surrogate); when the ensemble's private
budget — or, with a policy `key_quota_tokens`, the calling key's quota — is spent, the policy decides:
"public_only" answers from the public model (free, flagged per token), "refuse" answers 429.

Why the per-token flags are safe to return: private tokens are always a prefix of the answer, of length
min(tokens granted, tokens returned). The grant is a function of the request and of the two durable counters,
which count the private tokens of earlier answers; the answer's length is where the sampled EOS fell. So the
flags are a post-processing of the DP transcript (all answers) and the public requests: they reveal nothing
about anyone's data beyond the text the guarantee already covers (docs/privacy/pmixed.md, "What a response says").
Every private token is committed to the durable budget before it is drawn (components/prediction/budget.py).
"""
from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from components.core.errors import VeilError
from components.prediction.budget import QUOTA_SPENT
from components.publication import publish


def create_app(*, ensemble, budget, ensemble_id: str, when_exhausted: str, max_tokens_cap: int,
               certificate: dict | None = None, key_quota: int | None = None, max_body_bytes: int | None = None):
    max_body = int(max_body_bytes) if max_body_bytes else default_max_body_bytes(ensemble)
    app = FastAPI(title="Veil PMixED endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def err(status: int, msg: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": msg})

    def parse(body: Any) -> tuple[str, int] | str:
        if not isinstance(body, dict):
            return "body: expected a JSON object {\"prompt\": str, \"max_tokens\": int}"
        extra = sorted(set(body) - {"prompt", "max_tokens"})
        if extra:
            return (f"{extra[0]}: not accepted (this endpoint returns sampled tokens only; no seeds, "
                    "log-probabilities, top-k or sampling parameters)")
        p, n = body.get("prompt"), body.get("max_tokens")
        if not isinstance(p, str) or not p:
            return "prompt: expected a non-empty string"
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return "max_tokens: expected an integer ≥ 1"
        if n > max_tokens_cap:
            return f"max_tokens: at most {max_tokens_cap} per request"
        try:
            ensemble.check_prompt(p)  # length in characters and valid Unicode, before any tokenising
        except VeilError as e:
            return str(e)
        return p, n

    too_large = f"body: larger than this endpoint's limit of {max_body} bytes (veil serve --max-body-bytes)"

    async def read_body(request: Request) -> bytes | JSONResponse:
        """The body, or a 413 as soon as it is known to exceed the cap: from Content-Length before reading a byte,
        else while it streams in (chunked), so an oversize body is never held in memory whole."""
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                return err(400, "Content-Length: not a non-negative integer")
            if int(declared) > max_body:
                return err(413, too_large)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                return err(413, too_large)
            chunks.append(chunk)
        return b"".join(chunks)

    @app.post("/v1/completions")
    async def completions(request: Request):
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if not await run_in_threadpool(budget.key_ok, key):
            return JSONResponse(status_code=401, content={"error": "missing or invalid API key (Authorization: "
                                                                   "Bearer KEY; create one with `veil keys create`)"},
                                headers={"WWW-Authenticate": "Bearer"})
        raw = await read_body(request)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            body = json.loads(raw)
        except Exception:  # noqa: BLE001 - any unparsable body (bad UTF-8, too deeply nested) is the caller's error
            return err(422, "body: not valid JSON")
        parsed = parse(body)
        if isinstance(parsed, str):
            return err(422, parsed)
        prompt, n = parsed
        if when_exhausted == "refuse":
            if await run_in_threadpool(budget.remaining, ensemble_id) <= 0:
                return err(429, "the private token budget of this ensemble is spent; the policy refuses further "
                                "requests")
            if key_quota is not None and await run_in_threadpool(budget.key_remaining, ensemble_id, key,
                                                                 key_quota) <= 0:
                return err(429, f"this key's quota of {key_quota} private tokens is spent; the policy refuses "
                                "further requests")
        charge = budget.prepaid(ensemble_id, min(8, n), key=key, quota=key_quota)

        def run():
            # committed in blocks of ≤ 8 before any of them is drawn: one fsync per block, ≤ 7 wasted per request
            return ensemble.generate(prompt, n, charge=charge)

        try:
            out = await run_in_threadpool(run)
        except VeilError as e:
            return err(422, str(e))
        if when_exhausted == "refuse" and out["public_tokens"]:
            # budget ran out mid-request: public tokens are free, but "refuse" means no public answers —
            # return only what was private
            out["ids"] = out["ids"][:out["private_tokens"]]
            out["public_tokens"] = 0
            out["text"] = ensemble.tokenizer.decode([t for t in out["ids"] if t != ensemble.tokenizer.eos_token_id],
                                                    skip_special_tokens=True)
            if not out["ids"]:
                return err(429, "this key's private-token quota is spent" if charge.reason == QUOTA_SPENT
                           else "the private token budget of this ensemble is spent")
        remaining = await run_in_threadpool(budget.remaining, ensemble_id)
        key_left = (None if key_quota is None
                    else await run_in_threadpool(budget.key_remaining, ensemble_id, key, key_quota))
        k = out["private_tokens"]
        return publish("pmixed.response", {
            "text": out["text"], "tokens": len(out["ids"]),
            # generation draws privately until the first refused charge, then publicly: a prefix
            "private": [True] * k + [False] * (len(out["ids"]) - k),
            "private_tokens": k,
            "public_only_reason": charge.reason if out["public_tokens"] else None,
            "budget_remaining_tokens": remaining, "key_quota_remaining_tokens": key_left}, subject=ensemble_id)

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    return app


def default_max_body_bytes(ensemble) -> int:
    """The largest body a prompt that fits could need: JSON may escape each code point as up to 12 bytes
    (a surrogate pair, \\uXXXX\\uXXXX), plus 4 KiB for the rest of the object."""
    return 12 * int(ensemble.max_prompt_chars) + 4096
