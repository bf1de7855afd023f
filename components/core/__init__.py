"""Small shared pieces: settings, user errors, hashing, progress display."""
from components.core.errors import VeilError
from components.core.hashing import canonical_json, sha256_bytes, sha256_file, sha256_json
from components.core.settings import Settings, load_settings

__all__ = [
    "VeilError",
    "Settings",
    "load_settings",
    "canonical_json",
    "sha256_bytes",
    "sha256_file",
    "sha256_json",
]
