"""``SessionManager``: loads, caches, locks and saves sessions through a backend.

- ``save`` writes only what changed since the last load or save, in one transaction, conditional on the
  head sequence (messages) and version (metadata, status) it started from: a concurrent writer gets
  ``ConflictError``, never an interleaved history nor a silently overwritten field. Each attempt's write
  id is stored in the row, so a save whose answer never came (cancelled, COMMIT answer lost) is recognised
  by the session's next save or load as its own, not another writer's.
- ``lock(key)`` is one holder per session (see :mod:`statekeel.sessions.lock`).
- When the backend is unavailable, ``save`` writes a fallback file and warns; ``load`` merges it back, and
  ``replay_fallback()`` moves it into the backend once it works again (see
  :mod:`statekeel.sessions.fallback`).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime as dt
import logging
import math
import os
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from ..backends.base import (
    SessionLease,
    SessionRecord,
    StorageBackend,
)
from ..codec import Codec
from ..errors import (
    ConflictError,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    StatekeelError,
)
from ..fallback import FallbackDir, ReplayReport
from ..holders import new_owner_id
from ..journal import StepFn
from ..validation import check_aware, check_bool, check_int, check_key, check_text
from .branches import SessionBranches
from .fallback import SessionFallback
from .heartbeat import Heartbeat
from .listing import SessionListing
from .lock import SessionLock
from .session import Session, Summary, book
from .tools import MISSING, ToolCalls, ToolRecovery
from .writes import SessionWrites

log = logging.getLogger("statekeel.sessions")

DEFAULT_CACHE_SIZE = 200
DEFAULT_EXPIRY_HOURS = 24.0
DEFAULT_ARCHIVE_HOURS = 24.0 * 30
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_LOCK_TIMEOUT = 60.0
_MAX_HOURS = 24.0 * 365 * 1000
_MAX_LEASE_SECONDS = 86400.0 * 365
# A load whose repair lost a race to another writer reads the session again, at most this many times.
_LOAD_TRIES = 3


# How long resolve_tool() by key waits for the session held by another holder.
_RESOLVE_LOCK_TIMEOUT = 5.0


class SessionManager(SessionListing, SessionBranches):
    """Loads, caches, locks and saves sessions through a backend.

    async with statekeel.open_store("sqlite:///agent.db") as store:
        async with store.sessions.open("user-42") as session:   # lock + load-or-create + save on exit
            session.add_message("user", "hello")
    """

    def __init__(
        self,
        backend: StorageBackend,
        codec: Codec,
        *,
        fallback_dir: str | os.PathLike[str] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        expiry_hours: float = DEFAULT_EXPIRY_HOURS,
        archive_hours: float = DEFAULT_ARCHIVE_HOURS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        check_int(cache_size, "cache_size", minimum=1)
        # Bounded so that date arithmetic cannot overflow later; NaN fails every comparison.
        # An infinite lock_timeout is "wait forever".
        for name, value, top in (
            ("expiry_hours", expiry_hours, _MAX_HOURS),
            ("archive_hours", archive_hours, _MAX_HOURS),
            ("lease_seconds", lease_seconds, _MAX_LEASE_SECONDS),
            ("lock_timeout", lock_timeout, math.inf),
        ):
            if type(value) not in (int, float) or not 0 < value <= top:
                raise InvalidArgument(f"{name} must be a positive number up to {top}, got {value!r}")
        self.backend = backend
        self.codec = codec
        self.cache_size = cache_size
        self.expiry_hours = float(expiry_hours)
        self.archive_hours = float(archive_hours)
        self.lease_seconds = float(lease_seconds)
        self.lock_timeout = float(lock_timeout)
        self.fallback = None if fallback_dir is None else FallbackDir(fallback_dir, codec)
        # Identifies this manager's leases; unique per process and instance.
        self.owner_id = new_owner_id()
        self._cache: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self._locks: weakref.WeakValueDictionary[str, SessionLock] = weakref.WeakValueDictionary()
        self._held: dict[str, SessionLock] = {}
        self._evicting = asyncio.Lock()
        self._fallback = SessionFallback(backend, self.fallback, lambda key: self._new(key, None))
        heartbeat = Heartbeat(backend, self.owner_id, lambda: self.lease_seconds)
        # Every write of a session goes through _writes, which reads the held leases and the cache.
        self._writes = SessionWrites(
            backend,
            codec,
            self._fallback,
            heartbeat,
            owner=self,
            held=self._held,
            cache=self._cache,
            lock=self.lock,
        )
        self._tools = ToolCalls(self._writes, heartbeat, self._held)

    # --- helpers --------------------------------------------------------------------------------------

    def _new(self, key: str, record: SessionRecord | None) -> Session:
        return Session(key, owner=self, codec=self.codec, record=record)

    def _lease_for(self, key: str) -> SessionLease | None:
        return self._writes.lease_for(key)

    # --- locks ----------------------------------------------------------------------------------------

    def lock(self, key: str) -> SessionLock:
        """The lock of session ``key``: ``async with sessions.lock(key): ...`` (see :class:`SessionLock`)."""
        check_key(key)
        lock = self._locks.get(key)
        if lock is None:
            lock = SessionLock(self, key, self._held)
            self._locks[key] = lock
        return lock

    @asynccontextmanager
    async def open(
        self, key: str, *, timeout: float | None = None, repair: bool = True
    ) -> AsyncIterator[Session]:
        """``async with sessions.open(key) as session:`` — lock, load or create, and save on exit.

        Tool calls that a process that is gone left without a result are answered first, as in
        :meth:`load`. The save on exit also runs when the block raises (then a failing save is logged and
        the block's exception propagates).
        """
        check_bool(repair, "repair")
        lock = self.lock(key)
        await lock.acquire(timeout)
        try:
            session = await self.get_or_create(key, repair=repair)
            try:
                yield session
            except GeneratorExit:
                raise  # the block was abandoned, not finished: nothing may be awaited any more
            except BaseException:
                try:
                    await self.save(session)
                except Exception as exc:
                    log.warning("saving session %r after its block failed did not work: %s", key, exc)
                raise
            await self.save(session)
        finally:
            await lock.release()

    # --- loading --------------------------------------------------------------------------------------

    async def _cached(self, key: str, include_archived: bool) -> tuple[Session | None, Session | None]:
        """The cached session brought up to date with the backend (one row read) and its fallback file,
        or None when it is not cached or was dropped because another writer changed it in a way it cannot
        follow; then also the dropped session when it held unsaved changes (the fresh session it gives way
        to takes its metadata and status edits: :meth:`SessionBook.carried_from`)."""
        cached = self._cache.get(key)
        b = None if cached is None else book(cached)
        if cached is None or b is None or (include_archived and not b.full):
            return None, None
        record = await self.backend.load_session(key)
        if record is None:
            current = not b.in_backend
        else:
            if b.unheard and not b.in_step_with(record):
                await self._writes.settled(cached, record)  # its own save landed, unheard
            current = b.in_step_with(record) and b.refreshed(record)
        if current:
            try:
                await self._fallback.merge(key, cached, record)
            except ConflictError:
                pass
            else:
                if self._cache.get(key) is cached:
                    self._cache.move_to_end(key)
                return cached, None
        self.discard(key, cached)
        if not cached.is_dirty():
            return None, None
        log.warning(
            "cached session %r has unsaved changes but another writer changed it in the backend; loading "
            "the stored version, which takes its metadata and status edits (its save raises ConflictError "
            "when the other writer changed the same one); its unsaved messages stay in the old object, "
            "whose save raises ConflictError",
            key,
        )
        return None, cached

    async def load(self, key: str, *, include_archived: bool = False, repair: bool = True) -> Session | None:
        """The session, or None if it does not exist. A failed read raises; it never looks empty.

        Reads the backend and this session's fallback file, if any — also for a cached session — and
        merges them (fallback messages that follow the backend's head are kept as unsaved). Only the live
        messages are read, plus the compression summaries; ``include_archived=True`` loads every message
        from seq 0.

        Tool calls left without a result by a process that is gone (it died, or its heartbeat expired;
        never a call of a live process) are answered with an explicit interrupted result in their own
        transcript format, saved once, and listed in ``session.repaired`` (and logged). Calls whose
        function was started through :meth:`run_tool` are in doubt instead: left for ``run_tool`` (which
        re-runs an idempotent one) or :meth:`resolve_tool`. ``repair=False`` hands the session out as
        stored.
        """
        check_key(key)
        check_bool(repair, "repair")
        for _ in range(_LOAD_TRIES):
            session = await self._load(key, include_archived)
            if session is None or await self._tools.settle(session, repair):
                return session
            self.discard(key, session)  # another writer came first: read what it wrote
        return session

    async def _load(self, key: str, include_archived: bool) -> Session | None:
        cached, dropped = await self._cached(key, include_archived)
        if cached is not None and (book(cached).in_backend or cached.is_dirty()):
            return cached
        session = await self._load_fresh(key, include_archived)
        if session is not None:
            if dropped is not None:
                book(session).carried_from(dropped)
            await self._remember(session)
        return session

    async def get_or_create(
        self, key: str, *, repair: bool = True, metadata: dict[str, Any] | None = None
    ) -> Session:
        """Load the session (repairing it as :meth:`load` does), or start a new one in memory (created in
        the store by the first save).

        ``metadata`` is a new session's first metadata (an existing session keeps its own, as
        ``dict.setdefault`` keeps a value), e.g. the subject :meth:`Store.erase` finds it by::

            session = await store.sessions.get_or_create("chat-42", metadata={"subject": "user-7"})
        """
        check_key(key)
        check_bool(repair, "repair")
        if metadata is not None:
            if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
                raise InvalidArgument(f"metadata must be a dict with str keys, got {metadata!r}")
            self.codec.encode(metadata, where="metadata")  # SerializationError before anything else
        for _ in range(_LOAD_TRIES):
            session = await self._get_or_create(key, metadata)
            if await self._tools.settle(session, repair):
                return session
            self.discard(key, session)  # another writer came first: read what it wrote
        return session

    async def _get_or_create(self, key: str, metadata: dict[str, Any] | None = None) -> Session:
        cached, dropped = await self._cached(key, False)
        if cached is not None:
            return cached
        session = await self._load_fresh(key, False)
        if session is None:
            session = self._new(key, None)
            if metadata:
                session.metadata.update(copy.deepcopy(metadata))
        elif dropped is not None:
            book(session).carried_from(dropped)
        await self._remember(session)
        return session

    async def _load_fresh(self, key: str, include_archived: bool, *, settle: bool = True) -> Session | None:
        found = await self.backend.load_session_payloads(key, include_archived=include_archived)
        if found is None:
            return await self._fallback.merge(key, None, None, settle=settle)
        session = self._new(key, found.record)
        book(session).loaded(found.messages, [Summary(*s) for s in found.summaries], full=include_archived)
        return await self._fallback.merge(key, session, found.record, settle=settle)

    async def _peek(self, key: str) -> Session | None:
        """The session as a load would return it (backend and fallback file merged), for reading only:
        nothing is written — no repair, no file deleted or quarantined, and, since it does not join the
        cache, no eviction (which saves what it evicts)."""
        return await self._load_fresh(key, False, settle=False)

    # --- cache ----------------------------------------------------------------------------------------

    async def _remember(self, session: Session) -> None:
        self._cache[session.key] = session
        self._cache.move_to_end(session.key)
        if len(self._cache) > self.cache_size:
            await self._evict(session.key)

    async def _evict(self, newest: str) -> None:
        async with self._evicting:
            for key in list(self._cache):
                if len(self._cache) <= self.cache_size:
                    return
                session = self._cache.get(key)
                if session is None or key in self._held or key == newest:
                    continue  # a held session is never evicted, nor the one just handed out
                if session.is_dirty():
                    try:
                        await self._writes.save(session)
                    except StatekeelError as exc:
                        log.warning(
                            "could not save session %r before evicting it; it stays cached: %s", key, exc
                        )
                        continue
                if self._cache.get(key) is session:
                    del self._cache[key]

    def discard(self, key: str, session: Session) -> None:
        """Drop ``session`` from this manager's cache, unless another load has put a newer one there.

        For a caller whose own transaction around a save rolled back (an adapter's ``atomic()`` block):
        the object may hold changes the backend never got, and the next ``open(key)`` must read the
        backend instead of reusing it. Nothing is written or deleted in the store.

            try:
                async with store.backend.atomic():
                    await store.sessions.save(session)
            except BaseException:
                store.sessions.discard(session.key, session)
                raise
        """
        if self._cache.get(key) is session:
            del self._cache[key]

    def evict(self, key: str) -> None:
        """Drop ``key``'s session from this manager's cache and replay list (it was erased from the store:
        ``store.erase``); the next load reads the backend."""
        self._cache.pop(key, None)
        self._fallback.pending.discard(key)

    def cached(self, key: str) -> Session | None:
        """The cached session of ``key`` without touching the backend or the LRU order (for inspection)."""
        return self._cache.get(key)

    # --- saving ---------------------------------------------------------------------------------------

    async def save(self, session: Session) -> None:
        """Write the new messages and changed metadata/status in one transaction, conditional on what the
        session was loaded at: the head sequence for messages, the version for metadata and status.

        ``ConflictError`` if another writer changed it first (or saved it first to its fallback file);
        ``LeaseLost`` if this process held the session's lock and its lease was taken over. When the
        backend is unavailable the session is written to its fallback file and a warning is logged;
        raises only if both fail. Inside an ``atomic()`` block the save is part of the block's
        transaction: undone in the session if the block rolls back, and never written to a fallback file.

        A save whose outcome the session never heard (the call was cancelled, or the COMMIT's answer was
        lost) is recognised by the next save or load, from the write id stored with the row: settled as
        saved, never written twice nor taken for another writer's. ``BackendUnavailable`` once the store
        is closed, with nothing written. A session whose save raised ``ConflictError`` leaves the cache:
        the next load reads the stored version.
        """
        try:
            await self._writes.save(session)
        except ConflictError:
            self.discard(session.key, session)
            raise

    def _remove_file_later(self, files: FallbackDir, key: str) -> None:
        self._fallback.spawn(asyncio.to_thread(files.delete, key), f"statekeel-delete-{key}")

    def _after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` now, or, inside an ``atomic()`` block, once the outermost block committed."""

        def ended(committed: bool) -> None:
            if committed:
                action()

        if not self.backend.on_block_end(ended):
            action()

    # --- tool calls -----------------------------------------------------------------------------------

    async def run_tool(self, session: Session, call_id: str, fn: StepFn, *, idempotent: bool = False) -> Any:
        """Run the tool call ``call_id`` of ``session`` once, journaled, and append its result.

        The call must be one the session's transcript made (OpenAI chat ``tool_calls``, an OpenAI
        Responses call item, an Anthropic ``tool_use`` block) that has no result yet. In one transaction the
        session's unsaved messages (the assistant message with the call) and the call's *started* record
        are saved; ``fn`` (a callable, sync or async, or an awaitable) runs; then, in one transaction, its
        result message is appended in the call's own format and the record settled. Returns what ``fn``
        returned. A str (or a list of content parts) is the result's content; a message or item that
        answers this call is appended as it is; any other value as its JSON text.

        After a crash between the two, the call is in doubt: ``fn`` runs again if ``idempotent``;
        otherwise ``StepInDoubt`` (fields ``session_key``, ``call_id``, ``record``) until
        :meth:`resolve_tool` settles it. If ``fn`` raises, the failure is recorded, the exception
        propagates and the call keeps waiting (run it again, or answer it). Refused before anything is
        written or run: an empty or unknown ``call_id`` (``InvalidKey``, ``UnknownToolCall``), a call that
        already has its result (``ToolCallAlreadyAnswered``), one running elsewhere (``ConflictError``).
        A sync ``fn`` runs on the event loop's thread; pass an async function for long blocking work.

            for call in session.pending_calls():
                await store.sessions.run_tool(session, call.call_id, lambda: run_tests(), idempotent=True)
        """
        return await self._tools.run(session, call_id, fn, idempotent)

    async def resolve_tool(
        self,
        session: Session | str,
        call_id: str,
        *,
        result: Any = MISSING,
        interrupted: bool = False,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Answer a waiting tool call yourself — typically one in doubt after a crash — with ``result``
        (as :meth:`run_tool` would append what ``fn`` returned) or, with ``interrupted=True``, an
        explicit interrupted answer; its journal record is settled in the same transaction. Returns the
        message appended. A call whose turn other messages followed is answered after them (out of place;
        ``history()`` leaves both out). ``ConflictError`` while the call's function is running in a live
        process; ``InvalidArgument`` for a call that is not waiting for its result.

        ``session`` is an open session or a session's key: by key, the session is opened for the call
        (its lock taken, no other repair made; ``NotFound`` when it does not exist, ``LockTimeout`` while
        a live agent holds it). With an ``actor`` a ``tool_call.resolved`` audit entry naming the actor
        (the call id and how it was answered, never the result) commits with the answer.

            await store.sessions.resolve_tool(session, "call_1", interrupted=True)
            await store.sessions.resolve_tool("chat-42", "call_1", result="done", actor="alice")
        """
        if actor is not None:
            check_key(actor, "actor")
        if isinstance(session, str):
            check_key(session)
            if await self.backend.load_session(session) is None:
                raise NotFound(f"session {session!r} does not exist", key=session)
            async with self.open(session, repair=False, timeout=_RESOLVE_LOCK_TIMEOUT) as opened:
                return await self._tools.resolve(opened, call_id, result, interrupted, actor)
        return await self._tools.resolve(session, call_id, result, interrupted, actor)

    async def recover_tool_calls(self, repair: bool) -> ToolRecovery:
        """The sessions with tool calls left waiting by a process that died (``store.recover()`` calls it).

        With ``repair``, a call whose holder is gone and whose result never came is answered as
        interrupted, so the transcript is valid for the next model call; without it, they are only
        reported. Returns the counts and the calls still in doubt (see :mod:`statekeel.sessions.tools`).
        """
        return await self._tools.recover(repair, self.open, self._peek)

    # --- fallback replay ------------------------------------------------------------------------------

    async def replay_fallback(self) -> ReplayReport:
        """Write every fallback file's content into the backend; delete each file after its commit.

        Each replay appends exactly the file's messages, conditional on the backend head the file
        follows. A file whose messages the backend already has is deleted; one that conflicts with
        another writer, or cannot be read, is quarantined (renamed aside) and reported; one whose session
        is held (in this process or another one) is left to its holder's next save and reported as
        skipped. Files are independent: one failure never stops the others.
        """
        return await self._writes.replay()

    # --- lifecycle ------------------------------------------------------------------------------------

    async def _set_status(self, key: str, allowed_from: tuple[str, ...], to: str) -> SessionRecord:
        check_key(key)
        record = await self.backend.load_session(key)
        if record is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        if record.status == to:
            return record
        if record.status not in allowed_from:
            raise InvalidTransition(
                f"session {key!r} is {record.status}; it can become {to} only from "
                f"{' or '.join(allowed_from)}",
                key=key,
                status=record.status,
            )
        updated = await self.backend.update_session(
            key, expected_version=record.version, status=to, lease=self._lease_for(key)
        )

        def follow() -> None:
            cached = self._cache.get(key)
            if cached is not None:
                book(cached).status_set(record, updated)

        self._after_commit(follow)
        return updated

    async def expire(self, key: str) -> SessionRecord:
        """Mark an active session expired (``InvalidTransition`` from another status)."""
        return await self._set_status(key, ("active",), "expired")

    async def archive(self, key: str) -> SessionRecord:
        """Mark an active or expired session archived."""
        return await self._set_status(key, ("active", "expired"), "archived")

    async def reopen(self, key: str) -> SessionRecord:
        """Make an expired or archived session active again."""
        return await self._set_status(key, ("expired", "archived"), "active")

    async def delete(self, key: str) -> bool:
        """Delete the session, its messages, archive and fallback file. False if it did not exist."""
        check_key(key)
        existed = await self.backend.delete_session(key, lease=self._lease_for(key))
        self._cache.pop(key, None)
        self._fallback.pending.discard(key)
        files = self.fallback
        if files is None or not files.exists(key):
            return existed
        if self.backend.in_atomic():
            # The file is the only copy of its messages until the deletion commits.
            self._after_commit(lambda: self._remove_file_later(files, key))
            return True
        return await asyncio.to_thread(files.delete, key) or existed

    async def cleanup_expired(
        self,
        now: dt.datetime | None = None,
        *,
        expiry_hours: float | None = None,
        archive_hours: float | None = None,
    ) -> int:
        """Active sessions idle past ``expiry_hours`` become expired; expired ones idle past
        ``archive_hours`` become archived (idle = since ``updated_at``). Returns the number of changes."""
        if now is None:
            now = dt.datetime.now(dt.UTC)
        else:
            check_aware(now, "now")
        expiry = self.expiry_hours if expiry_hours is None else expiry_hours
        archive = self.archive_hours if archive_hours is None else archive_hours
        cutoffs = []
        for name, value in (("expiry_hours", expiry), ("archive_hours", archive)):
            if type(value) not in (int, float) or not 0 <= value < math.inf:
                raise InvalidArgument(f"{name} must be a non-negative finite number, got {value!r}")
            try:
                cutoffs.append(now - dt.timedelta(hours=value))
            except OverflowError:
                raise InvalidArgument(
                    f"{name}={value!r} reaches before year 1 from {now.isoformat()}; use a smaller value"
                ) from None
        expired = await self.backend.transition_idle_sessions("active", "expired", cutoffs[0])
        archived = await self.backend.transition_idle_sessions("expired", "archived", cutoffs[1])
        return expired + archived

    # --- compression ----------------------------------------------------------------------------------

    async def compress(self, key: str, upto_seq: int, summary: str) -> str:
        """Move messages ``[last_consolidated, upto_seq)`` into the message archive, replaced by
        ``summary``, and advance ``last_consolidated`` — in one transaction. Returns the compression id."""
        check_key(key)
        check_int(upto_seq, "upto_seq", minimum=0)
        # Same text on every backend: PostgreSQL refuses NUL, SQLite would keep it (and copy_store fail).
        check_text(summary, "summary", allow_empty=True)
        record = await self.backend.load_session(key)
        if record is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        if not record.last_consolidated < upto_seq <= record.head_seq:
            raise InvalidArgument(
                f"upto_seq {upto_seq} must be after last_consolidated {record.last_consolidated} and at most "
                f"the saved head {record.head_seq} of session {key!r}",
                key=key,
                upto_seq=upto_seq,
            )
        compression_id = uuid.uuid4().hex
        updated = await self.backend.archive_messages(
            key,
            compression_id=compression_id,
            upto_seq=upto_seq,
            summary=summary,
            expected_consolidated=record.last_consolidated,
            lease=self._lease_for(key),
            expected_created_at=record.created_at,  # the session checked above, not one created again
        )
        done = Summary(compression_id, record.last_consolidated, upto_seq, summary)

        def follow() -> None:
            cached = self._cache.get(key)
            if cached is not None:
                book(cached).compressed(done, record, updated)

        self._after_commit(follow)
        return compression_id

    # --- shutdown -------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop background work (fallback replay, lease renewal, the heartbeat). Held leases expire by
        themselves; tool calls this manager left waiting may be answered by the next load. Saves raise
        ``BackendUnavailable`` from now on."""
        self._writes.closed = True
        tasks = list(self._fallback.tasks)
        for task in tasks:
            task.cancel()
        for lock in list(self._held.values()):
            renewer = lock.stop_renewal()  # also when the cancellation is lost (see stop_renewal)
            if renewer is not None:
                tasks.append(renewer)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._tools.close()


__all__ = ["SessionManager"]
