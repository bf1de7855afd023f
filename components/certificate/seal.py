"""Seals: an Ed25519 signature over a certificate's hash and the hashes of what it certifies.

A certificate's self-hash only proves the document is internally consistent: anyone who edits it can
re-hash it. A seal is signed with a private key the registry's writers do not have to hold, and
binds the certificate to the exact bytes it speaks for:

    {"schema": "veil.seal/v1", "certificate_sha256": …,
     "bindings": {"weights", "base_model", "tokenizer", "plan", "policy", "ledger_entry", "code"},
     "public_key": {"algorithm": "ed25519", "raw": base64, "fingerprint": "sha256:…"},
     "signed_at": …, "signature": base64(Ed25519(canonical JSON of everything else))}

Keys. The signing key is `$VEIL_SIGNING_KEY` (a PEM file: a team key) or else
`VEIL_HOME/private/keys/signing-ed25519.pem`, created 0600 on first use. A consumer accepts a seal
only when its public key is in the trust store: `$VEIL_TRUSTED_KEYS` (PEM public keys; files or
folders, `os.pathsep`-separated), `VEIL_HOME/trusted-keys/*.pem`, and the local signing key's public
half when one exists. The public key inside a seal is a convenience for finding the key; trust
comes only from the store.
"""
from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

from components.core.errors import VeilError
from components.core.hashing import canonical_json
from components.publication import publish

SEAL_SCHEMA = "veil.seal/v1"
KEY_ENV = "VEIL_SIGNING_KEY"
TRUST_ENV = "VEIL_TRUSTED_KEYS"
DEFAULT_KEY_FILE = "signing-ed25519.pem"
TRUSTED_DIR = "trusted-keys"
BINDINGS = ("weights", "base_model", "tokenizer", "plan", "policy", "ledger_entry", "code")
# A synthetic corpus' seal (components.synthetic): its own schema, so a corpus seal is never taken
# for a model's (and the reverse), and its own bindings — the corpus files and the model release it
# post-processes.
SYNTHETIC_SEAL_SCHEMA = "veil.seal.synthetic/v1"
SYNTHETIC_BINDINGS = ("corpus_jsonl", "corpus_parquet", "model_certificate", "model_seal", "prompts")
_KINDS = {"model": (SEAL_SCHEMA, BINDINGS), "synthetic": (SYNTHETIC_SEAL_SCHEMA, SYNTHETIC_BINDINGS)}


def fingerprint(raw_public: bytes) -> str:
    """`sha256:<hex>` of the raw 32-byte Ed25519 public key (what a person compares by eye)."""
    return "sha256:" + hashlib.sha256(raw_public).hexdigest()


