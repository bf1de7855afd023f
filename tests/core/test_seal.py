"""Seals and verification without MLflow: directory hashes, keys and trust, ε/γ recomputation, amendments."""
from __future__ import annotations

import json
import math
import os

import dp_accounting
import pytest

from components.certificate import attach_audit, build_certificate
from components.certificate.seal import (
    BINDINGS,
    check_seal,
    fingerprint,
    load_signing_key,
    make_seal,
    raw_public_bytes,
    trusted_keys,
)
from components.certificate.verify import check_amendment, recheck_guarantee
from components.core.errors import VeilError
from components.core.hashing import model_dir_hashes, sha256_dir, sha256_json

import importlib.util as _ilu
from pathlib import Path as _Path

_h = _ilu.spec_from_file_location("bound_run", _Path(__file__).resolve().parents[1] / "bound_run.py")
bound_run = _ilu.module_from_spec(_h)
_h.loader.exec_module(bound_run)

Q, SIGMA, T, DELTA = 0.08, 1.1, 120, 1e-5


def _plan(**kw):
    return {"schema": "veil.plan/v1", "sha256": "ab" * 32, "mechanism": "uls", "privacy_unit": "user",
            "target": {"epsilon": 8.0, "delta": DELTA}, "sampling_rate": Q, "noise_multiplier": SIGMA, "steps": T,
            "expected_batch_size": 16, "clip_norm": 1.0, "records_per_user": 4, "selection": "random",
            "data": {"snapshot_commitment": "cd" * 32, "train_records_commitment": "ef" * 32},
            "policy": {"name": "p", "sha256": "01" * 32}, **kw}


def _res(**kw):
    return {**bound_run.binding(_plan(records_per_user=kw.pop("records_per_user", 4))), "steps_run": T, "mechanism": "uls", "noise_multiplier": SIGMA, "sampling_rate": Q, "clip_norm": 1.0, **kw}


def _rehash(doc):
    body = {k: v for k, v in doc.items() if k != "sha256"}
    return {**body, "sha256": sha256_json(body)}


# --- directory hashes ------------------------------------------------------------------------------

def test_directory_hash_is_content_and_names_not_timestamps(tmp_path):
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    (a / "w.bin").write_bytes(b"\x00\x01")
    (a / "sub" / "tokenizer.json").write_text("{}")
    h = sha256_dir(a)
    os.utime(a / "w.bin", (1, 1))
    assert sha256_dir(a) == h
    b = tmp_path / "b"
    (b / "sub").mkdir(parents=True)
    (b / "w.bin").write_bytes(b"\x00\x01")
    (b / "sub" / "tokenizer.json").write_text("{}")
    assert sha256_dir(b) == h                                 # same files elsewhere: same hash
    (b / "w.bin").rename(b / "w2.bin")
    assert sha256_dir(b) != h                                 # a renamed file is another directory
    (a / "w.bin").write_bytes(b"\x00\x02")
    assert sha256_dir(a) != h
    split = model_dir_hashes(a)
    assert split["tokenizer"] == sha256_dir(a, include=lambda r: r.endswith("tokenizer.json"))
    assert split["model"] == sha256_dir(a)
    # independent: the documented construction, by hand
    import hashlib

    files = {"sub/tokenizer.json": hashlib.sha256(b"{}").hexdigest(), "w.bin": hashlib.sha256(b"\x00\x02").hexdigest()}
    assert sha256_dir(a) == hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_certificate_run_section_must_name_the_sealed_files():
    from components.certificate.verify import certified_artifacts_mismatch

    b = {"weights": "a" * 64, "base_model": "b" * 64, "tokenizer": "c" * 64}
    cert = {"run": {"weights": {"sha256": "a" * 64}, "base_model": {"sha256": "b" * 64}, "tokenizer": None}}
    assert certified_artifacts_mismatch(cert, b) == []
    cert["run"]["base_model"]["sha256"] = "d" * 64
    assert [n for n, _ in certified_artifacts_mismatch(cert, b)] == ["base_model"]
    assert certified_artifacts_mismatch({}, b) == []          # certificates without a run section


