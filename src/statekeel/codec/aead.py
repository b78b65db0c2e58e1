"""The keys of encryption at rest and their AEAD: a key's id, the check of ``encryption_key``, and the
AES-256-GCM cipher of a key. The cipher (``encryption.py``) and the key ring (``keyring.py``) both seal
with these; this module imports neither."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from ..errors import EncryptionError, InvalidArgument

KEY_BYTES = 32
NONCE_BYTES = 12
INSTALL_HINT = "pip install 'statekeel[encryption]'"


def key_id(key: bytes) -> str:
    """The id under which values sealed with ``key`` are stored: 16 hex digits of an HMAC of a fixed
    label, which names the key in errors and reports without revealing it."""
    return hmac.new(key, b"statekeel encryption key id", hashlib.sha256).hexdigest()[:16]


def check_keys(value: Any) -> tuple[bytes, ...]:
    """``encryption_key`` as a tuple of keys, current first: one key (bytes) or a non-empty list of them."""
    keys = (value,) if isinstance(value, bytes) else value
    if not isinstance(keys, (list, tuple)) or not keys:
        raise InvalidArgument(
            "encryption_key must be 32 bytes (os.urandom(32)) or a non-empty list of such keys, current "
            f"first; got {type(value).__name__}"
        )
    for key in keys:
        if type(key) is not bytes or len(key) != KEY_BYTES:
            size = f" of {len(key)} bytes" if isinstance(key, bytes) else ""
            raise InvalidArgument(
                f"each encryption key must be {KEY_BYTES} bytes (AES-256; os.urandom(32)), got "
                f"{type(key).__name__}{size}"
            )
    ids = [key_id(k) for k in keys]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("encryption_key lists the same key twice")
    return tuple(keys)


def aead_for(key: bytes) -> Any:
    """The AES-256-GCM cipher of ``key`` (raises ``EncryptionError`` without the cryptography package)."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise EncryptionError(
            f"encryption_key needs the cryptography package, which is not installed: {INSTALL_HINT}",
            hint="",
        ) from None
    return AESGCM(key)


__all__ = ["INSTALL_HINT", "KEY_BYTES", "NONCE_BYTES", "aead_for", "check_keys", "key_id"]
