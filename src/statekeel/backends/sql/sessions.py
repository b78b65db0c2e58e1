"""Sessions, messages and the message archive: the operations every SQL dialect shares."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from typing import Any, NoReturn

import orjson

from ...errors import ConflictError, InvalidArgument, LeaseLost, NotFound
from ...validation import check_aware, check_int, check_key, check_str
from ..base import (
    ArchivedMessage,
    LoadedSession,
    MessageRecord,
    NewMessage,
    Page,
    SessionBackend,
    SessionLease,
    SessionRecord,
)
from . import Row, SqlBackend, Tx, from_micros, to_micros, utcnow
from .lineage import chain, chain_rows, detach_forks, resealed
from .segments import live_payloads, payload_array, seal

_EMPTY_OBJECT = b"{}"
_EPOCH = from_micros(0)


def session_from_row(tx: Tx, row: Row) -> SessionRecord:
    return SessionRecord(
        key=row["key"],
        status=row["status"],
        metadata=tx.json_out(row["metadata"]),
        last_consolidated=row["last_consolidated"],
        head_seq=row["head_seq"],
        version=row["version"],
        created_at=tx.ts_out(row["created_at"]),
        updated_at=tx.ts_out(row["updated_at"]),
        open_calls=row["open_calls"],
        calls_owner=row["calls_owner"],
        write_id=row["write_id"],
        parent_key=row["parent_key"],
        parent_seq=row["parent_seq"],
        rewinds=row["rewinds"],
    )


def message_from_row(tx: Tx, key: str, row: Row) -> MessageRecord:
    return MessageRecord(
        session_key=key,
        seq=row["seq"],
        role=row["role"],
        payload=tx.sealed_out(row["payload"], "message", key, row["seq"]),
        created_at=tx.ts_out(row["created_at"]),
    )


def encode_cursor(updated_at: dt.datetime, key: str) -> str:
    """An opaque cursor for keyset pagination on ``(updated_at, key)``; also used by other kinds."""
    return base64.urlsafe_b64encode(orjson.dumps([to_micros(updated_at), key])).decode("ascii")


def decode_cursor(cursor: Any) -> tuple[dt.datetime, str]:
    try:
        micros, key = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        if type(micros) is not int or type(key) is not str:
            raise ValueError
        return from_micros(micros), key
    except Exception:
        raise InvalidArgument(f"cursor {cursor!r} is not one that list returned", cursor=cursor) from None


async def _require_session(tx: Tx, key: str) -> Row:
    row = await tx.fetchone("session_get", key)
    if row is None:
        raise NotFound(f"session {key!r} does not exist", key=key)
    return row


async def check_fence(tx: Tx, key: str, lease: SessionLease | None) -> None:
    """Refuse a write from a holder whose lease was taken over; runs in the write's own transaction."""
    if lease is None:
        return
    row = await tx.fetchone("lease_fence", key)
    if row is None or row["token"] != lease.token or row["owner"] != lease.owner:
        current = None if row is None else row["token"]
        raise LeaseLost(
            f"the lease of session {key!r} with token {lease.token} is no longer current "
            f"(current token {current}): another holder took it over; the write was refused",
            key=key,
            token=lease.token,
            current=current,
        )


async def op_create_session(tx: Tx, key: str, metadata: bytes | None, if_missing: bool) -> SessionRecord:
    now = tx.ts_in(utcnow())
    row = await tx.fetchone("session_insert", key, tx.json_in(metadata or _EMPTY_OBJECT), now, now)
    if row is None:
        existing = await _require_session(tx, key)
        if not if_missing:
            raise ConflictError(f"session {key!r} already exists", key=key)
        return session_from_row(tx, existing)
    return session_from_row(tx, row)


async def op_load_session(tx: Tx, key: str) -> SessionRecord | None:
    row = await tx.fetchone("session_get", key)
    return None if row is None else session_from_row(tx, row)


