"""The reason for a non-pass reaches the registry's tags (through the real `record_audit` and the
publication gate), the Prefect log line and the run summary line — built from public audit outputs
only: no user id, no secret value, no exact figure."""
import json
from types import SimpleNamespace

import pyarrow as pa

import _audit_stub as stub
from components.audit.run import run_audit
from test_audit_public_leak import SECRETS, FakeClient, _certificate


def _audit(monkeypatch, settings, require):
    import components.registry.mlflow_registry as reg

    stub.install(monkeypatch, planted=SECRETS[0], bonus=6.0)
    cert = _certificate()
    loaded = stub.loaded(None)
    loaded.certificate = cert
    samples = stub.samples(12, 6, m=2, shift=0.1, seed=3)        # too few people to decide
    policy = {"max_user_inference_auroc": 0.65, "max_secret_exposure": 4.0, "require": require,
              "candidates_per_secret": 50, "secrets_per_class": 20}
    res = run_audit(loaded, stub.EMPTY_RECORDS, policy_thresholds=policy, settings=settings, samples=samples,
                    truth=stub.truth(*SECRETS), reference=stub.REFERENCE, bootstrap=20, plot=False)
    client = FakeClient(cert)
    monkeypatch.setattr(reg, "_client", lambda s: client)
    monkeypatch.setattr(reg, "_verified_embedded", lambda c, mv, s, uri: (cert, {"bindings": {
        k: "0" * 64 for k in ("weights", "base_model", "tokenizer", "plan", "policy", "ledger_entry", "code")}}))
    new_cert = reg.record_audit(settings, "models:/m/1", res.summary(), plot_path=None)
    return SimpleNamespace(res=res, client=client, cert=new_cert, samples=samples)


def test_reason_reaches_tags_log_and_summary_without_private_values(monkeypatch, settings):
    from flows.cli.core_cmds import _audit_line
    from flows.pipeline import audit_log_fields
    from flows.retrain import promotion_gate

    got = _audit(monkeypatch, settings, "passed")
    s, tags = got.res.summary(), got.client.tags
    assert s["verdict"] != "passed" and s["gate"] == got.cert["audit"]["gate"]   # stated on the certificate
    assert s["gate"]["require"] == "passed" and s["gate"]["meets"] is False
    assert s["reasons"] and all(r in s["gate"]["reason"] for r in s["reasons"])
    assert tags["audit.reason"] == s["gate"]["reason"] and tags["audit.require"] == "passed"
    assert tags["audit.meets_requirement"] == "false"
    log = audit_log_fields(s)["audit"]                              # goes through publish("prefect", …)
    assert log[0] == s["verdict"] and log[3] == s["gate"]["reason"]
    assert s["gate"]["reason"] in _audit_line(s)
    assert s["settings"]["n_candidates"] == 50 and s["settings"]["max_secrets_per_class"] == 20
    ok, why = promotion_gate(got.cert, s, ["epsilon"])
    assert not ok and s["reasons"][0] in why
    published = json.dumps([tags, s, log], ensure_ascii=False)
    for u in set(got.samples["user_id"].to_pylist()):
        assert u not in published
    for secret in SECRETS:
        assert secret not in published
    assert f"{got.res.private['user_inference']['auroc']:.4f}" not in published


def test_not_failed_promotes_an_inconclusive_audit(monkeypatch, settings):
    from flows.retrain import promotion_gate

    got = _audit(monkeypatch, settings, "not_failed")
    s = got.res.summary()
    if s["verdict"] == "inconclusive":
        assert s["gate"]["meets"] and got.client.tags["audit.meets_requirement"] == "true"
        assert promotion_gate(got.cert, s, ["epsilon"])[0]
    else:
        assert s["verdict"] == "failed" and not s["gate"]["meets"]
    one = s["one_run"]
    assert one["computed"] is False or one["epsilon_at_least"] <= 8.0


def test_the_gate_tags_an_audit_writes_verify_and_forged_ones_do_not(monkeypatch, settings):
    # issue 26: record_audit tagged audit.require/meets_requirement/reason/one_run_epsilon_at_least, and the
    # verifier called them forged — every audited model was refused by verify, load_model and evaluation
    import pytest

    from components.core.errors import VeilError
    from components.registry.verification import _check_tags

    got = _audit(monkeypatch, settings, "passed")
    tags = {k: v for k, v in got.client.tags.items() if k != "privacy.signing_key"}
    assert {"audit.require", "audit.meets_requirement", "audit.reason"} <= set(tags)
    _check_tags("run", tags, got.cert)
    for key, forged in (("audit.meets_requirement", "true"), ("audit.require", "not_failed"),
                        ("audit.one_run_epsilon_at_least", "0")):
        with pytest.raises(VeilError, match=key.replace(".", r"\.")):
            _check_tags("run", {**tags, key: forged}, got.cert)
