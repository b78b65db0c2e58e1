"""Sessions on JetStream: a session is a subject, every change one conditional publish on it.

Each session has one subject, ``<prefix>.s.<key>`` on the ``<prefix>_sessions`` stream. Every change —
create, append, metadata or status, compression, tool step, a new lease holder's fence, delete — is one
event published with ``Nats-Expected-Last-Subject-Sequence`` = the sequence of the last event read: the
server stores it only if nothing changed the session in between (the conditional append, as
``WHERE head_seq = ?`` is on SQL), so the conditions of a write (head, version, incarnation, the lease's
fence) are checked against exactly the state it changes. A writer that lost the race reads the new events
and decides again. An append is one event holding all its messages: it is stored whole or not at all,
and its seqs are dense. The state of a session is the fold of its events (kept per process, read on from
the last sequence it saw). Leases themselves are KV entries (lease_entries.py, leases.py); inside an
``atomic()`` block the writes of the block's session are decided on its copy and published together at
its end (blocks.py).

Deleting a session publishes a tombstone (which keeps the fence) and then purges the subject's events
before it. The ``<prefix>_index`` stream keeps one message per session (its row, for listing by
``updated_at``, by status and by waiting tool calls), written after each event that changes the row and
only forward (an index message names the event it reflects, and an older one never replaces a newer one).
"""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

import nats.js.errors

from ...codec import Codec
from ...errors import ConflictError, InvalidArgument, LeaseLost, NotFound, StorageCorrupt, Unsupported
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
from .branches import NatsBranches
from .client import (
    WRONG_LAST_SEQUENCE,
    NatsConnection,
    StreamSpec,
    checked_subject,
    encode_token,
    from_micros,
    micros,
    translate,
)
from .lease_entries import LeaseEntries

if TYPE_CHECKING:
    from .blocks import Block

__all__ = ["NatsSessions", "SessionState", "index_spec", "sessions_spec"]

T = TypeVar("T")
_CACHE = 512  # sessions whose folded state a process keeps


def sessions_spec(prefix: str) -> StreamSpec:
    return StreamSpec(f"{prefix}_sessions", (f"{prefix}.s.*",))


def index_spec(prefix: str) -> StreamSpec:
    return StreamSpec(f"{prefix}_index", (f"{prefix}.i.*",), max_msgs_per_subject=1)


def now_us() -> int:
    return micros(dt.datetime.now(dt.UTC))


@dataclass
class SessionState:
    """A session folded from its events: ``seq`` is the stream sequence of the last one folded (0: none)."""

    seq: int = 0
    read_seq: int = 0  # the last event read, folded or not (the subject's last sequence)
    writes: dict[str, int] = field(default_factory=dict)  # write id -> seq, of the last events folded
    row: dict[str, Any] | None = None
    fence: int = 0  # the token of the last lease taken (see leases.py): older holders' writes are refused
    messages: list[dict[str, Any]] = field(default_factory=list)  # every seq from 0: archived, then live
    compressions: list[list[Any]] = field(default_factory=list)  # [id, first, upto, summary, at]
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def apply(self, seq: int, event: dict[str, Any], where: str) -> None:
        """Fold the event stored at ``seq``, if its condition holds: it was decided on the state after
        ``event["after"]``, which must be the last event folded. An event stored although it was not (a
        server that lost a condition in a leader change) is read past and changes nothing."""
        if seq <= self.read_seq:
            return  # already read (two readers caught up at once)
        self.read_seq = seq
        after = event.get("after")
        # A tombstone may follow events a purge removed (read past them): it was decided on a state at
        # least as new as this one.
        purged = bool(event.get("reset")) and isinstance(after, int) and after >= self.seq
        if after != self.seq and not purged:
            return
        if event.get("reset"):
            self.messages, self.compressions, self.steps = [], [], {}
        if "row" in event:
            self.row = event["row"]
        if "fence" in event:
            self.fence = max(self.fence, int(event["fence"]))
        for m in event.get("msgs", ()):
            if m["seq"] != len(self.messages):
                raise StorageCorrupt(
                    f"{where}: message {m['seq']} follows {len(self.messages) - 1}: the seqs are not dense"
                )
            self.messages.append(m)
        if "compress" in event:
            self.compressions.append(event["compress"])
        for call_id, step in event.get("steps", {}).items():
            self.steps[call_id] = step
        self.seq = seq
        self.writes[event.get("wid", "")] = seq
        while len(self.writes) > 64:
            self.writes.pop(next(iter(self.writes)))


