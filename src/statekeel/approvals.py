"""Approvals bound to the exact arguments they approve, decided once, consumed once, all audited.

    approval = await store.approvals.request("task:42", "shell", {"cmd": "rm -rf build"}, "agent-7")
    await store.approvals.decide(approval.id, True, "alice", reason="build dir only")
    ok = await store.approvals.check("task:42", "shell", {"cmd": "rm -rf build"})   # the approval
    assert await store.approvals.check("task:42", "shell", {"cmd": "rm -rf /"}) is None
    await store.approvals.consume(ok.id, "agent-7")                                 # single use

The binding is the SHA-256 of the canonical encoding of ``args`` (sorted keys), compared exactly. Every
request, decision and consumption appends its audit entry (``approval.requested``, ``approval.granted``
or ``approval.denied``, ``approval.consumed``) in the same transaction as the change itself; the entry
holds ``row_hash``, the digest of the approval row as that change left it. Before an approval is honoured
(:meth:`ApprovalLog.check`, :meth:`ApprovalLog.consume`) the row is checked against its latest entry, so
a grant re-pointed at other arguments, or forged, behind the database's triggers raises ``AuditTampered``
instead of authorizing anything (see :mod:`statekeel.audit` for what each audit mode proves).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any, NoReturn

from .audit import AuditLog, binding_problem
from .backends.base import ApprovalRecord, StorageBackend
from .chain import approval_digest, args_digest
from .codec import Codec
from .errors import AuditTampered, ConflictError, InvalidArgument, InvalidTransition, NotFound
from .validation import check_aware, check_bool, check_int, check_key, check_text

Approval = ApprovalRecord
"""An approval as stored: see :class:`statekeel.backends.base.ApprovalRecord`."""


# Reads of an approval and of its latest entry are two snapshots: a change committed between them is
# looked at again, a mismatch that stays is tampering.
_CHECK_TRIES = 3


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
        return raw, args_digest(args)

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
            data = self._entry_data(record, expires_at=None if expires_at is None else expires_at.isoformat())
            await self.backend.append_audit("approval.requested", requested_by, subject, data)
        return record

    async def decide(
        self, approval_id: str, granted: bool, decided_by: str, reason: str | None = None
    ) -> Approval:
        """Grant or deny a pending approval, exactly once: a second decision raises ``ConflictError``,
        an expired approval ``InvalidTransition``, an unknown one ``NotFound`` (nothing written)."""
        check_key(approval_id, "approval_id")
        check_bool(granted, "granted")
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
            data = self._entry_data(record, reason=reason)
            kind = "approval.granted" if granted else "approval.denied"
            await self.backend.append_audit(kind, decided_by, record.subject, data)
        return record

    async def check(self, subject: str, action: str, args: Any) -> Approval | None:
        """A granted, unexpired, unconsumed approval for exactly these ``args``, or None.

        ``AuditTampered`` if the approval found does not match its audit entries (changed or forged
        outside statekeel): it is never returned."""
        check_key(subject, "subject")
        check_key(action, "action")
        digest = self.args_hash(args)
        tries = 0
        while True:
            found = await self.backend.find_approval(subject, action, digest, _utcnow())
            if found is None:
                return None
            problem = await self._binding_problem(found)
            if problem is None:
                return found
            again = await self.backend.get_approval(found.id)
            tries += 1
            if again is None or again.version == found.version or tries == _CHECK_TRIES:
                raise self._tampered(found, problem)
            # It changed between the two reads (consumed by another caller, say): look again.

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
            # The row is ours until commit: judge the grant it was, against its latest entry. A forged or
            # re-pointed grant raises, and the block rolls the consumption back.
            granted = dataclasses.replace(
                record, consumed_by=None, consumed_at=None, version=record.version - 1
            )
            problem = await self._binding_problem(granted)
            if problem is not None:
                raise self._tampered(granted, problem)
            data = self._entry_data(record)
            await self.backend.append_audit("approval.consumed", by, record.subject, data)
        return record

    def _entry_data(self, record: ApprovalRecord, **extra: Any) -> str:
        """The data of an approval's audit entry: its binding and the digest of the row as it now is."""
        return self.audit.encode_data(
            {
                "approval_id": record.id,
                "action": record.action,
                "args_hash": record.args_hash,
                "row_hash": approval_digest(record),
                **extra,
            }
        )

    async def _binding_problem(self, record: ApprovalRecord) -> str | None:
        """Why the approval does not match its latest audit entry, or None."""
        entry = await self.backend.latest_approval_entry(record.id)
        return binding_problem(record, entry, self.backend.audit_key)

    def _tampered(self, record: ApprovalRecord, problem: str) -> AuditTampered:
        return AuditTampered(
            f"approval {record.id!r} ({record.action} on {record.subject!r}) is not honoured: {problem}",
            approval_id=record.id,
            reason=problem,
        )

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
                # A retry meets the same used approval: reloading cannot change that.
                hint="An approval is used once; request a new one for another run of the action",
            )
        if verb == "decided" and current.status != "pending":
            raise ConflictError(
                f"approval {approval_id!r} was already {current.status} by {current.decided_by!r}",
                approval_id=approval_id,
                current=current.status,
                hint="A decision stands and is not made again; request a new approval to ask again",
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
