"""Tool calls of sessions: run once through the step journal, and answered when their process is gone.

- ``run_tool`` commits, in one transaction, the session's unsaved messages (the assistant message that
  made the call) and the call's *started* journal row; runs the tool; then commits, in one transaction,
  the result message (in the call's own transcript format) and the row's outcome. The result message *is*
  the journal's completion record: after a crash a call has its result in the transcript, or it has none
  and its row says whether its function may have run (in doubt) — one truth, never two to reconcile.
- ``load`` / ``open`` answer the calls a process that is gone left waiting with an explicit interrupted
  result (:meth:`ToolCalls.settle`), through the ordinary conditional save: a racing repair gets
  ``ConflictError``, reloads and finds nothing left to do. A call of a live process is never answered: the
  session row names the process that left its calls waiting, and that process keeps a heartbeat row while
  it runs (a process of this host that is gone is known at once; another host's when its heartbeat
  expires). A call whose function was started through ``run_tool`` is in doubt, not auto-answered.
- Each session row counts its waiting calls (``open_calls``, kept by every save), so ``recover()`` finds
  the sessions to repair through an index of those sessions, never by reading every session.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from ..backends.base import OpenCalls, SessionStepRecord
from ..codec import canonical
from ..errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    LeaseLost,
    StatekeelError,
    StepInDoubt,
    ToolCallAlreadyAnswered,
    UnknownToolCall,
)
from ..holders import holder_is_dead
from ..journal import StepFn, check_fn, check_outside_transaction, discard, run_step
from ..transcripts import ToolCall, TranscriptIndex, analyze, normalize_item, tool_result
from ..validation import check_bool, check_key
from .session import Session
from .transcript import take_back

if TYPE_CHECKING:
    from .manager import SessionManager

log = logging.getLogger("statekeel.sessions")

MISSING: Any = object()
# recover(): sessions read per page of the index; a session busy for longer than this is reported busy.
_PAGE = 500
_LOCK_TIMEOUT_S = 0.5
# recover(): how far back from a session's end the one-time count of an unknown session looks.
_TAIL = 200
_TAILS_PER_READ = 50  # sessions whose tails one read returns: bounds what is held in memory at once


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key(session: Session, call_id: str) -> tuple[str, str]:
    return (session.key, call_id)


@dataclass(slots=True)
class ToolRecovery:
    """What ``recover()`` found among the sessions with waiting tool calls."""

    repaired: dict[str, list[str]] = field(default_factory=dict)  # key -> call ids answered (or to be)
    busy: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    in_doubt: list[SessionStepRecord] = field(default_factory=list)


class ToolCalls:
    """The tool calls of one ``SessionManager``'s sessions."""

    def __init__(self, manager: SessionManager) -> None:
        self._manager = manager
        self._running: set[tuple[str, str]] = set()  # (session key, call id) whose function runs here
        self._beat_until: dt.datetime | None = None  # this manager's heartbeat row, as last committed
        self._beat_written = False
        self._beater: asyncio.Task[None] | None = None

    @property
    def owner(self) -> str:
        return self._manager.owner_id

    # --- heartbeat --------------------------------------------------------------------------------------

    async def ensure_heartbeat(self) -> None:
        """Make this manager's heartbeat row valid for a while, before a write names it the owner of
        waiting calls (committed first: a reader never sees the owner without its heartbeat)."""
        manager = self._manager
        ttl = dt.timedelta(seconds=manager.lease_seconds)
        now = _utcnow()
        if self._beat_until is None or self._beat_until - now < ttl / 2:
            until = now + ttl
            await manager.backend.put_heartbeat(self.owner, until)
            self._beat_written = True
            # Inside the caller's atomic() block the row commits with it, or not at all: write it again
            # next time rather than trust it.
            self._beat_until = None if manager.backend.in_atomic() else until
        if self._beater is None or self._beater.done():
            # A context of its own: the renewals must not join the atomic() block of the task that
            # started them.
            self._beater = asyncio.create_task(
                self._beat(), name="statekeel-heartbeat", context=contextvars.Context()
            )

    async def _beat(self) -> None:
        manager = self._manager
        interval = manager.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            until = _utcnow() + dt.timedelta(seconds=manager.lease_seconds)
            try:
                await manager.backend.put_heartbeat(self.owner, until)
                self._beat_until = until
                interval = manager.lease_seconds / 3
            except StatekeelError as exc:
                interval = max(manager.lease_seconds / 10, 0.05)  # retry sooner: it is ours until it expires
                log.warning("could not renew the heartbeat of %s: %s", self.owner, exc)

    async def close(self) -> None:
        """Stop the heartbeat and remove its row: calls this manager left waiting may be answered now."""
        beater, self._beater = self._beater, None
        if beater is not None:
            beater.cancel()
            await asyncio.gather(beater, return_exceptions=True)
        if self._beat_written:
            self._beat_written = False
            self._beat_until = None
            try:
                await self._manager.backend.delete_heartbeat(self.owner)
            except StatekeelError as exc:
                log.warning("could not remove the heartbeat of %s (it will expire): %s", self.owner, exc)

    # --- whose calls ------------------------------------------------------------------------------------

    async def _alive(self, owner: str | None, *, own_counts: bool = True) -> bool:
        """Whether ``owner`` (a process that left calls waiting) still runs. This manager counts as
        running unless ``own_counts`` is False (``recover()``: then only calls it runs right now do)."""
        if owner is None:
            return False
        if owner == self.owner:
            return own_counts
        if holder_is_dead(owner):
            return False
        until = await self._manager.backend.read_heartbeat(owner)
        return until is not None and until > _utcnow()

    async def _held_elsewhere(self, key: str) -> bool:
        """Whether another holder has the session's lock: another task of this manager, or a live lease."""
        manager = self._manager
        held = manager._held.get(key)
        if held is not None:
            return held._holder is not asyncio.current_task()
        lease = await manager.backend.read_session_lease(key)
        if lease is None or lease.owner is None or lease.owner == self.owner:
            return False
        return lease.expires_at > _utcnow() and not holder_is_dead(lease.owner)

    # --- what a save records ----------------------------------------------------------------------------

    async def counted(self, session: Session) -> tuple[int, str | None]:
        """The session's waiting calls and their owner, as a save records them (heartbeat ensured)."""
        count = session._tools.open_calls(session.messages, session._first)
        if not count:
            return 0, None
        await self.ensure_heartbeat()
        return count, self.owner

    # --- the transcript ---------------------------------------------------------------------------------

    @staticmethod
    def _index(session: Session) -> TranscriptIndex:
        return session._tools.index(session.messages, session._first)

    def _waiting_call(self, session: Session, call_id: str) -> ToolCall:
        """The call ``call_id`` of the session, which must still wait for a result that appending can
        give; a typed error otherwise (nothing is written)."""
        index = self._index(session)
        call = index.call(call_id)
        fields = {"call_id": call_id, "key": session.key}
        if call is None:
            raise UnknownToolCall(
                f"session {session.key!r} has no tool call {call_id!r}; pass the id of a call the model "
                "made (session.pending_calls() lists those waiting for a result)",
                dialect=None,
                index=None,
                **fields,
            )
        if index.answered(call):
            raise ToolCallAlreadyAnswered(
                f"tool call {call_id!r} of session {session.key!r} already has its result; a call gets "
                "exactly one",
                dialect=call.dialect.value,
                index=call.index,
                **fields,
            )
        index.check(tool_result(call, ""))  # placement: TranscriptError if other messages followed its turn
        return call

    def result_message(self, session: Session, call: ToolCall, value: Any) -> dict[str, Any]:
        """The message that answers ``call`` with ``value``: a str (or a list of content parts) is its
        content; a message or item (dict or pydantic model) that answers this very call is taken as it is;
        any other value becomes its JSON text."""
        if type(value) is str or (type(value) is list and all(type(v) is dict for v in value)):
            return tool_result(call, value)
        if type(value) is dict or hasattr(value, "model_dump"):
            try:
                item = normalize_item(value)
            except InvalidArgument:
                item = None
            if item is not None and {r.call_id for r in analyze([item]).results} == {call.call_id}:
                return item
        plain = session._codec.to_json(value, where="result")
        return tool_result(call, orjson.dumps(plain).decode("utf-8"))

    # --- run_tool ---------------------------------------------------------------------------------------

    async def run(self, session: Session, call_id: str, fn: StepFn, idempotent: bool) -> Any:
        """See ``SessionManager.run_tool``."""
        try:
            session = self._manager._check_owned(session)
            check_key(call_id, "call_id")
            check_bool(idempotent, "idempotent")
            check_fn(fn, call_id=call_id)
            check_outside_transaction(
                self._manager.backend.in_atomic(),
                f"tool call {call_id!r} of session {session.key!r}",
                key=session.key,
                call_id=call_id,
            )
            call = self._waiting_call(session, call_id)
            running = _key(session, call_id)
            if running in self._running:
                raise ConflictError(
                    f"tool call {call_id!r} of session {session.key!r} is already running in this process",
                    key=session.key,
                    call_id=call_id,
                )
        except BaseException:
            discard(fn)  # a coroutine passed as fn is closed, not left to warn "never awaited"
            raise
        self._running.add(running)
        try:
            return await run_step(_ToolStep(self, session, call, idempotent), fn, self._manager.codec)
        finally:
            self._running.discard(running)

    async def append_result(self, session: Session, message: dict[str, Any], settle: Any) -> None:
        """Append ``message`` (already checked) to the session and commit it, with the session's other
        unsaved messages, together with ``settle(seq)`` (the journal's record of the result at ``seq``),
        conditional on the head the session holds. The caller holds ``session._saving``. On
        ``BackendUnavailable`` the message stays in the session, unsaved; on any other failure it is taken
        back out."""
        manager = self._manager
        self._index(session).add(message)
        session.messages.append(message)
        seq = session.head_seq - 1
        try:
            await self.counted(session)  # the heartbeat, before the block that may name this process
            async with manager.backend.atomic():
                await manager._save_now(session)  # in the block: undone in the session if it rolls back
                await settle(seq)
        except BackendUnavailable:
            raise
        except BaseException:
            take_back(session.messages, [message], session._tools)
            raise

    # --- resolve_tool -----------------------------------------------------------------------------------

    async def resolve(
        self, session: Session, call_id: str, result: Any, interrupted: bool, actor: str | None = None
    ) -> dict[str, Any]:
        """See ``SessionManager.resolve_tool``."""
        manager = self._manager
        session = manager._check_owned(session)
        check_key(call_id, "call_id")
        check_bool(interrupted, "interrupted")
        if interrupted == (result is not MISSING):
            raise InvalidArgument("pass the call's result (result=...) or interrupted=True, not both")
        async with session._saving:
            call = self._waiting_call(session, call_id)
            if _key(session, call_id) in self._running:
                raise ConflictError(
                    f"tool call {call_id!r} of session {session.key!r} is running in this process; it "
                    "appends its own result",
                    key=session.key,
                    call_id=call_id,
                )
            if interrupted:
                message = self._index(session).repair(only=[call_id]).append[0]
            else:
                message = self.result_message(session, call, result)
            session._codec.encode(message, where=f"messages[{session.head_seq}]")
            self._index(session).check(message)

            async def settle(seq: int) -> None:
                step = await manager.backend.get_session_step(session.key, call_id)
                if (
                    step is not None
                    and step.status == "started"
                    and step.owner != self.owner
                    and await self._alive(step.owner)
                ):
                    raise ConflictError(
                        f"tool call {call_id!r} of session {session.key!r} is running in {step.owner}; it "
                        "appends its own result",
                        key=session.key,
                        call_id=call_id,
                        owner=step.owner,
                    )
                await manager.backend.settle_session_step(
                    session.key,
                    call_id,
                    status="interrupted" if interrupted else "succeeded",
                    owner=self.owner,
                    result_seq=seq,
                )
                if actor is not None:  # in the answer's transaction: both commit or neither
                    data = {"session_key": session.key, "call_id": call_id, "seq": seq}
                    data["answer"] = "interrupted" if interrupted else "result"
                    text = canonical(data).decode("utf-8")
                    await manager.backend.append_audit(
                        "tool_call.resolved", actor, f"session:{session.key}", text
                    )

            try:
                await self.append_result(session, message, settle)
            except BackendUnavailable:
                take_back(session.messages, [message], session._tools)  # nothing was written: retry it
                raise
        return message

    # --- repair where a transcript is handed out ----------------------------------------------------------

    async def settle(self, session: Session, repair: bool, *, recovering: bool = False) -> bool:
        """Answer the calls a process that is gone left waiting (not those in doubt) with an interrupted
        result, saved once; ``session.repaired`` lists them. False when another writer changed the session
        first (the caller reloads it and calls again)."""
        session.repaired = ()
        tools = session._tools
        if not repair or tools.stored_open == 0 or not session._in_backend:
            return True
        manager = self._manager
        key = session.key
        index = self._index(session)
        waiting = index.awaiting()
        if waiting and await self._alive(tools.calls_owner, own_counts=not recovering):
            return True  # its process may still be running them
        if await self._held_elsewhere(key):
            return True  # its holder answers them, or runs them
        todo = await self._not_started(session, waiting)
        if not todo:  # nothing to answer (or only calls in doubt): the stored count may be out of date
            if not session.unsaved():
                await self._recount(session, len(waiting))
            return True
        plan = index.repair(only=[c.call_id for c in todo])
        added: list[dict[str, Any]] = []
        try:
            for message in plan.append:
                added.append(session._append(message))
            await manager._save(session)
        except ConflictError:
            take_back(session.messages, added, tools)
            return False
        except BaseException:
            take_back(session.messages, added, tools)
            raise
        session.repaired = tuple(todo)
        log.warning(
            "session %r: %d tool call(s) left without a result by a process that is gone (%s) answered "
            "with an interrupted result: %s",
            key,
            len(todo),
            tools.calls_owner or "unknown",
            ", ".join(c.call_id for c in todo),
        )
        return True

    async def _not_started(self, session: Session, waiting: tuple[ToolCall, ...]) -> list[ToolCall]:
        """The waiting calls whose function was never started (those started are in doubt), minus those
        running in this manager."""
        if not waiting:
            return []
        started = {
            s.call_id for s in await self._manager.backend.session_steps(session.key, status="started")
        }
        return [
            c for c in waiting if c.call_id not in started and _key(session, c.call_id) not in self._running
        ]

    async def _recount(self, session: Session, count: int) -> None:
        """Correct a stored count that is out of date (unknown, or written by a writer that did not count);
        only a count: a failure is left to the next save."""
        tools = session._tools
        if tools.stored_open == count:
            return
        try:
            done = await self._manager.backend.set_open_calls(
                session.key,
                expected_head=session.saved_head,
                expected_created_at=session.created_at,
                open_calls=count,
                calls_owner=tools.calls_owner,
            )
        except (BackendUnavailable, ConflictError):
            return
        if done:
            tools.stored_open = count

    async def in_doubt(self, session: Session, *, recovering: bool = False) -> list[SessionStepRecord]:
        """The session's calls whose function was started and whose process is gone, without a result."""
        waiting = {c.call_id for c in session.pending_calls()}
        if not waiting:
            return []
        found = []
        for step in await self._manager.backend.session_steps(session.key, status="started"):
            if step.call_id not in waiting or _key(session, step.call_id) in self._running:
                continue
            if not await self._alive(step.owner, own_counts=not recovering):
                found.append(step)
        return found

    # --- recover() --------------------------------------------------------------------------------------

    async def recover(self, repair: bool) -> ToolRecovery:
        """The sessions whose calls wait for a result, read through the index of those sessions: answer
        what a process that is gone left (``repair``), list what is in doubt or busy."""
        out = ToolRecovery()
        backend = self._manager.backend
        after: str | None = None
        while True:
            page = await backend.sessions_with_open_calls(after=after, limit=_PAGE)
            counted = {
                c.key: c for c in await self._count_unknown([p for p in page if p.open_calls < 0], repair)
            }
            for found in (counted.get(p.key, p) for p in page):
                if found.open_calls and found.status == "active":
                    await self._recover_one(found, repair, out)
            if len(page) < _PAGE:
                return out
            after = page[-1].key

    async def _count_unknown(self, unknown: list[OpenCalls], repair: bool) -> list[OpenCalls]:
        """Count once the waiting calls of sessions written before counts were kept (from the last
        messages of each); store the zeros (``repair``). Returns the sessions with their count."""
        if not unknown:
            return []
        backend = self._manager.backend
        tails: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(unknown), _TAILS_PER_READ):
            keys = [found.key for found in unknown[start : start + _TAILS_PER_READ]]
            tails.update(await backend.read_session_tails(keys, _TAIL))
        counted = [
            replace(found, open_calls=len(TranscriptIndex(tails.get(found.key, ())).awaiting()))
            for found in unknown
        ]
        zeros = [c for c in counted if not c.open_calls]
        if repair and zeros:
            await backend.set_open_calls_many(zeros)
        return counted

    async def _recover_one(self, found: OpenCalls, repair: bool, out: ToolRecovery) -> None:
        manager = self._manager
        key = found.key
        try:
            if await self._held_elsewhere(key) or await self._alive(found.calls_owner, own_counts=False):
                out.busy.append(key)
                return
            if repair:
                async with manager.open(key, timeout=_LOCK_TIMEOUT_S, repair=False) as session:
                    if not await self.settle(session, True, recovering=True):
                        out.busy.append(key)
                        return
                    answered = [c.call_id for c in session.repaired]
                    doubt = await self.in_doubt(session, recovering=True)
            else:
                loaded = await manager._peek(key)  # writes nothing: not even by evicting from the cache
                if loaded is None:
                    return
                waiting = self._index(loaded).awaiting()
                answered = [c.call_id for c in await self._not_started(loaded, waiting)]
                doubt = await self.in_doubt(loaded, recovering=True)
        except (ConflictError, LeaseLost):
            out.busy.append(key)
            return
        except StatekeelError as exc:
            # One damaged session must not stop the repair of the others nor the rest of the recovery.
            log.warning("could not check or repair the tool calls of session %r: %s", key, exc)
            out.failed[key] = str(exc)
            return
        if answered:
            out.repaired[key] = answered
        out.in_doubt.extend(doubt)


