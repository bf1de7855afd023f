"""bench/gpu.py is ready for the next GPU: at a tiny Llama size on this CPU it runs every engine end to
end, writes its JSON, and its correctness check (Veil's clipped sum on every per-record path against
a brute-force float32 one) agrees to float32 rounding — a wrong sum fails here, not on the GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_bench_smoke_runs_every_engine_and_checks_the_clipped_sum(tmp_path):
    out = tmp_path / "gpu.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--smoke", "--precision", "fp32", "--check",
                        "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = {(r["tuning"], r["engine"]): r for r in doc["rows"]}
    for tuning in ("lora", "full"):
        for engine in ("nonprivate", "veil"):
            r = rows[(tuning, engine)]
            assert "error" not in r, r
            assert r["median_s"] > 0 and r["time_over_nonprivate"] > 0
        assert rows[(tuning, "veil")]["trainable_params"] == rows[(tuning, "nonprivate")]["trainable_params"]
    # Opacus is a dev dependency here: both of its modes must at least have been tried
    assert {("lora", "opacus"), ("lora", "opacus-ghost")} <= set(rows)
    checks = doc["correctness"]
    assert {(c["tuning"], c["per_record"]) for c in checks} == {
        (t, m) for t in ("lora", "full") for m in ("mixed", "hooks", "ghost", "vmap")}
    for c in checks:
        assert "error" not in c, c
        assert c["rel_error"] < 1e-5, c
    # the table a person reads names the card (here: the CPU) and every engine
    assert "DP step, llama-tiny" in p.stdout and "opacus" in p.stdout
