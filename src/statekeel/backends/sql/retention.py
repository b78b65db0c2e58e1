"""Retention: the deleting every SQL dialect shares, one short transaction per batch.

Each batch reads up to ``limit`` candidates from an index, oldest first, after the previous batch's last
key. The candidate read locks nothing, so another writer may change a candidate before it goes (a memory
put again, a session reopened, a task retried, a vector source announced again). Each candidate is
therefore first locked with the very check that chose it (``purge_*_lock``: ``FOR UPDATE`` on
PostgreSQL; on SQLite the writer already holds the write lock for the whole batch): a row that no longer
matches is left alone with everything that depends on it, and a row that matches cannot change until the
batch commits. Only then are the protections checked (an unfinished task, a child task that stays, an
open contradiction), the dependents counted, and the row deleted by a statement that states its reason
again; dependent rows the database does not cascade (file ledger records, access log entries, vectors)
go in the same transaction, and only once their parent is known to go. A dry run takes the same path on
one read snapshot and only counts, so both agree on what a purge deletes. Protected rows are never
candidates: audit entries and approvals are not visited at all (their triggers refuse a delete anyway),
sessions only when archived, tasks and workflows only when finished.

File ledger records follow their task (or, without one, their session), except each path's last record,
which ``files.check`` compares the disk with.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from ..base import PurgeBatch, RetentionBackend
from . import SqlBackend, Tx
from .lineage import detach_forks
from .vectors import delete_source_vectors, purge_gone_source

_FIRST = ""  # below every id: a cursor's id part before the first row


def _key(tx: Tx, after: tuple[Any, ...] | None, before: dt.datetime) -> tuple[Any, str]:
    """The (time, id) after which a listing starts: the caller's cursor, or the dawn of time."""
    if after is None:
        return tx.ts_in(dt.datetime(1970, 1, 1, tzinfo=dt.UTC)), _FIRST
    return tx.ts_in(after[0]), after[1]


async def _count(tx: Tx, name: str, *args: Any) -> int:
    row = await tx.fetchone(name, *args)
    assert row is not None  # an aggregate always returns one row
    return int(row["n"])


def _next(tx: Tx, rows: list[Any], limit: int, column: str, key: str) -> tuple[Any, ...] | None:
    if len(rows) < limit:
        return None
    return (tx.ts_out(rows[-1][column]), rows[-1][key])


async def op_purge_traces(tx: Tx, before: dt.datetime, limit: int, dry_run: bool) -> PurgeBatch:
    began = time.perf_counter()
    if dry_run:
        n = await _count(tx, "purge_traces_count", tx.ts_in(before))
        return PurgeBatch({"traces": n}, None, time.perf_counter() - began)
    n = await tx.execute("purge_traces_delete", tx.ts_in(before), limit)
    return PurgeBatch({"traces": n}, None if n < limit else (), time.perf_counter() - began)


async def _file_records(tx: Tx, query: str, owner: str, dry_run: bool) -> int:
    return await _count(tx, f"{query}_count", owner) if dry_run else await tx.execute(query, owner)


async def _holds(tx: Tx, lock: str, dry_run: bool, *args: Any) -> bool:
    """Lock a candidate with the check that chose it; False once it no longer matches (it stays). A dry
    run reads one snapshot, on which the candidate read is the check, and locks nothing."""
    return dry_run or await tx.fetchone(lock, *args) is not None


async def op_purge_sessions(
    tx: Tx, before: dt.datetime, limit: int, after: tuple[Any, ...] | None, dry_run: bool
) -> PurgeBatch:
    began = time.perf_counter()
    cutoff = tx.ts_in(before)
    rows = await tx.fetchall("purge_sessions_candidates", cutoff, *_key(tx, after, before), limit)
    counts = {"sessions": 0, "messages": 0, "file_changes": 0}
    for row in rows:
        key = row["key"]
        if not await _holds(tx, "purge_session_lock", dry_run, key, cutoff):
            continue  # reopened (or written) since it was listed: it stays, with its file records
        messages = await _count(tx, "purge_session_messages_count", key)
        if not dry_run:
            await detach_forks(tx, key)  # its forks keep their whole history (docs/branches.md)
        if not dry_run and not await tx.execute("purge_session_delete", key, cutoff):
            continue  # (cannot happen under the lock) its file records stay with it
        files = await _file_records(tx, "purge_session_files", key, dry_run)
        counts["sessions"] += 1
        counts["messages"] += messages
        counts["file_changes"] += files
    return PurgeBatch(counts, _next(tx, rows, limit, "updated_at", "key"), time.perf_counter() - began)


