"""Memories with their history, episodes, the entity graph, contradictions and the access log;
the file ledger."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from statekeel.backends.contract.store import Page

__all__ = [
    "FILE_ACTIONS",
    "MEMORY_EVENTS",
    "MEMORY_TYPES",
    "Contradiction",
    "Drift",
    "Episode",
    "FileBackend",
    "FileRecord",
    "Memory",
    "MemoryAccess",
    "MemoryBackend",
    "MemoryEvent",
    "MemoryPut",
    "Relation",
]


MEMORY_TYPES = ("user", "environment", "semantic", "episodic", "procedural")


MEMORY_EVENTS = ("ADD", "UPDATE", "DELETE", "SUPERSEDE")


FILE_ACTIONS = ("created", "modified", "deleted")


@dataclass(frozen=True, slots=True)
class Memory:
    """A memory as stored. ``version`` starts at 1 and grows by one at every change (update, forget,
    supersede), and ``updated_at`` moves with it; ``deleted_at`` is set when it was forgotten."""

    id: str
    type: str
    scope: str
    key: str | None
    content: Any
    data: Any
    confidence: float
    source: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    expires_at: dt.datetime | None
    superseded_by: str | None
    deleted_at: dt.datetime | None
    version: int

    @property
    def forgotten(self) -> bool:
        return self.deleted_at is not None

    @property
    def superseded(self) -> bool:
        return self.superseded_by is not None

    def expired(self, now: dt.datetime | None = None) -> bool:
        """True once ``expires_at`` has passed (at ``now``, default the current time)."""
        when = dt.datetime.now(dt.UTC) if now is None else now
        return self.expires_at is not None and self.expires_at <= when


@dataclass(frozen=True, slots=True)
class MemoryPut:
    """A memory to write: ``content`` and ``data`` codec-encoded, ``id`` used only if it is added."""

    id: str
    type: str
    scope: str
    key: str | None
    content: bytes
    data: bytes | None
    confidence: float
    source: str | None
    expires_at: dt.datetime | None
    actor: str | None
    reason: str | None
    at: dt.datetime


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """One change of a memory. ``old`` and ``new`` are its content before and after (None before an
    ADD and after a DELETE); ``before`` and ``after`` hold every field that can change (content, data,
    confidence, source, expires_at, superseded_by, deleted_at). ``version`` is the memory's version
    after the change: a memory's events have versions 1, 2, 3 … without gaps."""

    memory_id: str
    version: int
    event: str
    old: Any
    new: Any
    actor: str | None
    reason: str | None
    at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Episode:
    """What happened in a session, summarised: messages ``first_seq`` (inclusive) to ``upto_seq``.
    ``rewinds`` is the session's rewind count when it was recorded: the seqs are those of that count's
    live transcript, so ``(session_key, rewinds, seq)`` names one message forever (docs/branches.md);
    None when it was recorded before episodes carried it or the session is not in this SQL store."""

    id: str
    session_key: str
    summary: str
    first_seq: int | None
    upto_seq: int | None
    entities: tuple[str, ...]
    importance: float
    created_at: dt.datetime
    rewinds: int | None = None


@dataclass(frozen=True, slots=True)
class Relation:
    """An edge of the memory graph, true from ``valid_from`` until ``valid_to`` (excluded; None: still
    true). ``source_memory_id`` is the memory it was derived from, if any."""

    id: str
    subject: str
    relation: str
    object: str
    weight: float
    valid_from: dt.datetime
    valid_to: dt.datetime | None
    source_memory_id: str | None
    created_at: dt.datetime

    @property
    def obj(self) -> str:
        """The object, under the name ``relate`` takes it by."""
        return self.object

    def valid_at(self, when: dt.datetime) -> bool:
        """Whether the relation held at ``when``: from ``valid_from`` up to (not including) ``valid_to``."""
        return self.valid_from <= when and (self.valid_to is None or when < self.valid_to)


@dataclass(frozen=True, slots=True)
class Contradiction:
    """Two memories that disagree; open until resolved (once) with a resolution text."""

    id: str
    memory_a: str
    memory_b: str
    description: str
    resolution: str | None
    created_at: dt.datetime
    resolved_at: dt.datetime | None

    @property
    def resolved(self) -> bool:
        return self.resolved_at is not None