def raw_public_bytes(public_key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_pem(public_key) -> str:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def default_key_path(settings) -> Path:
    return Path(settings.private_dir) / "keys" / DEFAULT_KEY_FILE


def signing_key_path(settings, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env[KEY_ENV]).expanduser() if env.get(KEY_ENV) else default_key_path(settings)


def _read_private(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise VeilError(f"{path}: not a readable unencrypted PEM private key ({type(e).__name__}: {e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise VeilError(f"{path}: signing key must be Ed25519, got {type(key).__name__}")
    return key


def _create_default_key(path: Path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        # O_EXCL: two processes registering at once must not each write (and sign with) a different key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_private(path)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key


def load_signing_key(settings, *, env: Mapping[str, str] | None = None):
    """The Ed25519 private key that seals certificates (the default one is created on first use)."""
    env = os.environ if env is None else env
    path = signing_key_path(settings, env)
    if env.get(KEY_ENV):
        if not path.is_file():
            raise VeilError(f"${KEY_ENV}={path}: no such key file")
        return _read_private(path)
    if not path.is_file():
        return _create_default_key(path)
    return _read_private(path)


def read_public_keys(path: Path) -> list:
    """Public keys from a PEM file (a private key file contributes its public half)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    data = path.read_bytes()
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise VeilError(f"{path}: trusted key is not a PEM Ed25519 public key ({e})") from None
        if isinstance(key, Ed25519PrivateKey):
            key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise VeilError(f"{path}: trusted key must be Ed25519, got {type(key).__name__}")
    return [key]


def trusted_keys(settings=None, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{fingerprint: Ed25519PublicKey} of the keys whose seals this consumer accepts."""
    env = os.environ if env is None else env
    sources: list[Path] = []
    for part in (env.get(TRUST_ENV) or "").split(os.pathsep):
        if part.strip():
            p = Path(part.strip()).expanduser()
            if not p.exists():
                raise VeilError(f"${TRUST_ENV}: {p}: no such file or folder")
            sources += sorted(x for x in p.glob("*.pem")) if p.is_dir() else [p]
    if settings is not None:
        d = Path(settings.home) / TRUSTED_DIR
        if d.is_dir():
            sources += sorted(d.glob("*.pem"))
        local = signing_key_path(settings, env)
        if local.is_file():
            sources.append(local)
    out: dict[str, Any] = {}
    for src in sources:
        for key in read_public_keys(src):
            out[fingerprint(raw_public_bytes(key))] = key
    return out


def make_seal(certificate: Mapping[str, Any], bindings: Mapping[str, Any], private_key, *,
              signed_at: str | None = None, kind: str = "model") -> dict:
    """Sign `certificate`'s sha256 together with the artifact `bindings` (all of the kind's binding
    names, None allowed). `kind`: "model" (BINDINGS, channel `seal`) or "synthetic"
    (SYNTHETIC_BINDINGS, channel `synthetic.seal`)."""
    schema, names = _KINDS[kind]
    unknown = set(bindings) - set(names)
    missing = set(names) - set(bindings)
    if unknown or missing:
        raise VeilError(f"seal: bindings must be exactly {', '.join(names)} "
                        f"(unknown: {sorted(unknown)}, missing: {sorted(missing)})")
    raw = raw_public_bytes(private_key.public_key())
    body = {
        "schema": schema,
        "certificate_sha256": certificate["sha256"],
        "bindings": {k: bindings[k] for k in names},
        "public_key": {"algorithm": "ed25519", "raw": base64.b64encode(raw).decode(), "fingerprint": fingerprint(raw)},
        "signed_at": signed_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return publish("seal" if kind == "model" else "synthetic.seal",
                   {**body, "signature": base64.b64encode(private_key.sign(canonical_json(body))).decode()})


def check_seal(seal: Any, trusted: Mapping[str, Any], *, kind: str = "model") -> str:
    """Verify a seal's signature with a trusted key; return that key's fingerprint or raise VeilError.
    `kind`: the seal must be of that kind's schema (a corpus seal never passes for a model's)."""
    from cryptography.exceptions import InvalidSignature

    schema = _KINDS[kind][0]
    if not isinstance(seal, Mapping) or seal.get("schema") != schema:
        raise VeilError(f"seal: not a {schema} document")
    for k in ("certificate_sha256", "bindings", "public_key", "signature"):
        if k not in seal:
            raise VeilError(f"seal: missing field {k}")
    if not trusted:
        raise VeilError(f"seal: no trusted keys (set ${TRUST_ENV} to the signer's public key PEM, or add it to "
                        f"VEIL_HOME/{TRUSTED_DIR}/)")
    try:
        raw = base64.b64decode(seal["public_key"]["raw"], validate=True)
        sig = base64.b64decode(seal["signature"], validate=True)
    except (KeyError, TypeError, ValueError):
        raise VeilError("seal: public key or signature is not base64") from None
    fp = fingerprint(raw)
    key = trusted.get(fp)
    if key is None:
        raise VeilError(f"seal: signed by key {fp[:19]}…, which is not in the trust store")
    body = {k: v for k, v in seal.items() if k != "signature"}
    try:
        key.verify(sig, canonical_json(body))
    except InvalidSignature:
        raise VeilError(f"seal: signature does not verify with key {fp[:19]}… (the seal or what it binds was edited)") from None
    return fp