async def op_purge_workflows(
    tx: Tx, before: dt.datetime, limit: int, after: tuple[Any, ...] | None, dry_run: bool
) -> PurgeBatch:
    began = time.perf_counter()
    cutoff = tx.ts_in(before)
    rows = await tx.fetchall("purge_workflows_candidates", cutoff, *_key(tx, after, before), limit)
    counts = {"workflows": 0, "tasks": 0, "steps": 0, "file_changes": 0}
    purged: list[str] = []
    for row in rows:
        wf = row["id"]
        if not await _holds(tx, "purge_workflow_lock", dry_run, wf, cutoff):
            continue
        # Its tasks locked too (id order, as every writer of several tasks takes them): none is retried,
        # and none gets a child, between the checks below and the delete.
        tasks = await tx.fetchall("purge_workflow_task_ids" if dry_run else "purge_workflow_tasks_lock", wf)
        if await _count(tx, "purge_workflow_unfinished_tasks", wf):
            continue
        if await _count(tx, "purge_workflow_outside_children", wf):
            continue
        task_ids = [r["id"] for r in tasks]
        steps = await _count(tx, "purge_workflow_steps_count", wf)
        if dry_run:
            files = await _count(tx, "purge_workflow_files_count", wf)
        else:
            if not await tx.execute("purge_workflow_delete", wf, cutoff):
                continue  # (cannot happen under the lock) its tasks' file records stay
            files = sum([await tx.execute("purge_task_files", task_id) for task_id in task_ids])
        counts["workflows"] += 1
        counts["tasks"] += len(task_ids)
        counts["steps"] += steps
        counts["file_changes"] += files
        purged.extend(task_ids)
    return PurgeBatch(
        counts, _next(tx, rows, limit, "completed_at", "id"), time.perf_counter() - began, tuple(purged)
    )


async def op_purge_tasks(
    tx: Tx,
    before: dt.datetime,
    limit: int,
    after: tuple[Any, ...] | None,
    dry_run: bool,
    doomed: AbstractSet[str],
    ids: Sequence[str] | None,
) -> PurgeBatch:
    began = time.perf_counter()
    cutoff = tx.ts_in(before)
    if ids is None:
        rows = await tx.fetchall("purge_tasks_candidates", cutoff, *_key(tx, after, before), limit)
    else:
        rows = [r for task_id in ids for r in await tx.fetchall("purge_task_candidate", task_id, cutoff)]
    counts = {"tasks": 0, "steps": 0, "file_changes": 0}
    purged: list[str] = []
    parents: set[str] = set()
    for row in rows:
        task_id = row["id"]
        if task_id in doomed or task_id in purged:
            continue  # counted already (a dry run deletes nothing)
        if not await _holds(tx, "purge_task_lock", dry_run, task_id, cutoff):
            continue  # retried (or moved) since it was listed: it stays, with its steps and file records
        # A parent stays while a child does (deleting it would cut the child's link): children go first.
        children = await tx.fetchall("purge_task_children", task_id)
        if any(c["id"] not in doomed and c["id"] not in purged for c in children):
            continue
        steps = await _count(tx, "purge_task_steps_count", task_id)
        if not dry_run and not await tx.execute("purge_task_delete", task_id, cutoff):
            continue  # (a child added meanwhile) its file records stay with it
        files = await _file_records(tx, "purge_task_files", task_id, dry_run)
        counts["tasks"] += 1
        counts["steps"] += steps
        counts["file_changes"] += files
        purged.append(task_id)
        if row["parent_task_id"] is not None:
            parents.add(row["parent_task_id"])
    after_key = _next(tx, rows, limit, "completed_at", "id") if ids is None else None
    return PurgeBatch(
        counts, after_key, time.perf_counter() - began, tuple(purged), tuple(sorted(parents - set(purged)))
    )


