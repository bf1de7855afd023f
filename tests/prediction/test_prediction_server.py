"""The PMixED endpoint against real uvicorn servers on 127.0.0.1: 401/422/429, the public-only fallback,
concurrent requests across two server processes never overspending, and the budget under SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
VEIL = [sys.executable, "-c", "import sys; from flows.cli import main; sys.argv[0] = 'veil'; main()"]
sys.path.insert(0, str(Path(__file__).parent))


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_base, tiny_people):
    from components.core.settings import load_settings
    from test_prediction_build import make_built

    home = tmp_path_factory.mktemp("pmixed-home")
    s = load_settings(home).ensure()
    out = make_built(s, tiny_base, tiny_people, tmp_path_factory.mktemp("src"))
    return home, s, out


def _env(home):
    # only this home's settings: a VEIL_* variable another test of the same worker left in os.environ
    # (a ledger URL, a registry URI) would send the CLI's keys to another store than the server's
    base = {k: v for k, v in os.environ.items() if not k.startswith("VEIL_")}
    return {**base, "VEIL_HOME": str(home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _start(home, uri):
    port = _free_port()
    p = subprocess.Popen(VEIL + ["serve", uri, "--port", str(port)], cwd=ROOT,
                         env=_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if p.poll() is not None:
            raise AssertionError(p.stderr.read().decode())
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return p, url
        except httpx.HTTPError:
            time.sleep(0.1)
    p.kill()
    raise AssertionError("server did not start")


def _key(home) -> str:
    r = subprocess.run(VEIL + ["keys", "create", "--json"], cwd=ROOT, env=_env(home),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["key"]


def _remaining(s, eid):
    from components.prediction.budget import TokenBudget
    tb = TokenBudget.open(s)
    try:
        return tb.remaining(eid), tb.spent(eid)
    finally:
        tb.dispose()


def test_endpoint_paths_concurrency_and_fallback(built):
    home, s, out = built
    eid, T = out["certificate"]["ensemble_id"], out["certificate"]["token_budget"]
    key = _key(home)
    from components.prediction.budget import TokenBudget
    tb = TokenBudget.open(s)
    assert key not in (home / "private" / "ledger.db").read_bytes().decode("latin-1")  # stored hashed only
    tb.dispose()
    (p1, u1), (p2, u2) = _start(home, out["model_uri"]), _start(home, out["model_uri"])
    try:
        ok = {"prompt": "alpha bravo", "max_tokens": 3}
        assert httpx.post(u1 + "/v1/completions", json=ok).status_code == 401
        assert httpx.post(u1 + "/v1/completions", json=ok, headers={"Authorization": "Bearer nope"}).status_code == 401
        h = {"Authorization": f"Bearer {key}"}
        for bad, field in [({"max_tokens": 3}, "prompt"), ({"prompt": "a", "max_tokens": "3"}, "max_tokens"),
                           ({"prompt": "a", "max_tokens": 0}, "max_tokens"), ({**ok, "seed": 1}, "seed"),
                           ({**ok, "logprobs": 5}, "logprobs"), ({"prompt": "a", "max_tokens": 999}, "max_tokens")]:
            r = httpx.post(u1 + "/v1/completions", json=bad, headers=h)
            assert r.status_code == 422 and r.json()["error"].startswith(field), (bad, r.text)
        r = httpx.post(u1 + "/v1/completions", content=b"{not json", headers=h)
        assert r.status_code == 422 and "JSON" in r.json()["error"]
        # `veil serve` caps bodies by default (issue 28: a 20 MB prompt was read, parsed and tokenised in full)
        t0 = time.monotonic()
        r = _post_big(u1 + "/v1/completions", 20_000_000, h)
        assert r.status_code == 413 and r.json()["error"].startswith("body: larger than"), r.text
        assert time.monotonic() - t0 < 10
        # concurrent requests on two processes sharing one budget: never more than T private tokens
        results = []

        def fire(url):
            r = httpx.post(url + "/v1/completions", json={"prompt": "tango", "max_tokens": 4}, headers=h, timeout=120)
            results.append(r)
        threads = [threading.Thread(target=fire, args=(u,)) for u in (u1, u2) * 4]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert all(r.status_code == 200 for r in results), [r.text for r in results]
        assert all(set(r.json()) == {"text", "tokens", "private", "private_tokens", "public_only_reason",
                                     "budget_remaining_tokens", "key_quota_remaining_tokens"} for r in results)
        # private tokens are a prefix; together they are exactly the budget spent
        assert all(r.json()["private"] == [True] * r.json()["private_tokens"]
                   + [False] * (r.json()["tokens"] - r.json()["private_tokens"]) for r in results)
        assert sum(r.json()["private_tokens"] for r in results) <= T
        remaining, spent = _remaining(s, eid)
        assert spent == T and remaining == 0  # 8 requests × up to 4 tokens > T = 6: spent exactly, never more
        assert all(r.json()["budget_remaining_tokens"] >= 0 for r in results)
        # the budget is spent: public_only answers keep coming, free
        r = httpx.post(u2 + "/v1/completions", json=ok, headers=h, timeout=60)
        assert r.status_code == 200 and r.json()["budget_remaining_tokens"] == 0
        assert r.json()["private"] == [False] * r.json()["tokens"] and r.json()["public_only_reason"] == "budget_spent"
        assert _remaining(s, eid) == (0, T)
    finally:
        for p in (p1, p2):
            p.kill()
            p.wait()


def test_refuse_policy_answers_429_in_process_uvicorn(built, tiny_base):
    """The same ensemble behind a budget whose policy refuses: a real uvicorn server in a thread."""
    import uvicorn

    from components.prediction.budget import TokenBudget
    from components.prediction.release import open_ensemble, resolve
    from components.prediction.server import create_app

    home, s, out = built
    r = resolve(s, out["model_uri"])
    ens = open_ensemble(s, r)
    tb = TokenBudget.open(s)
    tb.create("refuse-test", 2, "refuse")
    key = tb.create_key()
    app = create_app(ensemble=ens, budget=tb, ensemble_id="refuse-test", when_exhausted="refuse", max_tokens_cap=8)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        h = {"Authorization": f"Bearer {key}"}
        a = httpx.post(url, json={"prompt": "alpha", "max_tokens": 5}, headers=h, timeout=60)
        assert a.status_code == 200 and a.json()["tokens"] <= 2 and a.json()["budget_remaining_tokens"] == 0
        b = httpx.post(url, json={"prompt": "alpha", "max_tokens": 5}, headers=h, timeout=60)
        assert b.status_code == 429 and "spent" in b.json()["error"]
        assert tb.spent("refuse-test") == 2
    finally:
        server.should_exit = True
        th.join(timeout=10)
        tb.dispose()


def _uvicorn(app):
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return server, th, f"http://127.0.0.1:{port}/v1/completions"


def test_per_key_quota_is_durable_and_flagged(built):
    """Two keys, a 5-token quota each, a 9-token budget: each key's private tokens stop at its quota (flagged
    key_quota_spent, public-only after); a second app on the same database (a restart) sees the same spend;
    the second key meets the ensemble's budget (budget_spent). Every flag is a prefix of True."""
    from components.prediction.budget import TokenBudget
    from components.prediction.release import open_ensemble, resolve
    from components.prediction.server import create_app

    home, s, out = built
    ens = open_ensemble(s, resolve(s, out["model_uri"]))
    tb = TokenBudget.open(s)
    tb.create("quota-test", 9, "public_only")
    ka, kb = tb.create_key(), tb.create_key()

    def app():
        return create_app(ensemble=ens, budget=tb, ensemble_id="quota-test", when_exhausted="public_only",
                          max_tokens_cap=8, key_quota=5)

    def ask(url, key, n=3):
        r = httpx.post(url, json={"prompt": "alpha", "max_tokens": n}, headers={"Authorization": f"Bearer {key}"},
                       timeout=60)
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["private"] == [True] * d["private_tokens"] + [False] * (d["tokens"] - d["private_tokens"])
        return d

    server, th, url = _uvicorn(app())
    try:
        got = [ask(url, ka) for _ in range(3)]   # ≤ 9 tokens asked, 5 granted at most
        assert tb.spent("quota-test") <= 5 and sum(d["private_tokens"] for d in got) <= 5
        assert tb.key_remaining("quota-test", ka, 5) == got[-1]["key_quota_remaining_tokens"]
    finally:
        server.should_exit = True
        th.join(timeout=10)
    # a restart: a new app on the same durable counters
    server, th, url = _uvicorn(app())
    try:
        while tb.key_remaining("quota-test", ka, 5) > 0:      # spend key A's quota to the end (EOS may cut short)
            ask(url, ka, 8)
        over = ask(url, ka)
        assert over["private_tokens"] == 0 and over["public_only_reason"] == "key_quota_spent"
        assert over["key_quota_remaining_tokens"] == 0 and over["budget_remaining_tokens"] == 4
        b = ask(url, kb, 8)                    # key B: 5 of quota, but only 4 left in the budget
        assert b["private_tokens"] <= 4
        while tb.remaining("quota-test") > 0:
            b = ask(url, kb, 8)
        b = ask(url, kb)
        assert b["private_tokens"] == 0 and b["public_only_reason"] == "budget_spent"
        assert b["key_quota_remaining_tokens"] == 1   # B was granted 4 of its 5: the budget ran out first
        assert tb.spent("quota-test") == 9
    finally:
        server.should_exit = True
        th.join(timeout=10)
        tb.dispose()


