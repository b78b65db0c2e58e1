"""Store-wide facts and operations: migrations, counts, incidents, damage, copy and retention."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CopyBackend",
    "CopyTableInfo",
    "Damage",
    "DatabaseFiles",
    "FreeSpace",
    "Incident",
    "IncidentBackend",
    "LifecycleBackend",
    "MigrationInfo",
    "Page",
    "PurgeBatch",
    "RetentionBackend",
    "RowPage",
    "StateCounts",
    "every_item",
]


@dataclass(frozen=True, slots=True)
class MigrationInfo:
    """One applied migration as recorded in ``schema_migrations``."""

    version: int
    name: str
    checksum: str
    applied_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[Any] = field(default_factory=list)
    next_cursor: str | None = None


async def every_item(fetch: Callable[[str | None], Awaitable[Page]]) -> AsyncIterator[Any]:
    """Each item of a cursor-paginated listing: ``fetch(cursor)`` returns one page, from ``None`` on."""
    cursor: str | None = None
    while True:
        page = await fetch(cursor)
        for item in page.items:
            yield item
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


@dataclass(frozen=True, slots=True)
class RowPage:
    """One page of verbatim rows of a table, in primary-key order; ``last_key`` is the last row's key."""

    rows: list[tuple[Any, ...]]
    last_key: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True)
