"""Workflows: a DAG of steps, each a task, advanced as dependencies finish.

    wf = await store.workflows.create("release", [
        {"name": "build"},
        {"name": "test", "depends_on": ["build"]},
        {"name": "publish", "depends_on": ["test"], "max_retries": 0},
    ])
    wf = await store.workflows.start(wf.id)       # queues "build"
    ...                                           # workers claim(workflow_id=wf.id) and finish tasks
    wf = await store.workflows.advance(wf.id)     # queues what became ready, settles the workflow

Workflow statuses: pending -> running | cancelled; running -> success | failed | cancelled. ``advance``
queues each pending step whose dependencies all succeeded; requeues a failed step that has retries left;
cancels each pending step whose dependency failed for good or was cancelled; and settles the workflow
(success when every step succeeded, else failed or cancelled once nothing is left to run). Interrupted
steps wait for recovery (or an operator) to requeue them. Each ``advance`` is one transaction that locks
the workflow, so concurrent advancers are serialized, and every task change in it is conditional.
"""

from __future__ import annotations

import builtins
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .backends.base import WORKFLOW_STATUSES, NewWorkflowStep, StorageBackend, TaskRecord, WorkflowRecord
from .codec import Codec
from .errors import ConflictError, InvalidArgument, InvalidTransition, NotFound
from .tasks import TaskManager, created_note, new_task, plan_transition, transition_note
from .validation import check_int, check_key, check_text

Workflow = WorkflowRecord
"""A workflow as stored, with its steps and their tasks: see :class:`WorkflowRecord`."""

WORKFLOW_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"running", "cancelled"}),
    "running": frozenset({"success", "failed", "cancelled"}),
    "success": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}
_ACTIVE = frozenset({"pending", "queued", "running", "suspended", "interrupted"})


@dataclass(frozen=True, slots=True)
class WorkflowStep:
    """One step of a workflow to create; a dict with the same keys works too."""

    name: str
    depends_on: tuple[str, ...] = ()
    title: str | None = None
    description: str | None = None
    priority: int = 5
    max_retries: int = 3
    metadata: dict[str, Any] = field(default_factory=dict)


_STEP_KEYS = frozenset(WorkflowStep.__dataclass_fields__)


def _as_step(index: int, raw: Any) -> WorkflowStep:
    if isinstance(raw, WorkflowStep):
        fields = {name: getattr(raw, name) for name in _STEP_KEYS}
    elif isinstance(raw, Mapping):
        unknown = set(raw) - _STEP_KEYS
        if unknown:
            raise InvalidArgument(
                f"steps[{index}] has unknown keys {sorted(map(str, unknown))}; allowed: {sorted(_STEP_KEYS)}",
                index=index,
            )
        if "name" not in raw:
            raise InvalidArgument(f"steps[{index}] has no name", index=index)
        fields = dict(raw)
    else:
        raise InvalidArgument(
            f"steps[{index}] must be a WorkflowStep or a dict, got {type(raw).__name__}", index=index
        )
    deps = fields.get("depends_on", ())
    if isinstance(deps, (str, bytes)) or not isinstance(deps, Sequence):
        raise InvalidArgument(
            f"steps[{index}].depends_on must be a list of step names, got {deps!r}", index=index
        )
    fields["depends_on"] = tuple(deps)
    if fields.get("metadata") is None:
        fields["metadata"] = {}
    step = WorkflowStep(**fields)
    check_key(step.name, f"steps[{index}].name")
    for dep in step.depends_on:
        check_key(dep, f"steps[{index}].depends_on entry")
    return step


def topological_order(deps: Mapping[str, Sequence[str]]) -> builtins.list[str]:
    """Step names so that each comes after its dependencies (input order kept among independent ones).

    ``InvalidArgument`` naming the steps of a cycle, or an unknown dependency.
    """
    for name, needs in deps.items():
        for dep in needs:
            if dep not in deps:
                raise InvalidArgument(
                    f"step {name!r} depends on {dep!r}, which is not a step of this workflow",
                    step=name,
                    unknown=dep,
                )
    done: set[str] = set()
    order: builtins.list[str] = []
    remaining = builtins.list(deps)
    while remaining:
        ready = [n for n in remaining if all(d in done for d in deps[n])]
        if not ready:
            cycle = _find_cycle(deps, remaining)
            raise InvalidArgument(f"the steps form a cycle: {' -> '.join(cycle)}", cycle=cycle)
        order.extend(ready)
        done.update(ready)
        remaining = [n for n in remaining if n not in done]
    return order


def _find_cycle(deps: Mapping[str, Sequence[str]], stuck: builtins.list[str]) -> builtins.list[str]:
    # Every stuck step waits on another stuck step, so following those edges must come back around.
    stuck_set = set(stuck)
    path: builtins.list[str] = []
    seen: dict[str, int] = {}
    node = stuck[0]
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(d for d in deps[node] if d in stuck_set)
    return [*path[seen[node] :], node]


