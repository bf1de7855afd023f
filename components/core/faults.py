"""A testing facility: SIGKILL this process at a named point of `veil retrain` (issue 28).

`VEIL_FAULT_KILL_AT=<point>` makes `kill_point(<point>)` send SIGKILL to the calling process — no
handler, no `finally`, no flush: what a power cut, the OOM killer or `kill -9` leaves. The fault suite
(tests/flows/test_kill_points.py, bench/kill_points.py) runs real `veil retrain` processes killed at
each point and checks that the next run resumes or refuses in one line, with one release per plan and
the charge taken once. `VEIL_FAULT_KILL_AT` may name several points, comma-separated; `<point>#N`
kills at the N-th time the point is reached (1 when not given), so a point inside a loop can be hit
later than its first pass.

Unset (the only setting for real use), `kill_point` is one dictionary lookup: the variable is read
once, at import.
"""
from __future__ import annotations

import os
import signal

ENV = "VEIL_FAULT_KILL_AT"

# Every point, in the order `veil retrain` reaches them (flows/retrain.py, flows/stages.py,
# components/training/engine.py, components/registry/mlflow_registry.py).
POINTS = (
    "after-plan",                 # the plan is written (its N̂ charged); nothing reserved yet
    "after-reserve",              # the ledger reservation committed; the run folder's copy not yet written
    "mid-training",               # a checkpoint was written, more steps to go
    "after-training",             # train_result.json written; the ledger's `trained` event not yet
    "during-registration",        # the MLflow run and model are logged; no registered version yet
    "after-registration",         # the version is registered; the ledger's `registered` event not yet
    "during-audit",               # the audited certificate is logged on the run; its tags not yet
    "after-audit",                # the audit is recorded; promotion not decided
    "during-promotion",           # latest-certified moved; the decision not yet tagged
    "after-promotion",            # promoted (or not); the run's result not yet returned
)


def _parse(value: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, nth = item.partition("#")
        if name not in POINTS:
            raise ValueError(f"{ENV}: {name!r} is not a kill point (one of {', '.join(POINTS)})")
        out[name] = int(nth) if nth else 1
    return out


_ARMED = _parse(os.environ.get(ENV))
_SEEN: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process when `VEIL_FAULT_KILL_AT` names `name` (and this is its N-th pass)."""
    if not _ARMED:
        return
    if name not in POINTS:
        raise ValueError(f"unknown kill point {name!r}")
    want = _ARMED.get(name)
    if want is None:
        return
    _SEEN[name] = _SEEN.get(name, 0) + 1
    if _SEEN[name] == want:
        os.kill(os.getpid(), signal.SIGKILL)
