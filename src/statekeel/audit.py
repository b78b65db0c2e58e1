"""The audit log: append-only entries chained by SHA-256, so any change or removal shows.

Each entry's ``hash`` covers a canonical encoding of its fields (seq, kind, actor, subject, data,
created_at in microseconds UTC) and the previous entry's hash. The database refuses UPDATE and DELETE on
entries (triggers); :meth:`AuditLog.verify` re-walks the chain to catch changes made around them.

    entry = await store.audit.append("tool.call", "agent-7", "task:42", {"tool": "rm", "path": "a.txt"})
    report = await store.audit.verify()
    assert report.ok, report.first_bad_seq

What the chain cannot show on its own: removing the *latest* entries leaves a shorter chain that still
verifies. Keep ``count`` and the last ``hash`` somewhere else (a log line, another system) to catch that.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any

from .backends.base import AuditRecord, StorageBackend
from .backends.sql import to_micros
from .codec import Codec, canonical
from .errors import AuditTampered
from .validation import check_aware, check_int, check_key

GENESIS_HASH = "0" * 64
_VERIFY_PAGE = 1000


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
        "created_at": to_micros(created_at),
        "prev_hash": prev_hash,
    }
    return hashlib.sha256(canonical(body)).hexdigest()


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit entry, its ``data`` decoded."""

    seq: int
    kind: str
    actor: str
    subject: str
    data: Any
    created_at: dt.datetime
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class AuditVerification:
    """The result of :meth:`AuditLog.verify`: ``first_bad_seq`` is None when ``ok``."""

    ok: bool
    count: int
    first_bad_seq: int | None = None
    reason: str | None = None

    def raise_if_tampered(self) -> None:
        """Raise :class:`~statekeel.errors.AuditTampered` (with ``first_bad_seq``) unless the chain verified.

        (await store.audit.verify()).raise_if_tampered()
        """
        if not self.ok:
            raise AuditTampered(
                f"the audit chain breaks at seq {self.first_bad_seq}: {self.reason}",
                first_bad_seq=self.first_bad_seq,
                reason=self.reason,
            )


class AuditLog:
    """Appends to, queries and verifies the hash-chained audit log. See DESIGN.md, Approvals and audit."""

    def __init__(self, backend: StorageBackend, codec: Codec) -> None:
        self.backend = backend
        self.codec = codec

    def _entry(self, record: AuditRecord) -> AuditEntry:
        return AuditEntry(
            seq=record.seq,
            kind=record.kind,
            actor=record.actor,
            subject=record.subject,
            data=self.codec.decode(record.data),
            created_at=record.created_at,
            prev_hash=record.prev_hash,
            hash=record.hash,
        )

    def encode_data(self, data: Any) -> str:
        """``data`` as the canonical JSON text an entry stores (sorted keys); typed error if unstorable."""
        # encode() enforces the size limit and names the path of a bad value; canonical() fixes key order.
        self.codec.encode(data, where="data")
        return canonical(data).decode("utf-8")

    async def append(self, kind: str, actor: str, subject: str, data: Any = None) -> AuditEntry:
        """Append an entry (committed before returning; joins the caller's ``atomic()`` block)."""
        check_key(kind, "kind")
        check_key(actor, "actor")
        check_key(subject, "subject")
        text = self.encode_data(data)
        record = await self.backend.append_audit(kind, actor, subject, text)
        return self._entry(record)

    async def query(
        self,
        subject: str | None = None,
        kind: str | None = None,
        since: dt.datetime | None = None,
        limit: int = 100,
        *,
        after_seq: int = 0,
    ) -> list[AuditEntry]:
        """Entries in seq order, filtered by subject, kind and ``created_at >= since``. Page on with
        ``after_seq`` = the last seq you got."""
        if subject is not None:
            check_key(subject, "subject")
        if kind is not None:
            check_key(kind, "kind")
        if since is not None:
            check_aware(since, "since")
        check_int(limit, "limit", minimum=1)
        check_int(after_seq, "after_seq", minimum=0)
        records = await self.backend.read_audit(
            subject=subject, kind=kind, since=since, after_seq=after_seq, limit=limit
        )
        return [self._entry(r) for r in records]

    async def verify(self) -> AuditVerification:
        """Walk the whole chain: dense seqs from 1, each ``prev_hash`` the previous ``hash``, each ``hash``
        recomputed from the stored fields. Reports the first seq where that fails."""
        expected_seq, prev_hash, count = 1, GENESIS_HASH, 0
        while True:
            page = await self.backend.read_audit(after_seq=expected_seq - 1, limit=_VERIFY_PAGE)
            for record in page:
                problem = _check(record, expected_seq, prev_hash)
                if problem is not None:
                    return AuditVerification(False, count, expected_seq, problem)
                count += 1
                expected_seq += 1
                prev_hash = record.hash
            if len(page) < _VERIFY_PAGE:
                return AuditVerification(True, count)


def _check(record: AuditRecord, expected_seq: int, prev_hash: str) -> str | None:
    if record.seq != expected_seq:
        return f"entry {expected_seq} is missing (next stored entry is {record.seq})"
    if record.prev_hash != prev_hash:
        return f"entry {record.seq} does not point to the hash of entry {record.seq - 1}"
    digest = chain_hash(
        record.seq,
        record.kind,
        record.actor,
        record.subject,
        record.data,
        record.created_at,
        record.prev_hash,
    )
    if digest != record.hash:
        return f"entry {record.seq} was changed after it was written (its hash does not match its fields)"
    return None
