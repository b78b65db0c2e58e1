"""Approvals: the operations every SQL dialect shares. Each write is one conditional statement, so an
approval is decided once and consumed once even under concurrent callers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from ..base import ApprovalBackend, ApprovalRecord, AuditRecord
from . import Row, SqlBackend, Tx, utcnow
from .audit import op_read_audit
from .tasks import ts_in_or_none, ts_or_none


def approval_from_row(tx: Tx, row: Row) -> ApprovalRecord:
    return ApprovalRecord(
        id=row["id"],
        subject=row["subject"],
        action=row["action"],
        args=tx.sealed_out(row["args"], "approval", row["id"]),
        args_hash=row["args_hash"],
        status=row["status"],
        requested_by=row["requested_by"],
        requested_at=tx.ts_out(row["requested_at"]),
        expires_at=ts_or_none(tx, row["expires_at"]),
        decided_by=row["decided_by"],
        decided_at=ts_or_none(tx, row["decided_at"]),
        reason=row["reason"],
        consumed_by=row["consumed_by"],
        consumed_at=ts_or_none(tx, row["consumed_at"]),
        version=row["version"],
    )


async def op_create_approval(
    tx: Tx,
    approval_id: str,
    subject: str,
    action: str,
    args: bytes,
    args_hash: str,
    requested_by: str,
    expires_at: dt.datetime | None,
) -> ApprovalRecord:
    row = await tx.fetchone(
        "approval_insert",
        approval_id,
        subject,
        action,
        tx.sealed_in(args, "approval", approval_id),
        args_hash,
        requested_by,
        tx.ts_in(utcnow()),
        ts_in_or_none(tx, expires_at),
    )
    assert row is not None
    return approval_from_row(tx, row)


async def op_get_approval(tx: Tx, approval_id: str) -> ApprovalRecord | None:
    row = await tx.fetchone("approval_get", approval_id)
    return None if row is None else approval_from_row(tx, row)


async def op_decide_approval(
    tx: Tx, approval_id: str, granted: bool, decided_by: str, reason: str | None, now: dt.datetime
) -> ApprovalRecord | None:
    status = "granted" if granted else "denied"
    row = await tx.fetchone("approval_decide", status, decided_by, tx.ts_in(now), reason, approval_id)
    return None if row is None else approval_from_row(tx, row)


async def op_find_approval(
    tx: Tx, subject: str, action: str, args_hash: str, now: dt.datetime
) -> ApprovalRecord | None:
    row = await tx.fetchone("approval_find", subject, action, args_hash, tx.ts_in(now))
    return None if row is None else approval_from_row(tx, row)


async def op_consume_approval(tx: Tx, approval_id: str, by: str, now: dt.datetime) -> ApprovalRecord | None:
    row = await tx.fetchone("approval_consume", by, tx.ts_in(now), approval_id)
    return None if row is None else approval_from_row(tx, row)


async def op_list_approvals(tx: Tx, after_id: str, limit: int) -> list[ApprovalRecord]:
    return [approval_from_row(tx, r) for r in await tx.fetchall("approval_list", after_id, limit)]


async def op_pending_approvals(tx: Tx, now: dt.datetime, limit: int) -> list[ApprovalRecord]:
    return [approval_from_row(tx, r) for r in await tx.fetchall("approval_pending", tx.ts_in(now), limit)]


async def op_scan_audit(
    tx: Tx,
    entries: Callable[[list[AuditRecord]], bool],
    approvals: Callable[[list[ApprovalRecord]], bool],
    page: int,
) -> None:
    """Every entry, then every approval, page by page in the one transaction (snapshot) of a read."""
    after_seq = 0
    while True:
        records = await op_read_audit(tx, None, None, None, after_seq, page)
        if records and not entries(records):
            return
        if len(records) < page:
            break
        after_seq = records[-1].seq
    after_id = ""
    while True:
        found = await op_list_approvals(tx, after_id, page)
        if found and not approvals(found):
            return
        if len(found) < page:
            break
        after_id = found[-1].id


class SqlApprovals(SqlBackend, ApprovalBackend):
    """The approval contract over the shared operations above."""

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
    ) -> ApprovalRecord:
        return await self._write(
            op_create_approval, approval_id, subject, action, args, args_hash, requested_by, expires_at
        )

    async def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        return await self._read(op_get_approval, approval_id)

    async def decide_approval(
        self, approval_id: str, *, granted: bool, decided_by: str, reason: str | None, now: dt.datetime
    ) -> ApprovalRecord | None:
        return await self._write(op_decide_approval, approval_id, granted, decided_by, reason, now)

    async def find_approval(
        self, subject: str, action: str, args_hash: str, now: dt.datetime
    ) -> ApprovalRecord | None:
        return await self._read(op_find_approval, subject, action, args_hash, now)

    async def consume_approval(self, approval_id: str, by: str, now: dt.datetime) -> ApprovalRecord | None:
        return await self._write(op_consume_approval, approval_id, by, now)

    async def pending_approvals(self, now: dt.datetime, limit: int = 100) -> list[ApprovalRecord]:
        return await self._read(op_pending_approvals, now, limit)

    async def list_approvals(self, *, after_id: str = "", limit: int = 1000) -> list[ApprovalRecord]:
        return await self._read(op_list_approvals, after_id, limit)

    async def scan_audit(
        self,
        entries: Callable[[list[AuditRecord]], bool],
        approvals: Callable[[list[ApprovalRecord]], bool],
        *,
        page: int = 1000,
    ) -> None:
        # AuditBackend's, kept beside the approvals it reads (sql/audit.py cannot import them). _read:
        # PostgreSQL's repeatable read, read-only transaction; SQLite's read transaction (WAL).
        await self._read(op_scan_audit, entries, approvals, page)