class CopyTableInfo:
    """A table ``copy_store`` moves: its primary key, the self-references set in a second pass
    (``links``), whether its rows can never be deleted (``append_only``), and the positions in an
    exported row of its JSON columns (``json_columns``: equal by value, their text differs by backend);
    ``columns`` names every column of an exported row, in order, with its portable kind (text, int,
    float, json, ts, bool, bytes)."""

    name: str
    key: tuple[str, ...]
    links: tuple[str, ...] = ()
    append_only: bool = False
    json_columns: tuple[int, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class StateCounts:
    """How much state a store holds, read on one snapshot by COUNTs over indexed columns.

    ``sessions``, ``tasks`` and ``workflows`` map every status to its count (0 included).
    ``approvals_pending`` counts undecided, unexpired approvals (what ``approvals.pending()`` lists);
    ``audit_entries`` is the audit head's sequence number: entries are numbered from 1 and never deleted.
    ``memories`` counts live memories (neither forgotten nor superseded), ``contradictions_open`` the
    unresolved contradictions, ``file_changes`` the records of the file ledger; ``checkpoint_threads`` and
    ``checkpoints`` the LangGraph threads (``StatekeelSaver``) and their checkpoints, every namespace.
    """

    sessions: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    workflows: dict[str, int] = field(default_factory=dict)
    approvals_pending: int = 0
    audit_entries: int = 0
    memories: int = 0  # live: neither forgotten nor superseded
    contradictions_open: int = 0
    file_changes: int = 0
    checkpoint_threads: int = 0
    checkpoints: int = 0


@dataclass(frozen=True, slots=True)
class DatabaseFiles:
    """The files an embedded store lives in: the database and its write-ahead log, in bytes."""

    path: str
    database_bytes: int
    wal_bytes: int


@dataclass(frozen=True, slots=True)
class Incident:
    """Damage statekeel found in its own storage, kept until someone acknowledges it.

    ``kind`` is e.g. ``"wal_lost"`` (a SQLite WAL file was deleted before its commits reached the database
    file: acknowledged writes are gone); ``detail`` says what was found and what to do.
    """

    id: int
    kind: str
    detected_at: dt.datetime
    detail: dict[str, Any]
    acknowledged_at: dt.datetime | None = None
    acknowledged_by: str | None = None


@dataclass(frozen=True, slots=True)
class Damage:
    """What a damaged table still holds (SQLite: pages the integrity check found damaged).

    ``index_only``: every row reads, only an index is damaged (rebuilding it loses nothing). Otherwise
    ``unreadable`` lists the primary keys of rows that cannot be read (a message as ``(session_key, seq)``,
    a task as ``(id,)``; a group whose rows cannot be told apart as its first key column alone), and
    ``complete`` is False when some unreadable rows could not be named. ``readable`` counts the rows that
    still read; ``detail`` is what the integrity check said.
    """

    table: str
    index_only: bool
    unreadable: tuple[tuple[Any, ...], ...]
    readable: int
    complete: bool
    detail: str


@dataclass(frozen=True, slots=True)
class PurgeBatch:
    """What one purge transaction deleted (or, in a dry run, would delete), by kind; ``after`` is where the
    next batch starts (None when this one was the last); ``seconds`` is how long it held the transaction;
    ``purged`` names the rows of the batch's kind it deleted that later batches must know of."""

    counts: dict[str, int]
    after: tuple[Any, ...] | None
    seconds: float
    purged: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()  # tasks: the parents of those purged, which may be free to go now


@dataclass(frozen=True, slots=True)
class FreeSpace:
    """Unused space inside an embedded database file: free pages and their size, and whether the file
    gives them back by itself after a purge (``incremental``: SQLite's ``auto_vacuum=INCREMENTAL``)."""

    free_pages: int
    page_size: int
    incremental: bool

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_size


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
    def in_atomic(self) -> bool:
        """True when the calling task is inside this backend's ``atomic()`` block."""

    @abc.abstractmethod
    def on_block_end(self, callback: Callable[[bool], None]) -> bool:
        """Inside an ``atomic()`` block of the current task: call ``callback(committed)`` once the
        outermost block has ended, ``committed`` being True only when its COMMIT succeeded, and return
        True. Outside one, return False: a write that returned there is committed already.

        Callbacks run in registration order after a commit, in reverse order after a rollback (undo
        first what was done last); they must not block nor raise.
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

    @abc.abstractmethod
    async def pending_migrations(self) -> list[tuple[int, str]]:
        """``(version, name)`` of the migrations this code ships that the database has not applied."""

    @abc.abstractmethod
    async def count_state(self) -> StateCounts:
        """Rows per state kind and status, on one snapshot, from COUNTs over indexed columns."""

    async def scan_damage(self) -> list[Damage]:
        """The tables whose pages are damaged, with the keys of the rows that no longer read (run when the
        integrity check found problems; reads only). Empty where the engine checks its own pages."""
        return []

    async def rebuild_indexes(self, tables: Sequence[str]) -> str | None:
        """Rebuild the indexes of ``tables`` from their rows (a damaged index loses no data). Returns None
        when rebuilt in place; the path of a rebuilt copy of the database when the damaged pages could
        not be replaced in place (a person swaps it in with the agents stopped)."""
        return None

    async def database_files(self) -> DatabaseFiles | None:
        """The sizes of the files the store lives in; None when it has none of its own (in memory, or
        on a database server)."""
        return None


class IncidentBackend(abc.ABC):
    """Damage statekeel found in its own storage (see :class:`Incident`)."""

    @abc.abstractmethod
    async def record_incident(self, kind: str, detail: bytes) -> Incident:
        """Record an incident (``detail``: codec-encoded JSON object)."""

    @abc.abstractmethod
    async def list_incidents(self, *, include_acknowledged: bool = False) -> list[Incident]:
        """Incidents oldest first: those not acknowledged yet, or all of them."""

    @abc.abstractmethod
    async def acknowledge_incident(self, incident_id: int, by: str) -> Incident | None:
        """Mark an incident acknowledged by ``by``; None when there is no such unacknowledged incident."""


class CopyBackend(abc.ABC):
    """Verbatim table access for ``statekeel.copy_store``: moving a whole store to another backend.

    Not for applications: rows bypass every state rule. Rows are portable between backends (aware UTC
    datetimes, JSON columns as JSON text) and pages follow the primary key in byte order on every
    backend, so a destination filled page by page holds a prefix of its source.
    """

    @abc.abstractmethod
    async def copy_tables(self) -> list[CopyTableInfo]:
        """The copyable tables that exist in this store, parents before children."""

    @abc.abstractmethod
    async def count_rows(self, table: str) -> int: ...

    @abc.abstractmethod
    async def export_rows(
        self, table: str, *, after: Sequence[Any] | None = None, limit: int = 1000
    ) -> RowPage:
        """Up to ``limit`` rows whose key is after ``after`` (from the start when None), in key order."""

    @abc.abstractmethod
    async def last_key(self, table: str) -> tuple[Any, ...] | None:
        """The greatest primary key of ``table``, or None when it is empty."""

    @abc.abstractmethod
    async def import_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> int:
        """Insert rows as exported, verbatim, in one transaction; returns how many. The table's ``links``
        columns are left empty: they may point at rows not copied yet (see :meth:`link_rows`)."""

    @abc.abstractmethod
    async def link_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> int:
        """Second pass over rows as exported: set their ``links`` columns; returns how many rows."""

    @abc.abstractmethod
    async def clear_rows(self, table: str) -> int:
        """Delete every row of ``table`` (children cascade); returns how many."""

    async def store_identity(self) -> str | None:
        """A name of the physical database, equal for two stores open on the same one whatever their
        URLs; None when there is none (an in-memory store). ``copy_store`` refuses to copy onto itself."""
        return None


class RetentionBackend(abc.ABC):
    """Deleting what retention allows, one short transaction per batch, never a protected row.

    Each method handles one batch: up to ``limit`` candidates in key order after ``after``; with
    ``dry_run`` nothing is deleted and the counts are what a real batch would delete.
    """

    @abc.abstractmethod
    async def purge_traces(self, before: dt.datetime, *, limit: int, dry_run: bool) -> PurgeBatch:
        """Spans started before ``before`` (a dry run counts them all at once)."""

    @abc.abstractmethod
    async def purge_sessions(
        self, before: dt.datetime, *, limit: int, after: tuple[Any, ...] | None, dry_run: bool
    ) -> PurgeBatch:
        """Archived sessions last updated before ``before``, with their messages and archive, and the file
        ledger records only they made (each path's last record is kept)."""

    @abc.abstractmethod
    async def purge_workflows(
        self, before: dt.datetime, *, limit: int, after: tuple[Any, ...] | None, dry_run: bool
    ) -> PurgeBatch:
        """Finished workflows completed before ``before`` whose tasks are all finished and have no child
        task outside the workflow, with their tasks and steps. ``purged``: the tasks' ids."""

    @abc.abstractmethod
    async def purge_tasks(
        self,
        before: dt.datetime,
        *,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
        doomed: AbstractSet[str] = frozenset(),
        ids: Sequence[str] | None = None,
    ) -> PurgeBatch:
        """Finished tasks outside workflows completed before ``before`` whose child tasks are all gone (or
        in ``doomed``: purged earlier in this purge), with their steps and their file ledger records (each
        path's last record is kept). With ``ids``, only those tasks (parents freed by a batch).
        ``purged``: their ids; ``parents``: the parents of those, which may be free to go now."""

    @abc.abstractmethod
    async def purge_memories(
        self,
        forgotten_before: dt.datetime | None,
        expired_before: dt.datetime | None,
        *,
        expired: bool,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
    ) -> PurgeBatch:
        """Memories forgotten before ``forgotten_before`` (or, with ``expired``, expired before
        ``expired_before`` and not already among the former) that no open contradiction names, with their
        history, access log entries and vectors. ``purged``: their ids."""

    @abc.abstractmethod
    async def purge_vector_sources(
        self,
        before: dt.datetime,
        *,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
        doomed: AbstractSet[str] = frozenset(),
    ) -> PurgeBatch:
        """Sources marked gone before ``before``, with their vectors (those in ``doomed`` were counted
        already)."""

    def batch_pause(self, held: float) -> float:
        """Seconds to leave the write lock free after a batch that held it ``held`` seconds, so that other
        processes' writers get it (0 where writers do not share one lock)."""
        return 0.0

    async def free_space(self) -> FreeSpace | None:
        """Free pages inside the database file; None when the store has no file of its own."""
        return None

    async def reclaim_space(self, max_pages: int) -> int:
        """Give up to ``max_pages`` free pages back to the file system in one short transaction (only where
        the file allows it: ``FreeSpace.incremental``); returns how many."""
        return 0

    async def shrink_log(self, *, wait: float = 0.0) -> bool:
        """Copy a write-ahead log into the database file and truncate it (SQLite: a TRUNCATE checkpoint),
        giving back the space a large purge grew and the old page images a delete left in the log; tried
        again for up to ``wait`` seconds while a reader's snapshot holds it up. Whether it finished (True
        where there is no log)."""
        return True

    async def vacuum(self) -> FreeSpace | None:
        """Rewrite the database file without its free pages (SQLite ``VACUUM``; it holds the write lock
        throughout) and let later purges give space back by themselves. None where there is no file."""
        return None


@dataclass(frozen=True, slots=True)
class ErasureBatch:
    """What one erasure transaction deleted (or, in a dry run, would delete), by kind; ``after`` is where
    the next batch of a paged kind starts (None when this one was the last); ``seconds`` is how long it
    held the transaction; ``keys`` are the sessions a session batch deleted (with the forks it found in
    its transaction, which the listing before it may not have held)."""

    counts: dict[str, int]
    after: Any = None
    seconds: float = 0.0
    keys: tuple[str, ...] = ()


class ErasureBackend(abc.ABC):
    """Deleting everything about one subject (``store.erase``), in short transactions.

    A session is the subject's when its key is the subject or its metadata's ``"subject"`` is, or when it
    is a fork (or a fork of a fork) of such a session; a memory when its scope is; a graph relation when
    the subject is one of its two entities. Every delete checks again, in its own statement, what made its
    row the subject's. With ``dry_run`` nothing is deleted and the counts are what a real batch would
    delete.
    """

    @abc.abstractmethod
    async def erasure_sessions(self, subject: str, *, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` keys of the subject's sessions and their forks after ``after``, in key order
        (reads only)."""

    @abc.abstractmethod
    async def erase_sessions(
        self, subject: str, keys: Sequence[str], *, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        """Delete the sessions ``keys`` that still are the subject's and their forks (listed again in the
        transaction and deleted first, deepest first: a fork made since ``erasure_sessions`` goes too), in
        one transaction, with their messages, summaries, archive, tool-call journal, episodes (and their
        vectors), file ledger records, the spans of the trace named after them, the LangGraph checkpoints
        of the thread named after them, the vectors of a source named after them, and their lease rows
        nobody holds (``leases_held`` counts those kept because a live process holds them)."""

    @abc.abstractmethod
    async def erasure_spans(
        self, subject: str, keys: Sequence[str], *, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str]]:
        """Up to ``limit`` (trace_id, span_id) of spans whose attributes' ``subject`` is the subject or
        whose ``session_key`` / ``session.id`` is one of ``keys``, after ``after`` (reads only)."""

    @abc.abstractmethod
    async def erase_spans(
        self, subject: str, keys: Sequence[str], spans: Sequence[tuple[str, str]], *, dry_run: bool
    ) -> ErasureBatch:
        """Delete those spans that still name the subject or one of ``keys``, in one transaction."""

    @abc.abstractmethod
    async def erase_memories(
        self, subject: str, *, after: str | None, limit: int, now: dt.datetime, dry_run: bool
    ) -> ErasureBatch:
        """Delete up to ``limit`` memories of scope ``subject`` (ids after ``after``) with their history,
        access log, contradictions (open ones are resolved as ``"erased"`` first), the relations they
        produced and their vectors, in one transaction."""

    @abc.abstractmethod
    async def erase_relations(
        self, subject: str, *, after: str | None, limit: int, dry_run: bool
    ) -> ErasureBatch:
        """Delete up to ``limit`` graph relations whose subject or object is ``subject``."""

    @abc.abstractmethod
    async def erase_episodes(
        self, subject: str, keys: Sequence[str], *, after: str | None, limit: int, dry_run: bool
    ) -> ErasureBatch:
        """Delete up to ``limit`` episodes that name ``subject`` among their entities (not those of the
        sessions ``keys``: they go with their session), with their vectors."""
