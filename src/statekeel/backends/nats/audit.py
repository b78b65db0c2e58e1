"""The audit chain on a JetStream stream: an entry's seq is its stream sequence.

An append reads the head (the stream's last message), chains the entry after it and publishes it with
``Nats-Expected-Last-Sequence`` = the head's seq: the server stores it only if nothing was appended in
between, so the chain never forks (a writer that lost the race reads the new head and chains again). Each
append carries a write id as ``Nats-Msg-Id``: a publish whose answer was lost is sent again with the same
id and the stream keeps one copy. The stream denies deletes and purges: entries are never removed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import orjson

import nats.js.errors

from ...chain import GENESIS_HASH, chain_hash, entry_mac
from ...errors import StorageCorrupt
from ..base import ApprovalRecord, AuditBackend, AuditRecord
from ..relay import OutboxEntry
from .client import (
    WRONG_LAST_SEQUENCE,
    NatsConnection,
    StreamSpec,
    checked_subject,
    encode_token,
    from_micros,
    micros,
)

__all__ = ["NatsAudit", "audit_spec"]


def audit_spec(prefix: str) -> StreamSpec:
    return StreamSpec(f"{prefix}_audit", (f"{prefix}.audit.*",), deny_delete=True, deny_purge=True)


def _record(seq: int, data: bytes, stream: str) -> AuditRecord:
    try:
        fields: dict[str, Any] = orjson.loads(data)
        record = AuditRecord(
            seq=int(fields["seq"]),
            kind=fields["kind"],
            actor=fields["actor"],
            subject=fields["subject"],
            data=fields["data"],
            created_at=from_micros(int(fields["created_at"])),
            prev_hash=fields["prev_hash"],
            hash=fields["hash"],
            mac=fields.get("mac"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise StorageCorrupt(
            f"message {seq} of the NATS stream {stream} is not an audit entry: {exc}"
        ) from None
    if record.seq != seq:
        raise StorageCorrupt(
            f"message {seq} of the NATS stream {stream} holds audit entry {record.seq}: the stream was "
            "written by something other than statekeel",
            seq=seq,
        )
    return record


class NatsAudit(AuditBackend):
    """The audit contract on the ``<prefix>_audit`` stream."""

    conn: NatsConnection
    prefix: str
    _audit_lock: asyncio.Lock

    @property
    def _audit_stream(self) -> str:
        return f"{self.prefix}_audit"

    async def _audit_head(self) -> tuple[int, str]:
        seq = await self.conn.last_seq(self._audit_stream)
        if seq == 0:
            return 0, GENESIS_HASH
        msg = await self.conn.get(self._audit_stream, seq)
        if msg is None or msg.data is None:
            raise StorageCorrupt(f"the head ({seq}) of the NATS stream {self._audit_stream} cannot be read")
        return seq, _record(seq, msg.data, self._audit_stream).hash

    def _entry_message(self, record: AuditRecord, relay: str | None = None) -> bytes:
        fields: dict[str, Any] = {
            "seq": record.seq,
            "kind": record.kind,
            "actor": record.actor,
            "subject": record.subject,
            "data": record.data,
            "created_at": micros(record.created_at),
            "prev_hash": record.prev_hash,
            "hash": record.hash,
            "mac": record.mac,
        }
        if relay is not None:
            fields["relay"] = relay  # the outbox entry it was relayed from (statekeel.backends.relay)
        return orjson.dumps(fields)

    def _chained(
        self,
        seq: int,
        prev_hash: str,
        kind: str,
        actor: str,
        subject: str,
        data: str,
        created_at: dt.datetime,
    ) -> AuditRecord:
        digest = chain_hash(seq, kind, actor, subject, data, created_at, prev_hash)
        key = self.audit_key
        mac = None if key is None else entry_mac(key, digest)
        return AuditRecord(seq, kind, actor, subject, data, created_at, prev_hash, digest, mac)

    async def _publish_entry(
        self, record: AuditRecord, head_seq: int, write_id: str, relay: str | None = None
    ) -> AuditRecord | None:
        """Publish ``record`` if ``head_seq`` is still the head: the record stored (an earlier copy's,
        when the stream found it a duplicate of ``write_id``), or None when another writer appended first."""
        token_subject = self._entry_subject(record.subject)
        stream = self._audit_stream
        headers = {"Nats-Msg-Id": write_id, "Nats-Expected-Last-Sequence": str(head_seq)}
        try:
            stored, duplicate = await self.conn.publish(
                token_subject,
                self._entry_message(record, relay),
                stream=stream,
                headers=headers,
                what="appending an audit entry",
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return None
            raise StorageCorrupt(
                f"the NATS stream {stream} refused an audit entry: {exc.description}"
            ) from exc
        if duplicate:
            # Our earlier attempt was stored (its answer was lost): that entry is the one.
            msg = await self.conn.get(stream, stored)
            assert msg is not None and msg.data is not None
            return _record(stored, msg.data, stream)
        if stored != record.seq:
            raise StorageCorrupt(
                f"audit entry {record.seq} was stored at {stored} of the NATS stream {stream}"
            )
        return record

    def _entry_subject(self, subject: str) -> str:
        return checked_subject(f"{self.prefix}.audit.{encode_token(subject)}", "audit subject", subject)

    async def append_audit(self, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
        self._entry_subject(subject)  # a subject that cannot be one is refused before the head is read
        write_id = f"audit-{uuid.uuid4().hex}"
        # One appender per process at a time; other processes are kept in order by the server.
        async with self._audit_lock:
            while True:
                head_seq, prev_hash = await self._audit_head()
                record = self._chained(
                    head_seq + 1, prev_hash, kind, actor, subject, data, dt.datetime.now(dt.UTC)
                )
                stored = await self._publish_entry(record, head_seq, write_id)
                if stored is not None:
                    return stored
                # another writer appended first: chain after its entry

    # The chain's side of statekeel.backends.relay.

    async def chain_head(self) -> tuple[int, str]:
        return await self._audit_head()

    async def chain_tag(self, seq: int) -> str | None:
        msg = await self.conn.get(self._audit_stream, seq)
        if msg is None or msg.data is None:
            return None
        try:
            tag = orjson.loads(msg.data).get("relay")
        except (orjson.JSONDecodeError, AttributeError):
            return None  # not an entry at all: verify() reports it; it is not this relay's
        return tag if isinstance(tag, str) else None

    async def chain_publish(self, seq: int, prev_hash: str, entry: OutboxEntry) -> int | None:
        async with self._audit_lock:
            record = self._chained(
                seq, prev_hash, entry.kind, entry.actor, entry.subject, entry.data, dt.datetime.now(dt.UTC)
            )
            stored = await self._publish_entry(record, seq - 1, entry.tag, relay=entry.tag)
        return None if stored is None else stored.seq

    async def latest_approval_entry(self, approval_id: str) -> AuditRecord | None:
        latest: AuditRecord | None = None
        async for seq, _, data, _ in self.conn.scan(self._audit_stream, f"{self.prefix}.audit.*"):
            record = _record(seq, data, self._audit_stream)
            if record.kind.startswith("approval."):
                try:
                    named = orjson.loads(record.data).get("approval_id")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if named == approval_id:
                    latest = record
        return latest

    async def read_audit(
        self,
        *,
        subject: str | None = None,
        kind: str | None = None,
        since: dt.datetime | None = None,
        after_seq: int = 0,
        limit: int = 100,
    ) -> list[AuditRecord]:
        token = "*" if subject is None else encode_token(subject)
        out: list[AuditRecord] = []
        expected = after_seq + 1
        async for seq, _, data, _ in self.conn.scan(
            self._audit_stream, f"{self.prefix}.audit.{token}", start_seq=after_seq + 1
        ):
            record = _record(seq, data, self._audit_stream)
            if subject is None:
                if seq != expected:
                    raise StorageCorrupt(
                        f"audit entry {expected} is missing from the NATS stream {self._audit_stream}",
                        seq=expected,
                    )
                expected += 1
            if kind is not None and record.kind != kind:
                continue
            if since is not None and record.created_at < since:
                continue
            out.append(record)
            if len(out) >= limit:
                break
        return out

    async def scan_audit(
        self,
        entries: Callable[[list[AuditRecord]], bool],
        approvals: Callable[[list[ApprovalRecord]], bool],
        *,
        page: int = 1000,
    ) -> None:
        # One snapshot: the stream up to its last sequence now (entries are never removed). A plain NATS
        # store holds no approvals, so there are none to pass on.
        stream = self._audit_stream
        last = await self.conn.last_seq(stream)
        batch: list[AuditRecord] = []
        async for seq, _, data, _ in self.conn.scan(stream, f"{self.prefix}.audit.*", limit=last):
            batch.append(_record(seq, data, stream))
            if len(batch) >= page:
                if not entries(batch):
                    return
                batch = []
        if batch:
            entries(batch)

    async def audit_count(self) -> int:
        return await self.conn.last_seq(self._audit_stream)
