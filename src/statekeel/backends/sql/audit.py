"""The audit chain: the operations every SQL dialect shares.

An append takes the dialect's chain lock and reads the head in one call (``audit_lock_head``: on
PostgreSQL a function that takes a transaction-scoped advisory lock, then reads; SQLite's single writer
already serializes), then inserts the next entry in the same transaction, so two writers can never give two
entries the same predecessor. A head that carries a MAC refuses an append without the audit key
(``AuditKeyRequired``), rolling back the change it audits.

A store paired with NATS keeps its chain there: with ``audit_outbox`` set, the entries of this store's
changes go to ``audit_outbox`` in the change's transaction instead, for :mod:`statekeel.backends.relay`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, TypeVar

from ...chain import GENESIS_HASH, chain_hash, entry_mac
from ...errors import AuditKeyRequired
from ..base import AuditBackend, AuditNote, AuditNotes, AuditRecord
from ..relay import OutboxEntry
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


async def op_queue_audits(tx: Tx, notes: Sequence[AuditNote]) -> list[AuditRecord]:
    """Write ``notes`` to the outbox: they get their seq, hash and MAC on the chain they are relayed to,
    so the records returned have seq 0 and no hash."""
    out: list[AuditRecord] = []
    for kind, actor, subject, data in notes:
        created_at = utcnow()
        await tx.execute("audit_outbox_insert", kind, actor, subject, data, tx.ts_in(created_at))
        out.append(AuditRecord(0, kind, actor, subject, data, created_at, "", "", None))
    return out


async def op_queue_audit(tx: Tx, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
    return (await op_queue_audits(tx, [(kind, actor, subject, data)]))[-1]


def audited(op: Op[T], audit: AuditNotes | None, key: bytes | None, outbox: bool = False) -> Op[T]:
    """``op`` followed, in its transaction, by the audit entries ``audit`` names for what it returned
    (appended to the chain, or with ``outbox`` written to the outbox)."""
    if audit is None:
        return op

    async def run(tx: Tx, *args: Any) -> T:
        out = await op(tx, *args)
        notes = audit(out)
        if notes:
            if outbox:
                await op_queue_audits(tx, notes)
            else:
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
        if self.audit_outbox:
            return await self._write(op_queue_audit, kind, actor, subject, data)
        return await self._write(op_append_audit, kind, actor, subject, data, self.audit_key)

    # The outbox's side of statekeel.backends.relay (each its own transaction; never inside a block).

    async def outbox_pending(self, after_id: int, limit: int) -> list[OutboxEntry]:
        return await self._read(_op_outbox_pending, after_id, limit)

    async def outbox_attempt(self, outbox_id: int, seq: int) -> None:
        await self._write(_op_execute, "audit_outbox_attempt", outbox_id, seq)

    async def outbox_attempts(self, entry: OutboxEntry) -> list[int] | None:
        return await self._read(_op_outbox_attempts, entry)

    async def outbox_relayed(self, entry: OutboxEntry) -> None:
        await self._write(_op_outbox_relayed, entry)

    async def outbox_lag(self) -> tuple[int, dt.datetime | None]:
        return await self._read(_op_outbox_lag)

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


async def _op_outbox_pending(tx: Tx, after_id: int, limit: int) -> list[OutboxEntry]:
    rows = await tx.fetchall("audit_outbox_pending", after_id, limit)
    return [
        OutboxEntry(int(r["id"]), r["kind"], r["actor"], r["subject"], r["data"], tx.ts_out(r["created_at"]))
        for r in rows
    ]


async def _op_execute(tx: Tx, name: str, *args: Any) -> None:
    await tx.execute(name, *args)


async def _op_outbox_attempts(tx: Tx, entry: OutboxEntry) -> list[int] | None:
    row = await tx.fetchone("audit_outbox_waiting", entry.id, tx.ts_in(entry.created_at))
    assert row is not None  # an aggregate always returns one row
    if not row["n"]:
        return None
    return [int(r["seq"]) for r in await tx.fetchall("audit_outbox_attempts", entry.id)]


async def _op_outbox_relayed(tx: Tx, entry: OutboxEntry) -> None:
    if await tx.execute("audit_outbox_relayed", entry.id, tx.ts_in(entry.created_at)):
        await tx.execute("audit_outbox_attempts_relayed", entry.id)


async def _op_outbox_lag(tx: Tx) -> tuple[int, dt.datetime | None]:
    row = await tx.fetchone("audit_outbox_lag")
    assert row is not None  # an aggregate always returns one row
    oldest = row["oldest"]
    return int(row["n"]), None if oldest is None else tx.ts_out(oldest)
