"""Reading what is stored of sessions without loading them: listing, paging, snapshots, the archive.

These calls never lock, cache, repair or merge fallback files: they only read, so tools can inspect a
store that agents are using. :class:`~statekeel.sessions.SessionManager` inherits them.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator

from ..backends.base import (
    SESSION_STATUSES,
    ArchivedMessage,
    LoadedSession,
    Page,
    SessionRecord,
    StorageBackend,
    every_item,
)
from ..errors import InvalidArgument
from ..validation import check_bool, check_int, check_key, check_str

DEFAULT_PAGE_SIZE = 500
MAX_LIST_LIMIT = 1000


class SessionListing:
    """The read-only calls of the session manager over its ``backend``."""

    backend: StorageBackend

    @staticmethod
    def _check_status(status: str | None) -> None:
        if status is not None and status not in SESSION_STATUSES:
            raise InvalidArgument(
                f"status must be None or one of {', '.join(SESSION_STATUSES)}, got {status!r}"
            )

    @staticmethod
    def _check_limit(limit: int, name: str) -> None:
        check_int(limit, name, minimum=1)
        if limit > MAX_LIST_LIMIT:
            raise InvalidArgument(f"{name} must be at most {MAX_LIST_LIMIT}, got {limit}")

    async def list(self, status: str | None = None, limit: int = 100, cursor: str | None = None) -> Page:
        """Sessions (``SessionRecord``) newest first by ``updated_at``; pass ``next_cursor`` on."""
        self._check_status(status)
        self._check_limit(limit, "limit")
        if cursor is not None and type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str returned by list, got {type(cursor).__name__}")
        return await self.backend.list_sessions(status=status, limit=limit, cursor=cursor)

    def iter(
        self, status: str | None = None, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[SessionRecord]:
        """Every session (``SessionRecord``), newest first by ``updated_at``, read a page at a time.

        async for record in store.sessions.iter(status="active"):
            print(record.key, record.head_seq)

        Arguments are checked at the call, before anything is read. A session updated while the
        iteration runs moves to the front and is not seen again; one created meanwhile may be missed.
        """
        self._check_status(status)
        self._check_limit(page_size, "page_size")
        return every_item(
            lambda cursor: self.backend.list_sessions(status=status, limit=page_size, cursor=cursor)
        )

    async def snapshot(self, key: str, *, include_archived: bool = True) -> LoadedSession | None:
        """The session as stored, read on one snapshot: its row, messages (from seq 0 with
        ``include_archived``, else from ``last_consolidated``) and compression summaries; None when there
        is no such session. Unlike :meth:`load` it never repairs, merges fallback files or caches: it
        writes nothing (for tools that inspect a store agents are using).

        loaded = await store.sessions.snapshot("chat-42")
        print(loaded.record.status, len(loaded.messages), loaded.summaries)
        """
        check_key(key, "key")
        check_bool(include_archived, "include_archived")
        return await self.backend.load_session_payloads(key, include_archived=include_archived)

    async def archived(self, key: str, compression_id: str | None = None) -> builtins.list[ArchivedMessage]:
        """Messages compression moved out, in sequence order (of every compression, or of one)."""
        check_key(key)
        if compression_id is not None:
            check_str(compression_id, "compression_id")
        return await self.backend.read_archive(key, compression_id=compression_id)
