"""Sessions: what an agent said and heard, append-only, resumable after a crash.

async with statekeel.open_store("sqlite:///agent.db") as store:
    async with store.sessions.open("user-42") as session:   # lock + load-or-create + save on exit
        session.add_message("user", "hello")

- ``save`` writes only what changed since the last load or save, in one transaction, conditional on the
  head sequence it started from: a concurrent writer gets ``ConflictError``, never an interleaved history.
- ``lock(key)`` is one holder per session: a reference-counted asyncio lock in the process, and a lease
  row in the backend across processes and machines (fencing token; writes of a holder whose lease was
  taken over raise ``LeaseLost``).
- When the backend is unavailable, ``save`` writes a fallback file (``statekeel.fallback``) and warns;
  ``load`` merges it back, and ``replay_fallback()`` moves it into the backend once it works again.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import datetime as dt
import logging
import math
import os
import uuid
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from .backends.base import (
    SESSION_STATUSES,
    ArchivedMessage,
    NewMessage,
    Page,
    SessionLease,
    SessionRecord,
    StorageBackend,
)
from .codec import Codec
from .errors import (
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    InvalidTransition,
    LeaseLost,
    NotFound,
    StatekeelError,
)
from .fallback import FallbackCorrupt, FallbackDir, FallbackSnapshot, ReplayReport
from .holders import holder_is_dead, new_owner_id
from .validation import check_int, check_key, check_str, check_text

log = logging.getLogger("statekeel.sessions")

DEFAULT_CACHE_SIZE = 200
DEFAULT_EXPIRY_HOURS = 24.0
DEFAULT_ARCHIVE_HOURS = 24.0 * 30
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_LOCK_TIMEOUT = 60.0
MAX_LIST_LIMIT = 1000
_MAX_HOURS = 24.0 * 365 * 1000
_MAX_LEASE_SECONDS = 86400.0 * 365
# Waiting for a lease held elsewhere: poll from 5 ms, doubling up to 250 ms (never past its expiry).
_POLL_FIRST = 0.005
_POLL_MAX = 0.25


@dataclass(frozen=True, slots=True)
class Summary:
    """What one compression replaced: messages ``[first_seq, upto_seq)`` now in the archive."""

    compression_id: str
    first_seq: int
    upto_seq: int
    summary: str


def _check_message(message: Any, seq: int) -> None:
    if type(message) is not dict:
        raise InvalidArgument(
            f"messages[{seq}] must be a dict, got {type(message).__name__}; use session.add_message()",
            seq=seq,
        )
    role = message.get("role")
    if type(role) is not str or not role:
        raise InvalidArgument(f"messages[{seq}] role must be a non-empty str, got {role!r}", seq=seq)


class Session:
    """A session in memory: its live messages plus what the store knows of it.

    ``messages`` holds the messages from ``last_consolidated`` on (or from seq 0 when loaded with
    ``include_archived=True``), in sequence order; ``summaries`` the compressions before them. Append with
    :meth:`add_message` and persist with ``SessionManager.save``; ``metadata`` and ``status`` may be
    changed in place and are saved when they differ from the stored ones.
    """

    __slots__ = (
        "_codec",
        "_fallback",
        "_first",
        "_full",
        "_head",
        "_in_backend",
        "_metadata_raw",
        "_owner",
        "_saved_last",
        "_saved_status",
        "_version",
        "created_at",
        "key",
        "last_consolidated",
        "messages",
        "metadata",
        "status",
        "summaries",
        "updated_at",
    )

    def __init__(self, key: str, *, owner: object, codec: Codec, record: SessionRecord | None = None) -> None:
        self.key = key
        self._owner = owner
        self._codec = codec
        self.messages: list[dict[str, Any]] = []
        self.summaries: list[Summary] = []
        self._fallback = False  # unsaved content also sits in a fallback file
        self._full = False
        # The last saved message object: if it is no longer at its place, the list was cut and regrown.
        self._saved_last: dict[str, Any] | None = None
        if record is None:
            now = dt.datetime.now(dt.UTC)
            self.metadata: dict[str, Any] = {}
            self.status = "active"
            self.last_consolidated = 0
            self.created_at = self.updated_at = now
            self._first = 0
            self._head = 0
            self._version = 0
            self._in_backend = False
            self._metadata_raw: bytes | None = None
            self._saved_status = "active"
        else:
            self.metadata = record.metadata
            self.status = record.status
            self.last_consolidated = record.last_consolidated
            self.created_at = record.created_at
            self.updated_at = record.updated_at
            self._first = record.last_consolidated
            self._head = record.head_seq
            self._version = record.version
            self._in_backend = True
            self._metadata_raw = codec.encode(record.metadata, where="metadata")
            self._saved_status = record.status

    @property
    def head_seq(self) -> int:
        """The sequence number the next added message will get."""
        return self._first + len(self.messages)

    @property
    def saved_head(self) -> int:
        """The head sequence the backend held when this session was last loaded or saved."""
        return self._head

    def add_message(self, role: str, content: Any, **fields: Any) -> dict[str, Any]:
        """Append a message in memory; raises a typed error (and adds nothing) if it cannot be stored."""
        check_str(role, "role")
        message: dict[str, Any] = {"role": role, "content": content, **fields}
        self._codec.encode(message, where=f"messages[{self.head_seq}]")
        self.messages.append(message)
        return message

    def _mark_saved(self) -> None:
        saved = self._head - self._first
        self._saved_last = self.messages[saved - 1] if 0 < saved <= len(self.messages) else None

    def _check_append_only(self) -> None:
        """Refuse a message list whose saved part was removed or replaced: ``unsaved()`` would be wrong."""
        saved = self._head - self._first
        if saved <= 0:
            return
        last = self._saved_last
        if len(self.messages) < saved or (
            last is not None and self.messages[saved - 1] is not last and self.messages[saved - 1] != last
        ):
            raise InvalidArgument(
                f"session {self.key!r}: messages already saved (up to seq {self._head - 1}) were removed or "
                "replaced; history is append-only. Add messages with add_message() and use "
                "history(max_messages) for a shorter context",
                key=self.key,
            )

    def unsaved(self) -> list[dict[str, Any]]:
        """Messages the backend does not have yet (added since the last load or save)."""
        return self.messages[self._head - self._first :]

    def is_dirty(self) -> bool:
        """Whether saving would write anything (messages, metadata or status)."""
        if self.unsaved() or self.status != self._saved_status:
            return True
        if self._metadata_raw is None:
            return bool(self.metadata)
        return self._codec.encode(self.metadata, where="metadata") != self._metadata_raw

    def history(self, max_messages: int = 500) -> list[dict[str, Any]]:
        """The last ``max_messages`` messages, made safe to send to an LLM.

        Starts at the first user message in that range when there is one; otherwise drops leading tool
        results, which would be orphaned (their assistant tool call fell outside the range).
        """
        check_int(max_messages, "max_messages", minimum=1)
        window = self.messages[-max_messages:]
        for i, message in enumerate(window):
            if message.get("role") == "user":
                return window[i:]
        start = 0
        while start < len(window) and window[start].get("role") == "tool":
            start += 1
        return window[start:]

    def __repr__(self) -> str:
        return (
            f"Session(key={self.key!r}, messages={len(self.messages)}, head_seq={self.head_seq}, "
            f"status={self.status!r})"
        )


class SessionLock:
    """The lock of one session key: one holder at a time, in this process and across processes.

    ``sessions.lock(key)`` returns the same object for a key for as long as anyone holds it or waits for
    it (then it is dropped, so the table never grows without bound). Re-entrant within one task.
    Across processes the holder also holds the session's lease in the backend, renewed in the background;
    saves made while it is held are fenced by the lease's token.
    """

    def __init__(self, manager: SessionManager, key: str) -> None:
        self.key = key
        self._manager = manager
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None
        self._depth = 0
        self.lease: SessionLease | None = None
        self.lost = False
        self._renewer: asyncio.Task[None] | None = None

    def locked(self) -> bool:
        """Whether some task of this process holds it."""
        return self._lock.locked()

    async def acquire(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds, default ``SessionManager.lock_timeout``) for the session.

        Raises ``ConflictError`` when another holder keeps it past the timeout, ``BackendUnavailable``
        when the backend cannot record the lease.
        """
        task = asyncio.current_task()
        if task is not None and self._holder is task:
            self._depth += 1
            return
        manager = self._manager
        wait = manager.lock_timeout if timeout is None else timeout
        if type(wait) not in (int, float) or not wait >= 0:  # also refuses NaN
            raise InvalidArgument(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            async with asyncio.timeout(wait):
                await self._lock.acquire()
        except TimeoutError:
            raise ConflictError(
                f"session {self.key!r} is locked by another task of this process; waited {wait}s",
                key=self.key,
            ) from None
        self._holder = task
        self._depth = 1
        manager._held[self.key] = self
        try:
            self.lease = await manager._acquire_lease(self.key, deadline)
        except BaseException:
            self._unhold()
            raise
        self.lost = False
        self._renewer = asyncio.create_task(self._renew_loop(self.lease), name=f"statekeel-lease-{self.key}")

    def _unhold(self) -> None:
        self._holder = None
        self._depth = 0
        if self._manager._held.get(self.key) is self:
            del self._manager._held[self.key]
        self._lock.release()

    async def release(self) -> None:
        """Release the session (the lease first, then the in-process lock)."""
        if not self._lock.locked():
            raise InvalidArgument(f"the lock of session {self.key!r} is not held")
        task = asyncio.current_task()
        if self._holder is not None and task is not self._holder:
            raise InvalidArgument(f"the lock of session {self.key!r} is held by another task")
        self._depth -= 1
        if self._depth > 0:
            return
        renewer, self._renewer = self._renewer, None
        lease, self.lease = self.lease, None
        try:
            if renewer is not None:
                renewer.cancel()
                await asyncio.gather(renewer, return_exceptions=True)
            if lease is not None and not self.lost:
                try:
                    await self._manager.backend.release_session_lease(lease)
                except StatekeelError as exc:
                    # Not fatal: the lease expires by itself; the next holder waits until then.
                    log.warning(
                        "could not release the lease of session %r (%s); it will expire", self.key, exc
                    )
        finally:
            self._unhold()

    async def _renew_loop(self, lease: SessionLease) -> None:
        manager = self._manager
        ttl = manager.lease_seconds
        interval = ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                lease = await manager.backend.renew_session_lease(lease, ttl)
                self.lease = lease
                interval = ttl / 3
            except LeaseLost as exc:
                self.lost = True
                log.warning("lease of session %r lost while held: %s", self.key, exc)
                return
            except StatekeelError as exc:
                # Retry sooner: the lease is still ours until it expires.
                interval = max(ttl / 10, 0.05)
                log.warning("could not renew the lease of session %r: %s", self.key, exc)

    async def __aenter__(self) -> SessionLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"SessionLock(key={self.key!r}, locked={self.locked()})"


class SessionManager:
    """Loads, caches, locks and saves sessions through a backend. See DESIGN.md, Sessions."""

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
        self._replaying = asyncio.Lock()
        self._pending_fallback: set[str] = set()  # keys this manager wrote fallback files for
        self._quarantined: dict[str, str] = {}  # reported by the next replay_fallback()
        self._background: set[asyncio.Task[Any]] = set()

    # --- helpers --------------------------------------------------------------------------------------

    def _new(self, key: str, record: SessionRecord | None) -> Session:
        return Session(key, owner=self, codec=self.codec, record=record)

    def _lease_for(self, key: str) -> SessionLease | None:
        held = self._held.get(key)
        return None if held is None else held.lease

    def _check_owned(self, session: Any) -> Session:
        if not isinstance(session, Session) or session._owner is not self:
            raise InvalidArgument(
                "this Session was not loaded from this store; load it from this store first"
            )
        return session

    # --- locks ----------------------------------------------------------------------------------------

    def lock(self, key: str) -> SessionLock:
        """The lock of session ``key``: ``async with sessions.lock(key): ...`` (see :class:`SessionLock`)."""
        check_key(key)
        lock = self._locks.get(key)
        if lock is None:
            lock = SessionLock(self, key)
            self._locks[key] = lock
        return lock

    async def _acquire_lease(self, key: str, deadline: float) -> SessionLease:
        loop = asyncio.get_running_loop()
        delay = _POLL_FIRST
        while True:
            lease = await self.backend.acquire_session_lease(key, self.owner_id, self.lease_seconds)
            if lease.acquired:
                return lease
            if holder_is_dead(lease.owner):
                # Its process is gone (a crash on this host): take over now rather than at expiry.
                taken = await self.backend.acquire_session_lease(
                    key, self.owner_id, self.lease_seconds, take_over=lease
                )
                if taken.acquired:
                    log.info("session %r: took over the lease of %s, whose process is gone", key, lease.owner)
                    return taken
                lease = taken
            left = deadline - loop.time()
            if left <= 0:
                raise ConflictError(
                    f"session {key!r} is locked by {lease.owner} (lease until "
                    f"{lease.expires_at.isoformat()}); gave up waiting",
                    key=key,
                    holder=lease.owner,
                    expires_at=lease.expires_at,
                )
            until_expiry = (lease.expires_at - dt.datetime.now(dt.UTC)).total_seconds()
            await asyncio.sleep(max(0.001, min(delay, left, until_expiry)))
            delay = min(delay * 2, _POLL_MAX)

    @asynccontextmanager
    async def open(self, key: str, *, timeout: float | None = None) -> AsyncIterator[Session]:
        """``async with sessions.open(key) as session:`` — lock, load or create, and save on exit.

        The save on exit also runs when the block raises (then a failing save is logged and the block's
        exception propagates).
        """
        lock = self.lock(key)
        await lock.acquire(timeout)
        try:
            session = await self.get_or_create(key)
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

    async def _cached_valid(self, key: str, include_archived: bool) -> Session | None:
        """The cached session if the backend still agrees with it (one row read), else None."""
        cached = self._cache.get(key)
        if cached is None or (include_archived and not cached._full):
            return None
        record = await self.backend.load_session(key)
        if record is None:
            if not cached._in_backend:
                self._cache.move_to_end(key)
                return cached
        elif (
            cached._in_backend
            and record.head_seq == cached._head
            and record.last_consolidated == cached.last_consolidated
            and record.created_at == cached.created_at  # not deleted and created again
        ):
            if record.version != cached._version:
                # Someone changed status or metadata only: take theirs unless changed here too.
                if cached.status == cached._saved_status:
                    cached.status = record.status
                cached._saved_status = record.status
                raw = self.codec.encode(record.metadata, where="metadata")
                if self.codec.encode(cached.metadata, where="metadata") == cached._metadata_raw:
                    cached.metadata = record.metadata
                cached._metadata_raw = raw
                cached._version = record.version
                cached.updated_at = record.updated_at
            self._cache.move_to_end(key)
            return cached
        if cached.is_dirty():
            log.warning(
                "cached session %r has unsaved changes but another writer changed it in the backend; "
                "loading the stored version (saving the old object will raise ConflictError)",
                key,
            )
        del self._cache[key]
        return None

    async def load(self, key: str, *, include_archived: bool = False) -> Session | None:
        """The session, or None if it does not exist. A failed read raises; it never looks empty.

        Reads the backend and this session's fallback file, if any, and takes the newer (fallback
        messages that follow the backend's head are kept as unsaved). Only the live messages are read,
        plus the compression summaries; ``include_archived=True`` loads every message from seq 0.
        """
        check_key(key)
        cached = await self._cached_valid(key, include_archived)
        if cached is not None and (cached._in_backend or cached.is_dirty()):
            return cached
        session = await self._load_fresh(key, include_archived)
        if session is not None:
            await self._remember(session)
        return session

    async def get_or_create(self, key: str) -> Session:
        """Load the session, or start a new one in memory (created in the store by the first save)."""
        check_key(key)
        cached = await self._cached_valid(key, False)
        if cached is not None:
            return cached
        session = await self._load_fresh(key, False)
        if session is None:
            session = self._new(key, None)
        await self._remember(session)
        return session

    async def _load_fresh(self, key: str, include_archived: bool) -> Session | None:
        found = await self.backend.load_session_payloads(key, include_archived=include_archived)
        snap = await self._read_fallback(key)
        session: Session | None = None
        if found is not None:
            session = self._from_backend(key, found.record, found.messages, include_archived)
            session.summaries = [Summary(*s) for s in found.summaries]
        if snap is None:
            return session
        if session is None:
            if snap.in_backend:
                await self._quarantine_key(
                    key, "the session was deleted from the backend after this file was written"
                )
                return None
            session = self._new(key, None)
            session.metadata = snap.metadata
            session.status = snap.status
            session.created_at = snap.created_at
            session.updated_at = snap.updated_at
            session.messages = list(snap.messages)
            session._fallback = True
            return session
        if snap.in_backend and snap.created_at != session.created_at:
            await self._quarantine_key(
                key,
                "the session was deleted and created again in the backend after this file was written; "
                "its messages were kept in the quarantined file",
            )
            return session
        if session._head == snap.base_head:
            # The fallback continues the backend: its messages are unsaved, written by the next save.
            session.messages.extend(snap.messages)
            if snap.metadata_changed:
                session.metadata = snap.metadata
            if snap.status_changed:
                session.status = snap.status
            session._fallback = True
            return session
        if session._head >= snap.head and await self._backend_has(snap):
            # Replayed already, but the process died before deleting the file.
            assert self.fallback is not None
            await asyncio.to_thread(self.fallback.delete, key)
            return session
        await self._quarantine_key(
            key,
            f"it follows head {snap.base_head} but the backend moved to {session._head} through another "
            "writer; its messages were kept in the quarantined file",
        )
        return session

    def _from_backend(
        self, key: str, record: SessionRecord, messages: builtins.list[dict[str, Any]], full: bool
    ) -> Session:
        session = self._new(key, record)
        session.messages = messages
        if full:
            session._first = 0
            session._full = True
        session._mark_saved()
        return session

    async def _read_fallback(self, key: str) -> FallbackSnapshot | None:
        fallback = self.fallback
        if fallback is None or not fallback.exists(key):
            return None
        try:
            return await asyncio.to_thread(fallback.read, key)
        except FallbackCorrupt as exc:
            await self._quarantine_key(key, str(exc))
            return None

    async def _quarantine_key(self, key: str, reason: str) -> None:
        assert self.fallback is not None
        path = self.fallback.file_for(key)
        try:
            target = await asyncio.to_thread(self.fallback.quarantine, path, reason)
        except FileNotFoundError:
            return
        self._quarantined[target] = reason
        self._pending_fallback.discard(key)

    async def _backend_has(self, snap: FallbackSnapshot) -> bool:
        """Whether the backend holds exactly the snapshot's messages at their sequence numbers."""
        record = await self.backend.load_session(snap.key)
        if record is None or record.head_seq < snap.head:
            return False
        stored: dict[int, Any] = {}
        if snap.base_head < record.last_consolidated:
            for a in await self.backend.read_archive(snap.key):
                if snap.base_head <= a.seq < snap.head:
                    stored[a.seq] = a.payload
        start = max(snap.base_head, record.last_consolidated)
        for r in await self.backend.read_messages(snap.key, start=start, end=snap.head):
            stored[r.seq] = r.payload
        return [stored.get(snap.base_head + i) for i in range(len(snap.messages))] == snap.messages

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
                        await self.save(session)
                    except StatekeelError as exc:
                        log.warning(
                            "could not save session %r before evicting it; it stays cached: %s", key, exc
                        )
                        continue
                if self._cache.get(key) is session:
                    del self._cache[key]

    def cached(self, key: str) -> Session | None:
        """The cached session of ``key`` without touching the backend or the LRU order (for inspection)."""
        return self._cache.get(key)

    # --- saving ---------------------------------------------------------------------------------------

    async def save(self, session: Session) -> None:
        """Write the new messages and changed metadata/status in one transaction, conditional on the head
        sequence the session was loaded at.

        ``ConflictError`` if another writer appended first; ``LeaseLost`` if this process held the
        session's lock and its lease was taken over. When the backend is unavailable the session is
        written to its fallback file and a warning is logged; raises only if both fail.
        """
        await self._save(session)

    async def _save(self, session: Session) -> bool:
        """Save; True when the backend took it, False when it went to the fallback file."""
        session = self._check_owned(session)
        base = session._head
        session._check_append_only()
        if type(session.metadata) is not dict:
            raise InvalidArgument(
                f"session {session.key!r}: metadata must be a dict, got {type(session.metadata).__name__}",
                key=session.key,
            )
        new = session.unsaved()
        encode = self.codec.encode
        batch = []
        for i, message in enumerate(new):
            _check_message(message, base + i)
            batch.append(NewMessage(message["role"], encode(message, where=f"messages[{base + i}]")))
        if session.status not in SESSION_STATUSES:
            raise InvalidArgument(
                f"session status must be one of {', '.join(SESSION_STATUSES)}, got {session.status!r}"
            )
        meta_raw = encode(session.metadata, where="metadata")
        changed_meta = meta_raw if meta_raw != session._metadata_raw else None
        changed_status = session.status if session.status != session._saved_status else None
        create = not session._in_backend
        if not batch and changed_meta is None and changed_status is None and not create:
            return True
        try:
            record = await self.backend.append_messages(
                session.key,
                base,
                batch,
                metadata=changed_meta,
                create=create,
                status=changed_status,
                lease=self._lease_for(session.key),
                # Same key and head but deleted and created again meanwhile: a conflict, not a fork.
                expected_created_at=session.created_at if session._in_backend else None,
            )
        except BackendUnavailable as exc:
            await self._save_fallback(session, exc)
            return False
        session._head = record.head_seq
        session._mark_saved()
        session._in_backend = True
        session._metadata_raw = meta_raw
        session._saved_status = record.status
        session._version = record.version
        session.updated_at = record.updated_at
        session.created_at = record.created_at
        if session._fallback:
            session._fallback = False
            await self._drop_covered_fallback(session.key, base, record.head_seq)
        if self._pending_fallback - {session.key}:
            self._schedule_replay()
        return True

    async def _save_fallback(self, session: Session, cause: BackendUnavailable) -> None:
        fallback = self.fallback
        if fallback is None:
            raise BackendUnavailable(
                f"{cause}; and this store has no fallback_dir, so session {session.key!r} was not saved",
                key=session.key,
            ) from cause
        snap = FallbackSnapshot(
            key=session.key,
            base_head=session._head,
            in_backend=session._in_backend,
            status=session.status,
            metadata=session.metadata,
            status_changed=session.status != session._saved_status,
            metadata_changed=session._metadata_raw is None
            or self.codec.encode(session.metadata, where="metadata") != session._metadata_raw,
            last_consolidated=session.last_consolidated,
            created_at=session.created_at,
            updated_at=dt.datetime.now(dt.UTC),
            messages=list(session.unsaved()),
        )
        try:
            path = await asyncio.to_thread(fallback.write, snap)
        except (OSError, StatekeelError) as exc:
            raise BackendUnavailable(
                f"{cause}; and writing the fallback file for session {session.key!r} in {fallback.path} "
                f"failed too ({exc}): it was not saved",
                key=session.key,
                fallback_error=str(exc),
            ) from cause
        session._fallback = True
        self._pending_fallback.add(session.key)
        log.warning(
            "backend unavailable (%s): session %r (%d unsaved messages) written to fallback file %s",
            cause,
            session.key,
            len(snap.messages),
            path,
        )

    async def _drop_covered_fallback(self, key: str, base: int, head: int) -> None:
        """Delete the key's fallback file if the write that just committed covers it."""
        fallback = self.fallback
        if fallback is None:
            return
        try:
            signature = await asyncio.to_thread(fallback.signature, key)
            snap = await asyncio.to_thread(fallback.read, key)
        except FallbackCorrupt as exc:
            await self._quarantine_key(key, str(exc))
            return
        except OSError as exc:
            log.warning("could not read the fallback file of session %r after saving it: %s", key, exc)
            return
        if snap is not None and snap.base_head == base and snap.head <= head:
            await asyncio.to_thread(fallback.delete, key, signature)
        self._pending_fallback.discard(key)

    def _schedule_replay(self) -> None:
        if self._replaying.locked() or any(not t.done() for t in self._background):
            return
        task = asyncio.create_task(self._background_replay(), name="statekeel-fallback-replay")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _background_replay(self) -> None:
        try:
            report = await self.replay_fallback()
        except Exception as exc:  # a background task has nobody to raise to: log it
            log.warning("replaying fallback files failed: %s", exc)
            return
        if report.replayed or not report.ok:
            log.warning("fallback replay after the backend came back: %s", report)

    # --- fallback replay ------------------------------------------------------------------------------

    async def replay_fallback(self) -> ReplayReport:
        """Write every fallback file's content into the backend; delete each file after its commit.

        Each replay appends exactly the file's messages, conditional on the backend head the file
        follows. A file whose messages the backend already has is deleted; one that conflicts with
        another writer, or cannot be read, is quarantined (renamed aside) and reported; one whose session
        is held (in this process or another one) is left to its holder's next save and reported as
        skipped. Files are independent: one failure never stops the others.
        """
        async with self._replaying:
            return await self._replay_all()

    async def _replay_all(self) -> ReplayReport:
        report = ReplayReport()
        fallback = self.fallback
        if fallback is None:
            return report
        paths = await asyncio.to_thread(lambda: list(fallback.files()))
        for path in paths:
            try:
                snap = await asyncio.to_thread(fallback.read_path, path)
            except FileNotFoundError:
                continue
            except FallbackCorrupt as exc:
                try:
                    target = await asyncio.to_thread(fallback.quarantine, path, str(exc))
                except FileNotFoundError:
                    continue
                report.quarantined[target] = str(exc)
                continue
            except OSError as exc:
                report.failed[path] = f"cannot read: {exc}"
                continue
            key = snap.key
            if key in self._held:
                report.skipped.append(key)
                continue
            # Replay as a holder of the session: one that another process holds (maybe the very agent
            # that wrote this file and will save it) is left to it, not written under its feet.
            lock = self.lock(key)
            try:
                await lock.acquire(timeout=0)
            except ConflictError:
                report.skipped.append(key)
                continue
            except StatekeelError as exc:
                report.failed[key] = str(exc)
                continue
            try:
                await self._replay_one(snap, report)
            except StatekeelError as exc:
                # Any error of one file (the backend is down, a message over a since-lowered
                # max_record_bytes, the session deleted meanwhile) leaves it on disk and reported.
                report.failed[key] = str(exc)
            finally:
                await lock.release()
        report.quarantined.update(self._quarantined)
        self._quarantined.clear()
        return report

    async def _replay_one(self, snap: FallbackSnapshot, report: ReplayReport) -> None:
        assert self.fallback is not None
        key = snap.key
        cached = self._cache.get(key)
        if cached is not None and cached._fallback and cached._head == snap.base_head:
            # The cached session holds the file's messages (and maybe more): saving it writes them all.
            if await self._save(cached):
                report.replayed[key] = len(snap.messages)
            else:
                report.failed[key] = "the backend is still unavailable"
            return
        signature = await asyncio.to_thread(self.fallback.signature, key)
        record = await self.backend.load_session(key)
        if record is None and snap.in_backend:
            await self._quarantine_key(
                key, "the session was deleted from the backend after this file was written"
            )
            return
        if record is not None and snap.in_backend and record.created_at != snap.created_at:
            await self._quarantine_key(
                key, "the session was deleted and created again in the backend after this file was written"
            )
            return
        if record is not None and record.head_seq != snap.base_head:
            if record.head_seq >= snap.head and await self._backend_has(snap):
                await asyncio.to_thread(self.fallback.delete, key, signature)
                self._pending_fallback.discard(key)
                report.stale.append(key)
                return
            await self._quarantine_key(
                key,
                f"it follows head {snap.base_head} but the backend moved to {record.head_seq} "
                "through another writer",
            )
            return
        encode = self.codec.encode
        batch = [
            NewMessage(m["role"], encode(m, where=f"messages[{snap.base_head + i}]"))
            for i, m in enumerate(snap.messages)
        ]
        await self.backend.append_messages(
            key,
            snap.base_head,
            batch,
            metadata=encode(snap.metadata, where="metadata")
            if snap.metadata_changed or record is None
            else None,
            create=record is None,
            status=snap.status if snap.status_changed else None,
            lease=self._lease_for(key),
            expected_created_at=snap.created_at if snap.in_backend else None,
        )
        await asyncio.to_thread(self.fallback.delete, key, signature)
        self._pending_fallback.discard(key)
        if cached is not None and not cached.is_dirty():
            del self._cache[key]  # stale now: the next load reads the replayed state
        report.replayed[key] = len(snap.messages)

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
        cached = self._cache.get(key)
        if cached is not None and cached._in_backend and cached._head == updated.head_seq:
            cached.status = cached._saved_status = updated.status
            cached._version = updated.version
            cached.updated_at = updated.updated_at
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
        self._pending_fallback.discard(key)
        if self.fallback is not None and self.fallback.exists(key):
            existed = await asyncio.to_thread(self.fallback.delete, key) or existed
        return existed

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
        elif not isinstance(now, dt.datetime) or now.tzinfo is None:
            raise InvalidArgument(f"now must be a timezone-aware datetime, got {now!r}")
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

    async def list(self, status: str | None = None, limit: int = 100, cursor: str | None = None) -> Page:
        """Sessions (``SessionRecord``) newest first by ``updated_at``; pass ``next_cursor`` on."""
        if status is not None and status not in SESSION_STATUSES:
            raise InvalidArgument(
                f"status must be None or one of {', '.join(SESSION_STATUSES)}, got {status!r}"
            )
        check_int(limit, "limit", minimum=1)
        if limit > MAX_LIST_LIMIT:
            raise InvalidArgument(f"limit must be at most {MAX_LIST_LIMIT}, got {limit}")
        if cursor is not None and type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str returned by list, got {type(cursor).__name__}")
        return await self.backend.list_sessions(status=status, limit=limit, cursor=cursor)

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
        )
        cached = self._cache.get(key)
        if cached is not None and cached._in_backend and cached.last_consolidated == record.last_consolidated:
            if not cached._full and cached._first < upto_seq:
                del cached.messages[: upto_seq - cached._first]
                cached._first = upto_seq
            cached.last_consolidated = upto_seq
            cached.summaries.append(Summary(compression_id, record.last_consolidated, upto_seq, summary))
            cached._version = updated.version
            cached.updated_at = updated.updated_at
        return compression_id

    async def archived(self, key: str, compression_id: str | None = None) -> builtins.list[ArchivedMessage]:
        """Messages compression moved out, in sequence order (of every compression, or of one)."""
        check_key(key)
        if compression_id is not None:
            check_str(compression_id, "compression_id")
        return await self.backend.read_archive(key, compression_id=compression_id)

    # --- shutdown -------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop background work (fallback replay, lease renewal). Held leases expire by themselves."""
        tasks = list(self._background)
        for lock in list(self._held.values()):
            if lock._renewer is not None:
                tasks.append(lock._renewer)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["ReplayReport", "Session", "SessionLock", "SessionManager", "Summary"]
