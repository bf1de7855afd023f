"""Pseudonymous person keys: HMAC-SHA256 of a person's canonical id under a secret ledger key.

The key file lives in the private area (0600). Without it a ledger row cannot be tied to a name by
hashing candidate ids (a plain hash of an e-mail address can). The same key gives the same
pseudonym in every snapshot and from every source, so a person is charged once however they arrive.
A ledger remembers a fingerprint of its key: a second machine with another key would give everyone
new pseudonyms (a fresh budget), so it is refused.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import unicodedata
from pathlib import Path

from components.core import identity as _identity
from components.core.errors import VeilError

KEY_BYTES = 32
KEY_FILE = "ledger.key"
ENV_KEY_FILE = "VEIL_LEDGER_KEY_FILE"   # a team's shared key (e.g. a mounted secret) instead of the private one


def key_path(private_dir: Path) -> Path:
    return Path(os.environ.get(ENV_KEY_FILE) or Path(private_dir) / KEY_FILE)


def load_or_create_key(private_dir: Path) -> bytes:
    """The ledger key; created once (O_EXCL, mode 0600) so concurrent first runs agree on one key."""
    path = key_path(private_dir)
    if not path.exists():
        if os.environ.get(ENV_KEY_FILE):
            raise VeilError(f"${ENV_KEY_FILE}: {path} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(path.parent, 0o700)
        except OSError:
            pass
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process won the race; read theirs below
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
    for _ in range(100):  # the winner may still be writing
        data = path.read_bytes()
        if len(data) >= KEY_BYTES:
            return data
        import time
        time.sleep(0.01)
    raise VeilError(f"ledger key {path}: shorter than {KEY_BYTES} bytes; restore it from backup")


def canonical_id(person_id: str) -> str:
    """The person an id names: the one identity rule (components.core.identity.person_id), which the
    catalog and the planner apply too. `Alice@Example.com `, `Alice <alice@example.com>` and
    `alice@example.com` are one person."""
    if person_id is None:
        raise VeilError("ledger: a person id is missing (None)")
    try:
        return _identity.person_id(person_id)
    except VeilError:
        raise VeilError("ledger: a person id is empty") from None


def person_key(key: bytes, person_id: str) -> str:
    return hmac.new(key, b"veil-person:" + canonical_id(person_id).encode("utf-8"), hashlib.sha256).hexdigest()


def person_keyer(key: bytes):
    """`person_key` under `key` as a function, for keying many ids: HMAC-SHA256 (RFC 2104) from the key's
    inner and outer hash states computed once, each id costing two hash copies (a release keys every one
    of its people; tests/privacy/test_ledger_store.py checks it against `person_key`)."""
    block = hashlib.sha256().block_size
    k = hashlib.sha256(key).digest() if len(key) > block else key
    k = k.ljust(block, b"\0")
    inner = hashlib.sha256(bytes(x ^ 0x36 for x in k))
    inner.update(b"veil-person:")
    outer = hashlib.sha256(bytes(x ^ 0x5C for x in k))

    def keyed(person_id: str) -> str:
        h = inner.copy()
        h.update(canonical_id(person_id).encode("utf-8"))
        o = outer.copy()
        o.update(h.digest())
        return o.hexdigest()
    return keyed


def legacy_person_key(key: bytes, person_id: str) -> str | None:
    """The pseudonym this id had under the ledger's earlier rule (NFKC, trimmed, case-folded;
    identity.legacy_person_id). The new rule only merges more, so it is this id's person's pseudonym
    then; None when it is the same as today's (nothing to link) or empty."""
    old = _identity.legacy_person_id(person_id)
    if not old or old == _identity.person_id_or_empty(person_id):
        return None
    return hmac.new(key, b"veil-person:" + old.encode("utf-8"), hashlib.sha256).hexdigest()


def canonical_secret_id(secret_id: str) -> str:
    """The catalog's `class:normalized value`, NFKC and trimmed (values such as keys are case-sensitive,
    so no case-folding). Refused without its class prefix: the class is part of the secret's name."""
    if secret_id is None:
        raise VeilError("ledger: a secret id is missing (None)")
    c = unicodedata.normalize("NFKC", str(secret_id)).strip()
    cls, sep, value = c.partition(":")
    if not sep or not cls or not value:
        raise VeilError("ledger: a secret id must read 'class:value'")
    return c


def secret_key(key: bytes, secret_id: str) -> str:
    """The secret's pseudonym in the ledger: only this, never the value, is stored."""
    return hmac.new(key, b"veil-secret:" + canonical_secret_id(secret_id).encode("utf-8"), hashlib.sha256).hexdigest()


def key_fingerprint(key: bytes) -> str:
    return hmac.new(key, b"veil-ledger-key-fingerprint", hashlib.sha256).hexdigest()
