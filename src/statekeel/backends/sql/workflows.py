"""Workflows (DAGs of tasks): the operations every SQL dialect shares. The DAG logic is in
``statekeel.workflows``; here a workflow, its steps and their tasks are written and read together."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import orjson

from ..base import NewWorkflowStep, WorkflowBackend, WorkflowRecord, WorkflowStepRecord
from . import Row, SqlBackend, Tx, utcnow
from .tasks import insert_task, task_from_row, ts_in_or_none, ts_or_none


async def _workflow_from_row(tx: Tx, row: Row) -> WorkflowRecord:
    steps = tuple(
        WorkflowStepRecord(
            name=r["step_name"],
            depends_on=tuple(tx.json_out(r["step_depends_on"])),
            task=task_from_row(tx, r),
        )
        for r in await tx.fetchall("workflow_steps", row["id"])
    )
    return WorkflowRecord(
        id=row["id"],
        name=row["name"],
        status=row["status"],
        metadata=tx.json_out(row["metadata"]),
        version=row["version"],
        created_at=tx.ts_out(row["created_at"]),
        updated_at=tx.ts_out(row["updated_at"]),
        started_at=ts_or_none(tx, row["started_at"]),
        completed_at=ts_or_none(tx, row["completed_at"]),
        steps=steps,
    )


async def op_create_workflow(
    tx: Tx, workflow_id: str, name: str, metadata: bytes, steps: Sequence[NewWorkflowStep]
) -> WorkflowRecord:
    now = utcnow()
    row = await tx.fetchone("workflow_insert", workflow_id, name, tx.json_in(metadata), tx.ts_in(now))
    assert row is not None
    for position, step in enumerate(steps):
        # One microsecond apart: among equal priorities, steps are claimed in the order they were given.
        await insert_task(tx, step.task, now + dt.timedelta(microseconds=position))
        await tx.execute(
            "workflow_step_insert",
            workflow_id,
            step.name,
            position,
            step.task.id,
            tx.json_in(orjson.dumps(list(step.depends_on))),
        )
    return await _workflow_from_row(tx, row)


async def op_get_workflow(tx: Tx, workflow_id: str, lock: bool) -> WorkflowRecord | None:
    row = await tx.fetchone("workflow_get_locked" if lock else "workflow_get", workflow_id)
    return None if row is None else await _workflow_from_row(tx, row)


async def op_list_workflows(tx: Tx, status: str | None, limit: int) -> list[WorkflowRecord]:
    if status is None:
        rows = await tx.fetchall("workflow_list", limit)
    else:
        rows = await tx.fetchall("workflow_list_status", status, limit)
    return [await _workflow_from_row(tx, r) for r in rows]


async def op_update_workflow(
    tx: Tx,
    workflow_id: str,
    expected_status: str,
    expected_version: int,
    status: str,
    started_at: dt.datetime | None,
    completed_at: dt.datetime | None,
) -> WorkflowRecord | None:
    row = await tx.fetchone(
        "workflow_update",
        status,
        ts_in_or_none(tx, started_at),
        ts_in_or_none(tx, completed_at),
        tx.ts_in(utcnow()),
        workflow_id,
        expected_status,
        expected_version,
    )
    return None if row is None else await _workflow_from_row(tx, row)


class SqlWorkflows(SqlBackend, WorkflowBackend):
    """The workflow contract over the shared operations above."""

    async def create_workflow(
        self, workflow_id: str, name: str, metadata: bytes, steps: Sequence[NewWorkflowStep]
    ) -> WorkflowRecord:
        return await self._write(op_create_workflow, workflow_id, name, metadata, steps)

    async def get_workflow(self, workflow_id: str, *, lock: bool = False) -> WorkflowRecord | None:
        if lock:
            return await self._write(op_get_workflow, workflow_id, True)
        return await self._read(op_get_workflow, workflow_id, False)

    async def list_workflows(self, *, status: str | None = None, limit: int = 100) -> list[WorkflowRecord]:
        return await self._read(op_list_workflows, status, limit)

    async def update_workflow(
        self,
        workflow_id: str,
        *,
        expected_status: str,
        expected_version: int,
        status: str,
        started_at: dt.datetime | None,
        completed_at: dt.datetime | None,
    ) -> WorkflowRecord | None:
        return await self._write(
            op_update_workflow,
            workflow_id,
            expected_status,
            expected_version,
            status,
            started_at,
            completed_at,
        )
