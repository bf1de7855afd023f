"""Sample a synthetic corpus through a PMixED ensemble: every record is a PMixED answer to a public prompt.

Unlike a corpus sampled from a DP model (generate.py: post-processing of weights already released), here
each token is a fresh private release: it is drawn from the ensemble's mixture (components.prediction,
docs/privacy/pmixed.md) and costs the ensemble's token budget. So:

* **charge before draw**, as serving does: `charge()` durably counts one private token and says yes
  before that token is drawn, and the loop stops at the first no (`stop_when_refused`: no public-only
  tail inside a private record) — the budget goes down by exactly the tokens drawn;
* **no seed and no sampling settings**: the ensemble draws from the OS CSPRNG at its certified
  temperature (a caller-known seed would make the output a deterministic function of the adapters,
  and a top-p or temperature of the caller's would sample a distribution the certificate does not
  cover);
* a record the budget cut short is kept (its tokens were drawn and charged); the loop then stops and
  says so (`stopped_by_budget`).

This module takes the ensemble object (anything with `generate(prompt, max_tokens, charge=…,
stop_when_refused=True)` and `max_positions`); it imports no data, no catalog, no prediction code.
"""
from __future__ import annotations

from collections.abc import Callable

from components.core.errors import VeilError
from components.synthetic.prompts import UNCONDITIONAL, Prompts

SAMPLER = ("PMixED: each token drawn from the ensemble's mollified mixture at its certified temperature, with the "
           "OS CSPRNG (no seed, no caller temperature or top-p); charged to the ensemble's token budget before it "
           "was drawn")


def check_budget(records: int, max_new_tokens: int, remaining: int, ensemble_id: str) -> None:
    """Refuse up front a corpus the budget cannot hold at its longest: records × max_new_tokens ≤ remaining."""
    need = int(records) * int(max_new_tokens)
    if need > int(remaining):
        fit = int(remaining) // int(max_new_tokens)
        raise VeilError(f"--records {records} × --max-new-tokens {max_new_tokens} = {need} private tokens, but "
                        f"ensemble {ensemble_id[:12]}… has {remaining} left: at most {fit} record"
                        f"{'s' if fit != 1 else ''} of {max_new_tokens} tokens fit (or ask fewer tokens per record)")


def generate_pmixed_records(ensemble, records: int, max_new_tokens: int, charge: Callable[[], bool],
                            prompts: Prompts | None = None, progress=None) -> tuple[list[dict], dict]:
    """Up to `records` records {"index", "control_code", "text"} (text = prompt text + the answer), and
    the run's facts {"tokens_charged", "records", "stopped_by_budget", "tokens_per_record"}.

    `charge()`: one durable private token, True before each draw (False: the budget is spent)."""
    if not 1 <= int(records) <= 10_000_000:
        raise VeilError(f"--records {records}: must be between 1 and 10000000")
    if not 1 <= int(max_new_tokens) <= 4096:
        raise VeilError(f"--max-new-tokens {max_new_tokens}: must be between 1 and 4096")
    conditioned = prompts is not None
    prompts = prompts or UNCONDITIONAL
    out: list[dict] = []
    per_record: list[int] = []
    charged = 0
    stopped = False
    for prompt, count in zip(prompts.prompts, prompts.allot(int(records))):
        for _ in range(count):
            g = ensemble.generate(prompt.text, int(max_new_tokens), charge=charge, stop_when_refused=True)
            if g["public_tokens"]:
                # stop_when_refused draws no public token; one here would be outside what was charged
                raise VeilError("synthesize --pmixed: the ensemble drew a public-only token inside a record")
            charged += int(g["private_tokens"])
            if g["ids"]:
                out.append({"index": len(out), "control_code": prompt.code if conditioned else None,
                            "text": prompt.text + g["text"]})
                per_record.append(len(g["ids"]))
            if progress is not None:
                progress(len(out))
            if g["refused"]:
                stopped = True
                break
        if stopped:
            break
    return out, {"tokens_charged": charged, "records": len(out), "stopped_by_budget": stopped,
                 "tokens_per_record": per_record}
