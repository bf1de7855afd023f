"""What the audit publishes — the certificate's audit section, the MLflow tags, metrics and
artifacts written by `record_audit`, the `veil audit` output — holds no user id, no secret value, no
per-person score and no per-secret figure, and no exact private aggregate (issue 11, items 3 and 6).

The audit runs for real around the deterministic scorer of `_audit_stub`; `record_audit` runs for real
against an in-memory MLflow client that keeps everything it is asked to log.
"""
import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

import _audit_stub as stub
from components.audit.canaries import make_canary_users
from components.audit.run import run_audit
from components.certificate import build_certificate

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

SECRETS = ["+1-555-013-4377", "+1-555-013-4912", "+1-555-013-4050"]


class FakeClient:
    """The MlflowClient calls record_audit makes, kept in memory."""

    def __init__(self, cert):
        self.cert, self.metrics, self.tags, self.artifacts = cert, {}, {}, {}

    def get_model_version(self, name, version):
        return SimpleNamespace(name=name, version=version, run_id="run1",
                               tags={"privacy.certificate_sha256": self.cert["sha256"]})

    def download_artifacts(self, run_id, path, dst):
        p = Path(dst) / path
        p.write_text(json.dumps(self.cert))
        return str(p)

    def log_artifact(self, run_id, path, artifact_path=None):
        self.artifacts[f"{artifact_path or ''}/{Path(path).name}"] = Path(path).read_bytes()

    def log_metric(self, run_id, key, value):
        self.metrics[key] = value

    def search_model_versions(self, query):
        return [self.get_model_version("m", "1")]

    def set_model_version_tag(self, name, version, key, value):
        self.tags[key] = value

    def set_tag(self, run_id, key, value):
        self.tags[key] = value


def _certificate():
    plan = {"schema": "veil.plan/v1", "sha256": "ab" * 32, "mechanism": "uls", "target": {"epsilon": 8.0, "delta": 1e-5},
            "sampling_rate": 0.05, "noise_multiplier": 1.0, "steps": 30, "clip_norm": 1.0, "records_per_user": 2,
            "expected_batch_size": 10, "selection": "random",
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32},
            "policy": {"name": "t", "sha256": "01" * 32}}
    res = {**bound_run.binding(plan), "steps_run": 30, "mechanism": "uls", "noise_multiplier": 1.0, "sampling_rate": 0.05, "clip_norm": 1.0}
    return build_certificate(plan, res).to_dict()


def _floats(x, out):
    if isinstance(x, bool) or x is None:
        return out
    if isinstance(x, (int, float)):
        out.append(float(x))
    elif isinstance(x, str):
        try:
            out.append(float(x))
        except ValueError:
            pass
    elif isinstance(x, dict):
        for k, v in x.items():
            _floats(v, out)
    else:
        for v in x:
            _floats(v, out)
    return out


@pytest.fixture
def published(monkeypatch, settings):
    import components.registry.mlflow_registry as reg

    stub.install(monkeypatch, planted=SECRETS[0], bonus=6.0)
    cert = _certificate()
    loaded = stub.loaded(None)
    loaded.certificate = cert
    samples = stub.samples(30, 30, m=2, shift=0.4, seed=5)
    canaries = make_canary_users(2, 3, seed=0, substring_words=6)
    import pyarrow as pa
    can_users = sorted(set(canaries["user_id"].to_pylist()))
    can_samples = pa.Table.from_pylist([{"user_id": u, "text": f"c|{0.5 if u == can_users[0] else -0.5!r}",
                                         "member": u == can_users[0]} for u in can_users])
    samples = pa.concat_tables([samples, can_samples.cast(samples.schema)])
    res = run_audit(loaded, stub.EMPTY_RECORDS, settings=settings, samples=samples, canary_records=canaries,
                    truth=stub.truth(*SECRETS), reference=stub.REFERENCE, bootstrap=20, n_candidates=50)
    client = FakeClient(cert)
    monkeypatch.setattr(reg, "_client", lambda s: client)
    # the release's verification (seal, weights, …) is tests/privacy/test_tamper.py's; here the
    # embedded certificate is taken as verified so that only what the audit publishes is under test
    monkeypatch.setattr(reg, "_verified_embedded", lambda c, mv, s, uri: (cert, {"bindings": {
        k: "0" * 64 for k in ("weights", "base_model", "tokenizer", "plan", "policy", "ledger_entry", "code")}}))
    new_cert = reg.record_audit(settings, "models:/m/1", res.summary(), plot_path=res.plot_path)
    return SimpleNamespace(res=res, client=client, cert=new_cert, samples=samples, canaries=canaries)


