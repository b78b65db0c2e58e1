"""The codec and what seals it: ``tagged.py`` the JSON codec with tagged types (``Codec``, ``canonical``),
``encryption.py`` the optional cipher it carries and key rotation, ``keyring.py`` the per-subject data keys
the cipher seals under."""

from __future__ import annotations

from .tagged import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_RECORD_BYTES,
    TAG,
    Codec,
    Decoder,
    Encoder,
    canonical,
    decode,
    encode,
    format_path,
    register_type,
)

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_RECORD_BYTES",
    "TAG",
    "Codec",
    "Decoder",
    "Encoder",
    "canonical",
    "decode",
    "encode",
    "format_path",
    "register_type",
]
