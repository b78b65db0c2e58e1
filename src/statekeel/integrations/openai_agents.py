"""The OpenAI Agents SDK on a statekeel store: :class:`StatekeelSession` (the SDK's ``Session``) and
:class:`StatekeelTracingProcessor` (its tracing processor, into ``store.traces``).

One line to adopt each (``pip install 'statekeel[openai-agents]'``)::

    from statekeel.integrations.openai_agents import StatekeelSession, StatekeelTracingProcessor

    session = StatekeelSession("user-42", "sqlite:///agent.db")       # or memory://, postgresql://…
    result = await Runner.run(agent, "run the tests", session=session)

    agents.add_trace_processor(StatekeelTracingProcessor(store))

A session's items are the messages of the statekeel session of the same key, in the OpenAI Responses
format the SDK hands over: ``statekeel show``, ``store.recover()`` and ``store.sessions.load`` work on it
as on any other session. The stored history is append-only: ``pop_item`` hides the last item (the hidden
sequence numbers are in the session's metadata) and ``clear_session`` moves the items into the message
archive; neither deletes a message. A session made from a URL works from any thread and event loop (its
store runs on a loop of its own), as ``SQLiteSession`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import datetime as dt
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

try:
    from agents.memory.session_settings import SessionSettings, coerce_session_settings
    from agents.tracing import Span as SdkSpan
    from agents.tracing import Trace as SdkTrace
    from agents.tracing import TracingProcessor
except ImportError as exc:  # an optional extra
    raise ImportError(
        "statekeel.integrations.openai_agents needs the OpenAI Agents SDK: "
        f"pip install 'statekeel[openai-agents]' ({exc})"
    ) from exc

from ..errors import (
    InvalidArgument,
    InvalidConfig,
    InvalidKey,
    SerializationError,
    SessionClosed,
    UnserializableValue,
)
from ..sessions import Session as StoredSession
from ..store import Store, open_store
from ..transcripts import Dialect, interrupted_answer, normalize_item
from ..validation import check_key
from ._bridge import LoopThread, blocking, on_loop, running_loop, submit
from ._spans import SinkOwner, SpanSink, utc_from_iso

T = TypeVar("T")

log = logging.getLogger("statekeel.integrations.openai_agents")

# Where a session keeps the sequence numbers pop_item hid, in its metadata: {"rewinds": n, "seqs": [...]},
# the seqs of the live transcript of rewind count n (a plain list, as older versions wrote: count 0).
HIDDEN_KEY = "openai_agents.popped"
# The summary of the compression clear_session makes.
CLEARED = "cleared by the OpenAI Agents SDK (clear_session)"
# The reason of the rewind pop_item makes.
POPPED = "item removed by the OpenAI Agents SDK (pop_item)"


def _session_id(value: Any) -> str:
    try:
        return check_key(value, "session_id")
    except InvalidKey as exc:
        raise InvalidConfig(exc.message, value=value) from None


def _check_limit(limit: Any) -> int | None:
    if limit is None:
        return None
    if type(limit) is not int or limit < 0:
        raise InvalidConfig(f"limit must be None or an int >= 0, got {limit!r}", value=limit)
    return limit


class StatekeelSession:
    """The OpenAI Agents SDK's ``Session`` protocol on a statekeel session.

    ``StatekeelSession(session_id, url)`` opens the store at ``url`` on first use, on an event loop of its
    own (a daemon thread), so that the session works from any thread and event loop — ``Runner.run`` on
    the application's loop, ``Runner.run_sync`` or ``asyncio.run`` in worker threads — as ``SQLiteSession``
    does; close it with ``session.close()``, ``await session.aclose()`` or ``async with``.
    ``StatekeelSession.from_store(store, session_id)`` (or ``StatekeelSession(session_id, store)``) uses a
    store the application opened and closes: the session then runs on that store's event loop, and a call
    from another thread or loop goes through it while it runs (a call that could never complete, that loop
    being closed or stopped, raises :class:`~statekeel.errors.SyncCallRefused` at once). ``open_store``
    options pass as keywords with a URL.

    The session stores and returns, unchanged and in order, what the SDK hands it, as ``SQLiteSession``
    does: a tool output answering no call of the session, a call id used again in a later turn (a result
    answers the latest call of that id still without one), an output added again after ``pop_item``.

    Each ``add_items`` is one transaction that appends its items after what the store holds (a failure
    appends none of them); ``pop_item`` and ``clear_session`` are one transaction each. Every write takes
    statekeel's session lock for its duration, so the writes of two processes on one session are
    serialized, never interleaved; ``async with session.hold():`` keeps the lock for a whole run, so that
    another process's run on the same session waits for it (or, past ``lock_timeout``, gets
    :class:`~statekeel.errors.LockTimeout`, a ``ConflictError``).

    Reading a session a process that is gone left with a tool call and no output (a run killed inside a
    tool, or waiting for an approval) answers the call with an explicit interrupted
    ``function_call_output``, stored once, so that the next model call is valid. ``repair=False`` leaves
    such calls waiting: for an application that resumes a serialized ``RunState`` after an approval,
    whose resumed run gives the call its real output.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store: str | Store,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        lock_timeout: float | None = None,
        repair: bool = True,
        **store_options: Any,
    ) -> None:
        self.session_id = _session_id(session_id)
        if type(repair) is not bool:
            raise InvalidConfig(f"repair must be True or False, got {repair!r}")
        self.repair = repair
        self.session_settings = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        if lock_timeout is not None and (type(lock_timeout) not in (int, float) or not lock_timeout >= 0):
            raise InvalidConfig(f"lock_timeout must be None or a number >= 0, got {lock_timeout!r}")
        self.lock_timeout = lock_timeout
        self._store: Store | None = None
        self._url: str | None = None
        self._opener: Any = None
        self._opening: asyncio.Lock | None = None
        self._home: asyncio.AbstractEventLoop | None = None  # the loop the store runs on
        self._thread: LoopThread | None = None  # the session's own loop, for a store it opened
        self._thread_lock = threading.Lock()
        self._closed = False
        self._holding = 0
        if isinstance(store, Store):
            if store_options:
                raise InvalidConfig(
                    f"open_store options ({', '.join(sorted(store_options))}) apply to a URL, not to an "
                    "open store"
                )
            self._store = store
            self._home = running_loop()
        elif isinstance(store, str):
            self._opener = open_store(store, **store_options)  # a bad URL or option fails here
            self._url = store
        else:
            raise InvalidConfig(
                f"StatekeelSession needs a store URL or an open statekeel Store, got {type(store).__name__}"
            )

    @classmethod
    def from_store(
        cls,
        store: Store,
        session_id: str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        lock_timeout: float | None = None,
        repair: bool = True,
    ) -> StatekeelSession:
        """A session on an open store (the application closes it)."""
        if not isinstance(store, Store):
            raise InvalidConfig(f"from_store needs an open statekeel Store, got {type(store).__name__}")
        return cls(
            session_id, store, session_settings=session_settings, lock_timeout=lock_timeout, repair=repair
        )

    # --- the store and its event loop -------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        """After ``close()`` every operation refuses, as ``SQLiteSession``'s do (a ``RuntimeError``)."""
        if self._closed:
            raise SessionClosed(f"StatekeelSession.{what}: the session was closed")

    def _loop(self, what: str) -> asyncio.AbstractEventLoop:
        """The event loop the store runs on (started with the session's own thread for a URL)."""
        self._check_open(what)
        if self._url is None:
            if self._home is None:
                self._home = running_loop()  # the store's loop: the first caller's
            assert self._home is not None  # every caller is a coroutine
            return self._home
        with self._thread_lock:
            self._check_open(what)  # again under the lock: a close() from another thread may be done
            if self._thread is None:
                self._thread = LoopThread(f"statekeel-session-{self.session_id}")
            return self._thread.loop

    async def _run(self, what: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._loop(what)  # before the coroutine is made: a refusal leaves none unawaited
        return await on_loop(make(), loop, f"StatekeelSession.{what}")

    async def _open_here(self) -> Store:
        if self._store is None:
            if self._opening is None:  # made on the store's loop, where every _open_here runs
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._store is None:
                    self._store = await self._opener
        return self._store

    async def store(self) -> Store:
        """The statekeel store, opened on first use when this session was made from a URL. Such a store
        runs on the session's own event loop: call its methods from there, or open another store on the
        same URL to read it from elsewhere."""
        return await self._run("store", self._open_here)

    async def _close_here(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()

    async def aclose(self) -> None:
        """Close the store if this session opened it (from a URL); a store passed in is left open."""
        self.close()

    def close(self) -> None:
        """Close the store if this session opened it (from a URL), as ``SQLiteSession.close()`` closes its
        connections; a store passed in is left open. Every later operation of this session raises
        :class:`~statekeel.errors.SessionClosed` (a ``RuntimeError``). Callable from any thread, also on
        an event loop, and more than once."""
        with self._thread_lock:
            thread, self._thread = self._thread, None
            self._closed = True
        if thread is None:
            return
        try:
            if thread.alive:
                blocking(self._close_here(), thread.loop, "StatekeelSession.close")
        finally:
            thread.stop()

    async def __aenter__(self) -> StatekeelSession:
        await self.store()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @asynccontextmanager
    async def hold(self, timeout: float | None = None) -> AsyncIterator[StatekeelSession]:
        """Hold statekeel's session lock for the block (in this process and across processes):

            async with session.hold():
                await Runner.run(agent, "run the tests", session=session)

        Another process's writes to this session wait until the block ends (``LockTimeout`` past
        ``timeout``, default the session's ``lock_timeout``).
        """
        wait = self.lock_timeout if timeout is None else timeout
        loop = self._loop("hold")
        if running_loop() is loop:  # on the store's loop: this task holds the lock
            store = await self._open_here()
            lock = store.sessions.lock(self.session_id)
            await lock.acquire(wait)
            self._holding += 1
            try:
                yield self
            finally:
                self._holding -= 1
                await lock.release()
            return
        # Elsewhere, one task on the store's loop takes the lock and gives it back (a lock is its task's).
        held: concurrent.futures.Future[asyncio.Event] = concurrent.futures.Future()
        holder = submit(self._hold_for(held, wait), loop, "StatekeelSession.hold")
        try:
            release = await asyncio.wrap_future(held)
        except BaseException:
            if held.done() and not held.cancelled() and held.exception() is None:
                loop.call_soon_threadsafe(held.result().set)  # taken as this caller gave up: give it back
            raise
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(release.set)
            await asyncio.wrap_future(holder)

    async def _hold_for(self, held: concurrent.futures.Future[asyncio.Event], wait: float | None) -> None:
        """Hold the session lock, on the store's loop, until the event handed out through ``held`` is set."""
        try:
            store = await self._open_here()
            lock = store.sessions.lock(self.session_id)
            await lock.acquire(wait)
        except BaseException as exc:
            if not held.done():
                held.set_exception(exc)
            raise
        release = asyncio.Event()
        self._holding += 1
        try:
            try:
                held.set_result(release)
            except concurrent.futures.InvalidStateError:
                return  # the caller stopped waiting (it was cancelled): give the lock back
            await release.wait()
        finally:
            self._holding -= 1
            await lock.release()

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[tuple[Store, StoredSession]]:
        """The statekeel session, loaded (and repaired) under its lock, for one write."""
        store = await self._open_here()
        if self._holding:
            yield store, await store.sessions.get_or_create(self.session_id, repair=self.repair)
            return
        lock = store.sessions.lock(self.session_id)
        await lock.acquire(self.lock_timeout)
        try:
            yield store, await store.sessions.get_or_create(self.session_id, repair=self.repair)
        finally:
            await lock.release()

    # --- the Session protocol ---------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items in order: the latest ``limit`` (default ``session_settings.limit``; None:
        all). Items ``pop_item`` removed are left out; items a save wrote to the fallback file while the
        database was unavailable are in."""
        limit = _check_limit(limit)
        if limit is None and self.session_settings is not None:
            limit = _check_limit(self.session_settings.limit)
        return await self._run("get_items", lambda: self._get_items(limit))

    async def _get_items(self, limit: int | None) -> list[Any]:
        store = await self._open_here()
        session = await store.sessions.load(self.session_id, repair=self.repair)
        if session is None or limit == 0:
            return []
        return copy.deepcopy(_visible(session, limit, await _hidden(store, session)))

    async def add_items(self, items: list[Any]) -> None:
        """Append ``items`` (dicts or the SDK's pydantic items) in one transaction, after what the store
        holds, each stored as it is (as ``SQLiteSession`` stores them: also a tool output that answers no
        call of the session, or a call already answered). Refused before anything is written: a non-list
        (``InvalidConfig``), an item that is not a Responses item (``InvalidConfig``) or cannot be
        serialized (``UnserializableValue``, a ``TypeError`` as ``json.dumps`` raises, and a
        ``ValueError``)."""
        self._check_open("add_items")  # before the empty batch's early return, as SQLiteSession does
        if not isinstance(items, Sequence) or isinstance(items, str | bytes):
            raise InvalidConfig(f"items must be a list of items, got {type(items).__name__}")
        if not items:
            return
        batch = list(items)
        await self._run("add_items", lambda: self._add_items(batch))

    async def _add_items(self, items: list[Any]) -> None:
        store = await self._open_here()
        messages = [_normalized(item, i, store) for i, item in enumerate(items)]
        async with self._writing() as (store, session):
            before = len(session.messages)
            try:
                for message in messages:
                    session.add_item(message, strict=False)
                await store.sessions.save(session)
            except BaseException:
                # Nothing of this batch may stay behind, unsaved, for a later write to save.
                saved = session.acknowledged_head - (session.head_seq - len(session.messages))
                if saved <= before:
                    del session.messages[before:]
                raise

    async def pop_item(self) -> Any | None:
        """Remove and return the most recent item (None for an empty session). It is rewound
        (``sessions.rewind``): the item, and anything hidden after it, leave the live transcript for the
        archive under a rewind record, in one transaction, and the next item takes its place; a removed
        call still waiting for its output leaves with it, so no repair answers it. An item the backend
        does not hold yet (in a fallback file) is hidden instead: its sequence number joins the hidden ones
        in the session's metadata (a removed waiting call is then answered, hidden too, with an
        interrupted output)."""
        return await self._run("pop_item", self._pop_item)

    async def _pop_item(self) -> Any | None:
        async with self._writing() as (store, session):
            first = session.head_seq - len(session.messages)
            hidden = await _hidden(store, session)
            found = _last_visible(session, hidden)
            if found is None:
                return None
            seq, item = found
            if not session.is_dirty() and session.fallback_file is None and first <= seq:
                await self._rewind(store, session, seq, hidden, first)
                return copy.deepcopy(item)
            before = len(session.messages)
            now_hidden = hidden | {seq}
            for call in session.pending_calls():
                if call.index == seq:
                    answer = interrupted_answer(call)
                    if call.dialect is Dialect.ANTHROPIC:
                        answer = {"role": "user", "content": [answer]}
                    now_hidden.add(session.head_seq)
                    session.add_item(answer, strict=False)
            _set_hidden(session, now_hidden, first)
            try:
                await store.sessions.save(session)
            except BaseException:
                _set_hidden(session, hidden, first)
                saved = session.acknowledged_head - (session.head_seq - len(session.messages))
                if saved <= before:
                    del session.messages[before:]
                raise
            return copy.deepcopy(item)

    async def _rewind(
        self, store: Store, session: StoredSession, seq: int, hidden: set[int], first: int
    ) -> None:
        """Rewind the session to ``seq``, and forget the hidden seqs from there on (they are rewound too,
        and the seqs go to the next items) in the same transaction."""
        try:
            async with store.backend.atomic():
                await store.sessions.rewind(self.session_id, seq, reason=POPPED)
                if any(h >= seq for h in hidden):
                    _set_hidden(session, {h for h in hidden if h < seq}, first)
                    await store.sessions.save(session)
        except BaseException:
            # The cached session may have followed a rewind that rolled back: read it again next time.
            store.sessions.discard(self.session_id, session)
            raise

    async def clear_session(self) -> None:
        """Clear the session: its items move into statekeel's message archive (``statekeel ui`` and
        ``store.sessions.archived(key)`` still list them), in one transaction."""
        await self._run("clear_session", self._clear_session)

    async def _clear_session(self) -> None:
        async with self._writing() as (store, session):
            if session.saved_head > session.last_consolidated:
                await store.sessions.compress(self.session_id, session.saved_head, CLEARED)

    def __repr__(self) -> str:
        return f"StatekeelSession(session_id={self.session_id!r})"


def _normalized(item: Any, i: int, store: Store) -> dict[str, Any]:
    """An item as the dict statekeel stores, checked before anything is written."""
    try:
        message = normalize_item(item)
    except SerializationError as exc:
        raise UnserializableValue(f"items[{i}]: {exc.message}", index=i) from None
    except InvalidArgument as exc:
        raise InvalidConfig(f"items[{i}]: {exc.message}", index=i) from None
    try:
        store.codec.encode(message, where=f"items[{i}]")
    except SerializationError as exc:
        if type(exc) is not SerializationError:
            raise  # PayloadTooLarge and the like keep their own type
        raise UnserializableValue(exc.message, index=i) from None
    return message


async def _hidden(store: Store, session: StoredSession) -> set[int]:
    """The seqs pop_item hid, in the session's live transcript as it is now. They were stored with the
    rewind count they were taken under; a rewind since then (any caller's) took every seq from its
    ``to_seq`` on out of the live transcript, so a hidden seq there names a rewound item, and the item at
    that seq now is another one: it is no longer hidden."""
    value = session.metadata.get(HIDDEN_KEY)
    if isinstance(value, dict):
        taken, seqs = value.get("rewinds"), value.get("seqs")
    else:
        taken, seqs = 0, value
    if not isinstance(seqs, list) or type(taken) is not int:
        return set()
    hidden = {s for s in seqs if type(s) is int}
    if hidden and taken != session.rewinds:
        # The rewinds since ``taken`` are the records after the first ``taken`` ones (oldest first).
        later = (await store.sessions.rewinds(session.key))[taken:]
        if later:
            cut = min(r.to_seq for r in later)
            hidden = {s for s in hidden if s < cut}
    return hidden


def _set_hidden(session: StoredSession, hidden: set[int], first: int) -> None:
    kept = sorted(s for s in hidden if s >= first)
    if kept:
        session.metadata[HIDDEN_KEY] = {"rewinds": session.rewinds, "seqs": kept}
    else:
        session.metadata.pop(HIDDEN_KEY, None)


def _visible(session: StoredSession, limit: int | None, hidden: set[int]) -> list[dict[str, Any]]:
    """The live, acknowledged items (in the backend, or in the fallback file) minus the ``hidden`` ones;
    the latest ``limit`` of them. Items another task is adding (not written yet) are not read."""
    first = session.head_seq - len(session.messages)
    messages = session.messages[: session.acknowledged_head - first]
    if not hidden:
        return list(messages if limit is None else messages[-limit:])
    out: list[dict[str, Any]] = []
    for i in range(len(messages) - 1, -1, -1):
        if limit is not None and len(out) >= limit:
            break
        if first + i not in hidden:
            out.append(messages[i])
    out.reverse()
    return out


def _last_visible(session: StoredSession, hidden: set[int]) -> tuple[int, dict[str, Any]] | None:
    first = session.head_seq - len(session.messages)
    for i in range(len(session.messages) - 1, -1, -1):
        if first + i not in hidden:
            return first + i, session.messages[i]
    return None


# The SDK's span types as statekeel span kinds (others are "custom").
_KINDS = {
    "agent": "agent",
    "function": "tool",
    "mcp_tools": "tool",
    "generation": "generation",
    "response": "response",
    "handoff": "handoff",
    "guardrail": "guardrail",
    "custom": "custom",
    "task": "task",
    "turn": "step",
}


class StatekeelTracingProcessor(SinkOwner, TracingProcessor):
    """The Agents SDK's tracing processor writing into ``store.traces`` (the buffered tier):

        agents.add_trace_processor(StatekeelTracingProcessor(store))

    A trace becomes a root span (``span_id`` = the trace id, kind ``workflow``, named after the workflow,
    ``group_id`` and metadata as attributes); each SDK span is recorded when it starts (open) and again
    when it ends, with ``parent_span_id`` its parent span or, at the top, the trace's root. Kinds: agent,
    tool (function and MCP tool listing), generation, response, handoff, guardrail, task, step (a turn),
    custom; the SDK's span data (``span_data.export()``) and error are the attributes. ``status`` is
    ``error`` when the SDK set an error on the span, else ``ok``.

    Recording never waits and never raises into the agent: a span statekeel refuses is logged and
    counted in ``refused``. ``force_flush()`` waits for the spans to be committed when called from
    another thread than the store's event loop; ``await processor.flush()`` does on the loop.
    ``shutdown()`` flushes likewise and leaves the store open (the application closes it).
    """

    def __init__(self, store: Store) -> None:
        self._sink = SpanSink(store, "StatekeelTracingProcessor")
        self._traces: dict[str, dt.datetime] = {}
        self._lock = threading.Lock()

    def _trace_span(self, trace: SdkTrace, ended_at: dt.datetime | None) -> dict[str, Any]:
        exported = _export(trace)
        attributes = {k: v for k, v in exported.items() if k not in ("object", "id", "workflow_name")}
        with self._lock:
            if ended_at is None:
                started = self._traces.setdefault(trace.trace_id, dt.datetime.now(dt.UTC))
            else:
                started = self._traces.pop(trace.trace_id, ended_at)
        return {
            "span_id": trace.trace_id,
            "name": trace.name,
            "kind": "workflow",
            "status": "unset" if ended_at is None else "ok",
            "attributes": attributes,
            "started_at": started,
            "ended_at": ended_at,
        }

    def _record_trace(self, trace: SdkTrace, ended_at: dt.datetime | None) -> None:
        try:
            span = self._trace_span(trace, ended_at)
        except Exception as exc:  # the SDK's own export failed: nothing to record
            log.warning("trace %r could not be exported: %s", trace.trace_id, exc)
            return
        self._sink.record(trace.trace_id, span)

    def on_trace_start(self, trace: SdkTrace) -> None:
        self._sink.bind()
        self._record_trace(trace, None)

    def on_trace_end(self, trace: SdkTrace) -> None:
        self._record_trace(trace, dt.datetime.now(dt.UTC))

    def _span(self, span: SdkSpan[Any]) -> dict[str, Any]:
        data = span.span_data.export()
        sdk_type = span.span_data.type
        error = span.error
        attributes: dict[str, Any] = {k: v for k, v in data.items() if k != "name"}
        attributes["type"] = sdk_type
        if error is not None:
            attributes["error"] = error
        ended = utc_from_iso(span.ended_at)
        return {
            "span_id": span.span_id,
            "parent_span_id": span.parent_id or span.trace_id,
            "name": data.get("name") if isinstance(data.get("name"), str) and data.get("name") else sdk_type,
            "kind": _KINDS.get(sdk_type, "custom"),
            "status": "error" if error is not None else ("ok" if ended is not None else "unset"),
            "attributes": attributes,
            "started_at": utc_from_iso(span.started_at) or dt.datetime.now(dt.UTC),
            "ended_at": ended,
        }

    def _record_span(self, span: SdkSpan[Any]) -> None:
        try:
            record = self._span(span)
        except Exception as exc:
            log.warning("span %r could not be exported: %s", getattr(span, "span_id", None), exc)
            return
        self._sink.record(span.trace_id, record)

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        self._sink.bind()
        self._record_span(span)

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        self._record_span(span)

    async def flush(self) -> None:
        """Return once every span recorded so far is committed (on the store's event loop)."""
        await self.store.traces.flush()

    def force_flush(self) -> None:
        """Wait (up to 30 s) for the recorded spans to be committed, from another thread than the
        store's event loop; on that loop, return at once (they are committed within 100 ms)."""
        self._sink.flush(30.0)

    def shutdown(self) -> None:
        """Flush as :meth:`force_flush` does; the store stays open (its owner closes it)."""
        self._sink.flush(30.0)


def _export(trace: SdkTrace) -> dict[str, Any]:
    exported = trace.export()
    return dict(exported) if exported else {}


__all__ = ["CLEARED", "HIDDEN_KEY", "StatekeelSession", "StatekeelTracingProcessor"]