# --- keys and trust --------------------------------------------------------------------------------

def test_default_key_is_private_and_stable_and_trusted(settings, monkeypatch):
    monkeypatch.delenv("VEIL_SIGNING_KEY", raising=False)
    monkeypatch.delenv("VEIL_TRUSTED_KEYS", raising=False)
    assert trusted_keys(settings) == {}                      # verifying never creates a key
    k1 = load_signing_key(settings)
    path = settings.private_dir / "keys" / "signing-ed25519.pem"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    k2 = load_signing_key(settings)
    fp = fingerprint(raw_public_bytes(k1.public_key()))
    assert fp == fingerprint(raw_public_bytes(k2.public_key()))
    assert set(trusted_keys(settings)) == {fp}


def test_team_key_from_the_environment_and_a_configured_trust_store(settings, tmp_path, monkeypatch):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    team = Ed25519PrivateKey.generate()
    key_file = tmp_path / "team.pem"
    key_file.write_bytes(team.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    pub_dir = tmp_path / "trust"
    pub_dir.mkdir()
    (pub_dir / "team.pem").write_bytes(team.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    monkeypatch.setenv("VEIL_SIGNING_KEY", str(key_file))
    key = load_signing_key(settings)
    fp = fingerprint(raw_public_bytes(team.public_key()))
    assert fingerprint(raw_public_bytes(key.public_key())) == fp
    assert not (settings.private_dir / "keys").exists()     # the team key, not a new local one
    # A consumer with only the public key (no private key anywhere) trusts it through the store.
    monkeypatch.delenv("VEIL_SIGNING_KEY")
    monkeypatch.setenv("VEIL_TRUSTED_KEYS", str(pub_dir))
    assert set(trusted_keys(settings)) == {fp}
    monkeypatch.setenv("VEIL_SIGNING_KEY", str(tmp_path / "missing.pem"))
    with pytest.raises(VeilError, match="no such key file"):
        load_signing_key(settings)


def test_seal_signature_binds_everything_and_trust_is_required():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    cert = build_certificate(_plan(), _res()).to_dict()
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    bindings = {b: f"{i:064x}" for i, b in enumerate(BINDINGS)}
    seal = make_seal(cert, bindings, key)
    trust = {fingerprint(raw_public_bytes(key.public_key())): key.public_key()}
    assert check_seal(seal, trust) == seal["public_key"]["fingerprint"]
    for edit in ({"certificate_sha256": "0" * 64}, {"bindings": dict(bindings, weights="f" * 64)},
                 {"signed_at": "2000-01-01"}):
        with pytest.raises(VeilError, match="does not verify"):
            check_seal({**seal, **edit}, trust)
    with pytest.raises(VeilError, match="not in the trust store"):
        check_seal(make_seal(cert, bindings, other), trust)
    with pytest.raises(VeilError, match="no trusted keys"):
        check_seal(seal, {})
    with pytest.raises(VeilError, match="bindings must be exactly"):
        make_seal(cert, {"weights": None}, key)


# --- the guarantee recomputed ----------------------------------------------------------------------

def test_epsilon_recomputed_matches_an_independent_accountant_and_refuses_edits():
    cert = build_certificate(_plan(), _res()).to_dict()
    eps, _ = recheck_guarantee(cert)
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), T))
    ref = acc.get_epsilon(DELTA)
    assert ref <= eps <= ref * 1.01
    with pytest.raises(VeilError, match="give ε"):
        recheck_guarantee(_rehash(dict(cert, epsilon=0.5)))
    with pytest.raises(VeilError, match="steps=1"):
        recheck_guarantee(_rehash(dict(cert, steps=1)))
    with pytest.raises(VeilError, match="give ε"):
        recheck_guarantee(_rehash(dict(cert, noise_multiplier=SIGMA * 2)))
    with pytest.raises(VeilError, match="within_target"):
        recheck_guarantee(_rehash(dict(cert, target=dict(cert["target"], epsilon=eps / 2))))
    # Inside the accountant's documented tolerance (a different dp-accounting build) is accepted.
    recheck_guarantee(dict(cert, epsilon=eps * (1 + 1e-3)))


