"""A registered model follows MLflow's and peft's conventions, so other tools can use it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "privacy"))
from _sealed_release import build_adapter, build_base, plan_and_certificate  # noqa: E402


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """(settings, registration, local copy of the logged model package)."""
    import mlflow

    from components.core.settings import load_settings
    from components.registry import register_model

    tmp = tmp_path_factory.mktemp("conventions")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VEIL_HOME", str(tmp / "home"))
        for var in ("VEIL_CONFIG", "VEIL_MLFLOW_TRACKING_URI", "VEIL_SIGNING_KEY", "VEIL_TRUSTED_KEYS"):
            mp.delenv(var, raising=False)
        settings = load_settings(tmp / "home").ensure()
        base = build_base(tmp / "base")
        adapter = build_adapter(base, tmp / "adapter")
        plan, cert = plan_and_certificate(adapter, base)
        reg = register_model(settings, name="conv", certificate=cert, plan=plan, base_model_dir=base,
                             adapter_dir=adapter)
        mv = mlflow.MlflowClient().get_model_version("conv", reg.version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(tmp / "pkg")))
        yield settings, reg, local, base


def test_signature_input_example_and_pinned_requirements(package):
    from mlflow.models import Model

    _, _, pkg, _ = package
    m = Model.load(str(pkg / "MLmodel"))
    assert m.signature is not None
    assert m.signature.inputs.input_names() == ["prompt"]
    assert [p.name for p in m.signature.params.params] == ["max_new_tokens"]
    assert (pkg / "input_example.json").is_file() and (pkg / "serving_input_example.json").is_file()
    reqs = [r.strip() for r in (pkg / "requirements.txt").read_text().splitlines() if r.strip()]
    names = {r.split("==")[0] for r in reqs}
    assert "veil" not in names, "veil is not on an index; its code travels as code_paths"
    assert {"torch", "transformers", "peft", "cryptography", "dp-accounting", "mlflow"} <= names
    assert all("==" in r and "+" not in r for r in reqs), reqs
    # The library the pyfunc imports ships inside the model.
    assert (pkg / "code" / "components" / "certificate" / "verify.py").is_file()


def test_serving_input_example_scores_through_the_serving_path(package):
    from mlflow.models import validate_serving_input

    _, reg, pkg, _ = package
    out = validate_serving_input(reg.model_uri, (pkg / "serving_input_example.json").read_text())
    assert len(out) == 1 and isinstance(out[0], str)


def test_registered_adapter_is_a_standard_peft_adapter(package):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    import mlflow

    _, reg, pkg, base = package
    adapter = pkg / "artifacts" / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA"
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter)).eval()
    served = mlflow.pyfunc.load_model(reg.model_uri).unwrap_python_model().model
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, served(ids).logits)
        # The adapter changes the model (B ≠ 0), so this compares adapters, not two copies of the base.
        assert not torch.allclose(plain(ids).logits, AutoModelForCausalLM.from_pretrained(base)(ids).logits)


def test_seal_publishes_the_public_key(package):
    import mlflow

    from components.certificate.seal import default_key_path, fingerprint, load_signing_key, raw_public_bytes

    settings, reg, pkg, _ = package
    seal = json.loads((pkg / "artifacts" / "seal.json").read_text())
    key = load_signing_key(settings)
    assert seal["public_key"]["fingerprint"] == fingerprint(raw_public_bytes(key.public_key()))
    assert (default_key_path(settings).stat().st_mode & 0o777) == 0o600
    run = mlflow.MlflowClient().get_run(reg.run_id)
    assert run.data.tags["privacy.signing_key"] == seal["public_key"]["fingerprint"]
    with open(mlflow.artifacts.download_artifacts(run_id=reg.run_id, artifact_path="signing_key.pub.pem")) as f:
        assert f.read().startswith("-----BEGIN PUBLIC KEY-----")


def test_full_fine_tune_directory_is_registered_as_a_model_and_verifies(package, tmp_path):
    """Full fine-tuning writes a whole HF model directory (training's `model/`), not an adapter."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from components.registry import load_model, register_model, verify_model

    settings, _, _, base = package
    full = tmp_path / "model"
    shutil.copytree(base, full)
    w = load_file(str(full / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in w.items()}, str(full / "model.safetensors"), metadata={"format": "pt"})
    plan, cert = plan_and_certificate(full, base)
    reg = register_model(settings, name="full", certificate=cert, plan=plan, base_model_dir=base, adapter_dir=full)
    assert verify_model(reg.model_uri, settings).valid
    loaded = load_model(reg.model_uri, settings)
    ids = torch.tensor([[1, 2, 3]])
    from components.modeling import load_base

    with torch.no_grad():
        assert torch.allclose(loaded.model(ids).logits, load_base(full)[0](ids).logits)
