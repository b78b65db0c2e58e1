"""Tasks, their leases and the step journal; workflows (a DAG of tasks)."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from statekeel.backends.contract.audit import AuditNote
from statekeel.backends.contract.store import Page

__all__ = [
    "STEP_STATUSES",
    "TASK_STATUSES",
    "WORKFLOW_STATUSES",
    "AuditNotes",
    "NewTask",
    "NewWorkflowStep",
    "StepRecord",
    "TaskBackend",
    "TaskChange",
    "TaskRecord",
    "WorkflowBackend",
    "WorkflowRecord",
    "WorkflowStepRecord",
]


TASK_STATUSES = ("pending", "queued", "running", "suspended", "interrupted", "success", "failed", "cancelled")


STEP_STATUSES = ("started", "succeeded", "failed")


WORKFLOW_STATUSES = ("pending", "running", "success", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task's row. ``lease_owner`` is the worker that last claimed it (None once the task re-entered
    running by a transition, without a claim); ``lease_expires_at`` is set only while it runs under a lease;
    ``lease_epoch`` (the fencing token) grows by one at every claim and every other entry into running."""

    id: str
    workflow_id: str | None
    parent_task_id: str | None
    title: str
    description: str | None
    status: str
    priority: int
    result: Any
    error: Any
    retry_count: int
    max_retries: int
    metadata: dict[str, Any]
    version: int
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    lease_epoch: int
    idempotency_key: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    # The id of the transition() that last changed the task (None for other changes until the next
    # transition): a retry of a transition whose answer was lost learns from it that its change landed.
    transition_id: str | None = None
    # The earliest time a claim may take the task while it is queued (None: at once). Set at creation
    # or by a transition back to queued (a delayed retry); kept until another transition to queued sets it.
    not_before: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to insert; ``metadata`` is codec-encoded JSON."""

    id: str
    title: str
    status: str = "pending"
    description: str | None = None
    priority: int = 5
    max_retries: int = 3
    metadata: bytes = b"{}"
    workflow_id: str | None = None
    parent_task_id: str | None = None
    idempotency_key: str | None = None
    not_before: dt.datetime | None = None  # the earliest time a claim may take it (None: at once)


@dataclass(frozen=True, slots=True)
class TaskChange:
    """The new values of a task's mutable fields, written by one conditional update.

    ``result`` and ``error`` are codec-encoded JSON; None keeps the stored value.
    """

    status: str
    retry_count: int
    lease_expires_at: dt.datetime | None
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    result: bytes | None = None
    error: bytes | None = None
    transition_id: str | None = None  # the caller's id for this change (TaskRecord.transition_id)
    not_before: dt.datetime | None = None  # a new earliest claim time; None keeps the stored one


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One entry of a task's step journal. ``attempt`` counts the runs of ``fn`` that were started."""

    task_id: str
    step_key: str
    status: str
    attempt: int
    result: Any
    error: Any
    started_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class NewWorkflowStep:
    """A step of a workflow to create: its name, the names it depends on, and the task it becomes."""

    name: str
    depends_on: tuple[str, ...]
    task: NewTask


@dataclass(frozen=True, slots=True)
class WorkflowStepRecord:
    name: str
    depends_on: tuple[str, ...]
    task: TaskRecord


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A workflow's row with its steps (in creation order), each with its task as stored now."""

    id: str
    name: str
    status: str
    metadata: dict[str, Any]
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    steps: tuple[WorkflowStepRecord, ...] = ()


AuditNotes = Callable[[Any], Sequence[AuditNote]]
"""Given what a change returned, the audit entries to append with it, in the same transaction (after
the change's statements: the audit chain's lock is the last one the transaction takes)."""


