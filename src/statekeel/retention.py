"""Retention: ``await store.purge()`` deletes what the store's :class:`Retention` allows, and never more.

    store = await statekeel.open_store(url, retention=statekeel.Retention(traces=dt.timedelta(days=7)))
    report = await store.purge(dry_run=True)     # what a purge would delete, nothing written
    report = await store.purge()                 # PurgeReport: counts per kind, longest batch

What goes, once older than its age (``None`` keeps that kind forever):

- ``traces``: spans started before ``now - traces`` (30 days by default);
- ``tasks``: tasks finished (success, failed, cancelled) before ``now - tasks``, with their steps; a task
  of a workflow only with its workflow, once the workflow finished that long ago and all its tasks are
  finished; a task whose child task stays, stays too;
- ``sessions``: archived sessions last updated before ``now - sessions``, with their messages, summaries
  and archive;
- ``memories``: memories forgotten, or expired, more than ``memories`` ago (the grace period), with their
  history, access log entries and vectors; vectors of any other source gone that long (a memory superseded
  or forgotten, a source given to ``vectors.source_deleted``) go too;
- file ledger records follow their task (or, without a task, their session), except each path's last
  record, which ``files.check`` compares the disk with.

Never: audit entries, approvals (pending or decided), unfinished tasks and the workflows that have one,
sessions that are not archived, memories named by an unresolved contradiction, the history of a memory
that stays, episodes and graph relations (they are memory of their own), the file ledger of tasks that
stay, and session lease rows (their fencing tokens only ever grow).

Each batch (``Retention.batch_size`` candidates) is its own short transaction, so other writers get the
write lock between batches; ``PurgeReport.longest_batch_seconds`` says how long the longest one held it.
On SQLite the freed pages are then given back to the file system a few thousand at a time when the file
was created with ``auto_vacuum=INCREMENTAL`` (every file created by this version); an older file reports
them (``free_pages``) until one ``await store.vacuum()`` (``statekeel gc --vacuum``) rewrites it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from .backends.base import FreeSpace, PurgeBatch, StorageBackend
from .errors import InvalidArgument
from .validation import check_aware, check_bool, check_int

# Free pages given back per transaction (4 KiB pages: 8 MiB).
RECLAIM_PAGES = 2048


def _age(value: Any, what: str) -> dt.timedelta | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidArgument(
            f"Retention.{what} must be a timedelta, a number of seconds or None, got {value!r}", value=value
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(
            f"Retention.{what} must be a finite, non-negative age, got {value!r}; use None to keep forever",
            value=value,
        )
    if isinstance(value, dt.timedelta):
        return value
    try:
        return dt.timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidArgument(
            f"Retention.{what} of {value!r} seconds is longer than a timedelta holds; use None to keep "
            "forever",
            value=value,
        ) from None


@dataclass(frozen=True, slots=True)
class Retention:
    """How long each kind of state is kept once it may go (see the module documentation).

    Ages are ``timedelta`` or seconds; ``None`` keeps that kind forever. Negative, NaN or infinite ages
    raise ``InvalidArgument`` when the Retention is made.
    """

    traces: dt.timedelta | float | None = dt.timedelta(days=30)
    tasks: dt.timedelta | float | None = dt.timedelta(days=90)
    sessions: dt.timedelta | float | None = dt.timedelta(days=90)
    memories: dt.timedelta | float | None = dt.timedelta(days=30)
    batch_size: int = 1000

    def __post_init__(self) -> None:
        for name in ("traces", "tasks", "sessions", "memories"):
            object.__setattr__(self, name, _age(getattr(self, name), name))
        check_int(self.batch_size, "Retention.batch_size", minimum=1)


@dataclass(frozen=True, slots=True)
class PurgeReport:
    """What ``store.purge()`` deleted — or, with ``dry_run``, would delete — per kind.

    ``batches`` counts the transactions, ``longest_batch_seconds`` the longest time one of them held
    (on SQLite: the write lock). ``free_pages`` / ``reclaimed_pages``: on a SQLite file, the unused pages
    left in it and those given back to the file system (None elsewhere).
    """

    now: dt.datetime
    dry_run: bool
    traces: int = 0
    sessions: int = 0
    messages: int = 0
    workflows: int = 0
    tasks: int = 0
    steps: int = 0
    memories: int = 0
    memory_events: int = 0
    memory_accesses: int = 0
    vectors: int = 0
    file_changes: int = 0
    batches: int = 0
    seconds: float = 0.0
    longest_batch_seconds: float = 0.0
    free_pages: int | None = None
    reclaimed_pages: int = 0
    page_size: int | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Rows per kind, the kinds with nothing included."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in _KINDS}

    @property
    def total(self) -> int:
        return sum(self.counts.values())


_KINDS = frozenset(
    ("traces", "sessions", "messages", "workflows", "tasks", "steps", "memories", "memory_events",
     "memory_accesses", "vectors", "file_changes")
)  # fmt: skip


@dataclass(slots=True)
class _Tally:
    backend: StorageBackend
    dry_run: bool
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KINDS, 0))
    batches: int = 0
    longest: float = 0.0
    on_batch: Callable[[dict[str, int]], object] | None = None

    async def add(self, batch: PurgeBatch) -> None:
        for kind, n in batch.counts.items():
            self.counts[kind] += n
        self.batches += 1
        self.longest = max(self.longest, batch.seconds)
        if self.on_batch is not None:
            self.on_batch(dict(self.counts))
        if not self.dry_run and (pause := self.backend.batch_pause(batch.seconds)) > 0:
            await asyncio.sleep(pause)  # other processes' writers take the lock in between


class Purgeable(Protocol):
    """What a purge needs of a store (a :class:`statekeel.Store` has it): its backend."""

    @property
    def backend(self) -> StorageBackend: ...


async def purge(
    store: Purgeable,
    retention: Retention,
    now: dt.datetime | None,
    dry_run: bool,
    on_batch: Callable[[dict[str, int]], object] | None = None,
) -> PurgeReport:
    """See the module documentation; ``Store.purge`` is the public entry."""
    if now is not None:
        check_aware(now, "now")
    check_bool(dry_run, "dry_run")
    if on_batch is not None and not callable(on_batch):
        raise InvalidArgument(f"on_batch must be callable, got {type(on_batch).__name__}")
    when = dt.datetime.now(dt.UTC) if now is None else now
    began = time.perf_counter()
    backend, limit = store.backend, retention.batch_size
    tally = _Tally(backend, dry_run, on_batch=on_batch)

    if retention.traces is not None:
        while True:
            batch = await backend.purge_traces(_before(when, retention.traces), limit=limit, dry_run=dry_run)
            await tally.add(batch)
            if batch.after is None:
                break

    if retention.sessions is not None:
        after: tuple[Any, ...] | None = None
        while True:
            batch = await backend.purge_sessions(
                _before(when, retention.sessions), limit=limit, after=after, dry_run=dry_run
            )
            await tally.add(batch)
            if (after := batch.after) is None:
                break

    if retention.tasks is not None:
        cutoff = _before(when, retention.tasks)
        # Workflows first: the ids of their tasks tell the task pass which children are gone.
        doomed: set[str] = set()
        after = None
        while True:
            batch = await backend.purge_workflows(cutoff, limit=limit, after=after, dry_run=dry_run)
            await tally.add(batch)
            doomed.update(batch.purged)
            if (after := batch.after) is None:
                break
        after = None
        parents: set[str] = set()
        while True:
            batch = await backend.purge_tasks(
                cutoff, limit=limit, after=after, dry_run=dry_run, doomed=doomed
            )
            await tally.add(batch)
            doomed.update(batch.purged)
            parents.update(batch.parents)
            if (after := batch.after) is None:
                break
        # Parents listed before their last child went: each round frees the next generation up.
        while parents := parents - doomed:
            todo = sorted(parents)
            parents = set()
            for i in range(0, len(todo), limit):
                batch = await backend.purge_tasks(
                    cutoff, limit=limit, after=None, dry_run=dry_run, doomed=doomed, ids=todo[i : i + limit]
                )
                await tally.add(batch)
                doomed.update(batch.purged)
                parents.update(batch.parents)

    if retention.memories is not None:
        cutoff = _before(when, retention.memories)
        memories: set[str] = set()
        for expired in (False, True):
            after = None
            while True:
                batch = await backend.purge_memories(
                    cutoff, cutoff, expired=expired, limit=limit, after=after, dry_run=dry_run
                )
                await tally.add(batch)
                memories.update(batch.purged)
                if (after := batch.after) is None:
                    break
        after = None
        while True:
            batch = await backend.purge_vector_sources(
                cutoff, limit=limit, after=after, dry_run=dry_run, doomed=memories
            )
            await tally.add(batch)
            if (after := batch.after) is None:
                break

    space, reclaimed = await _space(store, dry_run, deleted=any(tally.counts.values()))
    return PurgeReport(
        now=when,
        dry_run=dry_run,
        batches=tally.batches,
        seconds=time.perf_counter() - began,
        longest_batch_seconds=tally.longest,
        free_pages=None if space is None else space.free_pages,
        reclaimed_pages=reclaimed,
        page_size=None if space is None else space.page_size,
        **tally.counts,
    )


def _before(now: dt.datetime, age: dt.timedelta | float) -> dt.datetime:
    assert isinstance(age, dt.timedelta)
    try:
        return now - age
    except OverflowError:  # an age longer than the calendar: nothing is that old
        return dt.datetime.min.replace(tzinfo=dt.UTC)


async def _space(store: Purgeable, dry_run: bool, *, deleted: bool) -> tuple[FreeSpace | None, int]:
    """After a purge on a SQLite file: give free pages back (incremental auto-vacuum), then say how many
    are left. A dry run only reports."""
    backend = store.backend
    space = await backend.free_space()
    reclaimed = 0
    if space is not None and space.incremental and not dry_run:
        while True:
            began = time.perf_counter()
            n = await backend.reclaim_space(RECLAIM_PAGES)
            reclaimed += n
            if n < RECLAIM_PAGES:
                break
            await asyncio.sleep(backend.batch_pause(time.perf_counter() - began))
        space = await backend.free_space()
    if deleted and not dry_run:
        await backend.shrink_log()
    return space, reclaimed


__all__ = ["PurgeReport", "Purgeable", "Retention", "purge"]
