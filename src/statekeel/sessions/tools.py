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
  the sessions to repair through an index of those sessions, never by reading every session. A call of a
  turn that other messages followed (a user message appended after a crash) counts until a result for it
  is stored: ``resolve_tool`` and the repair append that result (out of place, where ``history()`` leaves
  it out with its call and ``plan_repair`` moves it where the provider wants it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ..backends.base import OpenCalls, SessionStepRecord, StorageBackend
from ..codec import canonical
from ..errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    LeaseLost,
    StatekeelError,
    StepInDoubt,
    ToolCallAlreadyAnswered,
    TranscriptError,
    UnknownToolCall,
)
from ..holders import holder_is_dead
from ..journal import StepFn, check_fn, check_outside_transaction, discard, run_step
from ..transcripts import (
    Dialect,
    ToolCall,
    TranscriptIndex,
    analyze,
    interrupted_answer,
    normalize_item,
    tool_result,
)
from ..validation import check_bool, check_key
from .heartbeat import Heartbeat, utcnow
from .session import Session, book
from .transcript import take_back
from .writes import SessionWrites

log = logging.getLogger("statekeel.sessions")

MISSING: Any = object()
# How recover() opens a session: SessionManager.open.
Opener = Callable[..., AbstractAsyncContextManager[Session]]
# recover(): sessions read per page of the index; a session busy for longer than this is reported busy.
_PAGE = 500
_LOCK_TIMEOUT_S = 0.5
# recover(): how far back from a session's end the one-time count of an unknown session looks.
_TAIL = 200
_TAILS_PER_READ = 50  # sessions whose tails one read returns: bounds what is held in memory at once
# Journal states of a call whose function may have run or did: never answered "interrupted" by a repair.
_RAN_OR_RUNNING = frozenset({"started", "succeeded"})


def _key(session: Session, call_id: str) -> tuple[str, str]:
    return (session.key, call_id)


def _interrupted_message(call: ToolCall) -> dict[str, Any]:
    """The message that answers ``call`` as interrupted when appended (an Anthropic block goes in a user
    message of its own)."""
    answer = interrupted_answer(call)
    return {"role": "user", "content": [answer]} if call.dialect is Dialect.ANTHROPIC else answer


@dataclass(slots=True)
class ToolRecovery:
    """What ``recover()`` found among the sessions with waiting tool calls."""

    repaired: dict[str, list[str]] = field(default_factory=dict)  # key -> call ids answered (or to be)
    busy: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    in_doubt: list[SessionStepRecord] = field(default_factory=list)


