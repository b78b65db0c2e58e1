"""Sessions' tool calls on JetStream: steps are events of their session's subject (so a step and the
session it belongs to change under one condition, and go with it), heartbeats one message per owner on
``<prefix>_heartbeats``, and the sessions whose calls wait for a result read from the session index."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ...validation import check_int, check_key, check_str
from ..base import SESSION_STEP_STATUSES, OpenCalls, SessionLease, SessionStepRecord, ToolCallBackend
from .client import NatsConnection, StreamSpec, checked_subject, encode_token, from_micros, micros
from .leases import NatsLeases
from .sessions import SessionState, now_us

__all__ = ["NatsToolCalls", "heartbeats_spec"]


def heartbeats_spec(prefix: str) -> StreamSpec:
    return StreamSpec(f"{prefix}_heartbeats", (f"{prefix}.hb.*",), max_msgs_per_subject=1)


def _check_status(status: str) -> None:
    from ...errors import InvalidArgument

    if status not in SESSION_STEP_STATUSES:
        raise InvalidArgument(
            f"status must be one of {', '.join(SESSION_STEP_STATUSES)}, got {status!r}", status=status
        )


def _owner(open_calls: int, calls_owner: str | None) -> str | None:
    check_int(open_calls, "open_calls", minimum=-1)
    if calls_owner is not None:
        check_str(calls_owner, "calls_owner")
    return calls_owner if open_calls else None


class NatsToolCalls(NatsLeases, ToolCallBackend):
    """The tool-call contract beside :class:`NatsSessions`."""

    conn: NatsConnection

    def _step(self, key: str, call_id: str, s: dict[str, Any]) -> SessionStepRecord:
        return SessionStepRecord(
            session_key=key,
            call_id=call_id,
            status=s["status"],
            attempt=s["attempt"],
            owner=s["owner"],
            result_seq=s["result_seq"],
            error=None if s["error"] is None else self.codec.decode(s["error"]),
            started_at=from_micros(s["started_at"]),
            finished_at=None if s["finished_at"] is None else from_micros(s["finished_at"]),
        )

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
        owner = _owner(open_calls, calls_owner)
        created = micros(expected_created_at)

        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], bool]]:
            self._fence(s, key, lease)
            row = s.row
            if row is None or row["head_seq"] != expected_head or row["created_at"] != created:
                return None, lambda n: False
            # Only the derived count and its owner change: not the version, not updated_at.
            return {"row": {**row, "open_calls": open_calls, "calls_owner": owner}}, lambda n: True

        return await self._change(key, decide, lease=lease)

    async def set_open_calls_many(self, counts: Sequence[OpenCalls]) -> int:
        for c in counts:  # all checked before the first is written
            _owner(c.open_calls, c.calls_owner)
            check_key(c.key, "session key")
        done = 0
        for c in counts:
            done += await self.set_open_calls(
                c.key,
                expected_head=c.head_seq,
                expected_created_at=c.created_at,
                open_calls=c.open_calls,
                calls_owner=c.calls_owner,
            )
        return done

    async def read_session_tails(self, keys: Sequence[str], n: int) -> dict[str, list[dict[str, Any]]]:
        check_int(n, "n", minimum=1)
        tails: dict[str, list[dict[str, Any]]] = {}
        for key in keys:
            messages = await self.tail_messages(key, n)
            if messages:
                tails[key] = [m.payload for m in messages]
        return tails

    async def sessions_with_open_calls(
        self, *, after: str | None = None, limit: int = 500
    ) -> list[OpenCalls]:
        check_int(limit, "limit", minimum=1)
        rows = sorted(
            (
                r
                for r in await self._indexed()
                if r["open_calls"] != 0 and (after is None or r["key"] > after)
            ),
            key=lambda r: r["key"],
        )
        return [
            OpenCalls(
                r["key"],
                r["status"],
                r["head_seq"],
                from_micros(r["created_at"]),
                r["open_calls"],
                r["calls_owner"],
            )
            for r in rows[:limit]
        ]

    async def get_session_step(self, key: str, call_id: str) -> SessionStepRecord | None:
        state = await self._state(key)
        step = state.steps.get(call_id) if state.row is not None else None
        return None if step is None else self._step(key, call_id, step)

    async def session_steps(self, key: str, *, status: str | None = None) -> list[SessionStepRecord]:
        if status is not None:
            _check_status(status)
        state = await self._state(key)
        if state.row is None:
            return []
        return [
            self._step(key, cid, s)
            for cid, s in sorted(state.steps.items())
            if s is not None and (status is None or s["status"] == status)
        ]

    async def start_session_step(
        self, key: str, call_id: str, *, owner: str, expected_attempt: int | None
    ) -> SessionStepRecord | None:
        check_key(call_id, "call_id")

        def decide(
            s: SessionState,
        ) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionStepRecord | None]]:
            if expected_attempt is None:
                self._require(s, key)
                if s.steps.get(call_id) is not None:
                    return None, lambda n: None
                attempt = 1
            else:
                found = s.steps.get(call_id) if s.row is not None else None
                if found is None or found["attempt"] != expected_attempt:
                    return None, lambda n: None
                attempt = expected_attempt + 1
            step = {
                "status": "started",
                "attempt": attempt,
                "owner": owner,
                "result_seq": None,
                "error": None,
                "started_at": now_us(),
                "finished_at": None,
            }
            return {"steps": {call_id: step}}, lambda n: self._step(key, call_id, step)

        return await self._change(key, decide)

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

        def decide(
            s: SessionState,
        ) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionStepRecord | None]]:
            found = s.steps.get(call_id) if s.row is not None else None
            if found is None or found["status"] != "started" or found["attempt"] != attempt:
                return None, lambda n: None
            step = {
                **found,
                "status": status,
                "result_seq": result_seq,
                "error": None if error is None else error.decode("utf-8"),
                "finished_at": now_us(),
            }
            return {"steps": {call_id: step}}, lambda n: self._step(key, call_id, step)

        return await self._change(key, decide)

    async def settle_session_step(
        self, key: str, call_id: str, *, status: str, owner: str, result_seq: int | None
    ) -> SessionStepRecord:
        _check_status(status)

        def decide(
            s: SessionState,
        ) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionStepRecord]]:
            self._require(s, key)
            at = now_us()
            found = s.steps.get(call_id)
            if found is None:
                step = {
                    "status": status,
                    "attempt": 1,
                    "owner": owner,
                    "result_seq": result_seq,
                    "error": None,
                    "started_at": at,
                    "finished_at": at,
                }
            else:
                step = {**found, "status": status, "result_seq": result_seq, "error": None, "finished_at": at}
            return {"steps": {call_id: step}}, lambda n: self._step(key, call_id, step)

        return await self._change(key, decide)

    # -- heartbeats -----------------------------------------------------------------------------------------

    def _heartbeat_subject(self, owner: str) -> str:
        return checked_subject(f"{self.prefix}.hb.{encode_token(owner)}", "owner", owner)

    async def put_heartbeat(self, owner: str, expires_at: dt.datetime) -> None:
        await self.conn.publish(
            self._heartbeat_subject(owner),
            orjson.dumps({"owner": owner, "expires_at": micros(expires_at)}),
            stream=f"{self.prefix}_heartbeats",
            headers={},
            what="recording a heartbeat",
        )

    async def delete_heartbeat(self, owner: str) -> bool:
        stream, subject = f"{self.prefix}_heartbeats", self._heartbeat_subject(owner)
        last = await self.conn.last(stream, subject)
        if last is None or last.seq is None:
            return False
        await self.conn.purge(stream, subject, before_seq=last.seq + 1)
        return True

    async def read_heartbeat(self, owner: str) -> dt.datetime | None:
        last = await self.conn.last(f"{self.prefix}_heartbeats", self._heartbeat_subject(owner))
        if last is None or last.data is None:
            return None
        return from_micros(int(orjson.loads(last.data)["expires_at"]))

    async def purge_heartbeats(self, expired_before: dt.datetime) -> int:
        stream = f"{self.prefix}_heartbeats"
        cutoff = micros(expired_before)
        gone = 0
        async for seq, subject, data, _ in self.conn.scan(stream, f"{self.prefix}.hb.*"):
            if int(orjson.loads(data)["expires_at"]) < cutoff:
                # Up to the message read: a heartbeat renewed since then stays.
                await self.conn.purge(stream, subject, before_seq=seq + 1)
                gone += 1
        return gone