async def op_load_with_messages(
    tx: Tx, key: str, include_archived: bool = False
) -> tuple[SessionRecord, list[MessageRecord]] | None:
    row = await tx.fetchone("session_get", key)
    if row is None:
        return None
    record = session_from_row(tx, row)
    rows = list(await tx.fetchall("archive_as_messages", key)) if include_archived else []
    messages = [message_from_row(tx, key, r) for r in rows]
    own_from = record.last_consolidated
    if record.parent_key is not None and record.parent_seq is not None and own_from < record.parent_seq:
        # A fork: what it inherited (and has not archived itself), opened under the key it is stored by.
        for src, r in await chain_rows(tx, record.parent_key, record.parent_seq, own_from, record.parent_seq):
            found = message_from_row(tx, src, r)
            messages.append(MessageRecord(key, found.seq, found.role, found.payload, found.created_at))
        own_from = record.parent_seq
    rows = await tx.fetchall("message_range_open", key, own_from)
    return record, messages + [message_from_row(tx, key, r) for r in rows]


async def op_load_payloads(tx: Tx, key: str, include_archived: bool) -> LoadedSession | None:
    # One query returns the whole history as one JSON array: a single decode instead of one per row.
    row = await tx.fetchone("session_get", key)
    if row is None:
        return None
    record = session_from_row(tx, row)
    live_from = record.last_consolidated
    messages: list[dict[str, Any]] = []
    if include_archived and live_from > 0:
        archived = await tx.fetchone("archive_payload_array", key)
        assert archived is not None  # an aggregate always returns a row
        messages = payload_array(tx, archived, key, 0, live_from)
    own_from = live_from
    if record.parent_key is not None and record.parent_seq is not None and live_from < record.parent_seq:
        # A fork: its ancestors' parts first (each read live or archived), on this same snapshot.
        flags: list[bool] = []
        parts = await chain(tx, record.parent_key, record.parent_seq, live_from, live=flags)
        for (part_key, lo, hi), unarchived in zip(parts, flags, strict=True):
            # A part none of which is archived is read in index order (and its sealed segments), without
            # merging the archive.
            if unarchived:
                messages += await live_payloads(tx, part_key, lo, hi, open_end=False)
                continue
            part = await tx.fetchone("view_payload_array", part_key, lo, hi)
            assert part is not None
            messages += payload_array(tx, part, part_key, lo, hi)
        own_from = record.parent_seq
    messages += await live_payloads(tx, key, own_from, record.head_seq, open_end=True)
    summaries: list[tuple[str, int, int, str]] = []
    if live_from > 0:
        summaries = [
            (r["compression_id"], r["first_seq"], r["upto_seq"], r["summary"])
            for r in await tx.fetchall("compression_list", key)
        ]
    return LoadedSession(record, messages, 0 if include_archived else live_from, summaries)


async def op_list_sessions(tx: Tx, status: str | None, limit: int, cursor: str | None) -> Page:
    if cursor is None:
        if status is None:
            rows = await tx.fetchall("session_list", limit + 1)
        else:
            rows = await tx.fetchall("session_list_status", status, limit + 1)
    else:
        after, after_key = decode_cursor(cursor)
        after_ts = tx.ts_in(after)
        if status is None:
            rows = await tx.fetchall("session_list_after", after_ts, after_key, limit + 1)
        else:
            rows = await tx.fetchall("session_list_status_after", status, after_ts, after_key, limit + 1)
    items = [session_from_row(tx, r) for r in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1]
        next_cursor = encode_cursor(tx.ts_out(last["updated_at"]), last["key"])
    return Page(items=items, next_cursor=next_cursor)


async def op_update_session(
    tx: Tx,
    key: str,
    expected_version: int | None,
    metadata: bytes | None,
    status: str | None,
    lease: SessionLease | None = None,
) -> SessionRecord:
    await check_fence(tx, key, lease)
    row = await tx.fetchone(
        "session_update",
        None if metadata is None else tx.json_in(metadata),
        status,
        tx.ts_in(utcnow()),
        key,
        expected_version,
    )
    if row is None:
        current = await _require_session(tx, key)
        raise ConflictError(
            f"session {key!r} is at version {current['version']}, not the expected {expected_version}",
            key=key,
            expected=expected_version,
            current=current["version"],
        )
    return session_from_row(tx, row)