class ToolCalls:
    """The tool calls of one ``SessionManager``'s sessions. Their writes go through ``writes``; ``held``
    is the manager's map of the session locks it holds (key → lock)."""

    def __init__(self, writes: SessionWrites, heartbeat: Heartbeat, held: Mapping[str, Any]) -> None:
        self.writes = writes
        self.backend: StorageBackend = writes.backend
        self.heartbeat = heartbeat
        self._held = held
        self._running: set[tuple[str, str]] = set()  # (session key, call id) whose function runs here

    @property
    def owner(self) -> str:
        return self.heartbeat.owner

    async def ensure_heartbeat(self) -> None:
        """See :meth:`Heartbeat.ensure`."""
        await self.heartbeat.ensure()

    async def close(self) -> None:
        """Stop the heartbeat and remove its row: calls this manager left waiting may be answered now."""
        await self.heartbeat.close()

    # --- whose calls ------------------------------------------------------------------------------------

    async def _alive(self, owner: str | None, *, own_counts: bool = True) -> bool:
        return await self.heartbeat.alive(owner, own_counts=own_counts)

    async def _held_elsewhere(self, key: str) -> bool:
        """Whether another holder has the session's lock: another task of this manager, or a live lease."""
        held = self._held.get(key)
        if held is not None:
            return held.holder is not asyncio.current_task()
        lease = await self.backend.read_session_lease(key)
        if lease is None or lease.owner is None or lease.owner == self.owner:
            return False
        return lease.expires_at > utcnow() and not holder_is_dead(lease.owner)

    # --- the transcript ---------------------------------------------------------------------------------

    @staticmethod
    def _index(session: Session) -> TranscriptIndex:
        return book(session).index()

    def _waiting_call(self, session: Session, call_id: str, *, late: bool = False) -> ToolCall:
        """The call ``call_id`` of the session, which must still wait for a result that appending can
        give in place — or, with ``late``, also a call of a turn other messages followed that no stored
        result answers (its result then goes after them); a typed error otherwise (nothing is written)."""
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
        if index.answered(call) or index.answered_late(call):
            raise ToolCallAlreadyAnswered(
                f"tool call {call_id!r} of session {session.key!r} already has its result; a call gets "
                "exactly one",
                dialect=call.dialect.value,
                index=call.index,
                **fields,
            )
        if late and not any(c is call for c in index.awaiting()):
            return call  # its turn was followed by other messages: answered after them
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
        plain = book(session).codec.to_json(value, where="result")
        return tool_result(call, orjson.dumps(plain).decode("utf-8"))

    # --- run_tool ---------------------------------------------------------------------------------------

    async def run(self, session: Session, call_id: str, fn: StepFn, idempotent: bool) -> Any:
        """See ``SessionManager.run_tool``."""
        try:
            session = self.writes.owned(session)
            check_key(call_id, "call_id")
            check_bool(idempotent, "idempotent")
            check_fn(fn, call_id=call_id)
            check_outside_transaction(
                self.backend.in_atomic(),
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
            return await run_step(_ToolStep(self, session, call, idempotent), fn, self.writes.codec)
        finally:
            self._running.discard(running)

    async def append_result(
        self,
        session: Session,
        message: dict[str, Any],
        settle: Callable[[int], Awaitable[None]],
        *,
        late: ToolCall | None = None,
    ) -> None:
        """Append ``message`` (already checked) to the session and commit it, with the session's other
        unsaved messages, together with ``settle(seq)`` (the journal's record of the result at ``seq``),
        conditional on the head the session holds. The caller holds the session's write lock. On
        ``BackendUnavailable`` the message stays in the session, unsaved; on any other failure it is taken
        back out. With ``late`` (a call of a turn other messages followed) ``message`` answers that call
        after them, out of place."""
        transcript = book(session).transcript
        if late is None:
            self._index(session).add(message)
        else:
            self._index(session).add_stored(message)  # out of place: strict placement would refuse it
        session.messages.append(message)
        if late is not None and not self._index(session).answered_late(late):
            take_back(session.messages, [message], transcript)
            raise TranscriptError(
                f"the result given for tool call {late.call_id!r} of session {session.key!r} does not "
                "answer that call; pass its content, or a result item for this very call",
                call_id=late.call_id,
                dialect=late.dialect.value,
                index=session.head_seq,
            )
        seq = session.head_seq - 1
        try:
            await self.writes.save_with(session, functools.partial(settle, seq))
        except BackendUnavailable:
            raise
        except BaseException:
            take_back(session.messages, [message], transcript)
            raise

    # --- resolve_tool -----------------------------------------------------------------------------------

    async def resolve(
        self, session: Session, call_id: str, result: Any, interrupted: bool, actor: str | None = None
    ) -> dict[str, Any]:
        """See ``SessionManager.resolve_tool``."""
        backend = self.backend
        session = self.writes.owned(session)
        check_key(call_id, "call_id")
        check_bool(interrupted, "interrupted")
        if interrupted == (result is not MISSING):
            raise InvalidArgument("pass the call's result (result=...) or interrupted=True, not both")
        async with book(session).saving:
            call = self._waiting_call(session, call_id, late=True)
            index = self._index(session)
            late = None if any(c is call for c in index.awaiting()) else call
            if _key(session, call_id) in self._running:
                raise ConflictError(
                    f"tool call {call_id!r} of session {session.key!r} is running in this process; it "
                    "appends its own result",
                    key=session.key,
                    call_id=call_id,
                )
            if interrupted:
                message = _interrupted_message(call)
            else:
                message = self.result_message(session, call, result)
            book(session).codec.encode(message, where=f"messages[{session.head_seq}]")
            if late is None:
                index.check(message)

            async def settle(seq: int) -> None:
                step = await backend.get_session_step(session.key, call_id)
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
                await backend.settle_session_step(
                    session.key,
                    call_id,
                    status="interrupted" if interrupted else "succeeded",
                    owner=self.owner,
                    result_seq=seq,
                )
                if actor is not None:  # in the answer's transaction: both commit or neither
                    # The seq names the answer in the live transcript of this rewind count.
                    data = {
                        "session_key": session.key,
                        "call_id": call_id,
                        "seq": seq,
                        "rewinds": session.rewinds,
                    }
                    data["answer"] = "interrupted" if interrupted else "result"
                    text = canonical(data).decode("utf-8")
                    await backend.append_audit("tool_call.resolved", actor, f"session:{session.key}", text)

            try:
                await self.append_result(session, message, settle, late=late)
            except BackendUnavailable:
                take_back(session.messages, [message], book(session).transcript)  # nothing written: retry
                raise
        return message

    # --- repair where a transcript is handed out ----------------------------------------------------------

    async def settle(self, session: Session, repair: bool, *, recovering: bool = False) -> bool:
        """Answer the calls a process that is gone left waiting (not those in doubt) with an interrupted
        result, saved once; ``session.repaired`` lists them. False when another writer changed the session
        first (the caller reloads it and calls again)."""
        session.repaired = ()
        b = book(session)
        tools = b.transcript
        if not repair or tools.stored_open == 0 or not b.in_backend:
            return True
        key = session.key
        index = self._index(session)
        waiting = index.outstanding()
        if waiting and await self._alive(tools.calls_owner, own_counts=not recovering):
            return True  # its process may still be running them
        if await self._held_elsewhere(key):
            return True  # its holder answers them, or runs them
        todo = await self._not_started(session, waiting)
        if not todo:  # nothing to answer (or only calls in doubt): the stored count may be out of date
            if not session.unsaved():
                await self._recount(session, len(waiting))
            return True
        in_place = {id(c) for c in index.awaiting()}
        plan = index.repair(only=[c.call_id for c in todo if id(c) in in_place])
        # A call of a turn other messages followed is answered after them (out of place: history() leaves
        # both out, plan_repair() moves the answer where the provider wants it).
        late = [_interrupted_message(c) for c in todo if id(c) not in in_place]
        added: list[dict[str, Any]] = []
        try:
            for message in plan.append:
                added.append(b.append(message))
            for message in late:
                added.append(b.append(message, strict=False))
            await self.writes.save(session)
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
        # A call whose journal says it ran (succeeded: its result was appended, then a rewind took it out
        # of the live transcript) is never answered as not run: it is in doubt, for a person to settle.
        ran = {
            s.call_id for s in await self.backend.session_steps(session.key) if s.status in _RAN_OR_RUNNING
        }
        return [c for c in waiting if c.call_id not in ran and _key(session, c.call_id) not in self._running]

    async def _recount(self, session: Session, count: int) -> None:
        """Correct a stored count that is out of date (unknown, or written by a writer that did not count);
        only a count: a failure is left to the next save."""
        tools = book(session).transcript
        if tools.stored_open == count:
            return
        try:
            done = await self.backend.set_open_calls(
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
        waiting = {c.call_id for c in self._index(session).outstanding()}
        if not waiting:
            return []
        found = []
        for step in await self.backend.session_steps(session.key):
            if step.status not in _RAN_OR_RUNNING:
                continue
            if step.call_id not in waiting or _key(session, step.call_id) in self._running:
                continue
            # One that ran is done whoever ran it; one started is in doubt once its process is gone.
            if step.status == "succeeded" or not await self._alive(step.owner, own_counts=not recovering):
                found.append(step)
        return found

    # --- recover() --------------------------------------------------------------------------------------

    async def recover(
        self, repair: bool, opener: Opener, peek: Callable[[str], Awaitable[Session | None]]
    ) -> ToolRecovery:
        """The sessions whose calls wait for a result, read through the index of those sessions: answer
        what a process that is gone left (``repair``), list what is in doubt or busy. ``opener`` opens a
        session as ``SessionManager.open`` does; ``peek`` reads one as a load would, writing nothing."""
        out = ToolRecovery()
        backend = self.backend
        after: str | None = None
        while True:
            page = await backend.sessions_with_open_calls(after=after, limit=_PAGE)
            counted = {
                c.key: c for c in await self._count_unknown([p for p in page if p.open_calls < 0], repair)
            }
            for found in (counted.get(p.key, p) for p in page):
                if found.open_calls and found.status == "active":
                    await self._recover_one(found, repair, out, opener, peek)
            if len(page) < _PAGE:
                return out
            after = page[-1].key

    async def _count_unknown(self, unknown: list[OpenCalls], repair: bool) -> list[OpenCalls]:
        """Count once the waiting calls of sessions written before counts were kept (from the last
        messages of each); store the zeros (``repair``). Returns the sessions with their count."""
        if not unknown:
            return []
        backend = self.backend
        tails: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(unknown), _TAILS_PER_READ):
            keys = [found.key for found in unknown[start : start + _TAILS_PER_READ]]
            tails.update(await backend.read_session_tails(keys, _TAIL))
        counted = [
            replace(found, open_calls=len(TranscriptIndex(tails.get(found.key, ())).outstanding()))
            for found in unknown
        ]
        zeros = [c for c in counted if not c.open_calls]
        if repair and zeros:
            await backend.set_open_calls_many(zeros)
        return counted

    async def _recover_one(
        self,
        found: OpenCalls,
        repair: bool,
        out: ToolRecovery,
        opener: Opener,
        peek: Callable[[str], Awaitable[Session | None]],
    ) -> None:
        key = found.key
        try:
            if await self._held_elsewhere(key) or await self._alive(found.calls_owner, own_counts=False):
                out.busy.append(key)
                return
            if repair:
                async with opener(key, timeout=_LOCK_TIMEOUT_S, repair=False) as session:
                    if not await self.settle(session, True, recovering=True):
                        out.busy.append(key)
                        return
                    answered = [c.call_id for c in session.repaired]
                    doubt = await self.in_doubt(session, recovering=True)
            else:
                loaded = await peek(key)  # writes nothing: not even by evicting from the cache
                if loaded is None:
                    return
                waiting = self._index(loaded).outstanding()
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
        backend = tools.backend

        async def started() -> tuple[SessionStepRecord, bool]:
            # The first run of a call: one insert. A row already there is judged by _restart.
            first = await backend.start_session_step(
                session.key, call_id, owner=tools.owner, expected_attempt=None
            )
            if first is not None:
                return first, True
            step = await backend.get_session_step(session.key, call_id)
            assert step is not None  # rows are deleted only with their session, locked here
            return await self._restart(step)

        async with book(session).saving:
            tools._waiting_call(session, call_id)  # again: a task of this process may have answered it
            return await tools.writes.save_with(session, started)

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
        started = await tools.backend.start_session_step(
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
        if record.status == "succeeded":
            # Its result was appended, then a rewind took it out of the live transcript.
            raise StepInDoubt(
                f"tool call {record.call_id!r} of session {record.session_key!r} ran (attempt "
                f"{record.attempt}, by {record.owner}) and its result was appended at seq "
                f"{record.result_seq}, but a rewind took that result out of the live transcript (it is in "
                "the rewind record: sessions.rewinds() and archived(key, compression_id)); running it "
                "again could repeat its side effect: settle it with resolve_tool(session, call_id, "
                "result=...) or interrupted=True",
                record=record,
                session_key=record.session_key,
                call_id=record.call_id,
            )
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
        await self.tools.backend.finish_session_step(
            record.session_key, record.call_id, status="failed", attempt=record.attempt, error=error
        )

    async def succeeded(self, record: SessionStepRecord, value: Any) -> Any:
        """Append the result message and settle the row in one transaction; return ``value``."""
        tools, session, call = self.tools, self.session, self.call
        backend = tools.backend
        async with book(session).saving:
            try:
                message = tools.result_message(session, call, value)
                book(session).codec.encode(message, where=f"messages[{session.head_seq}]")
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
                await tools.writes.save_held(session)
        return value


__all__ = ["MISSING", "ToolCalls", "ToolRecovery"]