def test_no_ids_secrets_or_per_person_figures_in_anything_published(published):
    res, client = published.res, published.client
    text = json.dumps({"section": res.summary(), "cert": published.cert, "metrics": client.metrics,
                       "tags": client.tags, "cli": res.to_json()})
    text += "".join(v.decode("utf-8", "ignore") for k, v in client.artifacts.items() if k.endswith(".json"))
    # user ids (real and canary), secret values, canary substrings
    for u in set(published.samples["user_id"].to_pylist()):
        assert u not in text and u.split("@")[0] not in text, u
    for s in SECRETS:
        assert s not in text and s[-4:] not in json.dumps(client.tags)
    for md in published.canaries["metadata"].to_pylist():
        assert json.loads(md)["substring"] not in text
    # per-person and per-secret rows, and the exact aggregates of the private report
    scores = pq.read_table(res.private_path)
    secrets = pq.read_table(res.private_path.with_suffix(".secrets.parquet"))
    private = list(scores["score"].to_pylist())
    for col in ("exposure", "exposure_extrapolated", "reference_exposure", "excess_exposure",
                "reference_exposure_extrapolated"):
        if col in secrets.column_names:
            private += [v for v in secrets[col].to_pylist() if v is not None]
    from components.audit.metrics import auroc
    real = scores.filter(pq.read_table(res.private_path)["canary"].to_numpy(zero_copy_only=False) == False)  # noqa: E712
    private.append(auroc(real["score"].to_numpy(), real["member"].to_numpy(zero_copy_only=False)))
    for ref in secrets["secret_ref"].to_pylist():
        assert ref not in text
    published_numbers = _floats([res.summary(), client.metrics, client.tags], [])
    for v in private:
        if abs(v / 0.05 - round(v / 0.05)) < 1e-9:      # a grid value can coincide with a bucket edge
            continue
        assert all(abs(v - x) > 1e-9 * max(1.0, abs(v)) for x in published_numbers), v
    # the measured ROC stays private; the logged plot is the public one
    assert set(client.artifacts) == {"/certificate.json", "/seal.json", f"audit/{res.plot_path.name}"}
    assert res.private_plot_path.parent == res.private_path.parent


def test_public_section_is_marked_and_tags_say_the_verdict(published):
    s, tags, metrics = published.res.summary(), published.client.tags, published.client.metrics
    assert s["covered_by_certificate"] is False and s["verdict"] in ("passed", "failed", "inconclusive")
    assert published.cert["audit"] == s
    assert tags["audit.verdict"] == s["verdict"] and tags["audit.covered_by_certificate"] == "false"
    assert set(metrics) <= {"audit_verdict", "audit_auroc_bucket_lo", "audit_auroc_bucket_hi",
                            "audit_auroc_interval_lo", "audit_auroc_interval_hi", "audit_auroc_ceiling",
                            "audit_auroc_ceiling_pld"}
    assert metrics["audit_auroc_bucket_lo"] == s["auroc"][0]


def test_record_audit_refuses_the_private_report(published, settings):
    from components.core.errors import VeilError
    from components.registry import record_audit

    with pytest.raises(VeilError, match="public audit section"):
        record_audit(settings, "models:/m/1", published.res.private)