async def op_delete_session(tx: Tx, key: str, lease: SessionLease | None = None) -> bool:
    await check_fence(tx, key, lease)
    if await tx.fetchone("session_get_for_update", key) is None:
        return False
    await detach_forks(tx, key)
    return await tx.execute("session_delete", key) > 0


def stored_owner(open_calls: int, calls_owner: str | None) -> str | None:
    """The ``calls_owner`` to store with ``open_calls`` (checked first): only a session whose calls wait
    for a result has an owner."""
    check_int(open_calls, "open_calls", minimum=-1)
    if calls_owner is not None:
        check_str(calls_owner, "calls_owner")
    return calls_owner if open_calls else None


def head_update_args(
    tx: Tx,
    count: int,
    metadata: bytes | None,
    now: Any,
    key: str,
    expected_head: int,
    status: str | None,
    expected_created_at: dt.datetime | None,
    expected_version: int | None,
    open_calls: int | None,
    calls_owner: str | None,
    write_id: str | None,
    expected_rewinds: int | None,
) -> tuple[Any, ...]:
    """The first twelve parameters of ``session_advance_head`` and ``session_save``, in their order: the
    conditional head update both run (one place, so the two statements cannot drift apart)."""
    return (
        count,
        None if metadata is None else tx.json_in(metadata),
        now,
        key,
        expected_head,
        status,
        None if expected_created_at is None else tx.ts_in(expected_created_at),
        expected_version,
        open_calls,
        calls_owner,
        write_id,
        expected_rewinds,
    )


async def refuse_append(
    tx: Tx,
    key: str,
    expected_head: int,
    expected_created_at: dt.datetime | None,
    expected_version: int | None,
    expected_rewinds: int | None,
) -> NoReturn:
    """Raise the ConflictError that says why a conditional append changed nothing."""
    current = await _require_session(tx, key)
    if current["head_seq"] == expected_head and expected_rewinds not in (None, current["rewinds"]):
        raise ConflictError(
            f"session {key!r} was rewound since it was loaded: load it again before appending",
            key=key,
            expected=expected_head,
            current=current["head_seq"],
        )
    if current["head_seq"] == expected_head:
        if expected_created_at is not None and tx.ts_out(current["created_at"]) != expected_created_at:
            # The head matches but the row is another incarnation: appending would fork histories.
            raise ConflictError(
                f"session {key!r} was deleted and created again since it was loaded "
                f"(created at {tx.ts_out(current['created_at']).isoformat()}, expected "
                f"{expected_created_at.isoformat()})",
                key=key,
                expected=expected_head,
                current=current["head_seq"],
            )
        raise ConflictError(
            f"session {key!r} is at version {current['version']}, not the expected {expected_version}: "
            "another writer changed its metadata or status since it was loaded",
            key=key,
            expected=expected_version,
            current=current["version"],
        )
    raise ConflictError(
        f"session {key!r} has head {current['head_seq']}, not the expected {expected_head}: "
        "another writer appended first",
        key=key,
        expected=expected_head,
        current=current["head_seq"],
    )