def _check_workflow_status(status: Any) -> str:
    if type(status) is not str or status not in WORKFLOW_STATUSES:
        raise InvalidArgument(
            f"status {status!r} is not a workflow status; use one of {', '.join(WORKFLOW_STATUSES)}",
            status=status,
        )
    return status


class WorkflowEngine:
    """Creates workflows and drives them through their DAG. See the module docstring."""

    def __init__(self, backend: StorageBackend, codec: Codec, tasks: TaskManager) -> None:
        self.backend = backend
        self.codec = codec
        self.tasks = tasks

    async def create(
        self,
        name: str,
        steps: Sequence[WorkflowStep | Mapping[str, Any]],
        *,
        metadata: dict[str, Any] | None = None,
    ) -> Workflow:
        """Create a pending workflow whose steps become pending tasks, in one transaction.

        A cycle, an unknown or duplicate step name, or a malformed step raises ``InvalidArgument`` and
        nothing is written.
        """
        check_text(name, "name")
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not steps:
            raise InvalidArgument("steps must be a non-empty list of steps", steps=type(steps).__name__)
        parsed = [_as_step(i, raw) for i, raw in enumerate(steps)]
        deps: dict[str, tuple[str, ...]] = {}
        for step in parsed:
            if step.name in deps:
                raise InvalidArgument(f"two steps are named {step.name!r}; step names must be unique")
            deps[step.name] = step.depends_on
        topological_order(deps)
        if metadata is not None and type(metadata) is not dict:
            raise InvalidArgument(f"metadata must be a dict, got {type(metadata).__name__}")
        workflow_id = str(uuid.uuid4())
        new_steps = [
            NewWorkflowStep(
                name=step.name,
                depends_on=step.depends_on,
                task=new_task(
                    self.codec,
                    step.title or step.name,
                    workflow_id=workflow_id,
                    priority=step.priority,
                    max_retries=step.max_retries,
                    metadata=step.metadata,
                    description=step.description,
                ),
            )
            for step in parsed
        ]
        meta = self.codec.encode(metadata or {}, where="metadata")
        async with self.backend.atomic():
            wf = await self.backend.create_workflow(workflow_id, name, meta, new_steps)
            for created in wf.steps:
                await self.backend.append_audit(*created_note(created.task, "workflow"))
        return wf

    async def get(self, workflow_id: str) -> Workflow | None:
        """The workflow with its steps, or None if it does not exist."""
        check_key(workflow_id, "workflow_id")
        return await self.backend.get_workflow(workflow_id)

    async def list(self, status: str | None = None, limit: int = 100) -> builtins.list[Workflow]:
        """Workflows oldest first, optionally only those in ``status``."""
        if status is not None:
            _check_workflow_status(status)
        check_int(limit, "limit", minimum=1)
        return await self.backend.list_workflows(status=status, limit=limit)

    async def unfinished(self, limit: int = 1000) -> builtins.list[Workflow]:
        """Pending and running workflows (for recovery)."""
        check_int(limit, "limit", minimum=1)
        running = await self.backend.list_workflows(status="running", limit=limit)
        pending = await self.backend.list_workflows(status="pending", limit=limit)
        return running + pending

    async def start(self, workflow_id: str) -> Workflow:
        """pending -> running, then :meth:`advance`, in one transaction."""
        check_key(workflow_id, "workflow_id")
        async with self.backend.atomic():
            wf = await self._lock(workflow_id)
            wf = await self._move(wf, "running", started_at=dt.datetime.now(dt.UTC))
            changes: builtins.list[tuple[str, TaskRecord]] = []
            wf = await self._advance_locked(wf, changes)
            await _audit_changes(self.backend, changes)
            return wf

    async def advance(self, workflow_id: str) -> Workflow:
        """Queue ready steps, retry or propagate failures, and settle the workflow when it is done.

        A workflow that is not running (not started yet, or finished) is returned unchanged.
        """
        check_key(workflow_id, "workflow_id")
        async with self.backend.atomic():
            wf = await self._lock(workflow_id)
            if wf.status != "running":
                return wf
            changes: builtins.list[tuple[str, TaskRecord]] = []
            wf = await self._advance_locked(wf, changes)
            await _audit_changes(self.backend, changes)
            return wf

    async def cancel(self, workflow_id: str, *, reason: str | None = None) -> Workflow:
        """Cancel the workflow and every step that has not finished, in one transaction."""
        check_key(workflow_id, "workflow_id")
        if reason is not None and type(reason) is not str:
            raise InvalidArgument(f"reason must be a str, got {type(reason).__name__}")
        error = self.codec.encode({"reason": "workflow cancelled", "detail": reason}, where="error")
        async with self.backend.atomic():
            wf = await self._lock(workflow_id)
            if "cancelled" not in WORKFLOW_TRANSITIONS[wf.status]:
                raise InvalidTransition(
                    f"workflow {workflow_id!r} is {wf.status}; it cannot be cancelled",
                    workflow_id=workflow_id,
                    current=wf.status,
                )
            changes: builtins.list[tuple[str, TaskRecord]] = []
            for step in wf.steps:
                if step.task.status in _ACTIVE:
                    await self._set_task(step.task, "cancelled", changes, error=error)
            wf = await self._move(wf, "cancelled", completed_at=dt.datetime.now(dt.UTC))
            await _audit_changes(self.backend, changes)
            return wf

    # --- internals (inside the caller's transaction) ------------------------------------------------

    async def _lock(self, workflow_id: str) -> Workflow:
        wf = await self.backend.get_workflow(workflow_id, lock=True)
        if wf is None:
            raise NotFound(f"workflow {workflow_id!r} does not exist", workflow_id=workflow_id)
        return wf

    async def _move(
        self,
        wf: Workflow,
        status: str,
        *,
        started_at: dt.datetime | None = None,
        completed_at: dt.datetime | None = None,
    ) -> Workflow:
        if status not in WORKFLOW_TRANSITIONS[wf.status]:
            raise InvalidTransition(
                f"workflow {wf.id!r} is {wf.status}; it cannot become {status}",
                workflow_id=wf.id,
                current=wf.status,
                requested=status,
            )
        updated = await self.backend.update_workflow(
            wf.id,
            expected_status=wf.status,
            expected_version=wf.version,
            status=status,
            started_at=started_at or wf.started_at,
            completed_at=completed_at,
        )
        if updated is None:
            raise ConflictError(f"workflow {wf.id!r} changed meanwhile; retry", workflow_id=wf.id)
        return updated

    async def _set_task(
        self,
        task: TaskRecord,
        status: str,
        changes: builtins.list[tuple[str, TaskRecord]],
        *,
        error: bytes | None = None,
    ) -> TaskRecord:
        """Move ``task`` to ``status``; the change joins ``changes`` (its status before, the task after)
        for :func:`_audit_changes` at the end of the transaction."""
        change = plan_transition(task, status, error=error)
        updated = await self.backend.update_task(
            task.id, expected_status=task.status, expected_version=task.version, change=change
        )
        if updated is None:
            raise ConflictError(
                f"task {task.id!r} of workflow {task.workflow_id!r} changed meanwhile; advance again",
                task_id=task.id,
            )
        changes.append((task.status, updated))
        return updated

    async def _advance_locked(self, wf: Workflow, changes: builtins.list[tuple[str, TaskRecord]]) -> Workflow:
        deps = {s.name: s.depends_on for s in wf.steps}
        tasks = {s.name: s.task for s in wf.steps}
        for name in topological_order(deps):
            task = tasks[name]
            if task.status == "failed" and task.retry_count < task.max_retries:
                tasks[name] = await self._set_task(task, "queued", changes)
            elif task.status == "pending":
                blocked = [d for d in deps[name] if _gone(tasks[d])]
                if blocked:
                    error = self.codec.encode(
                        {"reason": "dependency did not succeed", "dependencies": blocked}, where="error"
                    )
                    tasks[name] = await self._set_task(task, "cancelled", changes, error=error)
                elif all(tasks[d].status == "success" for d in deps[name]):
                    tasks[name] = await self._set_task(task, "queued", changes)
        statuses = [t.status for t in tasks.values()]
        outcome: str | None = None
        if all(s == "success" for s in statuses):
            outcome = "success"
        elif not any(s in _ACTIVE for s in statuses):
            outcome = "failed" if "failed" in statuses else "cancelled"
        if outcome is not None:
            return await self._move(wf, outcome, completed_at=dt.datetime.now(dt.UTC))
        # Only tasks changed, not the workflow's row, and each changed task is in hand as written.
        return replace(wf, steps=tuple(replace(s, task=tasks[s.name]) for s in wf.steps))


WORKFLOW_ACTOR = "statekeel.workflow"


async def _audit_changes(backend: StorageBackend, changes: Sequence[tuple[str, TaskRecord]]) -> None:
    # Appended after every task of the transaction is updated: the audit chain's lock is always the last
    # one a transaction takes, so a workflow and a worker's transition never wait for each other.
    for before, task in changes:
        await backend.append_audit(*transition_note(WORKFLOW_ACTOR, before, task, "workflow"))


def _gone(task: TaskRecord) -> bool:
    """A dependency that will never succeed: cancelled, or failed with no retry left."""
    return task.status == "cancelled" or (task.status == "failed" and task.retry_count >= task.max_retries)
