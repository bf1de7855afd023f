"""The certificate binds what ran (issue 11, item 9): a run whose k, data file, selection, steps or
weights differ from its plan is refused in one line, and the certificate's hashes of the trained
weights, the base model and its tokenizer match the files."""
from __future__ import annotations

import hashlib
import json
import importlib.util
import warnings
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from components.certificate import build_certificate
from components.core.errors import VeilError
from components.core.fingerprints import TOKENIZER_FILES, tree_sha256
from components.draws.annex import commitment
from components.training import TrainSpec, train

warnings.filterwarnings("ignore")
_spec = importlib.util.spec_from_file_location(
    "tiny_lm_training", Path(__file__).resolve().parents[1] / "training" / "tiny_lm_training.py")
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)

DATA_SHA = "e" * 64
SALT = "5a" * 32


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real 2-step ULS run on a base model saved to disk, its data tagged with the sha256 of
    the train-records file it came from (as draws.data.training_records does)."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("bind")
    base = tmp / "base"
    model, tok = tiny.make_model(), tiny.make_tokenizer()
    model.save_pretrained(base)
    tok.save_pretrained(base)
    data = tiny.make_texts(n_users=6, per_user=(1, 3)).replace_schema_metadata(
        {b"veil.train_records_sha256": DATA_SHA.encode()})
    spec = TrainSpec(mechanism="uls", sampling_rate=0.5, noise_multiplier=1.1, clip_norm=1.0, steps=2,
                     records_per_user=2, lora={"r": 2, "alpha": 4, "dropout": 0.0}, seq_len=16,
                     selection="random")
    res = train(spec, data, model, tok, tmp / "run", progress=False, base_dir=base).to_dict()
    assert res["train_records_sha256"] == DATA_SHA          # the trainer saw what it read
    # stages.train commits it under the annex's salt; the public plan holds the same commitment
    res["train_records_commitment"] = commitment(SALT, res["train_records_sha256"])
    plan = {"schema": "veil.plan/v1", "sha256": "ab" * 32, "mechanism": "uls", "privacy_unit": "user",
            "target": {"epsilon": 50.0, "delta": 1e-5}, "sampling_rate": 0.5, "noise_multiplier": 1.1, "steps": 2,
            "expected_batch_size": 3, "clip_norm": 1.0, "records_per_user": 2, "selection": "random",
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": commitment(SALT, DATA_SHA)},
            "policy": {"name": "t", "sha256": "01" * 32}}
    return plan, res, base


def test_certificate_hashes_match_the_files(run):
    plan, res, base = run
    cert = build_certificate(plan, res).doc
    r = cert["run"]
    adapter = Path(res["adapter_dir"])
    files = {p.relative_to(adapter).as_posix(): _sha(p) for p in sorted(adapter.rglob("*")) if p.is_file()}
    assert files and r["weights"]["files"] == files and r["weights"]["kind"] == "lora-adapter"
    assert r["weights"]["sha256"] == tree_sha256(files)
    base_files = {p.relative_to(base).as_posix(): _sha(p) for p in sorted(base.rglob("*")) if p.is_file()}
    assert r["base_model"]["sha256"] == tree_sha256(base_files)
    tok_files = {k: v for k, v in base_files.items() if any(Path(k).match(t) for t in TOKENIZER_FILES)}
    assert "tokenizer.json" in tok_files and r["tokenizer"]["sha256"] == tree_sha256(tok_files)
    assert r["train_records_commitment"] == commitment(SALT, DATA_SHA) and "train_records_sha256" not in r
    assert DATA_SHA not in json.dumps(cert)                  # the raw sha256 would test membership guesses
    assert r["device"] == "cpu" and r["precision"] == "float32"
    assert cert["steps"] == cert["steps_planned"] == 2


@pytest.mark.parametrize("change,needle", [
    (lambda res: res.update(records_per_user=5), "k=5"),
    (lambda res: res.update(train_records_commitment=commitment(SALT, "0" * 64)), "train records"),
    (lambda res: res.update(train_records_commitment=None), "train-records file"),
    (lambda res: res["extra"].update(selection="ppl-high"), "selection"),
    (lambda res: res.update(steps_attempted=3), "steps were started"),
    (lambda res: res.update(weights=None), "no trained weights"),
])
def test_run_that_differs_from_its_plan_is_refused(run, change, needle):
    plan, res, _ = run
    res = {**res, "extra": dict(res["extra"])}
    change(res)
    with pytest.raises(VeilError) as e:
        build_certificate(plan, res)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_weights_changed_after_training_are_refused(run, tmp_path):
    plan, res, _ = run
    import shutil

    copy = tmp_path / "adapter"
    shutil.copytree(res["adapter_dir"], copy)
    f = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    f.write_bytes(f.read_bytes()[:-1] + b"\x00")
    with pytest.raises(VeilError) as e:
        build_certificate(plan, {**res, "adapter_dir": str(copy)})
    assert "not the ones training wrote" in str(e.value) and "\n" not in str(e.value)


def test_training_records_pass_on_the_sha256_of_the_file_read(tmp_path):
    """draws.data.training_records tags its table with the sha256 of the bytes it parsed."""
    import pyarrow.parquet as pq

    from components.draws.data import training_records

    f = tmp_path / "train.parquet"
    pq.write_table(pa.table({"record_id": ["r1", "r2"], "user_id": ["u", "v"]}), f)
    sha = _sha(f)
    plan = {"data": {"snapshot_id": "s"}}
    annex = {"train_records_file": str(f), "train_records_sha256": sha}
    t = training_records(plan, annex, pa.table({"record_id": ["r1", "r2"], "text": ["a b", "c d"]}))
    assert t.schema.metadata[b"veil.train_records_sha256"] == sha.encode()
