"""Fallback files of sessions: written when the backend cannot take a save, merged back on load, and
replayed into the backend once it works again.

The file format (:class:`statekeel.fallback.FallbackDir`) knows nothing of sessions'
semantics; this module decides when a file is written, what a file means next to the backend's state
(it continues it, the backend has it already, or another writer moved on), and when it may be deleted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from ..errors import BackendUnavailable, ConflictError, StatekeelError
from ..fallback import FallbackCorrupt, FallbackDir, FallbackSnapshot, ReplayReport
from .session import Changes, Session, message_batch

if TYPE_CHECKING:
    from .manager import SessionManager

log = logging.getLogger("statekeel.sessions")


class SessionFallback:
    """The fallback files of one ``SessionManager`` (none when it has no ``fallback_dir``)."""

    def __init__(self, manager: SessionManager, files: FallbackDir | None) -> None:
        self._manager = manager
        self.files = files
        self.pending: set[str] = set()  # keys this manager wrote fallback files for
        self._quarantined: dict[str, str] = {}  # reported by the next replay
        self._replaying = asyncio.Lock()
        self.background: set[asyncio.Task[Any]] = set()

    # --- reading and quarantine -----------------------------------------------------------------------

    async def read(self, key: str) -> FallbackSnapshot | None:
        """The key's fallback file, or None; a file that cannot be read back is quarantined."""
        files = self.files
        if files is None or not files.exists(key):
            return None
        try:
            return await asyncio.to_thread(files.read, key)
        except FallbackCorrupt as exc:
            await self.quarantine_key(key, str(exc))
            return None

    async def quarantine_key(self, key: str, reason: str) -> None:
        assert self.files is not None
        path = self.files.file_for(key)
        try:
            target = await asyncio.to_thread(self.files.quarantine, path, reason)
        except FileNotFoundError:
            return
        self._quarantined[target] = reason
        self.pending.discard(key)

    async def backend_has(self, snap: FallbackSnapshot) -> bool:
        """Whether the backend holds exactly the snapshot's messages at their sequence numbers."""
        backend = self._manager.backend
        record = await backend.load_session(snap.key)
        if record is None or record.head_seq < snap.head:
            return False
        stored: dict[int, Any] = {}
        if snap.base_head < record.last_consolidated:
            for a in await backend.read_archive(snap.key):
                if snap.base_head <= a.seq < snap.head:
                    stored[a.seq] = a.payload
        start = max(snap.base_head, record.last_consolidated)
        for r in await backend.read_messages(snap.key, start=start, end=snap.head):
            stored[r.seq] = r.payload
        return [stored.get(snap.base_head + i) for i in range(len(snap.messages))] == snap.messages

    # --- load: merge the file into what the backend holds ---------------------------------------------

    async def merge(self, key: str, session: Session | None) -> Session | None:
        """The session as loaded from the backend (``session``) merged with its fallback file, if any.

        A file that continues the backend's head becomes the session's unsaved part; one the backend
        already holds is deleted; one that another writer overtook is quarantined (kept for a human).
        """
        snap = await self.read(key)
        if snap is None:
            return session
        if session is None:
            if snap.in_backend:
                await self.quarantine_key(
                    key, "the session was deleted from the backend after this file was written"
                )
                return None
            session = self._manager._new(key, None)
            session._from_fallback(snap)
            return session
        if snap.in_backend and snap.created_at != session.created_at:
            await self.quarantine_key(
                key,
                "the session was deleted and created again in the backend after this file was written; "
                "its messages were kept in the quarantined file",
            )
            return session
        if session.saved_head == snap.base_head:
            # The fallback continues the backend: its messages are unsaved, written by the next save.
            session._continued_by(snap)
            return session
        if session.saved_head >= snap.head and await self.backend_has(snap):
            # Replayed already, but the process died before deleting the file.
            assert self.files is not None
            await asyncio.to_thread(self.files.delete, key)
            return session
        await self.quarantine_key(
            key,
            f"it follows head {snap.base_head} but the backend moved to {session.saved_head} through "
            "another writer; its messages were kept in the quarantined file",
        )
        return session

    # --- save: write the file when the backend cannot take the save -----------------------------------

    async def write(self, session: Session, changes: Changes, cause: BackendUnavailable) -> None:
        """Write the session's unsaved part to its fallback file; ``BackendUnavailable`` if that fails."""
        files = self.files
        if files is None:
            raise BackendUnavailable(
                f"{cause}; and this store has no fallback_dir, so session {session.key!r} was not saved",
                key=session.key,
            ) from cause
        snap = FallbackSnapshot(
            key=session.key,
            base_head=changes.base,
            in_backend=not changes.create,
            status=session.status,
            metadata=session.metadata,
            status_changed=changes.status is not None,
            metadata_changed=changes.metadata is not None,
            last_consolidated=session.last_consolidated,
            created_at=session.created_at,
            updated_at=dt.datetime.now(dt.UTC),
            messages=list(changes.messages),
        )
        try:
            path = await asyncio.to_thread(files.write, snap)
        except (OSError, StatekeelError) as exc:
            raise BackendUnavailable(
                f"{cause}; and writing the fallback file for session {session.key!r} in {files.path} "
                f"failed too ({exc}): it was not saved",
                key=session.key,
                fallback_error=str(exc),
            ) from cause
        session._fell_back()
        self.pending.add(session.key)
        log.warning(
            "backend unavailable (%s): session %r (%d unsaved messages) written to fallback file %s",
            cause,
            session.key,
            len(snap.messages),
            path,
        )

    async def drop_covered(self, key: str, base: int, head: int) -> None:
        """Delete the key's fallback file if the write that just committed covers it."""
        files = self.files
        if files is None:
            return
        try:
            signature = await asyncio.to_thread(files.signature, key)
            snap = await asyncio.to_thread(files.read, key)
        except FallbackCorrupt as exc:
            await self.quarantine_key(key, str(exc))
            return
        except OSError as exc:
            log.warning("could not read the fallback file of session %r after saving it: %s", key, exc)
            return
        if snap is not None and snap.base_head == base and snap.head <= head:
            await asyncio.to_thread(files.delete, key, signature)
        self.pending.discard(key)

    def after_save(self, key: str) -> None:
        """A save of ``key`` reached the backend: replay the other keys' files in the background."""
        if self.pending - {key}:
            self.schedule_replay()

    # --- replay ---------------------------------------------------------------------------------------

    def schedule_replay(self) -> None:
        if self._replaying.locked() or any(not t.done() for t in self.background):
            return
        task = asyncio.create_task(self._background_replay(), name="statekeel-fallback-replay")
        self.background.add(task)
        task.add_done_callback(self.background.discard)

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
        async with self._replaying:
            return await self._replay_all()

    async def _replay_all(self) -> ReplayReport:
        report = ReplayReport()
        files = self.files
        if files is None:
            return report
        paths = await asyncio.to_thread(lambda: list(files.files()))
        for path in paths:
            snap = await self._read_for_replay(files, path, report)
            if snap is not None:
                await self._replay_held(snap, report)
        report.quarantined.update(self._quarantined)
        self._quarantined.clear()
        return report

    async def _read_for_replay(
        self, files: FallbackDir, path: str, report: ReplayReport
    ) -> FallbackSnapshot | None:
        """The file at ``path``, or None (gone, quarantined or unreadable: reported)."""
        try:
            return await asyncio.to_thread(files.read_path, path)
        except FileNotFoundError:
            return None
        except FallbackCorrupt as exc:
            try:
                target = await asyncio.to_thread(files.quarantine, path, str(exc))
            except FileNotFoundError:
                return None
            report.quarantined[target] = str(exc)
        except OSError as exc:
            report.failed[path] = f"cannot read: {exc}"
        return None

    async def _replay_held(self, snap: FallbackSnapshot, report: ReplayReport) -> None:
        """Replay one file as a holder of its session's lock."""
        manager = self._manager
        key = snap.key
        if key in manager._held:
            report.skipped.append(key)
            return
        # One that another process holds (maybe the very agent that wrote this file and will save it) is
        # left to it, not written under its feet.
        lock = manager.lock(key)
        try:
            await lock.acquire(timeout=0)
        except ConflictError:
            report.skipped.append(key)
            return
        except StatekeelError as exc:
            report.failed[key] = str(exc)
            return
        try:
            await self._replay_one(snap, report)
        except StatekeelError as exc:
            # Any error of one file (the backend is down, a message over a since-lowered
            # max_record_bytes, the session deleted meanwhile) leaves it on disk and reported.
            report.failed[key] = str(exc)
        finally:
            await lock.release()

    async def _replay_one(self, snap: FallbackSnapshot, report: ReplayReport) -> None:
        assert self.files is not None
        manager = self._manager
        key = snap.key
        cached = manager._cache.get(key)
        if cached is not None and cached._fallback and cached.saved_head == snap.base_head:
            # The cached session holds the file's messages (and maybe more): saving it writes them all.
            if await manager._save(cached):
                report.replayed[key] = len(snap.messages)
            else:
                report.failed[key] = "the backend is still unavailable"
            return
        signature = await asyncio.to_thread(self.files.signature, key)
        record = await manager.backend.load_session(key)
        if record is None and snap.in_backend:
            await self.quarantine_key(
                key, "the session was deleted from the backend after this file was written"
            )
            return
        if record is not None and snap.in_backend and record.created_at != snap.created_at:
            await self.quarantine_key(
                key, "the session was deleted and created again in the backend after this file was written"
            )
            return
        if record is not None and record.head_seq != snap.base_head:
            if record.head_seq >= snap.head and await self.backend_has(snap):
                await asyncio.to_thread(self.files.delete, key, signature)
                self.pending.discard(key)
                report.stale.append(key)
                return
            await self.quarantine_key(
                key,
                f"it follows head {snap.base_head} but the backend moved to {record.head_seq} "
                "through another writer",
            )
            return
        codec = manager.codec
        await manager.backend.append_messages(
            key,
            snap.base_head,
            message_batch(codec, snap.base_head, snap.messages),
            metadata=codec.encode(snap.metadata, where="metadata")
            if snap.metadata_changed or record is None
            else None,
            create=record is None,
            status=snap.status if snap.status_changed else None,
            lease=manager._lease_for(key),
            expected_created_at=snap.created_at if snap.in_backend else None,
        )
        await asyncio.to_thread(self.files.delete, key, signature)
        self.pending.discard(key)
        if cached is not None and not cached.is_dirty():
            del manager._cache[key]  # stale now: the next load reads the replayed state
        report.replayed[key] = len(snap.messages)


__all__ = ["ReplayReport", "SessionFallback"]
