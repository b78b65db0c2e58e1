"""The audit log: append-only entries chained by SHA-256, so any change or removal shows.

Each entry's ``hash`` covers a canonical encoding of its fields (seq, kind, actor, subject, data,
created_at in microseconds UTC) and the previous entry's hash. The database refuses UPDATE and DELETE on
entries (triggers); :meth:`AuditLog.verify` re-walks the chain to catch changes made around them, and checks
every approval against the digest its latest audit entry recorded (a grant re-pointed at other arguments,
or forged, with the triggers dropped, no longer matches).

    entry = await store.audit.append("tool.call", "agent-7", "task:42", {"tool": "rm", "path": "a.txt"})
    report = await store.audit.verify()
    assert report.ok, report.first_bad_seq

What each mode proves:

- **Without a key** (the default) the chain proves that no entry was changed, removed or inserted *by
  someone who did not recompute the hashes after it*. The chain has no secret: whoever can write the
  database can rewrite it whole, consistently, and approvals with it.
- **With** ``open_store(url, audit_key=...)`` each entry also carries an HMAC of its hash under that key.
  A rewrite without the key is found: the MACs no longer match, and an entry without one after the first
  keyed entry is reported. Since each hash covers every entry before it, one valid MAC vouches for the
  whole chain up to its entry — so when a key is added to a store that already has entries, the first
  entry appended under the key vouches for the entries before it (until then ``verify()`` reports them as
  not authenticated). An approval is honoured under a key only if its latest entry carries a valid MAC.

In neither mode can the chain show that its *latest* entries were removed: a shorter chain still verifies.
Keep ``count`` and the last ``hash`` somewhere else (a log line, another system) to catch that.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from .backends.base import ApprovalRecord, AuditRecord, StorageBackend
from .chain import (
    APPROVAL_ENTRY_KINDS,
    GENESIS_HASH,
    RESERVED_KIND_PREFIX,
    approval_digest,
    approval_entry_kind,
    args_digest,
    chain_hash,
    mac_ok,
)
from .codec import Codec, canonical
from .errors import AuditTampered, InvalidKey, SerializationError
from .validation import check_aware, check_int, check_key

_VERIFY_PAGE = 1000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit entry, its ``data`` decoded; ``mac`` is set when it was appended under an audit key."""

    seq: int
    kind: str
    actor: str
    subject: str
    data: Any
    created_at: dt.datetime
    prev_hash: str
    hash: str
    mac: str | None = None


@dataclass(frozen=True, slots=True)
class AuditVerification:
    """The result of :meth:`AuditLog.verify`: ``first_bad_seq`` is None when ``ok``.

    ``approvals`` counts the approvals checked against their latest entry; ``bad_approvals`` names those
    that do not match it (changed, forged, or deleted behind the triggers). ``authenticated`` counts the
    entries whose MAC verified under the store's audit key (0 without a key). ``unrelayed`` counts the
    entries of committed changes not on the chain yet, ``oldest_unrelayed`` the oldest one's time: on a
    store paired with NATS, entries the relay could not move there yet (NATS unreachable); 0 elsewhere.
    """

    ok: bool
    count: int
    first_bad_seq: int | None = None
    reason: str | None = None
    approvals: int = field(default=0, compare=False)
    bad_approvals: tuple[str, ...] = field(default=(), compare=False)
    authenticated: int = field(default=0, compare=False)
    unrelayed: int = field(default=0, compare=False)
    oldest_unrelayed: dt.datetime | None = field(default=None, compare=False)

    def raise_if_tampered(self) -> None:
        """Raise :class:`~statekeel.errors.AuditTampered` (with ``first_bad_seq``) unless the chain verified.

        (await store.audit.verify()).raise_if_tampered()
        """
        if not self.ok:
            where = (
                f"the audit chain breaks at seq {self.first_bad_seq}"
                if self.first_bad_seq is not None
                else "the audit log does not verify"
            )
            raise AuditTampered(
                f"{where}: {self.reason}",
                first_bad_seq=self.first_bad_seq,
                reason=self.reason,
                bad_approvals=self.bad_approvals,
            )