@dataclass(frozen=True, slots=True)
class MemoryAccess:
    """One read of a memory, from the access log (``id`` identifies the entry)."""

    id: str
    memory_id: str
    at: dt.datetime
    context_query: str | None


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One recorded change of a file. ``path`` is relative and POSIX-normalised; ``seq`` counts the
    records of that path from 1; ``checksum`` is the SHA-256 hex of the content (None for a deletion)."""

    path: str
    seq: int
    checksum: str | None
    size: int | None
    action: str
    task_id: str | None
    session_key: str | None
    recorded_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Drift:
    """A file whose state on disk no longer matches its last record: ``kind`` is "changed" (other
    content, not a regular file, or present although recorded as deleted), "missing" or "unreadable".
    ``checksum`` and ``size`` are those of the file on disk now, when it could be read."""

    path: str
    kind: str
    record: FileRecord
    checksum: str | None = None
    size: int | None = None


class MemoryBackend(abc.ABC):
    """Memories with their history, episodes, the temporal graph, contradictions and the access log."""

    @abc.abstractmethod
    async def put_memory(self, put: MemoryPut) -> tuple[Memory, str | None]:
        """Add a memory, or update the live one with the same (type, scope, key) in place, with its
        history event in the same transaction. Returns the memory and the event written ("ADD",
        "UPDATE"), or None when the stored memory already held exactly these values."""

    @abc.abstractmethod
    async def get_memory(self, memory_id: str) -> Memory | None:
        """The memory whatever its state (forgotten, superseded, expired), or None if unknown."""

    @abc.abstractmethod
    async def query_memories(
        self,
        *,
        type: str | None = None,
        scope: str | None = None,
        key: str | None = None,
        min_confidence: float | None = None,
        include_forgotten: bool = False,
        include_superseded: bool = False,
        live_at: dt.datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        scope_prefix: str | None = None,
    ) -> Page:
        """Memories newest first (by ``updated_at``, then id), cursor-paginated; with ``live_at``,
        those expired by then are left out. ``scope_prefix`` (instead of ``scope``) keeps the memories
        whose scope starts with it, read from the scope index's range of that prefix alone."""

    @abc.abstractmethod
    async def memory_scopes(
        self,
        *,
        prefix: str | None = None,
        type: str | None = None,
        live_at: dt.datetime,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """The distinct scopes (``str`` items) starting with ``prefix`` (all when None) that hold a memory
        neither forgotten, superseded nor expired at ``live_at`` (of ``type`` when given), in code point
        order, cursor-paginated; read from the scope index's range of that prefix alone."""

    @abc.abstractmethod
    async def changed_memories(
        self, *, since: dt.datetime | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        """Every memory (forgotten and superseded too) changed at or after ``since``, oldest change
        first (by ``updated_at``, then id), cursor-paginated."""

    @abc.abstractmethod
    async def forget_memory(
        self, memory_id: str, *, actor: str | None, reason: str | None, at: dt.datetime
    ) -> Memory:
        """Set ``deleted_at`` with a DELETE event. Already forgotten: returned as is, nothing written.
        ``NotFound`` for an unknown id."""

    @abc.abstractmethod
    async def supersede_memory(
        self, old_id: str, new_id: str, *, actor: str | None, reason: str | None, at: dt.datetime
    ) -> Memory:
        """Mark ``old_id`` superseded by ``new_id`` with a SUPERSEDE event; returns the old memory.
        ``NotFound`` for an unknown id, ``InvalidTransition`` unless both are live (superseding again
        by the same memory changes nothing)."""

    @abc.abstractmethod
    async def memory_history(self, memory_id: str) -> list[MemoryEvent]:
        """The memory's events in order. ``NotFound`` for an unknown id."""

    @abc.abstractmethod
    async def add_episode(self, episode: Episode) -> Episode: ...

    @abc.abstractmethod
    async def list_episodes(self, *, session_key: str | None = None, limit: int = 100) -> list[Episode]:
        """Episodes newest first (of one session, or all)."""

    @abc.abstractmethod
    async def add_relation(self, relation: Relation) -> Relation:
        """Insert an edge; ``NotFound`` if its ``source_memory_id`` is unknown."""

    @abc.abstractmethod
    async def end_relation(self, relation_id: str, at: dt.datetime) -> Relation:
        """Set ``valid_to = at``. ``NotFound`` for an unknown id, ``InvalidTransition`` if it already
        ended, ``InvalidArgument`` if ``at`` is before ``valid_from``."""

    @abc.abstractmethod
    async def relations_at(self, entity: str, *, relation: str | None, at: dt.datetime) -> list[Relation]:
        """Edges with ``entity`` as subject or object that were true at ``at``, oldest first."""

    @abc.abstractmethod
    async def add_contradiction(self, contradiction: Contradiction) -> Contradiction:
        """Insert an open contradiction; ``NotFound`` if either memory is unknown."""

    @abc.abstractmethod
    async def resolve_contradiction(
        self, contradiction_id: str, resolution: str, at: dt.datetime
    ) -> Contradiction:
        """Resolve an open contradiction. ``NotFound`` for an unknown id, ``ConflictError`` if it was
        resolved already."""

    @abc.abstractmethod
    async def open_contradictions(self, *, limit: int = 1000) -> list[Contradiction]:
        """Unresolved contradictions, oldest first."""

    @abc.abstractmethod
    async def record_accesses(self, accesses: Sequence[MemoryAccess]) -> int:
        """Append entries to the access log in one transaction; returns how many."""

    @abc.abstractmethod
    async def list_accesses(self, memory_id: str, *, limit: int = 100) -> list[MemoryAccess]:
        """A memory's accesses, newest first."""


class FileBackend(abc.ABC):
    """The file ledger: every recorded change of every file, append-only."""

    @abc.abstractmethod
    async def record_file(
        self,
        path: str,
        *,
        checksum: str | None,
        size: int | None,
        action: str,
        task_id: str | None,
        session_key: str | None,
        at: dt.datetime,
    ) -> FileRecord:
        """Append the next record of ``path`` (``seq`` one more than its last; ``recorded_at`` never
        before the last one's)."""

    @abc.abstractmethod
    async def list_files(
        self,
        *,
        task_id: str | None = None,
        session_key: str | None = None,
        path: str | None = None,
        limit: int | None = None,
    ) -> list[FileRecord]:
        """Records matching every given filter, in the order they were recorded."""

    @abc.abstractmethod
    async def last_file_records(
        self,
        *,
        after_path: str = "",
        limit: int = 1000,
        task_id: str | None = None,
        session_key: str | None = None,
    ) -> list[FileRecord]:
        """The last record of each path after ``after_path`` (in path order), for paths with a record of
        ``task_id`` / ``session_key`` when given."""