async def op_append_messages(
    tx: Tx,
    key: str,
    expected_head: int,
    messages: Sequence[NewMessage],
    metadata: bytes | None,
    create: bool,
    status: str | None = None,
    lease: SessionLease | None = None,
    expected_created_at: dt.datetime | None = None,
    expected_version: int | None = None,
    open_calls: int | None = None,
    calls_owner: str | None = None,
    write_id: str | None = None,
    expected_rewinds: int | None = None,
) -> SessionRecord:
    await check_fence(tx, key, lease)
    now_dt = utcnow()
    now = tx.ts_in(now_dt)
    if create:
        await tx.execute("session_insert_missing", key, tx.json_in(metadata or _EMPTY_OBJECT), now, now)
    row = await tx.fetchone(
        "session_advance_head",
        *head_update_args(
            tx,
            len(messages),
            metadata,
            now,
            key,
            expected_head,
            status,
            expected_created_at,
            expected_version,
            open_calls,
            calls_owner,
            write_id,
            expected_rewinds,
        ),
    )
    if row is None:
        await refuse_append(tx, key, expected_head, expected_created_at, expected_version, expected_rewinds)
    if messages:
        await tx.executemany(
            "message_insert",
            [
                (
                    key,
                    seq,
                    m.role,
                    tx.sealed_in(m.payload, "message", key, seq),
                    now,
                    None if m.usage is None else tx.json_in(m.usage),
                )
                for seq, m in enumerate(messages, expected_head)
            ],
        )
    record = session_from_row(tx, row)
    if messages and tx.segments:
        await seal(tx, record, expected_head)
    return record


async def op_read_messages(tx: Tx, key: str, start: int, end: int | None) -> list[MessageRecord]:
    if end is None:
        rows = await tx.fetchall("message_range_open", key, start)
    else:
        rows = await tx.fetchall("message_range", key, start, end)
    return [message_from_row(tx, key, r) for r in rows]


async def op_tail_messages(tx: Tx, key: str, n: int) -> list[MessageRecord]:
    rows = await tx.fetchall("message_tail", key, n)
    return [message_from_row(tx, key, r) for r in reversed(rows)]


async def op_archive_messages(
    tx: Tx,
    key: str,
    compression_id: str,
    upto_seq: int,
    summary: str,
    expected_consolidated: int,
    lease: SessionLease | None = None,
    expected_created_at: dt.datetime | None = None,
) -> SessionRecord:
    await check_fence(tx, key, lease)
    # Locked until the commit: the row checked here is the row updated below, not one deleted and
    # created again by another transaction in between.
    current = await tx.fetchone("session_get_for_update", key)
    if current is None:
        raise NotFound(f"session {key!r} does not exist", key=key)
    if expected_created_at is not None and tx.ts_out(current["created_at"]) != expected_created_at:
        raise ConflictError(
            f"session {key!r} was deleted and created again since it was read; nothing was compressed",
            key=key,
        )
    if current["last_consolidated"] != expected_consolidated:
        raise ConflictError(
            f"session {key!r} was consolidated up to {current['last_consolidated']}, "
            f"not the expected {expected_consolidated}",
            key=key,
            expected=expected_consolidated,
            current=current["last_consolidated"],
        )
    start = current["last_consolidated"]
    if not start < upto_seq <= current["head_seq"]:
        raise InvalidArgument(
            f"upto_seq {upto_seq} must be after last_consolidated {start} and at most the head "
            f"{current['head_seq']}",
            key=key,
            upto_seq=upto_seq,
        )
    now = tx.ts_in(utcnow())
    await tx.execute("compression_insert", key, compression_id, start, upto_seq, summary, now)
    parent_key, parent_seq = current["parent_key"], current["parent_seq"]
    if parent_key is not None and start < parent_seq:
        # A fork compressing what it inherited: its archive gets its own copy of those messages.
        inherited = await chain_rows(tx, parent_key, parent_seq, start, min(upto_seq, parent_seq))
        await tx.executemany(
            "archive_insert",
            [
                (
                    key,
                    compression_id,
                    r["seq"],
                    r["role"],
                    resealed(tx, r["payload"], src, key, r["seq"]),
                    r["created_at"],
                    r["usage"],
                )
                for src, r in inherited
            ],
        )
    await tx.execute("archive_copy", compression_id, key, start, upto_seq)
    await tx.execute("message_delete_range", key, start, upto_seq)
    row = await tx.fetchone("session_set_consolidated", upto_seq, now, key, start)
    assert row is not None  # the session row is locked by this transaction
    return session_from_row(tx, row)