class NatsSessions(LeaseEntries, NatsBranches, SessionBackend):
    """The session contract on the ``<prefix>_sessions`` and ``<prefix>_index`` streams."""

    conn: NatsConnection
    prefix: str
    codec: Codec
    _states: OrderedDict[str, SessionState]
    _block_var: ContextVar[Block | None]

    # -- plumbing -----------------------------------------------------------------------------------------

    @property
    def sessions_stream(self) -> str:
        """The stream holding every session's events (``<prefix>_sessions``)."""
        return f"{self.prefix}_sessions"

    def session_subject(self, key: str) -> str:
        """The subject of session ``key``'s events (``InvalidArgument`` for a key that cannot be one)."""
        check_key(key, "session key")
        return checked_subject(f"{self.prefix}.s.{encode_token(key)}", "session key", key)

    def _open_block(self) -> Block | None:
        """The ``atomic()`` block the calling task is in (see blocks.py), if any."""
        block = self._block_var.get()
        return None if block is None or block.ended else block

    async def _state(self, key: str) -> SessionState:
        """The session's state as of its last event; inside an ``atomic()`` block that writes it, the
        block's own copy (the block's writes included)."""
        block = self._open_block()
        if block is not None:
            if block.key == key:
                assert block.work is not None
                return block.work
            if block.key is None:
                return block.pin(key, await self.read_state(key))
        return await self.read_state(key)

    async def read_state(self, key: str) -> SessionState:
        """The session's state as of its last event (read on from what this process saw)."""
        subject = self.session_subject(key)
        stream = self.sessions_stream
        last = await self.conn.last(stream, subject)
        state = self._states.get(key)
        if last is None or last.seq is None:
            state = SessionState()
        else:
            if state is None or state.read_seq > last.seq:
                state = SessionState()
            if state.read_seq < last.seq:
                where = f"session {key!r} on the NATS stream {stream}"
                async for seq, _, data, _ in self.conn.scan(stream, subject, start_seq=state.read_seq + 1):
                    try:
                        event = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise StorageCorrupt(f"{where}: message {seq} is not a statekeel event") from None
                    state.apply(seq, event, where)
                if state.read_seq < last.seq:
                    raise StorageCorrupt(f"{where}: events up to {last.seq} could not be read")
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > _CACHE:
            self._states.popitem(last=False)
        return state

    async def _change(
        self,
        key: str,
        decide: Callable[[SessionState], tuple[dict[str, Any] | None, Callable[[SessionState], T]]],
        *,
        lease: SessionLease | None = None,
        own: bool = False,
    ) -> T:
        """Publish the event ``decide`` makes of the current state, conditional on that state; decide
        again on the newer state when another writer changed the session first. With ``lease``, the
        lease's KV entry is checked first (``LeaseLost``), and ``decide`` checks the fence. Inside an
        ``atomic()`` block the event joins the block's (published at its end), unless ``own``."""
        subject = self.session_subject(key)
        block = None if own else self._open_block()
        if block is not None:
            if lease is not None:
                await self._check_lease(key, lease)
            state = await self._state(key)
            block.check_key(key)
            event, result = decide(state)
            if event is not None:
                block.add(event, f"session {key!r}")
            return result(state)
        while True:
            if lease is not None:
                await self._check_lease(key, lease)
            state = await self.read_state(key) if own else await self._state(key)
            event, result = decide(state)
            if event is None:
                return result(state)
            wid = f"s-{uuid.uuid4().hex}"
            event = {**event, "after": state.seq, "wid": wid}
            payload = orjson.dumps(event)
            headers = {"Nats-Expected-Last-Subject-Sequence": str(state.read_seq), "Nats-Msg-Id": wid}
            stream = self.sessions_stream
            try:
                seq, _ = await self.conn.publish(
                    subject, payload, stream=stream, headers=headers, what=f"session {key!r}"
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code == WRONG_LAST_SEQUENCE:
                    continue
                raise StorageCorrupt(f"the NATS stream {stream} refused: {exc.description}") from exc
            # The event counts only if it directly follows the state it was decided on: the server
            # checked that, and the fold checks it again (see SessionState.apply).
            if state.read_seq < seq:
                follows = await self._next_seq(stream, subject, state.read_seq + 1)
                if follows == seq:
                    state.apply(seq, event, f"session {key!r}")
                else:
                    state = await self._state(key)
            if state.writes.get(wid) != seq:
                continue  # not folded: decide again on what is there
            await self.written(key, state, event, seq)
            return result(state)

    async def written(self, key: str, state: SessionState, event: dict[str, Any], seq: int) -> None:
        """What follows an event stored at ``seq`` and folded: the index (when the row changed), and the
        purge of the events before a tombstone."""
        if "row" in event:
            await self._index(key, state)
        if event.get("reset"):
            # The events before the tombstone go; the tombstone (with the fence) stays.
            await self.conn.purge(self.sessions_stream, self.session_subject(key), before_seq=seq)

    async def _next_seq(self, stream: str, subject: str, start: int) -> int | None:
        try:
            msg = await self.conn.js.get_msg(stream, seq=start, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return None
        except Exception as exc:
            raise translate(exc, f"reading session events of the NATS stream {stream}") from exc
        return msg.seq

    async def _index(self, key: str, state: SessionState) -> None:
        subject = f"{self.prefix}.i.{encode_token(key)}"
        stream = f"{self.prefix}_index"
        body = orjson.dumps({"key": key, "event": state.seq, "row": state.row})
        while True:
            last = await self.conn.last(stream, subject)
            if last is not None and last.data is not None and orjson.loads(last.data)["event"] >= state.seq:
                return  # a newer state is indexed already
            expected = 0 if last is None or last.seq is None else last.seq
            try:
                await self.conn.publish(
                    subject,
                    body,
                    stream=stream,
                    headers={"Nats-Expected-Last-Subject-Sequence": str(expected)},
                    what="indexing a session",
                )
                return
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise StorageCorrupt(f"the NATS stream {stream} refused: {exc.description}") from exc

    async def _indexed(self) -> list[dict[str, Any]]:
        """Every live session's indexed row."""
        rows = []
        async for _, _, data, _ in self.conn.scan(f"{self.prefix}_index", f"{self.prefix}.i.*"):
            row = orjson.loads(data)["row"]
            if row is not None:
                rows.append(row)
        return rows

    def _record(self, row: dict[str, Any]) -> SessionRecord:
        return SessionRecord(
            key=row["key"],
            status=row["status"],
            metadata=self.codec.decode(row["metadata"]),
            last_consolidated=row["last_consolidated"],
            head_seq=row["head_seq"],
            version=row["version"],
            created_at=from_micros(row["created_at"]),
            updated_at=from_micros(row["updated_at"]),
            open_calls=row["open_calls"],
            calls_owner=row["calls_owner"],
            write_id=row["write_id"],
        )

    def _message(self, key: str, m: dict[str, Any]) -> MessageRecord:
        return MessageRecord(key, m["seq"], m["role"], self.codec.decode(m["payload"]), from_micros(m["at"]))

    @staticmethod
    def _require(state: SessionState, key: str) -> dict[str, Any]:
        if state.row is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        return state.row

    @staticmethod
    def _fence(state: SessionState, key: str, lease: SessionLease | None) -> None:
        """Refuse a write of a holder whose lease a newer one took over (its token is older than the
        session's fence): checked in the same conditional publish as the write."""
        if lease is not None and state.fence > lease.token:
            raise LeaseLost(
                f"the lease of session {key!r} with token {lease.token} is no longer current "
                f"(current token {state.fence}): another holder took it over; the write was refused",
                key=key,
                token=lease.token,
                current=state.fence,
            )

    def _new_row(self, key: str, metadata: bytes | None) -> dict[str, Any]:
        at = now_us()
        return {
            "key": key,
            "status": "active",
            "metadata": (metadata or b"{}").decode("utf-8"),
            "last_consolidated": 0,
            "head_seq": 0,
            "version": 1,
            "created_at": at,
            "updated_at": at,
            "open_calls": 0,
            "calls_owner": None,
            "write_id": None,
        }

    # -- the contract -------------------------------------------------------------------------------------

    async def create_session(
        self, key: str, *, metadata: bytes | None = None, if_missing: bool = False
    ) -> SessionRecord:
        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionRecord]]:
            if s.row is not None:
                if not if_missing:
                    raise ConflictError(f"session {key!r} already exists", key=key)
                return None, lambda n: self._record(self._require(n, key))
            return {"row": self._new_row(key, metadata)}, lambda n: self._record(self._require(n, key))

        return await self._change(key, decide)

    async def load_session(self, key: str) -> SessionRecord | None:
        state = await self._state(key)
        return None if state.row is None else self._record(state.row)

    async def load_session_payloads(
        self, key: str, *, include_archived: bool = False
    ) -> LoadedSession | None:
        state = await self._state(key)
        if state.row is None:
            return None
        record = self._record(state.row)
        first = 0 if include_archived else record.last_consolidated
        if len(state.messages) != record.head_seq:
            raise StorageCorrupt(
                f"session {key!r}: {len(state.messages)} messages for head {record.head_seq}"
            )
        chosen = state.messages[first:]
        payloads: list[dict[str, Any]] = (
            self.codec.decode("[" + ",".join(m["payload"] for m in chosen) + "]") if chosen else []
        )
        summaries = [(c[0], c[1], c[2], c[3]) for c in state.compressions]
        return LoadedSession(record, payloads, first, summaries)

    async def load_session_with_messages(
        self, key: str, *, include_archived: bool = False
    ) -> tuple[SessionRecord, list[MessageRecord]] | None:
        state = await self._state(key)
        if state.row is None:
            return None
        record = self._record(state.row)
        first = 0 if include_archived else record.last_consolidated
        return record, [self._message(key, m) for m in state.messages[first:]]

    async def list_sessions(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        after: tuple[int, str] | None = None
        if cursor is not None:
            after = _decode_cursor(cursor)
        rows = [r for r in await self._indexed() if status is None or r["status"] == status]
        rows.sort(key=lambda r: (r["updated_at"], r["key"]), reverse=True)
        if after is not None:
            rows = [r for r in rows if (r["updated_at"], r["key"]) < after]
        items = [self._record(r) for r in rows[:limit]]
        next_cursor = None
        if len(rows) > limit:
            last = rows[limit - 1]
            next_cursor = _encode_cursor(last["updated_at"], last["key"])
        return Page(items=items, next_cursor=next_cursor)

    async def update_session(
        self,
        key: str,
        *,
        expected_version: int | None = None,
        metadata: bytes | None = None,
        status: str | None = None,
        lease: SessionLease | None = None,
    ) -> SessionRecord:
        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionRecord]]:
            self._fence(s, key, lease)
            row = dict(self._require(s, key))
            if expected_version is not None and row["version"] != expected_version:
                raise ConflictError(
                    f"session {key!r} is at version {row['version']}, not the expected {expected_version}",
                    key=key,
                    expected=expected_version,
                    current=row["version"],
                )
            if metadata is not None:
                row["metadata"] = metadata.decode("utf-8")
            if status is not None:
                row["status"] = status
            row["version"] += 1
            row["updated_at"] = now_us()
            return {"row": row}, lambda n: self._record(self._require(n, key))

        return await self._change(key, decide, lease=lease)

    async def delete_session(self, key: str, *, lease: SessionLease | None = None) -> bool:
        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], bool]]:
            self._fence(s, key, lease)
            if s.row is None:
                return None, lambda n: False
            return {"reset": True, "row": None, "fence": s.fence}, lambda n: True

        return await self._change(key, decide, lease=lease)

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
        check_key(key, "session key")
        check_int(expected_head, "expected_head")
        if expected_rewinds is not None:
            # No rewind is ever made here (NatsBranches): every session has had none.
            check_int(expected_rewinds, "expected_rewinds")
        if any(m.usage is not None for m in messages):
            raise Unsupported(
                f"a NATS store ({self.url}) does not record usage with messages: add them without usage=, "
                "or keep sessions in a SQL store",
                kind="sessions",
                url=self.url,
            )
        if expected_version is not None:
            check_int(expected_version, "expected_version")
        if expected_created_at is not None:
            check_aware(expected_created_at, "expected_created_at")
        if open_calls is not None:
            check_int(open_calls, "open_calls", minimum=-1)
            if calls_owner is not None:
                check_str(calls_owner, "calls_owner")
            calls_owner = calls_owner if open_calls else None
        if write_id is not None:
            check_str(write_id, "write_id")
        payloads = [(m.role, m.payload.decode("utf-8")) for m in messages]

        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionRecord]]:
            self._fence(s, key, lease)
            if s.row is None and not create:
                raise NotFound(f"session {key!r} does not exist", key=key)
            row = dict(s.row if s.row is not None else self._new_row(key, metadata))
            if row["head_seq"] != expected_head:
                raise ConflictError(
                    f"session {key!r} has head {row['head_seq']}, not the expected {expected_head}: "
                    "another writer appended first",
                    key=key,
                    expected=expected_head,
                    current=row["head_seq"],
                )
            if expected_created_at is not None and from_micros(row["created_at"]) != expected_created_at:
                raise ConflictError(
                    f"session {key!r} was deleted and created again since it was loaded "
                    f"(created at {from_micros(row['created_at']).isoformat()}, expected "
                    f"{expected_created_at.isoformat()})",
                    key=key,
                    expected=expected_head,
                    current=row["head_seq"],
                )
            if expected_version is not None and row["version"] != expected_version:
                raise ConflictError(
                    f"session {key!r} is at version {row['version']}, not the expected {expected_version}: "
                    "another writer changed its metadata or status since it was loaded",
                    key=key,
                    expected=expected_version,
                    current=row["version"],
                )
            if expected_rewinds not in (None, 0):
                raise ConflictError(
                    f"session {key!r} has had no rewind, not the expected {expected_rewinds}",
                    key=key,
                    expected=expected_rewinds,
                    current=0,
                )
            at = now_us()
            msgs = [
                {"seq": seq, "role": role, "payload": text, "at": at}
                for seq, (role, text) in enumerate(payloads, expected_head)
            ]
            row["head_seq"] += len(msgs)
            if metadata is not None:
                row["metadata"] = metadata.decode("utf-8")
            if status is not None:
                row["status"] = status
            row["version"] += 1
            row["updated_at"] = at
            if open_calls is not None:
                row["open_calls"], row["calls_owner"] = open_calls, calls_owner
            elif msgs:
                row["open_calls"] = -1
            row["write_id"] = write_id
            return {"row": row, "msgs": msgs}, lambda n: self._record(self._require(n, key))

        return await self._change(key, decide, lease=lease)

    async def read_messages(self, key: str, *, start: int = 0, end: int | None = None) -> list[MessageRecord]:
        state = await self._state(key)
        if state.row is None:
            return []
        live = max(start, state.row["last_consolidated"])
        stop = len(state.messages) if end is None else min(end, len(state.messages))
        return [self._message(key, m) for m in state.messages[live:stop]] if live < stop else []

    async def tail_messages(self, key: str, n: int) -> list[MessageRecord]:
        state = await self._state(key)
        if state.row is None or n <= 0:
            return []
        live = state.messages[state.row["last_consolidated"] :]
        return [self._message(key, m) for m in live[-n:]]

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

        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], SessionRecord]]:
            self._fence(s, key, lease)
            row = dict(self._require(s, key))
            if expected_created_at is not None and from_micros(row["created_at"]) != expected_created_at:
                raise ConflictError(
                    f"session {key!r} was deleted and created again since it was read; "
                    "nothing was compressed",
                    key=key,
                )
            start = row["last_consolidated"]
            if start != expected_consolidated:
                raise ConflictError(
                    f"session {key!r} was consolidated up to {start}, "
                    f"not the expected {expected_consolidated}",
                    key=key,
                    expected=expected_consolidated,
                    current=start,
                )
            if not start < upto_seq <= row["head_seq"]:
                raise InvalidArgument(
                    f"upto_seq {upto_seq} must be after last_consolidated {start} and at most the head "
                    f"{row['head_seq']}",
                    key=key,
                    upto_seq=upto_seq,
                )
            if any(c[0] == compression_id for c in s.compressions):
                raise ConflictError(
                    f"session {key!r} has a compression {compression_id!r} already; nothing was compressed",
                    key=key,
                    compression_id=compression_id,
                )
            at = now_us()
            row["last_consolidated"] = upto_seq
            row["version"] += 1
            row["updated_at"] = at
            event = {"row": row, "compress": [compression_id, start, upto_seq, summary, at]}
            return event, lambda n: self._record(self._require(n, key))

        return await self._change(key, decide, lease=lease)

    async def read_archive(self, key: str, *, compression_id: str | None = None) -> list[ArchivedMessage]:
        state = await self._state(key)
        out: list[ArchivedMessage] = []
        for cid, first, upto, summary, _ in state.compressions:
            if compression_id is not None and cid != compression_id:
                continue
            for m in state.messages[first:upto]:
                payload = self.codec.decode(m["payload"])
                out.append(ArchivedMessage(key, cid, m["seq"], payload, summary, from_micros(m["at"])))
        out.sort(key=lambda a: a.seq)
        return out

    async def read_summaries(self, key: str) -> list[tuple[str, int, int, str]]:
        state = await self._state(key)
        return [(c[0], c[1], c[2], c[3]) for c in state.compressions]

    async def transition_idle_sessions(
        self, from_status: str, to_status: str, idle_before: dt.datetime
    ) -> int:
        cutoff = micros(idle_before)
        moved = 0
        for indexed in await self._indexed():
            if indexed["status"] != from_status or indexed["updated_at"] >= cutoff:
                continue

            def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], bool]]:
                row = s.row
                # Checked again on the state the change applies to: a session touched since stays.
                if row is None or row["status"] != from_status or row["updated_at"] >= cutoff:
                    return None, lambda n: False
                changed = {**row, "status": to_status, "version": row["version"] + 1}
                return {"row": changed}, lambda n: True

            moved += await self._change(indexed["key"], decide)
        return moved


def _encode_cursor(updated_at: int, key: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([updated_at, key])).decode("ascii")


def _decode_cursor(cursor: Any) -> tuple[int, str]:
    try:
        at, key = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        if type(at) is not int or type(key) is not str:
            raise ValueError
        return at, key
    except Exception:
        raise InvalidArgument(f"cursor {cursor!r} is not one that list returned", cursor=cursor) from None