class TaskBackend(abc.ABC):
    """Tasks (conditional transitions, leases) and their step journal."""

    @abc.abstractmethod
    async def create_task(self, task: NewTask, *, audit: AuditNotes | None = None) -> tuple[TaskRecord, bool]:
        """Insert a task; with an ``idempotency_key`` already used, return that task instead.

        Returns ``(record, created)``. ``NotFound`` if ``workflow_id`` or ``parent_task_id`` is unknown.
        Every task method that writes takes ``audit``: see :data:`AuditNotes`.
        """

    @abc.abstractmethod
    async def get_task(self, task_id: str) -> TaskRecord | None:
        """The task, or None when the backend says it does not exist."""

    @abc.abstractmethod
    async def list_tasks(
        self,
        *,
        workflow_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Tasks oldest first (by ``created_at``, then id), cursor-paginated."""

    @abc.abstractmethod
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
        """Apply ``change`` with one conditional UPDATE (status and version as expected), bumping the
        version. None when the condition did not hold (or the task does not exist).

        With ``lease_valid_at`` (a fenced caller's clock), also None when the task's lease had expired by
        then: checked in the same statement, whether or not :meth:`expire_task_leases` ran."""

    @abc.abstractmethod
    async def claim_task(
        self,
        worker_id: str,
        *,
        lease_expires_at: dt.datetime,
        workflow_id: str | None = None,
        audit: AuditNotes | None = None,
        now: dt.datetime | None = None,
    ) -> TaskRecord | None:
        """Atomically take the queued task with the highest priority (then the oldest) whose
        ``not_before`` has passed at ``now`` (the caller's clock; the backend's when None), set it
        running under ``worker_id``'s lease and bump ``lease_epoch``. None when no queued task is due."""

    @abc.abstractmethod
    async def heartbeat_task(
        self,
        task_id: str,
        worker_id: str,
        lease_epoch: int,
        *,
        lease_expires_at: dt.datetime,
        now: dt.datetime | None = None,
    ) -> TaskRecord | None:
        """Extend the lease if ``worker_id`` at ``lease_epoch`` still holds the running task and its lease
        has not expired at ``now`` (the caller's clock); else None."""

    @abc.abstractmethod
    async def expire_task_leases(
        self, now: dt.datetime, *, audit: AuditNotes | None = None
    ) -> list[TaskRecord]:
        """Move running tasks whose lease expired before ``now`` to interrupted; return them."""

    @abc.abstractmethod
    async def expired_task_leases(self, now: dt.datetime) -> list[TaskRecord]:
        """Running tasks whose lease expired before ``now`` (what :meth:`expire_task_leases` would move),
        read through the status index; nothing is written."""

    @abc.abstractmethod
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
        """Record that a step starts, in its own transaction. Returns ``(record, run)``.

        ``attempt_id`` (the caller's id for this start) is stored with the started record: a retry of a
        start whose answer was lost, with the same id, finds its own record and gets ``run`` True.

        With ``lease_epoch``, ``LeaseLost`` unless the task is running at that epoch under a lease that has
        not expired at ``now`` (the caller's clock), checked in the same transaction: a worker whose lease
        was taken over or ran out records nothing.

        New step, or one that failed before: recorded *started*, ``run`` is True. Already succeeded:
        ``run`` is False. Found *started* (never finished): restarted (``attempt + 1``) if
        ``rerun_started``, else returned as is with ``run`` False. ``NotFound`` for an unknown task.
        """

    @abc.abstractmethod
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
        """Record the outcome of a *started* step (of that ``attempt``, if given). None when the step is
        no longer started at that attempt (settled or re-run by someone else)."""

    @abc.abstractmethod
    async def get_step(self, task_id: str, step_key: str) -> StepRecord | None: ...

    @abc.abstractmethod
    async def list_steps(self, task_id: str) -> list[StepRecord]:
        """A task's steps in the order they were first started."""

    @abc.abstractmethod
    async def steps_in_doubt(self, now: dt.datetime) -> list[StepRecord]:
        """Steps still *started* whose task is not running under a live lease (their runner is gone)."""


class WorkflowBackend(abc.ABC):
    """Workflows: DAGs of tasks."""

    @abc.abstractmethod
    async def create_workflow(
        self, workflow_id: str, name: str, metadata: bytes, steps: Sequence[NewWorkflowStep]
    ) -> WorkflowRecord:
        """Insert the workflow (pending), its steps and their tasks in one transaction."""

    @abc.abstractmethod
    async def get_workflow(self, workflow_id: str, *, lock: bool = False) -> WorkflowRecord | None:
        """The workflow with its steps. ``lock`` (inside ``atomic()``) serializes concurrent advancers."""

    @abc.abstractmethod
    async def list_workflows(self, *, status: str | None = None, limit: int = 100) -> list[WorkflowRecord]:
        """Workflows oldest first, with their steps."""

    @abc.abstractmethod
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
        """Conditional status change (bumps the version); None when the condition did not hold."""
