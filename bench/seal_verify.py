"""How long verifying a sealed release takes, next to the hash-only check it replaces.

A release the size of the demo's (base: 2 layers, 128 wide, 4096-token vocabulary, ~0.85M parameters;
LoRA r=8; ULS at q=0.4, T=120, σ calibrated to ε=8, δ=1e-5) is registered in a fresh VEIL_HOME,
then each path is timed (median of --repeat runs, warm imports):

    baseline  hash only        the pre-seal check: the run certificate's self-hash vs the version tag
    ours      ε recomputed     recheck_guarantee on the certificate
    ours      package checks   verify_package: seal, weights/base/tokenizer hashes, plan, ε
    ours      veil verify      verify_model: package download + package + registry checks
    ours      load_model       registry.load_model: verify_model + the pyfunc's own load_context checks + load

    python bench/seal_verify.py [--json] [--repeat 3]

Target (issue 13): verification of the demo's certificate under a few seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _release(tmp: Path):
    import torch

    from components.accounting import calibrate
    from components.certificate import build_certificate
    from components.core.settings import load_settings
    from components.modeling import build_base_model, load_base
    from components.modeling.lora import attach_lora, lora_config
    from components.planning.plan import seal
    from components.registry import register_model

    os.environ["VEIL_HOME"] = str(tmp / "home")
    settings = load_settings(tmp / "home").ensure()
    settings.apply_environment()
    texts = [f"the weekly report number {i} is ready for review by the team" for i in range(400)]
    base = build_base_model(texts, tmp / "base", steps=1, batch_size=2, seq_len=32, progress=False)
    model, _ = load_base(base)
    peft = attach_lora(model, lora_config(r=8, alpha=16), seed=0)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    peft.save_pretrained(str(tmp / "adapter"))
    q, T = 0.4, 120
    sigma = calibrate("uls", epsilon=8.0, delta=1e-5, sampling_rate=q, steps=T).noise_multiplier
    plan = seal({"schema": "veil.plan/v1", "created_at": "2026-01-01T00:00:00+00:00", "mechanism": "uls",
                 "privacy_unit": "user", "neighbouring": "add_remove_user", "target": {"epsilon": 8.0, "delta": 1e-5},
                 "sampling_rate": q, "noise_multiplier": sigma, "steps": T, "expected_batch_size": 16,
                 "clip_norm": 1.0, "records_per_user": None, "selection": "all", "training": {}, "accounting": {},
                 "data": {"snapshot_commitment": "00" * 32},
                 "audit": {"held_out_users": [], "thresholds": {"max_user_inference_auroc": 0.6}},
                 "policy": {"name": "bench", "sha256": "11" * 32}})
    cert = build_certificate(plan, {"steps_run": T, "mechanism": "uls", "noise_multiplier": sigma,
                                    "sampling_rate": q, "clip_norm": 1.0}).to_dict()
    reg = register_model(settings, name="bench", certificate=cert, plan=plan, base_model_dir=base,
                         adapter_dir=tmp / "adapter")
    return settings, reg, cert


def _time(fn, repeat: int) -> float:
    from components.certificate.verify import _EPSILON_CACHE

    fn()  # warm imports; the in-process ε cache is emptied before every timed call (a fresh CLI run)
    out = []
    for _ in range(repeat):
        _EPSILON_CACHE.clear()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import mlflow

    from components.certificate import verify_certificate
    from components.certificate.seal import trusted_keys
    from components.certificate.verify import recheck_guarantee, verify_package
    from components.registry import load_model, verify_model
    from components.registry.artifacts import package_artifacts, run_json

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        settings, reg, cert = _release(tmp)
        client = mlflow.MlflowClient()
        mv = client.get_model_version("bench", reg.version)
        pkg = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(tmp / "pkg"))
        arts, trusted = package_artifacts(pkg), trusted_keys(settings)
        assert verify_model(reg.model_uri, settings).valid
        rows = [
            ("baseline", "hash only (pre-seal)", _time(lambda: verify_certificate(
                run_json(client, mv.run_id, "certificate.json"),
                expected_sha256=mv.tags["privacy.certificate_sha256"]), args.repeat)),
            ("ours", "ε recomputed", _time(lambda: recheck_guarantee(cert), args.repeat)),
            ("ours", "package checks", _time(lambda: verify_package(arts, trusted), args.repeat)),
            ("ours", "veil verify (all checks)", _time(lambda: verify_model(reg.model_uri, settings), args.repeat)),
            ("ours", "load_model (verify + load)", _time(lambda: load_model(reg.model_uri, settings), args.repeat)),
        ]
        size = sum(f.stat().st_size for f in Path(pkg).rglob("*") if f.is_file())
    doc = {"epsilon": cert["epsilon"], "steps": cert["steps"], "package_bytes": size,
           "rows": [{"side": s, "what": w, "seconds": round(t, 4)} for s, w, t in rows]}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"release: ε={cert['epsilon']:.4f} (ULS, T={cert['steps']}), package {size / 1e6:.1f} MB")
    print(f"{'side':<9} {'what':<30} {'seconds':>8}")
    for s, w, t in rows:
        print(f"{s:<9} {w:<30} {t:>8.3f}")


if __name__ == "__main__":
    main()