def entry_problem(record: AuditRecord, key: bytes | None) -> str | None:
    """Why one entry does not verify on its own (its hash, and its MAC under ``key``), or None."""
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
    if key is not None and record.mac is not None and not mac_ok(key, record.hash, record.mac):
        return (
            f"entry {record.seq}'s MAC does not verify under the audit key: the entry was rewritten, or "
            "written under another key"
        )
    return None


def binding_problem(approval: ApprovalRecord, entry: AuditRecord | None, key: bytes | None) -> str | None:
    """Why ``approval`` does not match ``entry`` (its latest audit entry), or None when it does.

    Entries written before approvals were bound (no ``row_hash`` in their data) are checked for their kind
    only; under an audit key the entry must carry a valid MAC.
    """
    try:
        if args_digest(approval.args) != approval.args_hash:
            return "its arguments do not match their recorded hash"
    except SerializationError:
        return "its arguments cannot be encoded"
    if entry is None:
        return "it has no audit entry (it was written outside statekeel)"
    problem = entry_problem(entry, key)
    if problem is not None:
        return problem
    if key is not None and entry.mac is None:
        return (
            f"its latest audit entry ({entry.seq}) carries no MAC under the audit key (written without the "
            "key, or forged); request the approval again"
        )
    expected = approval_entry_kind(approval)
    if entry.kind != expected:
        return f"it is {_state(approval)} but its latest audit entry ({entry.seq}) is {entry.kind}"
    row_hash = _row_hash(entry)
    if row_hash is not None and row_hash != approval_digest(approval):
        return f"its row differs from the one its audit entry {entry.seq} recorded"
    return None


def _state(approval: ApprovalRecord) -> str:
    return "consumed" if approval.consumed_at is not None else approval.status


def _row_hash(entry: AuditRecord) -> str | None:
    data = _entry_data(entry)
    value = data.get("row_hash")
    return value if isinstance(value, str) else None


def _entry_data(entry: AuditRecord) -> dict[str, Any]:
    # Approval entries hold plain JSON objects (canonical text): no codec tags to restore.
    try:
        data = orjson.loads(entry.data)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