class _ToolStep:
    """A session's tool call in the step journal: its ``session_steps`` row and its result message."""

    def __init__(self, tools: ToolCalls, session: Session, call: ToolCall, idempotent: bool) -> None:
        self.tools = tools
        self.session = session
        self.call = call
        self.idempotent = idempotent

    async def begin(self) -> tuple[SessionStepRecord, bool]:
        """Commit the session's unsaved messages (the call among them) and the *started* row together."""
        tools, session, call_id = self.tools, self.session, self.call.call_id
        manager = tools._manager
        backend = manager.backend
        async with session._saving:
            tools._waiting_call(session, call_id)  # again: a task of this process may have answered it
            changes = session._changes()
            count, owner = await tools.counted(session)  # count > 0: this call waits
            async with backend.atomic():
                if changes.empty:
                    # Nothing to append: claim the waiting calls, conditional on the head this session
                    # holds (its view of the call is current) and fenced by its lease.
                    if not await backend.set_open_calls(
                        session.key,
                        expected_head=session.saved_head,
                        expected_created_at=session.created_at,
                        open_calls=count,
                        calls_owner=owner,
                        lease=manager._lease_for(session.key),
                    ):
                        raise ConflictError(
                            f"session {session.key!r} changed in the store since it was loaded (another "
                            "writer appended or deleted it); reload it before running its tool calls",
                            key=session.key,
                        )
                else:
                    await manager._save_now(session)  # in the block: undone in the session if it rolls back
                # The first run of a call: one insert. A row already there is judged by _restart.
                started = await backend.start_session_step(
                    session.key, call_id, owner=tools.owner, expected_attempt=None
                )
                run = True
                if started is None:
                    step = await backend.get_session_step(session.key, call_id)
                    assert step is not None  # rows are deleted only with their session, locked here
                    started, run = await self._restart(step)
            if changes.empty:
                session._tools.stored_open, session._tools.calls_owner = count, owner
        return started, run

    async def _restart(self, step: SessionStepRecord) -> tuple[SessionStepRecord, bool]:
        """A call that has a row but no result: run it again (it failed, or it is idempotent), or it is in
        doubt (``run`` False), or it is running in another live process (``ConflictError``)."""
        tools, session, call_id = self.tools, self.session, self.call.call_id
        if step.status == "started" and step.owner != tools.owner and await tools._alive(step.owner):
            raise ConflictError(
                f"tool call {call_id!r} of session {session.key!r} is running in {step.owner}",
                key=session.key,
                call_id=call_id,
                owner=step.owner,
            )
        if step.status != "failed" and not self.idempotent:
            return step, False  # it may have run: in doubt
        started = await tools._manager.backend.start_session_step(
            session.key, call_id, owner=tools.owner, expected_attempt=step.attempt
        )
        if started is None:
            raise ConflictError(
                f"tool call {call_id!r} of session {session.key!r} was started by someone else meanwhile",
                key=session.key,
                call_id=call_id,
            )
        return started, True

    def recorded(self, record: SessionStepRecord) -> Any:
        raise StepInDoubt(
            f"tool call {record.call_id!r} of session {record.session_key!r} was started (attempt "
            f"{record.attempt}, at {record.started_at.isoformat()}, by {record.owner}) but its result was "
            "never appended: its function may have run (resolve_tool(session, call_id, result=...) or "
            "interrupted=True settles it)",
            record=record,
            session_key=record.session_key,
            call_id=record.call_id,
        )

    async def failed(self, record: SessionStepRecord, error: bytes) -> None:
        await self.tools._manager.backend.finish_session_step(
            record.session_key, record.call_id, status="failed", attempt=record.attempt, error=error
        )

    async def succeeded(self, record: SessionStepRecord, value: Any) -> Any:
        """Append the result message and settle the row in one transaction; return ``value``."""
        tools, session, call = self.tools, self.session, self.call
        backend = tools._manager.backend
        async with session._saving:
            try:
                message = tools.result_message(session, call, value)
                session._codec.encode(message, where=f"messages[{session.head_seq}]")
                tools._index(session).check(message)
            except StatekeelError as exc:
                # fn ran, so its side effect may have happened: the call stays in doubt rather than failed.
                raise type(exc)(
                    f"tool call {call.call_id!r} of session {session.key!r} ran, but its result cannot be "
                    f"appended ({exc}); the call is left in doubt: settle it with sessions.resolve_tool()",
                    **exc.fields,
                ) from None

            async def settle(seq: int) -> None:
                done = await backend.finish_session_step(
                    session.key, call.call_id, status="succeeded", attempt=record.attempt, result_seq=seq
                )
                if done is None:
                    raise ConflictError(
                        f"tool call {call.call_id!r} of session {session.key!r} was settled or started "
                        "again by someone else while its function ran",
                        key=session.key,
                        call_id=call.call_id,
                    )

            try:
                await tools.append_result(session, message, settle)
            except BackendUnavailable:
                # The transcript keeps the result: saved as any save is (to the fallback file if the
                # backend is still down), its record left started; the result is the truth.
                await tools._manager._save_now(session)
        return value


__all__ = ["MISSING", "ToolCalls", "ToolRecovery"]
