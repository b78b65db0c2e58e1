"""The hashes that make the audit log tamper-evident, used by the audit and approval managers and by the
backends that append entries (it sits below both).

- :func:`chain_hash`: an entry's SHA-256 over its fields and its predecessor's hash (the chain);
- :func:`entry_mac`: with an audit key, an HMAC-SHA256 of that hash. The chain alone shows a changed or
  removed entry, but anyone who can write the database can recompute a whole new chain; a MAC cannot be
  recomputed without the key, and since each hash covers every entry before it, one valid MAC vouches for
  the whole chain up to its entry;
- :func:`approval_digest`: the SHA-256 of an approval row's canonical form, stored in the audit entry
  of every change to the approval, so a row changed behind the database's triggers no longer matches.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from typing import Any, Protocol

import orjson

from .codec import canonical
from .errors import InvalidArgument

GENESIS_HASH = "0" * 64
MIN_AUDIT_KEY_BYTES = 16


def check_audit_key(key: Any) -> None:
    """Refuse an ``audit_key`` that is not bytes of at least :data:`MIN_AUDIT_KEY_BYTES`."""
    if key is not None and (type(key) is not bytes or len(key) < MIN_AUDIT_KEY_BYTES):
        raise InvalidArgument(
            f"audit_key must be bytes of at least {MIN_AUDIT_KEY_BYTES} (e.g. os.urandom(32)), got "
            f"{type(key).__name__}" + (f" of {len(key)} bytes" if isinstance(key, bytes) else "")
        )


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class ApprovalFields(Protocol):
    """The fields of an approval row its digest and entry kind are computed from (the backends'
    ``ApprovalRecord`` has them): the chain sits below the storage contract and knows no backend."""

    @property
    def id(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def args_hash(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def requested_by(self) -> str: ...
    @property
    def requested_at(self) -> dt.datetime: ...
    @property
    def expires_at(self) -> dt.datetime | None: ...
    @property
    def decided_by(self) -> str | None: ...
    @property
    def decided_at(self) -> dt.datetime | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def consumed_by(self) -> str | None: ...
    @property
    def consumed_at(self) -> dt.datetime | None: ...


def micros(value: dt.datetime) -> int:
    """Microseconds since the Unix epoch (exact)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def chain_hash(
    seq: int, kind: str, actor: str, subject: str, data: str, created_at: dt.datetime, prev_hash: str
) -> str:
    """The hash of one entry: SHA-256 over the canonical JSON of its fields and its predecessor's hash.

    ``data`` is the stored canonical JSON text and ``created_at`` counts in whole microseconds, so the hash
    is recomputed exactly from what the database holds.
    """
    body = {
        "seq": seq,
        "kind": kind,
        "actor": actor,
        "subject": subject,
        "data": data,
        "created_at": micros(created_at),
        "prev_hash": prev_hash,
    }
    # The fields are plain JSON, which canonical() would hand back unchanged — except text holding a NUL,
    # which it tags: only then is the codec's walk needed (verify() hashes every entry, so it matters).
    if "\x00" in kind or "\x00" in actor or "\x00" in subject or "\x00" in data or "\x00" in prev_hash:
        return hashlib.sha256(canonical(body)).hexdigest()
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def entry_mac(key: bytes, digest: str) -> str:
    """The MAC of an entry's chain hash under the store's audit key (hex)."""
    return hmac.new(key, digest.encode("ascii"), hashlib.sha256).hexdigest()


def mac_ok(key: bytes, digest: str, mac: str | None) -> bool:
    return mac is not None and hmac.compare_digest(entry_mac(key, digest), mac)


def args_digest(args: Any) -> str:
    """The binding of approval arguments: SHA-256 hex of their canonical encoding."""
    return hashlib.sha256(canonical(args)).hexdigest()


def _ts(value: dt.datetime | None) -> int | None:
    return None if value is None else micros(value)


def approval_digest(record: ApprovalFields) -> str:
    """SHA-256 of the approval row as stored (every field but its version counter)."""
    body = {
        "id": record.id,
        "subject": record.subject,
        "action": record.action,
        "args_hash": record.args_hash,
        "status": record.status,
        "requested_by": record.requested_by,
        "requested_at": _ts(record.requested_at),
        "expires_at": _ts(record.expires_at),
        "decided_by": record.decided_by,
        "decided_at": _ts(record.decided_at),
        "reason": record.reason,
        "consumed_by": record.consumed_by,
        "consumed_at": _ts(record.consumed_at),
    }
    return hashlib.sha256(canonical(body)).hexdigest()


# The kinds of the audit entries statekeel itself writes for approvals: the only ones an approval's binding
# (check, consume, verify) reads, on every backend. ``audit.append`` refuses any kind starting with
# ``approval.`` (in any case), so an application's own entry can never stand for an approval's latest change.
APPROVAL_ENTRY_KINDS = frozenset(
    ("approval.requested", "approval.granted", "approval.denied", "approval.consumed")
)
RESERVED_KIND_PREFIX = "approval."


def approval_entry_kind(record: ApprovalFields) -> str:
    """The kind of the audit entry that the approval's latest change appended."""
    if record.consumed_at is not None:
        return "approval.consumed"
    return {"pending": "approval.requested", "granted": "approval.granted"}.get(
        record.status, "approval.denied"
    )


__all__ = [
    "APPROVAL_ENTRY_KINDS",
    "GENESIS_HASH",
    "MIN_AUDIT_KEY_BYTES",
    "RESERVED_KIND_PREFIX",
    "ApprovalFields",
    "approval_digest",
    "approval_entry_kind",
    "args_digest",
    "chain_hash",
    "check_audit_key",
    "entry_mac",
    "mac_ok",
    "micros",
]