class AuditLog:
    """Appends to, queries and verifies the hash-chained audit log. See the module docstring."""

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
            mac=record.mac,
        )

    def encode_data(self, data: Any) -> str:
        """``data`` as the canonical JSON text an entry stores (sorted keys); typed error if unstorable."""
        # encode() enforces the size limit and names the path of a bad value; canonical() fixes key order.
        self.codec.encode(data, where="data")
        return canonical(data).decode("utf-8")

    async def append(self, kind: str, actor: str, subject: str, data: Any = None) -> AuditEntry:
        """Append an entry (committed before returning; joins the caller's ``atomic()`` block).

        Kinds starting with ``approval.`` (in any case) are statekeel's own and raise ``InvalidKey``: the
        approvals write them, and an approval is honoured only while its latest such entry matches it.
        """
        check_key(kind, "kind")
        if kind.casefold().startswith(RESERVED_KIND_PREFIX):
            raise InvalidKey(
                f"audit kind {kind!r} is reserved: statekeel writes the approval.* entries itself (through "
                "store.approvals); give your entry a kind of its own, e.g. 'app.approval_note'",
                key=kind,
            )
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
        recomputed from the stored fields (and, with an audit key, each MAC); then check every approval
        against its latest entry. Reports the first seq where the chain fails, or the approvals that do
        not match.

        The entries and the approvals are read on one snapshot (``StorageBackend.scan_audit``): an
        approval requested, decided or consumed while ``verify()`` runs is seen with its entry or not at
        all, never reported as tampering."""
        # Without one snapshot (a store paired with NATS: entries there, approvals in SQL) an approval
        # changed between the two reads looks newer than its entry: read again. Tampering stays.
        for _ in range(1 if self.backend.audit_snapshot else _REREADS):
            walk = _Walk(self.backend.audit_key)
            await self.backend.scan_audit(walk.entries, walk.approvals, page=_VERIFY_PAGE)
            result = walk.result()
            if not result.bad_approvals:
                break
        unrelayed, oldest = await self.backend.audit_lag()
        return replace(result, unrelayed=unrelayed, oldest_unrelayed=oldest) if unrelayed else result


_REREADS = 4  # an approval changes at most three times (requested, decided, consumed)


@dataclass(slots=True)
class _Walk:
    """The state of one :meth:`AuditLog.verify`, fed page by page from one snapshot."""

    key: bytes | None
    expected_seq: int = 1
    prev_hash: str = GENESIS_HASH
    count: int = 0
    authenticated: int = 0
    first_keyed: int | None = None
    failure: AuditVerification | None = None
    latest: dict[str, AuditRecord] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    bad: dict[str, str] = field(default_factory=dict)

    def entries(self, page: list[AuditRecord]) -> bool:
        key = self.key
        for record in page:
            problem = _check(record, self.expected_seq, self.prev_hash) or entry_problem(record, key)
            if problem is None and key is not None:
                if record.mac is not None:
                    self.authenticated += 1
                    self.first_keyed = self.first_keyed or record.seq
                elif self.first_keyed is not None:
                    problem = (
                        f"entry {record.seq} carries no MAC although entry {self.first_keyed} does: it was "
                        "appended without the audit key, or its MAC was removed"
                    )
            if problem is not None:
                self.failure = AuditVerification(
                    False, self.count, self.expected_seq, problem, authenticated=self.authenticated
                )
                return False
            if record.kind in APPROVAL_ENTRY_KINDS:
                approval_id = _entry_data(record).get("approval_id")
                if isinstance(approval_id, str):
                    self.latest[approval_id] = record
            self.count += 1
            self.expected_seq += 1
            self.prev_hash = record.hash
        return True

    def approvals(self, page: list[ApprovalRecord]) -> bool:
        """Compare each approval row with its latest entry."""
        for approval in page:
            self.seen.add(approval.id)
            problem = binding_problem(approval, self.latest.get(approval.id), self.key)
            if problem is not None:
                self.bad[approval.id] = f"approval {approval.id!r}: {problem}"
        return True

    def result(self) -> AuditVerification:
        if self.failure is not None:
            return self.failure
        if self.key is not None and self.count and self.first_keyed is None:
            return AuditVerification(
                False,
                self.count,
                1,
                "no entry carries a MAC under the audit key: the log was written without it, or its MACs "
                "were removed. If you trust it as it is, append an entry under the key to vouch for it",
            )
        bad = dict(self.bad)
        for approval_id in sorted(set(self.latest) - self.seen):
            bad[approval_id] = f"approval {approval_id!r} has audit entries but no longer exists (deleted)"
        if bad:
            return AuditVerification(
                False,
                self.count,
                None,
                f"{len(bad)} approval(s) do not match their audit entries: " + "; ".join(bad.values()),
                approvals=len(self.seen),
                bad_approvals=tuple(bad),
                authenticated=self.authenticated,
            )
        return AuditVerification(True, self.count, approvals=len(self.seen), authenticated=self.authenticated)


def _check(record: AuditRecord, expected_seq: int, prev_hash: str) -> str | None:
    if record.seq != expected_seq:
        return f"entry {expected_seq} is missing (next stored entry is {record.seq})"
    if record.prev_hash != prev_hash:
        return f"entry {record.seq} does not point to the hash of entry {record.seq - 1}"
    return None


__all__ = [
    "GENESIS_HASH",
    "AuditEntry",
    "AuditLog",
    "AuditVerification",
    "binding_problem",
    "chain_hash",
    "entry_problem",
]
