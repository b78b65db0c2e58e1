"""Every write of a session's messages, in one place: a save, the replay of a fallback file, and the two
records of a tool call.

A write is a unit of work, from the session's snapshot to its new state, in one direction:

1. :meth:`SessionWrites.save` takes the session's snapshot (``book(session).changes()``: what is unsaved,
   checked and encoded) under the session's write lock;
2. it refuses a save past another writer's fallback file (:mod:`.fallback`), counts the waiting tool
   calls, and writes to the backend, conditional on the head and version the snapshot follows;
3. when the backend cannot take it (and no ``atomic()`` block owns the outcome), the same snapshot goes
   to the session's fallback file instead;
4. the outcome is handed back to the session once, through its :class:`~.session.SessionBook`
   (``saved``, ``saved_undoably``, ``fell_back``, ``attempt_failed``), and the fallback file the backend
   now covers is deleted.

Nothing else writes a session's messages: the manager, :mod:`.fallback` and :mod:`.tools` call this
module, and it never calls back into the manager — what it needs of it (the leases held, the cache, the
lock of a key) is handed to it when the manager is made.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Protocol, TypeVar, cast

from ..backends.base import SessionLease, SessionRecord, StorageBackend
from ..codec import Codec
from ..errors import BackendUnavailable, ConflictError, InvalidArgument, StatekeelError
from ..fallback import FallbackSnapshot, ReplayReport
from .changes import Changes, message_batch
from .fallback import SessionFallback
from .heartbeat import Heartbeat
from .session import Session, SessionBook, book

log = logging.getLogger("statekeel.sessions")

T = TypeVar("T")


class Holder(Protocol):
    """A held session lock, as this module sees it: the lease it holds (fences every write)."""

    @property
    def lease(self) -> SessionLease | None: ...


class KeyLock(Protocol):
    """The lock of one session key (:class:`~.lock.SessionLock`), taken by a replay."""

    async def acquire(self, timeout: float | None = None) -> None: ...

    async def release(self) -> None: ...


class SessionWrites:
    """The writes of one ``SessionManager``'s sessions (see the module's docstring).

    ``held`` (key → held lock) and ``cache`` (key → session) are the manager's own mappings, read here;
    ``lock(key)`` is the manager's lock of a key; ``owner`` the manager, which a session names as its own.
    """

    def __init__(
        self,
        backend: StorageBackend,
        codec: Codec,
        files: SessionFallback,
        heartbeat: Heartbeat,
        *,
        owner: object,
        held: Mapping[str, Holder],
        cache: MutableMapping[str, Session],
        lock: Callable[[str], KeyLock],
    ) -> None:
        self.backend = backend
        self.codec = codec
        self.files = files
        self.heartbeat = heartbeat
        self._owner = owner
        self._held = held
        self._cache = cache
        self._lock = lock
        self.closed = False  # set by close(): saves raise BackendUnavailable, nothing written
        # Each save attempt gets its own write id (stored in the row it writes): a save that never heard
        # its outcome recognises its own write by it. Unique per manager instance.
        self._write_prefix = f"{secrets.token_hex(8)}."
        self._write_seq = itertools.count()
        self._replaying = asyncio.Lock()
        self._replay_task: asyncio.Task[Any] | None = None

    # --- what a write needs -----------------------------------------------------------------------------

    def lease_for(self, key: str) -> SessionLease | None:
        """The lease this manager holds on ``key`` (None when it does not hold its lock)."""
        held = self._held.get(key)
        return None if held is None else held.lease

    def owned(self, session: Any) -> Session:
        """``session``, checked to be a session of this manager (``InvalidArgument`` otherwise)."""
        self._book_of(session)
        return cast(Session, session)  # checked by _book_of

    def _book_of(self, session: Any) -> SessionBook:
        b = book(session) if isinstance(session, Session) else None
        if b is None or b.owner is not self._owner:
            raise InvalidArgument(
                "this Session was not loaded from this store; load it from this store first"
            )
        return b

    async def counted(self, session: Session, b: SessionBook | None = None) -> tuple[int, str | None]:
        """The session's waiting calls and their owner, as a save records them (heartbeat ensured)."""
        count = len((b or book(session)).index().outstanding())
        if not count:
            return 0, None
        await self.heartbeat.ensure()
        return count, self.heartbeat.owner

    # --- a save -----------------------------------------------------------------------------------------

    async def save(self, session: Session) -> bool:
        """Save; True when the backend took it, False when it went to the fallback file. Saves of one
        session object run one at a time: each writes what the one before it left unsaved."""
        b = self._book_of(session)
        async with b.saving:
            return await self.save_held(session, b=b)

    async def save_held(
        self,
        session: Session,
        changes: Changes | None = None,
        *,
        b: SessionBook | None = None,
        calls: tuple[int, str | None] | None = None,
    ) -> bool:
        """:meth:`save` for a caller that holds the session's write lock (``changes``: its snapshot, and
        ``calls``: its waiting calls counted, when the caller took them already; ``b``: its book)."""
        if self.closed:
            raise BackendUnavailable(
                f"the store is closed: session {session.key!r} was not saved (nor written to a fallback "
                "file); open the store again, load the session and re-apply the change",
                key=session.key,
            )
        if b is None:
            b = book(session)
        if changes is None:
            changes = b.changes()
        if changes.empty:
            return True
        key = session.key
        if self.files.may_exist(key):
            await self.files.check_before_save(session)
        if calls is None:
            calls = await self.counted(session, b)
        in_block = self.backend.in_atomic()
        write_id = f"{self._write_prefix}{next(self._write_seq)}"
        if not in_block:  # in a block, the block's outcome decides
            b.attempting(write_id, changes)
        try:
            record = await self.backend.append_messages(
                key,
                changes.base,
                changes.batch,
                metadata=changes.metadata,
                create=changes.create,
                status=changes.status,
                lease=self.lease_for(key),
                # Same key and head but deleted and created again meanwhile: a conflict, not a fork.
                expected_created_at=b.expected_created_at(),
                expected_version=changes.expected_version,
                expected_rewinds=changes.expected_rewinds,
                # How many tool calls wait for a result after this save, and whose they are.
                open_calls=calls[0],
                calls_owner=calls[1],
                write_id=write_id,
            )
        except BackendUnavailable as exc:
            if in_block:
                raise  # the block's transaction decides: a fallback file would outlive its rollback
            if getattr(exc, "outcome", None) != "unknown":
                b.attempt_failed(write_id)
            await self.files.write(session, changes, exc)
            return False
        except ConflictError:
            b.attempt_failed(write_id)
            # A save of this session whose answer it never heard may have moved the row (and a load may
            # have settled it meanwhile): then it is no conflict, and what is left unsaved is written now.
            if session.saved_head == changes.base and (
                not b.unheard or not await self.settled(session, await self.backend.load_session(key))
            ):
                raise
            return await self.save_held(session, b=b)
        except StatekeelError:
            if not in_block:
                b.attempt_failed(write_id)
            raise
        covered = b.fallback_signature
        if in_block:
            # Settled for the rest of the block; undone if it rolls back. The file goes after COMMIT.
            undo = b.saved_undoably(record, changes, write_id)
            self.backend.on_block_end(functools.partial(self._block_ended, key, undo, covered))
        else:
            b.saved(record, changes)
            if covered is not None:
                await self.files.drop_covered(key, covered)
        if self.files.pending and self.files.pending != {key}:
            self.schedule_replay()  # the backend works: replay the other keys' files in the background
        return True

    async def settled(self, session: Session, record: SessionRecord | None) -> bool:
        """Whether ``record`` (the backend's row) was written by a save of ``session`` whose answer it never
        heard; then that save is settled as done, and the fallback file it holds deleted once the backend
        has all of it."""
        b = book(session)
        if record is None or not b.landed(record):
            return False
        log.info("session %r: a save whose answer was lost had landed; settled as saved", session.key)
        covered = b.covered_fallback()
        if covered is not None:
            await self.files.drop_covered(session.key, covered)
        return True

    def _block_ended(self, key: str, undo: Callable[[], None], covered: str | None, committed: bool) -> None:
        if not committed:
            undo()
        elif covered is not None:
            self.files.spawn(self.files.drop_covered(key, covered), f"statekeel-drop-{key}")

    # --- a tool call's records ------------------------------------------------------------------------

    async def save_with(self, session: Session, record: Callable[[], Awaitable[T]]) -> T:
        """In one transaction, the session's unsaved part (as :meth:`save_held` writes it: the caller holds
        the write lock) and ``record()`` — a tool call's journal row; returns what ``record`` returned.
        With nothing unsaved, the session's waiting calls are claimed instead, conditional on the head it
        holds (its view of the call is current) and fenced by its lease."""
        b = book(session)
        changes = b.changes()
        calls = await self.counted(session, b)  # the heartbeat, before the block that may name it
        async with self.backend.atomic():
            if not changes.empty:
                # In the block: undone in the session if it rolls back.
                await self.save_held(session, changes, b=b, calls=calls)
            elif not await self.backend.set_open_calls(
                session.key,
                expected_head=session.saved_head,
                expected_created_at=session.created_at,
                open_calls=calls[0],
                calls_owner=calls[1],
                lease=self.lease_for(session.key),
            ):
                raise ConflictError(
                    f"session {session.key!r} changed in the store since it was loaded (another writer "
                    "appended or deleted it); reload it before running its tool calls",
                    key=session.key,
                )
            done = await record()
        if changes.empty:
            b.calls_stored(*calls)
        return done

    # --- replay of fallback files ---------------------------------------------------------------------

    def schedule_replay(self) -> None:
        """Replay the fallback files in the background, unless a replay runs already."""
        if self._replaying.locked() or (self._replay_task is not None and not self._replay_task.done()):
            return
        self._replay_task = self.files.spawn(self._background_replay(), "statekeel-fallback-replay")

    async def _background_replay(self) -> None:
        try:
            report = await self.replay()
        except Exception as exc:  # a background task has nobody to raise to: log it
            log.warning("replaying fallback files failed: %s", exc)
            return
        if report.replayed or not report.ok:
            log.warning("fallback replay after the backend came back: %s", report)

    async def replay(self) -> ReplayReport:
        """See ``SessionManager.replay_fallback``."""
        if self.backend.in_atomic():
            raise InvalidArgument(
                "replay_fallback() commits each file on its own and deletes it after: call it outside "
                "an atomic() block"
            )
        async with self._replaying:
            report = ReplayReport()
            async for key in self.files.scan(report):
                await self._replay_held(key, report)
            return self.files.reported(report)

    async def _replay_held(self, key: str, report: ReplayReport) -> None:
        """Replay one key's file as a holder of the session's lock."""
        if key in self._held:
            report.skipped.append(key)
            return
        # One that another process holds (maybe the very agent that wrote this file and will save it) is
        # left to it, not written under its feet.
        lock = self._lock(key)
        try:
            await lock.acquire(timeout=0)
        except ConflictError:
            report.skipped.append(key)
            return
        except StatekeelError as exc:
            report.failed[key] = str(exc)
            return
        try:
            await self._replay_one(key, report)
        except StatekeelError as exc:
            # Any error of one file (the backend is down, a message over a since-lowered
            # max_record_bytes, the session deleted meanwhile) leaves it on disk and reported.
            report.failed[key] = str(exc)
        finally:
            await lock.release()

    async def _replay_one(self, key: str, report: ReplayReport) -> None:
        # Read again now that the session is held: the file may have changed while the lease was awaited.
        found = await self.files.read(key)
        if found is None:
            return
        snap, signature = found
        cached = self._cache.get(key)
        if cached is not None and book(cached).fallback_signature == signature:
            now = await self.backend.load_session(key)
            if now is not None and now.created_at == cached.created_at and now.rewinds != cached.rewinds:
                # Rewound since the file was taken: judged (and quarantined) below, never saved over.
                cached = None
        if cached is not None and book(cached).fallback_signature == signature:
            if book(cached).unheard and await self._landed_unheard(cached):
                report.stale.append(key)  # the save that wrote the file had landed: nothing to replay
                return
            # The cached session holds the file's messages (and maybe more): saving it writes them all,
            # after any save of it already under way.
            if await self.save(cached):
                report.replayed[key] = len(snap.messages)
            else:
                report.failed[key] = "the backend is still unavailable"
            return
        record = await self.backend.load_session(key)
        verdict = await self.files.judge(snap, record)
        if not await self.files.settle(key, snap, signature, verdict):
            if verdict.kind == "covered":
                report.stale.append(key)
            return
        await self._append(snap, record, verdict.covered)
        await self.files.delete(key, signature)  # a file rewritten meanwhile stays, for the next replay
        if cached is not None and not cached.is_dirty() and self._cache.get(key) is cached:
            del self._cache[key]  # stale now: the next load reads the replayed state
        report.replayed[key] = len(snap.messages) - verdict.covered

    async def _landed_unheard(self, session: Session) -> bool:
        """Whether a save of ``session`` whose answer was lost had landed, and with it all of the file the
        session holds (then deleted)."""
        async with book(session).saving:  # not while a save of it is under way
            record = await self.backend.load_session(session.key)
            return await self.settled(session, record) and book(session).fallback_signature is None

    async def _append(self, snap: FallbackSnapshot, record: SessionRecord | None, covered: int) -> None:
        """Write the file's messages the backend lacks, with its metadata and status changes."""
        codec = self.codec
        base = snap.base_head + covered
        metadata = (
            codec.encode(snap.metadata, where="metadata") if snap.metadata_changed or record is None else None
        )
        status = snap.status if snap.status_changed else None
        await self.backend.append_messages(
            snap.key,
            base,
            message_batch(codec, base, snap.messages[covered:]),
            metadata=metadata,
            create=record is None,
            status=status,
            lease=self.lease_for(snap.key),
            expected_created_at=None if record is None else record.created_at,
            # The file's metadata and status replace the row's only if nobody changed them since.
            expected_version=None
            if record is None or (metadata is None and status is None)
            else record.version,
            # Judged under the rewind count it was taken under: a rewind since then refuses the write.
            expected_rewinds=None if record is None else snap.rewinds or 0,
        )


__all__ = ["Holder", "KeyLock", "SessionWrites"]
