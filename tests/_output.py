"""Checks that captured terminal output and Prefect log lines hold no third-party noise (issue 26):
no Python warning, no tqdm/HF/MLflow progress bar, no ANSI escape code, no traceback, no library
notice. End-to-end tests that already run a command pass what they captured; nothing is re-run."""
from __future__ import annotations

import re

# what Veil never prints itself, each with why it is noise
NOISE = [
    (re.compile(r"\b[A-Z]\w*Warning\b"), "a Python warning (FutureWarning, UserWarning, …)"),
    (re.compile(r"warnings\.warn\("), "a warning's source line"),
    (re.compile(r"Traceback \(most recent call last\)"), "a traceback"),
    (re.compile(r"\x1b\["), "an ANSI escape code"),
    (re.compile(r"\d+%\|"), "a tqdm progress bar"),
    (re.compile(r"\d+(\.\d+)?\s*(it|s)/(s|it)\]"), "a tqdm progress bar"),
    (re.compile(r"Downloading artifacts", re.I), "MLflow's artifact download bar"),
    (re.compile(r"Loading weights", re.I), "transformers' loading bar"),
    (re.compile(r"indexing errors"), "the tokenizer's length notice"),
    (re.compile(r"database is locked"), "Prefect's telemetry on a locked SQLite file"),
    (re.compile(r"cloudpickle", re.I), "MLflow's pickling warning"),
    (re.compile(r"type hints? to the", re.I), "MLflow's type-hint warning"),
    (re.compile(r"attention[_ ]mask", re.I), "transformers' attention-mask notice"),
    (re.compile(r"deprecat", re.I), "a deprecation notice"),
    (re.compile(r"leaked instance", re.I), "a native leak dump"),
]


def noise_in(text: str) -> list[str]:
    """Every noisy line of `text`, each with what it is."""
    found = []
    for line in text.splitlines():
        for pat, what in NOISE:
            if pat.search(line):
                found.append(f"{what}: {line[:200]!r}")
                break
    return found


def assert_quiet(text: str, where: str = "output") -> None:
    found = noise_in(text)
    assert not found, f"third-party noise in {where}:\n" + "\n".join(found[:20])


def prefect_log_text(api, since) -> str:
    """The Prefect server's log lines of the flow runs (subflows included) that started after `since`
    (an aware datetime), one per line. `api(method, path, json=…)`: a raw call to the server
    (tests/flows' PrefectServer.api). Other tests' runs on a shared server are left out."""
    runs = api("POST", "/flow_runs/filter", json={"flow_runs": {"start_time": {"after_": since.isoformat()}},
                                                  "limit": 200}) or []
    ids = [r["id"] for r in runs]
    assert ids, f"no flow run started after {since}"
    body = {"limit": 200, "offset": 0, "sort": "TIMESTAMP_ASC", "logs": {"flow_run_id": {"any_": ids}}}
    lines, offset = [], 0
    while True:
        got = api("POST", "/logs/filter", json={**body, "offset": offset}) or []
        lines += [g["message"] for g in got]
        if len(got) < 200:
            return "\n".join(lines)
        offset += 200


def harness_log_text(since) -> str:
    """`prefect_log_text` against the in-process harness (the client's own API URL), after the
    process' buffered log lines were sent."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)

    def api(method, path, json=None):
        with get_client(sync_client=True) as c:
            r = c.request(method, path, json=json)
            return r.json()
    text = prefect_log_text(api, since)
    for _ in range(5):      # the server stores a batch a moment after it answered the client
        time.sleep(1)
        again = prefect_log_text(api, since)
        if again == text:
            return text
        text = again
    return text
