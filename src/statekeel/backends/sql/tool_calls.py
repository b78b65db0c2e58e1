"""Sessions' tool calls: the operations every SQL dialect shares.

The decisions (is a call in doubt, is its owner gone) are made by ``statekeel.sessions.tools``; here each
write is one statement whose WHERE clause carries its condition (the session's head, the step's attempt),
so that two writers never both win.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...errors import InvalidArgument, NotFound
from ...validation import check_int, check_key
from ..base import SESSION_STEP_STATUSES, OpenCalls, SessionLease, SessionStepRecord, ToolCallBackend
from . import Row, SqlBackend, Tx, utcnow
from .lineage import chain_rows
from .sessions import check_fence, stored_owner
from .tasks import ts_or_none


def step_from_row(tx: Tx, row: Row) -> SessionStepRecord:
    return SessionStepRecord(
        session_key=row["session_key"],
        call_id=row["call_id"],
        status=row["status"],
        attempt=row["attempt"],
        owner=row["owner"],
        result_seq=row["result_seq"],
        error=None if row["error"] is None else tx.json_out(row["error"]),
        started_at=tx.ts_out(row["started_at"]),
        finished_at=ts_or_none(tx, row["finished_at"]),
    )


async def op_set_open_calls(
    tx: Tx,
    key: str,
    expected_head: int,
    expected_created_at: dt.datetime,
    open_calls: int,
    calls_owner: str | None,
    lease: SessionLease | None,
) -> bool:
    await check_fence(tx, key, lease)
    changed = await tx.execute(
        "session_set_open_calls",
        open_calls,
        calls_owner,
        key,
        expected_head,
        tx.ts_in(expected_created_at),
    )
    return changed > 0


async def op_set_open_calls_many(tx: Tx, counts: Sequence[OpenCalls]) -> int:
    done = 0
    for c in counts:
        done += await tx.execute(
            "session_set_open_calls", c.open_calls, c.calls_owner, c.key, c.head_seq, tx.ts_in(c.created_at)
        )
    return done


async def op_read_tails(tx: Tx, keys: Sequence[str], n: int) -> dict[str, list[dict[str, Any]]]:
    tails = {}
    for key in keys:
        rows = await tx.fetchall("message_tail", key, n)
        tail = [tx.sealed_out(r["payload"], "message", key, r["seq"]) for r in reversed(rows)]
        if len(rows) < n:
            # Shorter than asked: a fork's tail goes on into what it inherited.
            tail = await _inherited_tail(tx, key, n - len(rows)) + tail
        if tail:
            tails[key] = tail
    return tails


async def _inherited_tail(tx: Tx, key: str, n: int) -> list[dict[str, Any]]:
    row = await tx.fetchone("session_get", key)
    if row is None or row["parent_key"] is None:
        return []
    parent_seq, lo = row["parent_seq"], row["last_consolidated"]
    if lo >= parent_seq:
        return []
    rows = await chain_rows(tx, row["parent_key"], parent_seq, max(lo, parent_seq - n), parent_seq)
    return [tx.sealed_out(r["payload"], "message", src, r["seq"]) for src, r in rows]


async def op_sessions_with_open_calls(tx: Tx, after: str | None, limit: int) -> list[OpenCalls]:
    if after is None:
        rows = await tx.fetchall("sessions_open_calls_first", limit)
    else:
        rows = await tx.fetchall("sessions_open_calls_after", after, limit)
    return [
        OpenCalls(
            key=r["key"],
            status=r["status"],
            head_seq=r["head_seq"],
            created_at=tx.ts_out(r["created_at"]),
            open_calls=r["open_calls"],
            calls_owner=r["calls_owner"],
        )
        for r in rows
    ]


async def op_get_step(tx: Tx, key: str, call_id: str) -> SessionStepRecord | None:
    row = await tx.fetchone("session_step_get", key, call_id)
    return None if row is None else step_from_row(tx, row)


async def op_steps(tx: Tx, key: str, status: str | None) -> list[SessionStepRecord]:
    if status is None:
        rows = await tx.fetchall("session_steps_all", key)
    else:
        rows = await tx.fetchall("session_steps_in_status", key, status)
    return [step_from_row(tx, r) for r in rows]


async def op_start_step(
    tx: Tx, key: str, call_id: str, owner: str, expected_attempt: int | None
) -> SessionStepRecord | None:
    now = tx.ts_in(utcnow())
    if expected_attempt is None:
        if await tx.fetchone("session_get", key) is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        row = await tx.fetchone("session_step_insert", key, call_id, owner, now)
    else:
        row = await tx.fetchone("session_step_restart", owner, now, key, call_id, expected_attempt)
    return None if row is None else step_from_row(tx, row)


async def op_finish_step(
    tx: Tx,
    key: str,
    call_id: str,
    status: str,
    attempt: int,
    result_seq: int | None,
    error: bytes | None,
) -> SessionStepRecord | None:
    row = await tx.fetchone(
        "session_step_finish",
        status,
        result_seq,
        None if error is None else tx.json_in(error),
        tx.ts_in(utcnow()),
        key,
        call_id,
        attempt,
    )
    return None if row is None else step_from_row(tx, row)


async def op_settle_step(
    tx: Tx, key: str, call_id: str, status: str, owner: str, result_seq: int | None
) -> SessionStepRecord:
    row = await tx.fetchone(
        "session_step_settle", key, call_id, status, owner, result_seq, tx.ts_in(utcnow())
    )
    assert row is not None  # an upsert always returns its row
    return step_from_row(tx, row)


async def op_put_heartbeat(tx: Tx, owner: str, expires_at: dt.datetime) -> None:
    await tx.execute("heartbeat_put", owner, tx.ts_in(expires_at))


async def op_delete_heartbeat(tx: Tx, owner: str) -> bool:
    return await tx.execute("heartbeat_delete", owner) > 0


async def op_read_heartbeat(tx: Tx, owner: str) -> dt.datetime | None:
    row = await tx.fetchone("heartbeat_get", owner)
    return None if row is None else tx.ts_out(row["expires_at"])


async def op_purge_heartbeats(tx: Tx, expired_before: dt.datetime) -> int:
    return await tx.execute("heartbeat_purge", tx.ts_in(expired_before))


def _check_status(status: str) -> None:
    if status not in SESSION_STEP_STATUSES:
        raise InvalidArgument(
            f"status must be one of {', '.join(SESSION_STEP_STATUSES)}, got {status!r}", status=status
        )


class SqlToolCalls(SqlBackend, ToolCallBackend):
    """The tool-call contract over the shared operations above."""

    async def set_open_calls(
        self,
        key: str,
        *,
        expected_head: int,
        expected_created_at: dt.datetime,
        open_calls: int,
        calls_owner: str | None,
        lease: SessionLease | None = None,
    ) -> bool:
        owner = stored_owner(open_calls, calls_owner)
        return await self._write(
            op_set_open_calls, key, expected_head, expected_created_at, open_calls, owner, lease
        )

    async def set_open_calls_many(self, counts: Sequence[OpenCalls]) -> int:
        # All checked before the transaction: a bad entry writes none of them.
        stored = [replace(c, calls_owner=stored_owner(c.open_calls, c.calls_owner)) for c in counts]
        return await self._write(op_set_open_calls_many, stored)

    async def read_session_tails(self, keys: Sequence[str], n: int) -> dict[str, list[dict[str, Any]]]:
        check_int(n, "n", minimum=1)
        return await self._read(op_read_tails, list(keys), n)

    async def sessions_with_open_calls(
        self, *, after: str | None = None, limit: int = 500
    ) -> list[OpenCalls]:
        check_int(limit, "limit", minimum=1)
        return await self._read(op_sessions_with_open_calls, after, limit)

    async def get_session_step(self, key: str, call_id: str) -> SessionStepRecord | None:
        return await self._read(op_get_step, key, call_id)

    async def session_steps(self, key: str, *, status: str | None = None) -> list[SessionStepRecord]:
        if status is not None:
            _check_status(status)
        return await self._read(op_steps, key, status)

    async def start_session_step(
        self, key: str, call_id: str, *, owner: str, expected_attempt: int | None
    ) -> SessionStepRecord | None:
        check_key(call_id, "call_id")
        return await self._write(op_start_step, key, call_id, owner, expected_attempt)

    async def finish_session_step(
        self,
        key: str,
        call_id: str,
        *,
        status: str,
        attempt: int,
        result_seq: int | None = None,
        error: bytes | None = None,
    ) -> SessionStepRecord | None:
        _check_status(status)
        return await self._write(op_finish_step, key, call_id, status, attempt, result_seq, error)

    async def settle_session_step(
        self, key: str, call_id: str, *, status: str, owner: str, result_seq: int | None
    ) -> SessionStepRecord:
        _check_status(status)
        return await self._write(op_settle_step, key, call_id, status, owner, result_seq)

    async def put_heartbeat(self, owner: str, expires_at: dt.datetime) -> None:
        await self._write(op_put_heartbeat, owner, expires_at)

    async def delete_heartbeat(self, owner: str) -> bool:
        return await self._write(op_delete_heartbeat, owner)

    async def read_heartbeat(self, owner: str) -> dt.datetime | None:
        return await self._read(op_read_heartbeat, owner)

    async def purge_heartbeats(self, expired_before: dt.datetime) -> int:
        return await self._write(op_purge_heartbeats, expired_before)


__all__ = ["SqlToolCalls", "step_from_row"]
