"""The PMixED HTTP endpoint (FastAPI): POST /v1/completions with a bearer key.

    request  {"prompt": str, "max_tokens": int ≥ 1}        (any other field → 422: no seeds, no logprobs)
    response {"text", "tokens", "budget_remaining_tokens"}

401 without a valid key; 422 with one line naming the field on a malformed body; when the private budget is
spent the policy decides: "public_only" answers from the public model (free), "refuse" answers 429.
Every private token is committed to the durable budget before it is drawn (components/prediction/budget.py).
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from components.core.errors import VeilError


def create_app(*, ensemble, budget, ensemble_id: str, when_exhausted: str, max_tokens_cap: int,
               certificate: dict | None = None):
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
        return p, n

    @app.post("/v1/completions")
    async def completions(request: Request):
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if not await run_in_threadpool(budget.key_ok, key):
            return JSONResponse(status_code=401, content={"error": "missing or invalid API key (Authorization: "
                                                                   "Bearer KEY; create one with `veil keys create`)"},
                                headers={"WWW-Authenticate": "Bearer"})
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001 - any unparsable body is the caller's error
            return err(422, "body: not valid JSON")
        parsed = parse(body)
        if isinstance(parsed, str):
            return err(422, parsed)
        prompt, n = parsed
        if when_exhausted == "refuse" and await run_in_threadpool(budget.remaining, ensemble_id) <= 0:
            return err(429, "the private token budget of this ensemble is spent; the policy refuses further requests")

        def run():
            # committed in blocks of ≤ 8 before any of them is drawn: one fsync per block, ≤ 7 wasted per request
            charge = budget.prepaid(ensemble_id, min(8, n))
            return ensemble.generate(prompt, n, charge=charge)

        try:
            out = await run_in_threadpool(run)
        except VeilError as e:
            return err(422, str(e))
        if when_exhausted == "refuse" and out["public_tokens"]:
            # budget ran out mid-request: public tokens are free, but "refuse" means no public answers —
            # return only what was private
            out["ids"] = out["ids"][:out["private_tokens"]]
            out["text"] = ensemble.tokenizer.decode([t for t in out["ids"] if t != ensemble.tokenizer.eos_token_id],
                                                    skip_special_tokens=True)
            if not out["ids"]:
                return err(429, "the private token budget of this ensemble is spent")
        remaining = await run_in_threadpool(budget.remaining, ensemble_id)
        from components.publication import publish

        return publish("pmixed.response", {"text": out["text"], "tokens": len(out["ids"]),
                                           "budget_remaining_tokens": remaining}, subject=ensemble_id)

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    return app
