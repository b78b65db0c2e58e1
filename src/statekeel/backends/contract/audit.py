"""The hash-chained audit log and the approvals bound to it."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "APPROVAL_STATUSES",
    "ApprovalBackend",
    "ApprovalRecord",
    "AuditBackend",
    "AuditNote",
    "AuditRecord",
]


APPROVAL_STATUSES = ("pending", "granted", "denied")


AuditNote = tuple[str, str, str, str]
"""An audit entry to append with a change, in the change's transaction: (kind, actor, subject, data as
canonical JSON text)."""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An audit row as stored. ``data`` is the canonical JSON text the hash was computed over; ``mac`` is
    the HMAC of ``hash`` under the store's audit key (None when appended without a key)."""

    seq: int
    kind: str
    actor: str
    subject: str
    data: str
    created_at: dt.datetime
    prev_hash: str
    hash: str
    mac: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """An approval: requested, decided once (granted or denied), consumed at most once."""

    id: str
    subject: str
    action: str
    args: Any
    args_hash: str
    status: str
    requested_by: str
    requested_at: dt.datetime
    expires_at: dt.datetime | None
    decided_by: str | None
    decided_at: dt.datetime | None
    reason: str | None
    consumed_by: str | None
    consumed_at: dt.datetime | None
    version: int


class AuditBackend(abc.ABC):
    """The append-only, hash-chained audit log."""

    # Set by the store (``open_store(audit_key=...)``): every entry appended gets the MAC of its hash.
    audit_key: bytes | None = None

    # Whether scan_audit reads the entries and the approvals on one snapshot. A store paired with NATS
    # reads them from two systems, and AuditLog.verify reads again when an approval seems not to match.
    audit_snapshot: bool = True

    async def audit_lag(self) -> tuple[int, dt.datetime | None]:
        """Audit entries of committed changes that are not on the chain yet, and the oldest one's time: a
        store paired with NATS relays its SQL kinds' entries from an outbox after their commit. ``(0,
        None)`` on a store whose changes and entries commit together."""
        return 0, None

    @abc.abstractmethod
    async def append_audit(self, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
        """Append an entry after the current head (serialized: the chain never forks). ``data`` is
        canonical JSON text; seq, prev_hash, created_at, hash (and with :attr:`audit_key`, mac) are
        assigned in the transaction."""

    @abc.abstractmethod
    async def latest_approval_entry(self, approval_id: str) -> AuditRecord | None:
        """The newest ``approval.*`` entry whose data names ``approval_id``, or None."""

    @abc.abstractmethod
    async def read_audit(
        self,
        *,
        subject: str | None = None,
        kind: str | None = None,
        since: dt.datetime | None = None,
        after_seq: int = 0,
        limit: int = 100,
    ) -> list[AuditRecord]:
        """Entries in seq order with ``seq > after_seq`` matching the filters."""

    @abc.abstractmethod
    async def scan_audit(
        self,
        entries: Callable[[list[AuditRecord]], bool],
        approvals: Callable[[list[ApprovalRecord]], bool],
        *,
        page: int = 1000,
    ) -> None:
        """Read the whole log, then every approval, on **one** snapshot (what ``audit.verify()`` needs:
        an approval requested, decided or consumed meanwhile is seen with its entry, or not at all).

        Pages of up to ``page`` entries in seq order go to ``entries``, then pages of approvals in id
        order to ``approvals``; either callback returns False to stop the scan. The callbacks are plain
        functions (they may run on the backend's reading thread): they must not block or await."""


class ApprovalBackend(abc.ABC):
    """Approvals bound to exact arguments; decided once, consumed once."""

    @abc.abstractmethod
    async def create_approval(
        self,
        approval_id: str,
        *,
        subject: str,
        action: str,
        args: bytes,
        args_hash: str,
        requested_by: str,
        expires_at: dt.datetime | None,
    ) -> ApprovalRecord: ...

    @abc.abstractmethod
    async def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    @abc.abstractmethod
    async def decide_approval(
        self, approval_id: str, *, granted: bool, decided_by: str, reason: str | None, now: dt.datetime
    ) -> ApprovalRecord | None:
        """Decide a pending, unexpired approval. None when it is not (already decided, expired, unknown)."""

    @abc.abstractmethod
    async def find_approval(
        self, subject: str, action: str, args_hash: str, now: dt.datetime
    ) -> ApprovalRecord | None:
        """The oldest granted, unexpired, unconsumed approval with exactly this binding."""

    @abc.abstractmethod
    async def consume_approval(self, approval_id: str, by: str, now: dt.datetime) -> ApprovalRecord | None:
        """Mark a granted, unexpired, unconsumed approval consumed. None when it is not."""

    @abc.abstractmethod
    async def pending_approvals(self, now: dt.datetime, limit: int = 100) -> list[ApprovalRecord]:
        """Undecided, unexpired approvals, oldest first."""

    @abc.abstractmethod
    async def list_approvals(self, *, after_id: str = "", limit: int = 1000) -> list[ApprovalRecord]:
        """Every approval with an id after ``after_id``, in id order (bytewise), for verification."""
