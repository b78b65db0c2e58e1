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

    async def append_audit(self, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
        token_subject = checked_subject(
            f"{self.prefix}.audit.{encode_token(subject)}", "audit subject", subject
        )
        write_id = f"audit-{uuid.uuid4().hex}"
        stream = self._audit_stream
        # One appender per process at a time; other processes are kept in order by the server.
        async with self._audit_lock:
            while True:
                head_seq, prev_hash = await self._audit_head()
                seq, created_at = head_seq + 1, dt.datetime.now(dt.UTC)
                digest = chain_hash(seq, kind, actor, subject, data, created_at, prev_hash)
                key = self.audit_key
                mac = None if key is None else entry_mac(key, digest)
                record = AuditRecord(seq, kind, actor, subject, data, created_at, prev_hash, digest, mac)
                payload = orjson.dumps(
                    {
                        "seq": seq,
                        "kind": kind,
                        "actor": actor,
                        "subject": subject,
                        "data": data,
                        "created_at": micros(created_at),
                        "prev_hash": prev_hash,
                        "hash": digest,
                        "mac": mac,
                    }
                )
                headers = {"Nats-Msg-Id": write_id, "Nats-Expected-Last-Sequence": str(head_seq)}
                try:
                    stored, duplicate = await self.conn.publish(
                        token_subject,
                        payload,
                        stream=stream,
                        headers=headers,
                        what="appending an audit entry",
                    )
                except nats.js.errors.APIError as exc:
                    if exc.err_code == WRONG_LAST_SEQUENCE:
                        continue  # another writer appended first: chain after its entry
                    raise StorageCorrupt(
                        f"the NATS stream {stream} refused an audit entry: {exc.description}"
                    ) from exc
                if duplicate:
                    # Our earlier attempt was stored (its answer was lost): that entry is the one.
                    msg = await self.conn.get(stream, stored)
                    assert msg is not None and msg.data is not None
                    return _record(stored, msg.data, stream)
                if stored != seq:
                    raise StorageCorrupt(
                        f"audit entry {seq} was stored at {stored} of the NATS stream {stream}"
                    )
                return record

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