async def op_purge_memories(
    tx: Tx,
    forgotten_before: dt.datetime | None,
    expired_before: dt.datetime | None,
    expired: bool,
    limit: int,
    after: tuple[Any, ...] | None,
    dry_run: bool,
) -> PurgeBatch:
    began = time.perf_counter()
    # A bound of the dawn of time matches nothing: that kind of memory is not purged.
    never = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    forgotten = tx.ts_in(forgotten_before or never)
    key = _key(tx, after, never)
    if expired:
        rows = await tx.fetchall(
            "purge_memories_expired", tx.ts_in(expired_before or never), forgotten, *key, limit
        )
        column = "expires_at"
    else:
        rows = await tx.fetchall("purge_memories_forgotten", forgotten, *key, limit)
        column = "deleted_at"
    counts = {"memories": 0, "memory_events": 0, "memory_accesses": 0, "vectors": 0}
    purged: list[str] = []
    expired_cutoff = tx.ts_in(expired_before or never)
    for row in rows:
        memory_id = row["id"]
        if not await _holds(tx, "purge_memory_lock", dry_run, memory_id, forgotten, expired_cutoff):
            continue  # put again (or changed) since it was listed: it stays
        if await _count(tx, "purge_memory_open_contradictions", memory_id):
            continue  # an open contradiction keeps both its memories
        events = await _count(tx, "purge_memory_events_count", memory_id)
        if dry_run:
            accesses = await _count(tx, "purge_memory_accesses_count", memory_id)
        else:
            accesses = await tx.execute("purge_memory_accesses", memory_id)
        vectors = await delete_source_vectors(tx, memory_id, dry_run)
        if not dry_run:
            await tx.execute("purge_memory_delete", memory_id, forgotten, expired_cutoff)
        counts["memories"] += 1
        counts["memory_events"] += events
        counts["memory_accesses"] += accesses
        counts["vectors"] += vectors
        purged.append(memory_id)
    return PurgeBatch(
        counts, _next(tx, rows, limit, column, "id"), time.perf_counter() - began, tuple(purged)
    )


async def op_purge_vector_sources(
    tx: Tx,
    before: dt.datetime,
    limit: int,
    after: tuple[Any, ...] | None,
    dry_run: bool,
    doomed: AbstractSet[str],
) -> PurgeBatch:
    began = time.perf_counter()
    cutoff = tx.ts_in(before)
    rows = await tx.fetchall("purge_vector_sources_gone", cutoff, *_key(tx, after, before), limit)
    counts = {"vectors": 0}
    for row in rows:
        if row["source_id"] in doomed:
            continue  # its memory's purge counted (or deleted) them
        if dry_run:
            counts["vectors"] += await delete_source_vectors(tx, row["source_id"], True)
        else:
            counts["vectors"] += await purge_gone_source(tx, row["source_id"], cutoff)
    return PurgeBatch(counts, _next(tx, rows, limit, "gone_at", "source_id"), time.perf_counter() - began)


class SqlRetention(SqlBackend, RetentionBackend):
    """The retention contract over the shared operations above. Batches go through ``_write_bulk``: on
    SQLite they run on the writer thread, never inline on the event loop's."""

    async def _purge(self, op: Any, dry_run: bool, *args: Any) -> PurgeBatch:
        batch: PurgeBatch = await (self._read(op, *args) if dry_run else self._write_bulk(op, *args))
        return batch

    async def purge_traces(self, before: dt.datetime, *, limit: int, dry_run: bool) -> PurgeBatch:
        return await self._purge(op_purge_traces, dry_run, before, limit, dry_run)

    async def purge_sessions(
        self, before: dt.datetime, *, limit: int, after: tuple[Any, ...] | None, dry_run: bool
    ) -> PurgeBatch:
        return await self._purge(op_purge_sessions, dry_run, before, limit, after, dry_run)

    async def purge_workflows(
        self, before: dt.datetime, *, limit: int, after: tuple[Any, ...] | None, dry_run: bool
    ) -> PurgeBatch:
        return await self._purge(op_purge_workflows, dry_run, before, limit, after, dry_run)

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
        return await self._purge(op_purge_tasks, dry_run, before, limit, after, dry_run, doomed, ids)

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
        return await self._purge(
            op_purge_memories, dry_run, forgotten_before, expired_before, expired, limit, after, dry_run
        )

    async def purge_vector_sources(
        self,
        before: dt.datetime,
        *,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
        doomed: AbstractSet[str] = frozenset(),
    ) -> PurgeBatch:
        return await self._purge(op_purge_vector_sources, dry_run, before, limit, after, dry_run, doomed)
