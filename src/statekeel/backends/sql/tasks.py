"""Tasks, leases and the step journal: the operations every SQL dialect shares.

The state machine lives in ``statekeel.tasks``; here each write is one statement whose WHERE clause carries
its condition (expected status and version, lease owner and epoch), so a lost update cannot happen.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ...errors import LeaseLost, NotFound
from ...validation import check_str
from ..base import AuditNotes, NewTask, Page, StepRecord, TaskBackend, TaskChange, TaskRecord
from . import Row, SqlBackend, Tx, utcnow
from .audit import audited
from .sessions import decode_cursor, encode_cursor

# Listing starts after this (created_at, id): before any task.
_LIST_START = (dt.datetime(1970, 1, 1, tzinfo=dt.UTC), "")


def _json_or_none(tx: Tx, value: Any) -> Any:
    return None if value is None else tx.json_out(value)


def ts_or_none(tx: Tx, value: Any) -> dt.datetime | None:
    """A nullable timestamp column as an aware datetime or None (shared with workflows and approvals)."""
    return None if value is None else tx.ts_out(value)


def ts_in_or_none(tx: Tx, value: dt.datetime | None) -> Any:
    """A datetime or None as the dialect stores a nullable timestamp."""
    return None if value is None else tx.ts_in(value)


def task_from_row(tx: Tx, row: Row) -> TaskRecord:
    return TaskRecord(
        id=row["id"],
        workflow_id=row["workflow_id"],
        parent_task_id=row["parent_task_id"],
        title=row["title"],
        description=row["description"],
        status=row["status"],
        priority=row["priority"],
        result=_json_or_none(tx, row["result"]),
        error=_json_or_none(tx, row["error"]),
        retry_count=row["retry_count"],
        max_retries=row["max_retries"],
        metadata=tx.json_out(row["metadata"]),
        version=row["version"],
        lease_owner=row["lease_owner"],
        lease_expires_at=ts_or_none(tx, row["lease_expires_at"]),
        lease_epoch=row["lease_epoch"],
        idempotency_key=row["idempotency_key"],
        created_at=tx.ts_out(row["created_at"]),
        updated_at=tx.ts_out(row["updated_at"]),
        started_at=ts_or_none(tx, row["started_at"]),
        completed_at=ts_or_none(tx, row["completed_at"]),
        transition_id=row["transition_id"],
        not_before=ts_or_none(tx, row["not_before"]),
    )


def step_from_row(tx: Tx, row: Row) -> StepRecord:
    result = row["result"]
    return StepRecord(
        task_id=row["task_id"],
        step_key=row["step_key"],
        status=row["status"],
        attempt=row["attempt"],
        result=None if result is None else tx.sealed_out(result, "step", row["task_id"], row["step_key"]),
        error=_json_or_none(tx, row["error"]),
        started_at=tx.ts_out(row["started_at"]),
        finished_at=ts_or_none(tx, row["finished_at"]),
    )


async def insert_task(tx: Tx, task: NewTask, now: dt.datetime) -> tuple[TaskRecord, bool]:
    """Insert ``task`` (or find the one holding its idempotency key). Shared with workflow creation."""
    if task.workflow_id is not None and await tx.fetchone("workflow_exists", task.workflow_id) is None:
        raise NotFound(f"workflow {task.workflow_id!r} does not exist", workflow_id=task.workflow_id)
    if task.parent_task_id is not None and await tx.fetchone("task_get", task.parent_task_id) is None:
        raise NotFound(f"parent task {task.parent_task_id!r} does not exist", task_id=task.parent_task_id)
    row = await tx.fetchone(
        "task_insert",
        task.id,
        task.workflow_id,
        task.parent_task_id,
        task.title,
        task.description,
        task.status,
        task.priority,
        task.max_retries,
        tx.json_in(task.metadata),
        task.idempotency_key,
        tx.ts_in(now),
        ts_in_or_none(tx, task.not_before),
    )
    if row is not None:
        return task_from_row(tx, row), True
    existing = await tx.fetchone("task_by_idempotency_key", task.idempotency_key)
    if existing is None:  # the conflicting row was deleted meanwhile: nothing to return, let them retry
        raise NotFound(
            f"the task holding idempotency key {task.idempotency_key!r} vanished while creating; retry",
            idempotency_key=task.idempotency_key,
        )
    return task_from_row(tx, existing), False


async def op_create_task(tx: Tx, task: NewTask) -> tuple[TaskRecord, bool]:
    return await insert_task(tx, task, utcnow())


async def op_get_task(tx: Tx, task_id: str) -> TaskRecord | None:
    row = await tx.fetchone("task_get", task_id)
    return None if row is None else task_from_row(tx, row)


async def op_list_tasks(
    tx: Tx, workflow_id: str | None, status: str | None, limit: int, cursor: str | None
) -> Page:
    after, after_id = _LIST_START if cursor is None else decode_cursor(cursor)
    rows = await tx.fetchall("task_list", workflow_id, status, tx.ts_in(after), after_id, limit + 1)
    items = [task_from_row(tx, r) for r in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = items[-1]
        next_cursor = encode_cursor(last.created_at, last.id)
    return Page(items=items, next_cursor=next_cursor)


async def op_update_task(
    tx: Tx,
    task_id: str,
    expected_status: str,
    expected_version: int,
    change: TaskChange,
    lease_valid_at: dt.datetime | None,
) -> TaskRecord | None:
    row = await tx.fetchone(
        "task_update",
        change.status,
        change.retry_count,
        ts_in_or_none(tx, change.lease_expires_at),
        ts_in_or_none(tx, change.started_at),
        ts_in_or_none(tx, change.completed_at),
        None if change.result is None else tx.json_in(change.result),
        None if change.error is None else tx.json_in(change.error),
        tx.ts_in(utcnow()),
        task_id,
        expected_status,
        expected_version,
        ts_in_or_none(tx, lease_valid_at),
        change.transition_id,
        ts_in_or_none(tx, change.not_before),
    )
    return None if row is None else task_from_row(tx, row)


async def op_claim_task(
    tx: Tx, worker_id: str, lease_expires_at: dt.datetime, workflow_id: str | None, at: dt.datetime
) -> TaskRecord | None:
    # ``at`` is the claimer's clock: it decides which delayed tasks are due (not_before <= at).
    now = tx.ts_in(at)
    if workflow_id is None:
        row = await tx.fetchone("task_claim", worker_id, tx.ts_in(lease_expires_at), now)
    else:
        row = await tx.fetchone(
            "task_claim_workflow", worker_id, tx.ts_in(lease_expires_at), now, workflow_id
        )
    return None if row is None else task_from_row(tx, row)


async def op_heartbeat_task(
    tx: Tx, task_id: str, worker_id: str, lease_epoch: int, lease_expires_at: dt.datetime, now: dt.datetime
) -> TaskRecord | None:
    row = await tx.fetchone(
        "task_heartbeat", tx.ts_in(lease_expires_at), tx.ts_in(now), task_id, worker_id, lease_epoch
    )
    return None if row is None else task_from_row(tx, row)


async def op_expire_task_leases(tx: Tx, now: dt.datetime) -> list[TaskRecord]:
    rows = await tx.fetchall("task_expire_leases", tx.ts_in(utcnow()), tx.ts_in(now))
    return [task_from_row(tx, r) for r in rows]


async def op_expired_task_leases(tx: Tx, now: dt.datetime) -> list[TaskRecord]:
    return [task_from_row(tx, r) for r in await tx.fetchall("task_expired_leases", tx.ts_in(now))]


async def op_begin_step(
    tx: Tx,
    task_id: str,
    step_key: str,
    rerun_started: bool,
    lease_epoch: int | None,
    at: dt.datetime,
    attempt_id: str | None = None,
) -> tuple[StepRecord, bool, bool]:
    """``(record, run, own)``: ``own`` when the started record found is this very start (``attempt_id``),
    retried after its answer was lost."""
    now = tx.ts_in(at)
    if lease_epoch is not None:
        # PostgreSQL: FOR SHARE holds off a takeover (claim) until this record is committed.
        task = await tx.fetchone("task_fence", task_id, now)
        if task is None:
            raise NotFound(f"task {task_id!r} does not exist", task_id=task_id)
        if task["status"] != "running" or task["lease_epoch"] != lease_epoch or not task["lease_live"]:
            state = "its lease has expired" if task["status"] == "running" else f"it is {task['status']}"
            raise LeaseLost(
                f"task {task_id!r}: {state} (lease epoch {task['lease_epoch']}); a worker at epoch "
                f"{lease_epoch} may not start step {step_key!r}",
                task_id=task_id,
                owner=task["lease_owner"],
                lease_epoch=task["lease_epoch"],
                status=task["status"],
            )
    row = await tx.fetchone("step_get", task_id, step_key)
    if row is None:
        # A fenced start has read the task already (task_fence); only an unfenced one must look.
        if lease_epoch is None and await tx.fetchone("task_get", task_id) is None:
            raise NotFound(f"task {task_id!r} does not exist", task_id=task_id)
        row = await tx.fetchone("step_insert", task_id, step_key, now, attempt_id)
        if row is not None:
            return step_from_row(tx, row), True, False
        # Another runner inserted it between our read and insert (PostgreSQL): judge what it wrote.
        row = await tx.fetchone("step_get", task_id, step_key)
        assert row is not None
    status = row["status"]
    if status == "started" and attempt_id is not None and row["attempt_id"] == attempt_id:
        # This very start, retried after its answer was lost: its function never ran, so it runs now.
        return step_from_row(tx, row), True, True
    if status == "succeeded" or (status == "started" and not rerun_started):
        return step_from_row(tx, row), False, False
    restarted = await tx.fetchone("step_restart", now, task_id, step_key, status, row["attempt"], attempt_id)
    if restarted is None:  # settled or restarted by someone else meanwhile: report what is there now
        current = await tx.fetchone("step_get", task_id, step_key)
        assert current is not None
        return step_from_row(tx, current), False, False
    return step_from_row(tx, restarted), True, False


async def op_finish_step(
    tx: Tx,
    task_id: str,
    step_key: str,
    status: str,
    attempt: int | None,
    result: bytes | None,
    error: bytes | None,
) -> StepRecord | None:
    row = await tx.fetchone(
        "step_finish",
        status,
        None if result is None else tx.sealed_in(result, "step", task_id, step_key),
        None if error is None else tx.json_in(error),
        tx.ts_in(utcnow()),
        task_id,
        step_key,
        attempt,
    )
    return None if row is None else step_from_row(tx, row)


async def op_get_step(tx: Tx, task_id: str, step_key: str) -> StepRecord | None:
    row = await tx.fetchone("step_get", task_id, step_key)
    return None if row is None else step_from_row(tx, row)


async def op_list_steps(tx: Tx, task_id: str) -> list[StepRecord]:
    return [step_from_row(tx, r) for r in await tx.fetchall("step_list", task_id)]


async def op_steps_in_doubt(tx: Tx, now: dt.datetime) -> list[StepRecord]:
    return [step_from_row(tx, r) for r in await tx.fetchall("step_in_doubt", tx.ts_in(now))]


class SqlTasks(SqlBackend, TaskBackend):
    """The task contract over the shared operations above."""

    async def create_task(self, task: NewTask, *, audit: AuditNotes | None = None) -> tuple[TaskRecord, bool]:
        return await self._write(audited(op_create_task, audit, self.audit_key, self.audit_outbox), task)

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._read(op_get_task, task_id)

    async def list_tasks(
        self,
        *,
        workflow_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        return await self._read(op_list_tasks, workflow_id, status, limit, cursor)

    async def update_task(
        self,
        task_id: str,
        *,
        expected_status: str,
        expected_version: int,
        change: TaskChange,
        lease_valid_at: dt.datetime | None = None,
        audit: AuditNotes | None = None,
    ) -> TaskRecord | None:
        return await self._write(
            audited(op_update_task, audit, self.audit_key, self.audit_outbox),
            task_id,
            expected_status,
            expected_version,
            change,
            lease_valid_at,
        )

    async def claim_task(
        self,
        worker_id: str,
        *,
        lease_expires_at: dt.datetime,
        workflow_id: str | None = None,
        audit: AuditNotes | None = None,
        now: dt.datetime | None = None,
    ) -> TaskRecord | None:
        op = audited(op_claim_task, audit, self.audit_key, self.audit_outbox)
        return await self._write(op, worker_id, lease_expires_at, workflow_id, now or utcnow())

    async def heartbeat_task(
        self,
        task_id: str,
        worker_id: str,
        lease_epoch: int,
        *,
        lease_expires_at: dt.datetime,
        now: dt.datetime | None = None,
    ) -> TaskRecord | None:
        return await self._write(
            op_heartbeat_task, task_id, worker_id, lease_epoch, lease_expires_at, now or utcnow()
        )

    async def expire_task_leases(
        self, now: dt.datetime, *, audit: AuditNotes | None = None
    ) -> list[TaskRecord]:
        return await self._write(
            audited(op_expire_task_leases, audit, self.audit_key, self.audit_outbox), now
        )

    async def expired_task_leases(self, now: dt.datetime) -> list[TaskRecord]:
        return await self._read(op_expired_task_leases, now)

    async def begin_step(
        self,
        task_id: str,
        step_key: str,
        *,
        rerun_started: bool,
        lease_epoch: int | None = None,
        now: dt.datetime | None = None,
        audit: AuditNotes | None = None,
        attempt_id: str | None = None,
    ) -> tuple[StepRecord, bool]:
        if attempt_id is not None:
            check_str(attempt_id, "attempt_id")
        # Its own start found again was audited when it was written: no second entry for it.
        notes = None if audit is None else (lambda out: () if out[2] else audit(out[:2]))
        record, run, _ = await self._write(
            audited(op_begin_step, notes, self.audit_key, self.audit_outbox),
            task_id,
            step_key,
            rerun_started,
            lease_epoch,
            now or utcnow(),
            attempt_id,
        )
        return record, run

    async def finish_step(
        self,
        task_id: str,
        step_key: str,
        *,
        status: str,
        attempt: int | None,
        result: bytes | None = None,
        error: bytes | None = None,
        audit: AuditNotes | None = None,
    ) -> StepRecord | None:
        op = audited(op_finish_step, audit, self.audit_key, self.audit_outbox)
        return await self._write(op, task_id, step_key, status, attempt, result, error)

    async def get_step(self, task_id: str, step_key: str) -> StepRecord | None:
        return await self._read(op_get_step, task_id, step_key)

    async def list_steps(self, task_id: str) -> list[StepRecord]:
        return await self._read(op_list_steps, task_id)

    async def steps_in_doubt(self, now: dt.datetime) -> list[StepRecord]:
        return await self._read(op_steps_in_doubt, now)
