"""The storage contract: one ABC per state kind, records as frozen dataclasses.

A backend is the composition of these ABCs (:class:`StorageBackend`). Every method is a state-semantic
operation that is atomic on its own; ``async with backend.atomic():`` groups several into one transaction.
Managers (``statekeel.sessions`` …) hold the semantics that do not depend on a backend and talk to storage
only through this contract.

Sequence numbers of a session's messages are dense and 0-based: ``head_seq`` is the number of messages
ever appended, and the next message gets ``seq == head_seq``.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

SESSION_STATUSES = ("active", "expired", "archived")


@dataclass(frozen=True, slots=True)
class MigrationInfo:
    """One applied migration as recorded in ``schema_migrations``."""

    version: int
    name: str
    checksum: str
    applied_at: dt.datetime


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's row: everything but its messages."""

    key: str
    status: str
    metadata: dict[str, Any]
    last_consolidated: int
    head_seq: int
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append: its role and its whole payload (the message dict, role included)."""

    role: str
    payload: bytes  # codec-encoded JSON object


@dataclass(frozen=True, slots=True)
class MessageRecord:
    session_key: str
    seq: int
    role: str
    payload: dict[str, Any]
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A message that compression moved out of the live history, with the summary that replaced it."""

    session_key: str
    compression_id: str
    seq: int
    payload: dict[str, Any]
    summary: str
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[Any] = field(default_factory=list)
    next_cursor: str | None = None


class LifecycleBackend(abc.ABC):
    """Opening, closing, transactions and the schema."""

    url: str

    @abc.abstractmethod
    async def initialize(self) -> None:
        """Connect, refuse a database that is not ours or is too new, and apply pending migrations."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish in-flight writes and release connections. Idempotent."""

    @abc.abstractmethod
    def atomic(self) -> AbstractAsyncContextManager[None]:
        """``async with backend.atomic():`` — the enclosed calls commit together or not at all.

        Nested blocks join the outer transaction. Calls made from other tasks are not part of it.
        """

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The highest applied migration version."""

    @abc.abstractmethod
    async def migrations(self) -> list[MigrationInfo]:
        """Applied migrations in order."""

    @abc.abstractmethod
    async def integrity_check(self) -> list[str]:
        """Problems found by the storage engine's own check; empty when healthy."""


class SessionBackend(abc.ABC):
    """Sessions, their append-only messages and the message archive."""

    @abc.abstractmethod
    async def create_session(
        self, key: str, *, metadata: bytes | None = None, if_missing: bool = False
    ) -> SessionRecord:
        """Create an empty active session. ``ConflictError`` if it exists, unless ``if_missing``."""

    @abc.abstractmethod
    async def load_session(self, key: str) -> SessionRecord | None:
        """The session's row, or None when the backend says it does not exist (errors always raise)."""

    @abc.abstractmethod
    async def load_session_with_messages(self, key: str) -> tuple[SessionRecord, list[MessageRecord]] | None:
        """The session's row and its live messages (from ``last_consolidated``), read on one snapshot."""

    @abc.abstractmethod
    async def list_sessions(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        """Sessions newest first (by ``updated_at``, then key), cursor-paginated."""

    @abc.abstractmethod
    async def update_session(
        self,
        key: str,
        *,
        expected_version: int | None = None,
        metadata: bytes | None = None,
        status: str | None = None,
    ) -> SessionRecord:
        """Change metadata and/or status, conditional on ``expected_version`` (``ConflictError``)."""

    @abc.abstractmethod
    async def delete_session(self, key: str) -> bool:
        """Delete a session with its messages and archive. False when it did not exist."""

    @abc.abstractmethod
    async def append_messages(
        self,
        key: str,
        expected_head: int,
        messages: Sequence[NewMessage],
        *,
        metadata: bytes | None = None,
        create: bool = False,
    ) -> SessionRecord:
        """Append at ``expected_head`` (and optionally set metadata) in one transaction.

        ``ConflictError`` with ``current`` = the actual head when another writer appended first;
        ``NotFound`` when the session does not exist and ``create`` is false.
        """

    @abc.abstractmethod
    async def read_messages(self, key: str, *, start: int = 0, end: int | None = None) -> list[MessageRecord]:
        """Live (not archived) messages with ``start <= seq < end``, in sequence order."""

    @abc.abstractmethod
    async def tail_messages(self, key: str, n: int) -> list[MessageRecord]:
        """The last ``n`` live messages, in sequence order."""

    @abc.abstractmethod
    async def archive_messages(
        self,
        key: str,
        *,
        compression_id: str,
        upto_seq: int,
        summary: str,
        expected_consolidated: int,
    ) -> SessionRecord:
        """Move live messages ``[last_consolidated, upto_seq)`` into the archive under ``compression_id``
        and set ``last_consolidated = upto_seq``, in one transaction (``ConflictError`` if
        ``last_consolidated`` is not ``expected_consolidated``)."""

    @abc.abstractmethod
    async def read_archive(self, key: str, *, compression_id: str | None = None) -> list[ArchivedMessage]:
        """Archived messages in sequence order (all compressions, or one)."""

    @abc.abstractmethod
    async def read_summaries(self, key: str) -> list[tuple[str, int, int, str]]:
        """``(compression_id, first_seq, last_seq, summary)`` per compression, in order."""


class StorageBackend(LifecycleBackend, SessionBackend, abc.ABC):
    """Everything a store needs from storage. Other state kinds add their ABCs here as they land."""

    async def __aenter__(self) -> StorageBackend:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
