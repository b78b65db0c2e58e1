"""Fallback files of sessions: written when the backend cannot take a save, merged into every load, and
replayed into the backend once it works again.

The file format (:class:`statekeel.fallback.FallbackDir`) knows nothing of sessions' semantics; this
module decides when a file is written, what a file means next to the backend's state, and when it may be
deleted. The rules that keep an acknowledged write from being lost:

- A file is replaced, deleted or quarantined only if it is still the file this process read or wrote
  (compare-and-swap on its signature): never one another process wrote in between.
- What a file means is judged from the backend's row and the file's content, never its message count:
  it *continues* the backend (the backend holds none, or only the first of its messages, at their
  sequence numbers: the rest are unsaved), is *covered* (the backend holds all of them: delete it), or
  is *overtaken* (the backend holds other messages there, or another incarnation: quarantine it).
- Every load merges the file, cached session or not. A save finds a file it does not hold that still
  continues the backend: another writer saved there first, and the save raises ``ConflictError``.
- A file is deleted only once the commit that covers it is known (after the outermost ``atomic()``
  block commits), and replay reads the file again once it holds the session's lease.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..backends.base import SessionRecord, StorageBackend
from ..errors import BackendUnavailable, ConflictError, StatekeelError
from ..fallback import FallbackChanged, FallbackCorrupt, FallbackDir, FallbackSnapshot, ReplayReport
from .changes import Changes
from .session import Session, book

log = logging.getLogger("statekeel.sessions")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a fallback file means next to the backend's state of its session."""

    kind: str  # "continues", "covered" or "overtaken"
    covered: int = 0  # how many of its first messages the backend holds already
    reason: str = ""  # why it was overtaken


def background(coro: Any, name: str) -> asyncio.Task[Any]:
    """Start ``coro`` as a task in a fresh context: never inside the caller's ``atomic()`` block (its
    writes would join, or wait forever for, a transaction that is not theirs)."""
    return asyncio.create_task(coro, name=name, context=contextvars.Context())