async def op_read_archive(tx: Tx, key: str, compression_id: str | None) -> list[ArchivedMessage]:
    if compression_id is None:
        rows = await tx.fetchall("archive_all", key)
    else:
        kind = await tx.fetchone("compression_kind", key, compression_id)
        rewound = kind is not None and kind["kind"] == "rewind"
        rows = await tx.fetchall("rewound_one" if rewound else "archive_one", key, compression_id)
    return [
        ArchivedMessage(
            session_key=key,
            compression_id=r["compression_id"],
            seq=r["seq"],
            payload=tx.sealed_out(r["payload"], "message", key, r["seq"]),
            summary=r["summary"],
            created_at=tx.ts_out(r["created_at"]),
        )
        for r in rows
    ]


async def op_read_summaries(tx: Tx, key: str) -> list[tuple[str, int, int, str]]:
    rows = await tx.fetchall("compression_list", key)
    return [(r["compression_id"], r["first_seq"], r["upto_seq"], r["summary"]) for r in rows]


async def op_transition_idle(tx: Tx, from_status: str, to_status: str, idle_before: dt.datetime) -> int:
    return await tx.execute("session_transition_idle", to_status, from_status, tx.ts_in(idle_before))


def _lease_from_row(tx: Tx, key: str, row: Row, acquired: bool) -> SessionLease:
    return SessionLease(
        key=key,
        owner=row["owner"],
        token=row["token"],
        expires_at=tx.ts_out(row["expires_at"]),
        acquired=acquired,
    )


async def op_acquire_lease(
    tx: Tx, key: str, owner: str, ttl_seconds: float, take_over: SessionLease | None = None
) -> SessionLease:
    now = utcnow()
    await tx.execute("lease_ensure", key)
    expires = tx.ts_in(now + dt.timedelta(seconds=ttl_seconds))
    if take_over is not None:
        row = await tx.fetchone("lease_take_over", owner, expires, key, take_over.owner, take_over.token)
    else:
        row = await tx.fetchone("lease_take", owner, expires, key, tx.ts_in(now))
    if row is not None:
        return _lease_from_row(tx, key, row, True)
    row = await tx.fetchone("lease_get", key)
    assert row is not None  # ensured above, and lease rows are never deleted
    return _lease_from_row(tx, key, row, False)


async def op_renew_lease(tx: Tx, lease: SessionLease, ttl_seconds: float) -> SessionLease:
    expires = tx.ts_in(utcnow() + dt.timedelta(seconds=ttl_seconds))
    row = await tx.fetchone("lease_renew", expires, lease.key, lease.owner, lease.token)
    if row is None:
        current = await tx.fetchone("lease_get", lease.key)
        raise LeaseLost(
            f"the lease of session {lease.key!r} (token {lease.token}) was taken over by "
            f"{None if current is None else current['owner']!r}",
            key=lease.key,
            token=lease.token,
            current=None if current is None else current["token"],
        )
    return _lease_from_row(tx, lease.key, row, True)


async def op_release_lease(tx: Tx, lease: SessionLease) -> bool:
    return await tx.execute("lease_release", tx.ts_in(_EPOCH), lease.key, lease.owner, lease.token) > 0


async def op_read_lease(tx: Tx, key: str) -> SessionLease | None:
    row = await tx.fetchone("lease_get", key)
    return None if row is None else _lease_from_row(tx, key, row, False)


