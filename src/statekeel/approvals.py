"""Approvals bound to the exact arguments they approve, decided once, consumed once, all audited.

    approval = await store.approvals.request("task:42", "shell", {"cmd": "rm -rf build"}, "agent-7")
    await store.approvals.decide(approval.id, True, "alice", reason="build dir only")
    ok = await store.approvals.check("task:42", "shell", {"cmd": "rm -rf build"})   # the approval
    assert await store.approvals.check("task:42", "shell", {"cmd": "rm -rf /"}) is None
    await store.approvals.consume(ok.id, "agent-7")                                 # single use

The binding is the SHA-256 of the canonical encoding of ``args`` (sorted keys), compared exactly. Every
request, decision and consumption appends its audit entry (``approval.requested``, ``approval.granted``
or ``approval.denied``, ``approval.consumed``) in the same transaction as the change itself.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any, NoReturn

from .audit import AuditLog
from .backends.base import ApprovalRecord, StorageBackend
from .codec import Codec, canonical
from .errors import ConflictError, InvalidArgument, InvalidTransition, NotFound
from .validation import check_aware, check_int, check_key, check_text

Approval = ApprovalRecord
"""An approval as stored: see :class:`statekeel.backends.base.ApprovalRecord`."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ApprovalLog:
    """Requests, decides, checks and consumes approvals. See the module docstring."""

    def __init__(self, backend: StorageBackend, codec: Codec, audit: AuditLog) -> None:
        self.backend = backend
        self.codec = codec
        self.audit = audit

    def args_hash(self, args: Any) -> str:
        """The binding of ``args``: SHA-256 hex of their canonical encoding (typed error if unstorable)."""
        return self._encode_args(args)[1]

    def _encode_args(self, args: Any) -> tuple[bytes, str]:
        # encode() names the path of a bad value and enforces the size limit; canonical() fixes key order.
        raw = self.codec.encode(args, where="args")
        return raw, hashlib.sha256(canonical(args)).hexdigest()

    async def request(
        self,
        subject: str,
        action: str,
        args: Any,
        requested_by: str,
        expires_at: dt.datetime | None = None,
    ) -> Approval:
        """Ask for approval of ``action`` on ``subject`` with exactly ``args``; pending until decided."""
        check_key(subject, "subject")
        check_key(action, "action")
        check_key(requested_by, "requested_by")
        if expires_at is not None:
            check_aware(expires_at, "expires_at")
            if expires_at <= _utcnow():
                raise InvalidArgument(f"expires_at {expires_at.isoformat()} is already past")
        raw, digest = self._encode_args(args)
        approval_id = str(uuid.uuid4())
        data = self.audit.encode_data(
            {
                "approval_id": approval_id,
                "action": action,
                "args_hash": digest,
                "expires_at": None if expires_at is None else expires_at.isoformat(),
            }
        )
        async with self.backend.atomic():
            record = await self.backend.create_approval(
                approval_id,
                subject=subject,
                action=action,
                args=raw,
                args_hash=digest,
                requested_by=requested_by,
                expires_at=expires_at,
            )
            await self.backend.append_audit("approval.requested", requested_by, subject, data)
        return record

    async def decide(
        self, approval_id: str, granted: bool, decided_by: str, reason: str | None = None
    ) -> Approval:
        """Grant or deny a pending approval, exactly once: a second decision raises ``ConflictError``,
        an expired approval ``InvalidTransition``, an unknown one ``NotFound`` (nothing written)."""
        check_key(approval_id, "approval_id")
        if type(granted) is not bool:
            raise InvalidArgument(f"granted must be a bool, got {granted!r}")
        check_key(decided_by, "decided_by")
        if reason is not None:
            check_text(reason, "reason", allow_empty=True)
        now = _utcnow()
        async with self.backend.atomic():
            record = await self.backend.decide_approval(
                approval_id, granted=granted, decided_by=decided_by, reason=reason, now=now
            )
            if record is None:
                await self._refuse(approval_id, "decided", now)
            data = self.audit.encode_data(
                {
                    "approval_id": approval_id,
                    "action": record.action,
                    "args_hash": record.args_hash,
                    "reason": reason,
                }
            )
            kind = "approval.granted" if granted else "approval.denied"
            await self.backend.append_audit(kind, decided_by, record.subject, data)
        return record

    async def check(self, subject: str, action: str, args: Any) -> Approval | None:
        """A granted, unexpired, unconsumed approval for exactly these ``args``, or None."""
        check_key(subject, "subject")
        check_key(action, "action")
        digest = self.args_hash(args)
        return await self.backend.find_approval(subject, action, digest, _utcnow())

    async def consume(self, approval_id: str, by: str) -> Approval:
        """Use a granted approval once: a second use raises ``ConflictError``; a pending, denied or
        expired one ``InvalidTransition``; an unknown one ``NotFound``."""
        check_key(approval_id, "approval_id")
        check_key(by, "by")
        now = _utcnow()
        async with self.backend.atomic():
            record = await self.backend.consume_approval(approval_id, by, now)
            if record is None:
                await self._refuse(approval_id, "consumed", now)
            data = self.audit.encode_data(
                {"approval_id": approval_id, "action": record.action, "args_hash": record.args_hash}
            )
            await self.backend.append_audit("approval.consumed", by, record.subject, data)
        return record

    async def get(self, approval_id: str) -> Approval | None:
        """The approval, or None if it does not exist."""
        check_key(approval_id, "approval_id")
        return await self.backend.get_approval(approval_id)

    async def pending(self, limit: int = 100) -> list[Approval]:
        """Approvals waiting for a decision (unexpired), oldest first."""
        check_int(limit, "limit", minimum=1)
        return await self.backend.pending_approvals(_utcnow(), limit)

    async def _refuse(self, approval_id: str, verb: str, now: dt.datetime) -> NoReturn:
        current = await self.backend.get_approval(approval_id)
        if current is None:
            raise NotFound(f"approval {approval_id!r} does not exist", approval_id=approval_id)
        if current.consumed_at is not None:
            raise ConflictError(
                f"approval {approval_id!r} was already consumed by {current.consumed_by!r}",
                approval_id=approval_id,
                current="consumed",
            )
        if verb == "decided" and current.status != "pending":
            raise ConflictError(
                f"approval {approval_id!r} was already {current.status} by {current.decided_by!r}",
                approval_id=approval_id,
                current=current.status,
            )
        if current.expires_at is not None and current.expires_at <= now:
            raise InvalidTransition(
                f"approval {approval_id!r} expired at {current.expires_at.isoformat()}; request a new one",
                approval_id=approval_id,
                current="expired",
            )
        raise InvalidTransition(
            f"approval {approval_id!r} is {current.status}; only a granted approval can be consumed",
            approval_id=approval_id,
            current=current.status,
        )