class SessionFallback:
    """The fallback files of one ``SessionManager`` (none when it has no ``fallback_dir``): reading,
    judging, writing and deleting them. Replaying them is a write, owned by :mod:`.writes`."""

    def __init__(
        self, backend: StorageBackend, files: FallbackDir | None, new: Callable[[str], Session]
    ) -> None:
        self.backend = backend
        self.files = files
        self._new = new  # a new session of the key, not in the backend
        self.pending: set[str] = set()  # keys this manager wrote fallback files for
        self._quarantined: dict[str, str] = {}  # reported by the next replay
        self.tasks: set[asyncio.Task[Any]] = set()  # background work, cancelled by close()

    # --- reading, judging, quarantine -----------------------------------------------------------------

    async def read(self, key: str, *, settle: bool = True) -> tuple[FallbackSnapshot, str] | None:
        """The key's fallback file and its signature, or None; one that cannot be read is quarantined
        (left in place when not ``settle``)."""
        files = self.files
        if files is None or not files.exists(key):
            return None
        try:
            return await asyncio.to_thread(files.read_signed, key)
        except FallbackCorrupt as exc:
            if settle:
                await self.quarantine_key(key, str(exc))
            return None

    async def quarantine_key(self, key: str, reason: str, signature: str | None = None) -> None:
        """Rename the key's file aside (only if it is still the one with ``signature``, when given)."""
        assert self.files is not None
        path = self.files.file_for(key)
        try:
            target = await asyncio.to_thread(self.files.quarantine, path, reason, signature)
        except FileNotFoundError:
            return
        if target is not None:
            self._quarantined[target] = reason
            self.pending.discard(key)

    async def delete(self, key: str, signature: str) -> bool:
        """Delete the key's file if it is still the one with ``signature``."""
        assert self.files is not None
        deleted = await asyncio.to_thread(self.files.delete, key, signature)
        if deleted:
            self.pending.discard(key)
        return deleted

    async def judge(self, snap: FallbackSnapshot, record: SessionRecord | None) -> Verdict:
        """What ``snap`` means next to the backend's row ``record`` of its session (None: no row)."""
        if record is None:
            if snap.in_backend:
                return Verdict(
                    "overtaken", reason="the session was deleted from the backend after this file was written"
                )
            return Verdict("continues")  # the file creates the session
        if snap.in_backend and record.created_at != snap.created_at:
            return Verdict(
                "overtaken",
                reason="the session was deleted and created again in the backend after this file was "
                "written; its messages were kept in the quarantined file",
            )
        taken = snap.rewinds or 0
        if (record.rewinds or 0) != taken:
            # Its seqs name messages of the live transcript it was taken in; after a rewind the same seqs
            # (even the same head) name others: replaying it would splice the old branch onto the new one.
            return Verdict(
                "overtaken",
                reason=f"the session was rewound after this file was written (rewind count {record.rewinds} "
                f"in the backend, {taken} when the file was taken): its messages follow a history the "
                "live transcript no longer holds; they were kept in the quarantined file",
            )
        head = record.head_seq
        if head == snap.base_head:
            return Verdict("continues")
        covered = min(head, snap.head) - snap.base_head
        if covered > 0 and await self._backend_holds(snap, record, covered):
            if covered == len(snap.messages):
                return Verdict("covered", covered)
            return Verdict("continues", covered)
        return Verdict(
            "overtaken",
            covered,
            f"it follows head {snap.base_head} but the backend moved to {head} through another writer; "
            "its messages were kept in the quarantined file",
        )

    async def _backend_holds(self, snap: FallbackSnapshot, record: SessionRecord, n: int) -> bool:
        """Whether the backend holds the snapshot's first ``n`` messages, exactly, at their seqs."""
        backend = self.backend
        start, end = snap.base_head, snap.base_head + n
        stored: dict[int, Any] = {}
        if start < record.last_consolidated:
            for a in await backend.read_archive(snap.key):
                if start <= a.seq < end:
                    stored[a.seq] = a.payload
        for r in await backend.read_messages(snap.key, start=max(start, record.last_consolidated), end=end):
            stored[r.seq] = r.payload
        return [stored.get(start + i) for i in range(n)] == snap.messages[:n]

    async def settle(self, key: str, snap: FallbackSnapshot, signature: str, verdict: Verdict) -> bool:
        """Delete a covered file, quarantine an overtaken one; True when the file continues the backend."""
        if verdict.kind == "covered":
            await self.delete(key, signature)
        elif verdict.kind == "overtaken":
            await self.quarantine_key(key, verdict.reason, signature)
        return verdict.kind == "continues"

    # --- load: merge the file into what the backend holds ---------------------------------------------

    async def merge(
        self, key: str, session: Session | None, record: SessionRecord | None, *, settle: bool = True
    ) -> Session | None:
        """``session`` (built from the backend's row ``record``, or None) merged with the key's file.

        ``ConflictError`` when ``session`` holds unsaved messages that the file, written by another
        writer, does not continue (the caller drops that session and loads again). Without ``settle``
        nothing is written: a covered file is not deleted, an overtaken or unreadable one not quarantined.
        """
        found = await self.read(key, settle=settle)
        if found is None:
            return session
        snap, signature = found
        if session is not None and book(session).fallback_signature == signature:
            return session  # it holds this very file already
        verdict = await self.judge(snap, record)
        if settle:
            continues = await self.settle(key, snap, signature, verdict)
        else:
            continues = verdict.kind == "continues"
        if not continues:
            return session
        if session is None:
            session = self._new(key)
            book(session).from_fallback(snap, signature)
            return session
        missing = snap.messages[verdict.covered :]
        unsaved = session.unsaved()
        if missing[: len(unsaved)] != unsaved:
            raise ConflictError(
                f"session {key!r} has unsaved messages, and another writer's fallback file holds others "
                "at the same place",
                key=key,
            )
        book(session).continued_by(snap, missing[len(unsaved) :], signature)
        return session

    # --- save: before the backend, and when it cannot take the save -----------------------------------

    def may_exist(self, key: str) -> bool:
        """Whether the key may have a fallback file (one stat; False without a fallback directory)."""
        return self.files is not None and self.files.exists(key)

    async def check_before_save(self, session: Session) -> None:
        """Refuse a save that would fork from a fallback file another writer saved first.

        A file this session does not hold that still continues the backend holds acknowledged messages
        the backend does not have yet: saving past it would lose or fork them, so ``ConflictError``. A
        covered file is deleted, an overtaken one quarantined. (The caller checks :meth:`may_exist`
        first: one stat when there is no file.)
        """
        files = self.files
        if files is None:
            return
        held = book(session).fallback_signature
        if held is not None and await asyncio.to_thread(files.signature, session.key) == held:
            return  # its own file (only the header is read)
        found = await self.read(session.key)
        if found is None or found[1] == held:
            return
        snap, signature = found
        try:
            record = await self.backend.load_session(session.key)
            verdict = await self.judge(snap, record)
        except BackendUnavailable:
            return  # cannot tell now; a save that falls back finds the file changed and conflicts
        if await self.settle(session.key, snap, signature, verdict):
            raise ConflictError(
                f"another writer saved session {session.key!r} first, to its fallback file (while the "
                "backend was unavailable): load the session again, which merges that file, then re-apply "
                "your change",
                key=session.key,
            )

    async def write(self, session: Session, changes: Changes, cause: BackendUnavailable) -> None:
        """Write the session's unsaved part to its fallback file, replacing only the file this session
        holds. ``BackendUnavailable`` if that fails, ``ConflictError`` if another writer changed the file."""
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
            rewinds=changes.expected_rewinds or 0,  # the count its seqs belong to
        )
        try:
            path, signature = await asyncio.to_thread(
                files.write_signed, snap, replacing=book(session).fallback_signature
            )
        except FallbackChanged:
            raise ConflictError(
                f"{cause}; and another writer changed the fallback file of session {session.key!r} since "
                "this session read it, so it was not saved: load it again, which merges that file, then "
                "re-apply your change",
                key=session.key,
            ) from cause
        except (OSError, StatekeelError) as exc:
            raise BackendUnavailable(
                f"{cause}; and writing the fallback file for session {session.key!r} in {files.path} "
                f"failed too ({exc}): it was not saved",
                key=session.key,
                fallback_error=str(exc),
            ) from cause
        book(session).fell_back(signature, changes.base + len(snap.messages))
        self.pending.add(session.key)
        log.warning(
            "backend unavailable (%s): session %r (%d unsaved messages) written to fallback file %s",
            cause,
            session.key,
            len(snap.messages),
            path,
        )

    async def drop_covered(self, key: str, signature: str) -> None:
        """A commit covers the file with ``signature`` (the one the saved session held): delete it, unless
        another writer replaced it meanwhile."""
        if self.files is not None:
            await self.delete(key, signature)

    # --- replay (the writes are :class:`~statekeel.sessions.writes.SessionWrites`'s) ---------------------

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, outside any ``atomic()`` block; ``close()`` cancels it."""
        task = background(coro, name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def scan(self, report: ReplayReport) -> AsyncIterator[str]:
        """The key of every file of the directory that can be read, one file read at a time; the others
        are quarantined or reported."""
        files = self.files
        if files is None:
            return
        paths = await asyncio.to_thread(lambda: list(files.files()))
        for path in paths:
            snap = await self._read_for_replay(files, path, report)
            if snap is not None:
                yield snap.key

    def reported(self, report: ReplayReport) -> ReplayReport:
        """``report`` with the files quarantined since the last replay (each reported once)."""
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
            if target is not None:
                report.quarantined[target] = str(exc)
        except OSError as exc:
            report.failed[path] = f"cannot read: {exc}"
        return None


__all__ = ["SessionFallback", "Verdict", "background"]