def test_quota_grants_are_atomic_across_processes(built, tmp_path):
    """Two processes granting to one key concurrently: its grants sum to the quota, never more."""
    from components.prediction.budget import TokenBudget

    home, s, _ = built
    tb = TokenBudget.open(s)
    tb.create("quota-race", 1000, "public_only")
    key = tb.create_key()
    code = ("import sys; from components.core.settings import load_settings; "
            "from components.prediction.budget import TokenBudget; "
            "tb = TokenBudget.open(load_settings(sys.argv[1]).ensure()); "
            "n = sum(iter(lambda: tb.grant('quota-race', 3, key=sys.argv[2], quota=50)[0], 0)); print(n)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(home), key], cwd=ROOT, env=_env(home),
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    got = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert sum(got) == 50 and tb.spent("quota-race") == 50 and tb.key_remaining("quota-race", key, 50) == 0
    tb.dispose()


_KILL_WORKER = r"""
import sys, os
from components.core.settings import load_settings
from components.prediction.budget import TokenBudget
tb = TokenBudget.open(load_settings(sys.argv[1]).ensure())
log = open(sys.argv[2], "a")
while True:
    if not tb.charge("kill-test", 1):
        break
    log.write("sampled\n"); log.flush(); os.fsync(log.fileno())  # a token is drawn only after its charge commits
"""


def test_budget_under_sigkill_never_gives_tokens_back(built, tmp_path):
    """Workers charging then 'sampling' are SIGKILLed at random moments: every sampled token is in the durable
    budget, the database stays consistent, and a restarted process sees the same spend."""
    from components.prediction.budget import TokenBudget

    home, s, _ = built
    tb = TokenBudget.open(s)
    tb.create("kill-test", 400, "refuse")
    log = tmp_path / "sampled.log"
    for delay in (0.0, 0.05, 0.2):
        start = len(log.read_text().splitlines()) if log.exists() else 0
        procs = [subprocess.Popen([sys.executable, "-c", _KILL_WORKER, str(home), str(log)], cwd=ROOT,
                                  env=_env(home)) for _ in range(2)]
        for _ in range(600):  # kill while they are charging, not while Python is still importing
            if log.exists() and len(log.read_text().splitlines()) > start:
                break
            time.sleep(0.05)
        time.sleep(delay)
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        sampled = len(log.read_text().splitlines()) if log.exists() else 0
        spent = TokenBudget.open(s).spent("kill-test")
        assert sampled <= spent <= sampled + 2  # at most one committed-but-undrawn token per killed worker
    assert spent > 0
    # run to exhaustion after the kills: never more than the budget
    subprocess.run([sys.executable, "-c", _KILL_WORKER, str(home), str(log)], cwd=ROOT, env=_env(home), check=True,
                   timeout=300)
    assert TokenBudget.open(s).spent("kill-test") == 400
    assert len(log.read_text().splitlines()) <= 400
    tb.dispose()


def test_registered_pyfunc_serves_through_the_same_budget(built, monkeypatch):
    import mlflow

    home, s, out = built
    monkeypatch.setenv("VEIL_HOME", str(home))
    mlflow.set_tracking_uri(s.mlflow_tracking_uri)
    mlflow.set_registry_uri(s.mlflow_registry_uri)
    m = mlflow.pyfunc.load_model(out["model_uri"])
    before = _remaining(s, out["certificate"]["ensemble_id"])
    texts = m.predict(["alpha bravo"], params={"max_tokens": 2})
    assert len(texts) == 1 and isinstance(texts[0], str)
    after = _remaining(s, out["certificate"]["ensemble_id"])
    if before[0] > 0:
        assert after[1] > before[1]  # private tokens went through the durable budget
    else:
        assert after == before == (0, out["certificate"]["token_budget"])  # spent: public only, free


def test_cli_build_bad_policy_is_one_line_exit_2(tmp_path, veil_home):
    p = tmp_path / "bad.yaml"
    p.write_text("apiVersion: veil.dev/v1\nkind: PredictionPolicy\nmetadata: {name: x, owner: y}\n"
                 "spec: {target: {epsilon: 8.0, delta: 1.0e-5}, shards: 2, subsample_rate: 1.5, token_budget: 4}\n")
    r = subprocess.run(VEIL + ["pmixed", "build", "--policy", str(p), "--json"], cwd=ROOT,
                       env=_env(veil_home), capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "spec.subsample_rate" in r.stderr


def _post_big(url, n: int, headers):
    """POST a JSON body of about n bytes (a prompt of n ASCII characters) with its Content-Length. The server may
    answer 413 and close before the upload ends: the answer is read all the same."""
    body = b'{"prompt": "' + b"a" * n + b'", "max_tokens": 2}'
    with socket.create_connection((url.split("//")[1].split(":")[0], int(url.rsplit(":", 1)[1].split("/")[0]))) as c:
        path = "/" + url.split("/", 3)[3]
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
        c.sendall(head)
        try:
            c.sendall(body)
        except OSError:   # reset by a server that already answered
            pass
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    payload = data.split(b"\r\n\r\n", 1)[1]
    return httpx.Response(status, content=payload)


def test_oversize_bodies_and_prompts_are_refused_before_parsing_or_tokenising(built):
    """Issue 28. A body over the cap: 413 from its Content-Length (nothing read) or as it streams in (chunked); a
    prompt that cannot fit the model's positions: 422 before the tokenizer sees it; a lone surrogate: 422, one line,
    not a 500. Each refusal is one JSON line naming what is wrong."""
    from components.prediction.budget import TokenBudget
    from components.prediction.release import open_ensemble, resolve
    from components.prediction.server import create_app, default_max_body_bytes

    home, s, out = built
    ens = open_ensemble(s, resolve(s, out["model_uri"]))
    encoded = []
    real_encode = ens.encode
    ens.encode = lambda prompt: encoded.append(len(prompt)) or real_encode(prompt)
    tb = TokenBudget.open(s)
    tb.create("limits-test", 1000, "public_only")
    key = tb.create_key()
    h = {"Authorization": f"Bearer {key}"}
    # the bound: 63 prompt positions × the longest vocabulary entry (13 characters: '<|endoftext|>')
    assert ens.max_positions == 64 and ens.max_prompt_chars == 63 * 13
    cap = default_max_body_bytes(ens)
    assert cap == 12 * 63 * 13 + 4096

    def one_line(r, status, start):
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and "\n" not in r.json()["error"], r.text
        assert r.json()["error"].startswith(start), r.text

    server, th, url = _uvicorn(create_app(ensemble=ens, budget=tb, ensemble_id="limits-test",
                                          when_exhausted="public_only", max_tokens_cap=8))
    try:
        t0 = time.monotonic()
        one_line(_post_big(url, 20_000_000, h), 413, "body: larger than this endpoint's limit of " + str(cap))
        assert time.monotonic() - t0 < 10

        def chunks():   # no Content-Length: refused while streaming, after cap bytes
            for _ in range(100):
                yield b" " * 65536
        one_line(httpx.post(url, content=chunks(), headers=h, timeout=30), 413, "body: larger than")
        # under the body cap, over the prompt bound: refused without tokenising
        one_line(httpx.post(url, json={"prompt": "a" * (ens.max_prompt_chars + 1), "max_tokens": 2}, headers=h,
                            timeout=30), 422, f"prompt: {ens.max_prompt_chars + 1} characters; at most")
        # a lone surrogate (valid JSON, not valid Unicode): one line, 422
        one_line(httpx.post(url, content=b'{"prompt": "ab\\ud800cd", "max_tokens": 2}',
                            headers={**h, "Content-Type": "application/json"}, timeout=30),
                 422, "prompt: not valid Unicode (a lone surrogate at character 2)")
        one_line(httpx.post(url, content=b'{"prompt": "\xff\xfe", "max_tokens": 2}', headers=h, timeout=30),
                 422, "body: not valid JSON")
        assert encoded == []        # the tokenizer never saw any of them
        ok = httpx.post(url, json={"prompt": "alpha bravo", "max_tokens": 2}, headers=h, timeout=60)
        assert ok.status_code == 200 and encoded == [len("alpha bravo")], ok.text
    finally:
        server.should_exit = True
        th.join(timeout=10)
    # a configured cap (veil serve --max-body-bytes) replaces the default
    server, th, url = _uvicorn(create_app(ensemble=ens, budget=tb, ensemble_id="limits-test",
                                          when_exhausted="public_only", max_tokens_cap=8, max_body_bytes=2048))
    try:
        one_line(httpx.post(url, json={"prompt": "a" * 2100, "max_tokens": 2}, headers=h, timeout=30), 413,
                 "body: larger than this endpoint's limit of 2048 bytes")
    finally:
        server.should_exit = True
        th.join(timeout=10)
        tb.dispose()
    # the pyfunc path (no HTTP) refuses the same prompts in the same words
    from components.core.errors import VeilError
    with pytest.raises(VeilError, match="lone surrogate"):
        ens.generate("a\ud800", 2, charge=lambda: False)
    with pytest.raises(VeilError, match="characters; at most"):
        ens.generate("a" * 20_000_000, 2, charge=lambda: False)
    assert encoded == [len("alpha bravo")]


def test_keys_list_and_revoke_take_effect_on_a_running_server(built):
    """Issue 28: `veil keys list` shows ids, hashes and dates (never a key); `veil keys revoke ID` is durable and a
    server already running answers 401 to that key from its next request, while other keys keep working."""
    from components.prediction.budget import TokenBudget
    from components.prediction.release import open_ensemble, resolve
    from components.prediction.server import create_app

    home, s, out = built
    ens = open_ensemble(s, resolve(s, out["model_uri"]))
    tb = TokenBudget.open(s)
    tb.create("revoke-test", 100, "public_only")
    a, b = _key(home), _key(home)
    server, th, url = _uvicorn(create_app(ensemble=ens, budget=tb, ensemble_id="revoke-test",
                                          when_exhausted="public_only", max_tokens_cap=8))

    def ask(key):
        return httpx.post(url, json={"prompt": "alpha", "max_tokens": 1}, headers={"Authorization": f"Bearer {key}"},
                          timeout=60).status_code

    def veil(*args):
        return subprocess.run(VEIL + ["keys", *args], cwd=ROOT, env=_env(home), capture_output=True, text=True)

    try:
        assert ask(a) == 200 and ask(b) == 200
        r = veil("list", "--json")
        assert r.returncode == 0, r.stderr
        listed = json.loads(r.stdout)["keys"]
        assert a not in r.stdout and b not in r.stdout          # hashes only
        from components.prediction.budget import key_digest
        mine = {k["sha256"]: k for k in listed}
        ka = mine[key_digest(a)]
        assert set(ka) == {"id", "sha256", "created_at", "revoked_at"} and ka["revoked_at"] is None
        assert ka["id"] == key_digest(a)[:16]
        r = veil("revoke", ka["id"], "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["revoked"]["revoked_at"]
        assert ask(a) == 401 and ask(b) == 200                 # the same running server, its next request
        r = veil("list")
        assert r.returncode == 0 and f"{ka['id']}  created" in r.stdout and "REVOKED" in r.stdout
        assert a not in r.stdout + r.stderr
        for bad, words in [("zz", "expected at least 8 hex digits"), ("00000000", "no such key")]:
            r = veil("revoke", bad)
            assert r.returncode == 2 and r.stdout == "" and r.stderr.strip().count("\n") == 0, r.stderr
            assert words in r.stderr
    finally:
        server.should_exit = True
        th.join(timeout=10)
    # durable: a new server (a restart) on the same ledger still refuses it
    server, th, url = _uvicorn(create_app(ensemble=ens, budget=tb, ensemble_id="revoke-test",
                                          when_exhausted="public_only", max_tokens_cap=8))
    try:
        assert ask(a) == 401 and ask(b) == 200
    finally:
        server.should_exit = True
        th.join(timeout=10)
        tb.dispose()
