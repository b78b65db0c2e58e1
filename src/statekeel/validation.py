"""Argument checks shared by the managers: each raises a typed error before anything is written."""

from __future__ import annotations

import datetime as dt
from typing import Any

from .errors import InvalidArgument, InvalidKey

MAX_KEY_BYTES = 512
# The largest integer every backend stores (SQLite's INTEGER and PostgreSQL's BIGINT are signed 64-bit).
MAX_INT = 2**63 - 1


def check_key(key: Any, what: str = "key") -> str:
    """Return ``key`` if it is a valid identifier: non-empty str, no NUL, at most 512 UTF-8 bytes."""
    if type(key) is not str:
        raise InvalidKey(f"{what} must be a str, got {type(key).__name__}", key=key)
    if not key:
        raise InvalidKey(f"{what} is empty", key=key)
    if "\x00" in key:
        raise InvalidKey(f"{what} {key!r} contains NUL", key=key)
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidKey(f"{what} {key!r} is not valid Unicode (lone surrogate)", key=key) from None
    if size > MAX_KEY_BYTES:
        raise InvalidKey(f"{what} is {size} bytes in UTF-8, over the limit of {MAX_KEY_BYTES}", key=key[:40])
    return key


def check_int(value: Any, what: str, *, minimum: int | None = 0, maximum: int = MAX_INT) -> int:
    """Return ``value`` if it is an int (not a bool) of at least ``minimum`` and at most ``maximum``
    (by default the largest signed 64-bit integer, what every backend stores)."""
    if type(value) is not int:
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__} {value!r}", value=value)
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{what} must be >= {minimum}, got {value}", value=value)
    if value > maximum or value < -MAX_INT - 1:
        raise InvalidArgument(
            f"{what} must be at most {maximum} (a signed 64-bit integer), got {value}", value=value
        )
    return value


def check_bool(value: Any, what: str) -> bool:
    """Return ``value`` if it is True or False (not 0, 1 or another truthy value)."""
    if type(value) is not bool:
        raise InvalidArgument(f"{what} must be True or False, got {value!r}", value=value)
    return value


def check_str(value: Any, what: str) -> str:
    """Return ``value`` if it is a non-empty str."""
    if type(value) is not str or not value:
        raise InvalidArgument(f"{what} must be a non-empty str, got {value!r}", value=value)
    return value


def check_aware(value: Any, what: str) -> dt.datetime:
    """Return ``value`` if it is a timezone-aware datetime that has a UTC equivalent (what is stored)."""
    # utcoffset(), not tzinfo: a tzinfo whose offset is None leaves the datetime naive.
    if type(value) is not dt.datetime or value.utcoffset() is None:
        raise InvalidArgument(f"{what} must be a timezone-aware datetime, got {value!r}", value=value)
    try:
        value.astimezone(dt.UTC)
    except OverflowError:
        raise InvalidArgument(
            f"{what} {value!r} has no UTC equivalent (it falls outside years 1-9999 in UTC); give a time "
            "within that range",
            value=value,
        ) from None
    return value


def check_text(value: Any, what: str, *, allow_empty: bool = False) -> str:
    """Return ``value`` if it is a str every backend can store as text: no NUL (PostgreSQL refuses it,
    SQLite would keep it, so a store could not be copied across) and no lone surrogate (not UTF-8)."""
    if type(value) is not str or (not value and not allow_empty):
        wanted = "a str" if allow_empty else "a non-empty str"
        raise InvalidArgument(f"{what} must be {wanted}, got {value!r}", value=value)
    if "\x00" in value:
        raise InvalidArgument(f"{what} {value[:40]!r} contains NUL; remove it or store it in metadata")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {value[:40]!r} is not valid Unicode (lone surrogate)") from None
    return value
