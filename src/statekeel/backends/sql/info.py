"""Counts of every state kind for ``store.info()``, shared by the SQL dialects.

Each count is one named query over an indexed column, all read on one snapshot, so ``info()`` stays cheap
on a store of millions of rows.
"""

from __future__ import annotations

import datetime as dt

from ..base import (
    SESSION_STATUSES,
    TASK_STATUSES,
    WORKFLOW_STATUSES,
    LifecycleBackend,
    StateCounts,
)
from . import SqlBackend, Tx, utcnow


async def _by_status(tx: Tx, query: str, statuses: tuple[str, ...]) -> dict[str, int]:
    counts = dict.fromkeys(statuses, 0)
    for row in await tx.fetchall(query):
        counts[row["status"]] = int(row["n"])
    return counts


async def op_count_state(tx: Tx, now: dt.datetime) -> StateCounts:
    pending = await tx.fetchone("info_approvals_pending", tx.ts_in(now))
    audit = await tx.fetchone("info_audit_entries")
    memories = await tx.fetchone("info_memories_live")
    contradictions = await tx.fetchone("info_contradictions_open")
    files = await tx.fetchone("info_file_changes")
    threads = await tx.fetchone("info_checkpoint_threads")
    checkpoints = await tx.fetchone("info_checkpoints")
    # An aggregate always returns one row.
    assert pending is not None and audit is not None
    assert memories is not None and contradictions is not None and files is not None
    assert threads is not None and checkpoints is not None
    return StateCounts(
        sessions=await _by_status(tx, "info_sessions_by_status", SESSION_STATUSES),
        tasks=await _by_status(tx, "info_tasks_by_status", TASK_STATUSES),
        workflows=await _by_status(tx, "info_workflows_by_status", WORKFLOW_STATUSES),
        approvals_pending=int(pending["n"]),
        audit_entries=int(audit["n"]),
        memories=int(memories["n"]),
        contradictions_open=int(contradictions["n"]),
        file_changes=int(files["n"]),
        checkpoint_threads=int(threads["n"]),
        checkpoints=int(checkpoints["n"]),
    )


class SqlInfo(SqlBackend, LifecycleBackend):
    """The counting half of the lifecycle contract over the shared operation above."""

    async def count_state(self) -> StateCounts:
        return await self._read(op_count_state, utcnow())