def test_gamma_recomputed_for_a_secret_certificate():
    from components.accounting.secrets import SecretTarget, _d_kl

    plan = _plan(mechanism="secret", steps=50, sampling_rate=0.02, noise_multiplier=3.0, records_per_user=None,
                 target={"epsilon": None, "delta": None, "secrets": {"credential": {"kappa": 1e-3, "gamma": 0.05}}})
    res = _res(steps_run=50, mechanism="secret", sampling_rate=0.02, noise_multiplier=3.0, records_per_user=None)
    targets = [SecretTarget.make("credential:A", [0.02], 1e-3, 0.05),
               SecretTarget.make("credential:B", [0.04], 1e-3, 0.05)]
    cert = build_certificate(plan, res, secret_targets=targets).to_dict()
    eps, gamma = recheck_guarantee(cert)
    cls = cert["secrets"]["credential"]
    assert eps is None and gamma["credential"] == pytest.approx(cls["max_gamma"], rel=1e-12)
    # independent: γ is where the Bernoulli KL from κ reaches the certificate's KL, rounded up to 6
    # significant digits (components.core.canonical): at or just past that point, never before it
    assert _d_kl(gamma["credential"], 1e-3) >= cls["max_kl"] * (1 - 1e-9)
    assert _d_kl(gamma["credential"] / (1 + 1e-5), 1e-3) <= cls["max_kl"]
    with pytest.raises(VeilError, match="steps × per-step"):
        recheck_guarantee(_rehash(dict(cert, steps=5)))
    edited = json.loads(json.dumps(cert))
    edited["secrets"]["credential"]["max_gamma"] = 0.002
    with pytest.raises(VeilError, match="gives γ"):
        recheck_guarantee(_rehash(edited))


# --- the audit amendment ---------------------------------------------------------------------------

def test_amendment_may_add_only_an_audit():
    pre = build_certificate(_plan(), _res()).to_dict()
    post = attach_audit(pre, {"auroc": 0.5, "passed": True}).to_dict()
    check_amendment(post, pre)
    check_amendment(pre, pre)
    with pytest.raises(VeilError, match="beyond its audit: epsilon"):
        check_amendment(_rehash(dict(post, epsilon=0.5)), pre)
    again = attach_audit(post, {"auroc": 0.4, "passed": True}).to_dict()   # a chain of two links
    with pytest.raises(VeilError, match="neither is nor supersedes"):
        check_amendment(again, pre)
    with pytest.raises(VeilError, match="pre-audit"):
        check_amendment(attach_audit(post, {"auroc": 0.4}).to_dict(), post)


def test_keys_command_shows_the_public_key_and_adds_trusted_keys(settings, tmp_path, monkeypatch):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.delenv("VEIL_SIGNING_KEY", raising=False)
    monkeypatch.delenv("VEIL_TRUSTED_KEYS", raising=False)
    res = CliRunner().invoke(app, ["signing-key", "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["trusted"] == [doc["fingerprint"]]
    assert "PRIVATE" not in res.stdout and doc["public_key_pem"].startswith("-----BEGIN PUBLIC KEY-----")
    team = Ed25519PrivateKey.generate().public_key()
    pem = tmp_path / "team.pub.pem"
    pem.write_bytes(team.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    res = CliRunner().invoke(app, ["signing-key", "--trust", str(pem), "--json"])
    assert fingerprint(raw_public_bytes(team)) in json.loads(res.stdout)["trusted"]
    res = CliRunner().invoke(app, ["signing-key", "--trust", str(tmp_path / "nope.pem")])
    assert res.exit_code == 2
