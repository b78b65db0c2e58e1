"""The audit chain: the operations every SQL dialect shares.

An append takes the dialect's chain lock and reads the head in one call (``audit_lock_head``: on
PostgreSQL a function that takes a transaction-scoped advisory lock, then reads; SQLite's single writer
already serializes), then inserts the next entry in the same transaction, so two writers can never give two
entries the same predecessor. A head that carries a MAC refuses an append without the audit key
(``AuditKeyRequired``), rolling back the change it audits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, TypeVar

from ...chain import GENESIS_HASH, chain_hash, entry_mac
from ...errors import AuditKeyRequired
from ..base import AuditBackend, AuditNote, AuditNotes, AuditRecord
from . import Op, Row, SqlBackend, Tx, utcnow

T = TypeVar("T")


def audit_from_row(tx: Tx, row: Row) -> AuditRecord:
    return AuditRecord(
        seq=row["seq"],
        kind=row["kind"],
        actor=row["actor"],
        subject=row["subject"],
        data=row["data"],
        created_at=tx.ts_out(row["created_at"]),
        prev_hash=row["prev_hash"],
        hash=row["hash"],
        mac=row["mac"],
    )


async def op_append_audit(
    tx: Tx, kind: str, actor: str, subject: str, data: str, key: bytes | None
) -> AuditRecord:
    return (await op_append_audits(tx, [(kind, actor, subject, data)], key))[-1]


async def op_append_audits(tx: Tx, notes: Sequence[AuditNote], key: bytes | None) -> list[AuditRecord]:
    """Append ``notes`` in order: the lock is taken and the head read once, the entries chained in memory."""
    head = await tx.fetchone("audit_lock_head")  # the chain's lock, then its head: one call
    if key is None and head is not None and head["mac"] is not None:
        # A keyed chain stays keyed: an entry without a MAC after a keyed one fails verify() under the
        # key for good. Raised inside the write's transaction, so the change it audits rolls back too.
        raise AuditKeyRequired(
            f"the audit chain of this store is keyed (entry {head['seq']} carries a MAC) and this store "
            "was opened without the audit key",
            head_seq=head["seq"],
        )
    seq, prev_hash = (0, GENESIS_HASH) if head is None else (head["seq"], head["hash"])
    out: list[AuditRecord] = []
    for kind, actor, subject, data in notes:
        seq += 1
        created_at = utcnow()
        digest = chain_hash(seq, kind, actor, subject, data, created_at, prev_hash)
        mac = None if key is None else entry_mac(key, digest)
        await tx.execute(
            "audit_insert", seq, kind, actor, subject, data, tx.ts_in(created_at), prev_hash, digest, mac
        )
        out.append(AuditRecord(seq, kind, actor, subject, data, created_at, prev_hash, digest, mac))
        prev_hash = digest
    return out


def audited(op: Op[T], audit: AuditNotes | None, key: bytes | None) -> Op[T]:
    """``op`` followed, in its transaction, by the audit entries ``audit`` names for what it returned."""
    if audit is None:
        return op

    async def run(tx: Tx, *args: Any) -> T:
        out = await op(tx, *args)
        notes = audit(out)
        if notes:
            await op_append_audits(tx, notes, key)
        return out

    return run


async def op_latest_approval_entry(tx: Tx, approval_id: str) -> AuditRecord | None:
    row = await tx.fetchone("audit_latest_for_approval", approval_id)
    return None if row is None else audit_from_row(tx, row)


async def op_read_audit(
    tx: Tx,
    subject: str | None,
    kind: str | None,
    since: dt.datetime | None,
    after_seq: int,
    limit: int,
) -> list[AuditRecord]:
    rows = await tx.fetchall(
        "audit_read", after_seq, subject, kind, None if since is None else tx.ts_in(since), limit
    )
    return [audit_from_row(tx, r) for r in rows]


class SqlAudit(SqlBackend, AuditBackend):
    """The audit contract over the shared operations above."""

    async def append_audit(self, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
        return await self._write(op_append_audit, kind, actor, subject, data, self.audit_key)

    async def latest_approval_entry(self, approval_id: str) -> AuditRecord | None:
        return await self._read(op_latest_approval_entry, approval_id)

    async def read_audit(
        self,
        *,
        subject: str | None = None,
        kind: str | None = None,
        since: dt.datetime | None = None,
        after_seq: int = 0,
        limit: int = 100,
    ) -> list[AuditRecord]:
        return await self._read(op_read_audit, subject, kind, since, after_seq, limit)