class SqlSessions(SqlBackend, SessionBackend):
    """The session contract over the shared operations above."""

    async def create_session(
        self, key: str, *, metadata: bytes | None = None, if_missing: bool = False
    ) -> SessionRecord:
        return await self._write(op_create_session, key, metadata, if_missing)

    async def load_session(self, key: str) -> SessionRecord | None:
        return await self._read(op_load_session, key)

    async def load_session_payloads(
        self, key: str, *, include_archived: bool = False
    ) -> LoadedSession | None:
        return await self._read(op_load_payloads, key, include_archived)

    async def load_session_with_messages(
        self, key: str, *, include_archived: bool = False
    ) -> tuple[SessionRecord, list[MessageRecord]] | None:
        return await self._read(op_load_with_messages, key, include_archived)

    async def list_sessions(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        return await self._read(op_list_sessions, status, limit, cursor)

    async def update_session(
        self,
        key: str,
        *,
        expected_version: int | None = None,
        metadata: bytes | None = None,
        status: str | None = None,
        lease: SessionLease | None = None,
    ) -> SessionRecord:
        return await self._write(op_update_session, key, expected_version, metadata, status, lease)

    async def delete_session(self, key: str, *, lease: SessionLease | None = None) -> bool:
        return await self._write(op_delete_session, key, lease)

    async def append_messages(
        self,
        key: str,
        expected_head: int,
        messages: Sequence[NewMessage],
        *,
        metadata: bytes | None = None,
        create: bool = False,
        status: str | None = None,
        lease: SessionLease | None = None,
        expected_created_at: dt.datetime | None = None,
        expected_version: int | None = None,
        open_calls: int | None = None,
        calls_owner: str | None = None,
        write_id: str | None = None,
        expected_rewinds: int | None = None,
    ) -> SessionRecord:
        # Checked at the backend's public boundary: a bad head never reaches a transaction.
        check_key(key, "session key")
        check_int(expected_head, "expected_head")
        if expected_version is not None:
            check_int(expected_version, "expected_version")
        if expected_created_at is not None:
            check_aware(expected_created_at, "expected_created_at")
        if open_calls is not None:
            calls_owner = stored_owner(open_calls, calls_owner)
        if write_id is not None:
            check_str(write_id, "write_id")
        if expected_rewinds is not None:
            check_int(expected_rewinds, "expected_rewinds")
        return await self._write_append(
            key,
            expected_head,
            messages,
            metadata,
            create,
            status,
            lease,
            expected_created_at,
            expected_version,
            open_calls,
            calls_owner if open_calls is not None else None,
            write_id,
            expected_rewinds,
        )

    async def _write_append(self, *args: Any) -> SessionRecord:
        """Run a checked append (``op_append_messages``' arguments); a dialect may run it otherwise."""
        return await self._write(op_append_messages, *args)

    async def read_messages(self, key: str, *, start: int = 0, end: int | None = None) -> list[MessageRecord]:
        return await self._read(op_read_messages, key, start, end)

    async def tail_messages(self, key: str, n: int) -> list[MessageRecord]:
        return await self._read(op_tail_messages, key, n)

    async def archive_messages(
        self,
        key: str,
        *,
        compression_id: str,
        upto_seq: int,
        summary: str,
        expected_consolidated: int,
        lease: SessionLease | None = None,
        expected_created_at: dt.datetime | None = None,
    ) -> SessionRecord:
        if expected_created_at is not None:
            check_aware(expected_created_at, "expected_created_at")
        return await self._write(
            op_archive_messages,
            key,
            compression_id,
            upto_seq,
            summary,
            expected_consolidated,
            lease,
            expected_created_at,
        )

    async def read_archive(self, key: str, *, compression_id: str | None = None) -> list[ArchivedMessage]:
        return await self._read(op_read_archive, key, compression_id)

    async def read_summaries(self, key: str) -> list[tuple[str, int, int, str]]:
        return await self._read(op_read_summaries, key)

    async def transition_idle_sessions(
        self, from_status: str, to_status: str, idle_before: dt.datetime
    ) -> int:
        return await self._write(op_transition_idle, from_status, to_status, idle_before)

    async def acquire_session_lease(
        self, key: str, owner: str, ttl_seconds: float, *, take_over: SessionLease | None = None
    ) -> SessionLease:
        return await self._write(op_acquire_lease, key, owner, ttl_seconds, take_over)

    async def renew_session_lease(self, lease: SessionLease, ttl_seconds: float) -> SessionLease:
        return await self._write(op_renew_lease, lease, ttl_seconds)

    async def release_session_lease(self, lease: SessionLease) -> bool:
        return await self._write(op_release_lease, lease)

    async def read_session_lease(self, key: str) -> SessionLease | None:
        return await self._read(op_read_lease, key)
