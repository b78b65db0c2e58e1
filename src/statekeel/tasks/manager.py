"""Tasks: a state machine with conditional transitions, leases with fencing, and a step journal.

    task = await store.tasks.create("index the repo", status="queued")
    claimed = await store.tasks.claim("worker-1", lease_seconds=30)
    files = await store.tasks.step(claimed.id, "list-files", list_files)      # recorded, never re-run
    await store.tasks.transition(claimed.id, "success", result=files, lease_epoch=claimed.lease_epoch)

Statuses and the transitions allowed between them (:data:`TRANSITIONS`)::

    pending     -> queued | running | cancelled
    queued      -> running | cancelled
    running     -> success | failed | cancelled | suspended | interrupted
    suspended   -> queued | running | cancelled
    interrupted -> queued | running | failed | cancelled
    failed      -> queued            (a retry: at most max_retries times)
    success, cancelled: terminal

Every transition is one conditional UPDATE on the status and version it was decided from: a concurrent
change makes it fail with :class:`ConflictError` instead of being lost. **Higher priority runs first**;
among equal priorities the oldest task is claimed first.

**Audited.** Creating a task, each transition (by :meth:`TaskManager.transition`, a claim, a lease
expiry, or a workflow) and each change of a step's journal record (started, succeeded, failed, resolved)
appends an entry to the audit log (``store.audit``) in the same transaction as the change: subject
``task:<id>``, kinds ``task.created``, ``task.transitioned``, ``task.step.started``,
``task.step.succeeded``, ``task.step.failed``, ``task.step.resolved``. An entry holds ids, statuses,
versions and the SHA-256 of a step's stored result or error, never the values themselves. A lease
heartbeat (no status change) and a step replayed from its record (nothing written) are not audited.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import secrets
from collections.abc import AsyncIterator
from typing import Any

from ..backends.base import (
    Page,
    StepRecord,
    StorageBackend,
    TaskRecord,
    every_item,
)
from ..codec import Codec
from ..errors import (
    ConflictError,
    InvalidArgument,
    LeaseLost,
    NotFound,
    StepInTransaction,
)
from ..journal import StepFn, check_outside_transaction, discard, run_step
from ..validation import check_aware, check_int, check_key
from . import operations as _ops
from . import rules
from .rules import (
    LEASE_EXPIRY_ACTOR,
    UNSPECIFIED_ACTOR,
    Task,
    check_lease_seconds,
    check_status,
    created_note,
    plan_transition,
    transition_note,
)
from .steps import TaskStep, check_step_args

# Tries per transition when the caller gave no expected_version: a concurrent change is re-judged.
_TRANSITION_TRIES = 3


class TaskManager:
    """Creates, transitions, claims and journals tasks. See the module docstring."""

    def __init__(self, backend: StorageBackend, codec: Codec) -> None:
        self.backend = backend
        self.codec = codec
        # The attempt ids of step starts whose answer was lost, by (task, step, lease epoch): the retry
        # of such a start sends the same id and learns whether its record landed.
        self.unheard_starts: dict[tuple[str, str, int | None], str] = {}
        # Likewise for transitions, by (task, new status, lease epoch, expected version).
        self.unheard_transitions: dict[tuple[str, str, int | None, int | None], str] = {}

    # --- tasks --------------------------------------------------------------------------------------

    async def create(
        self,
        title: str,
        *,
        workflow_id: str | None = None,
        parent_task_id: str | None = None,
        priority: int = 5,
        max_retries: int = 3,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        description: str | None = None,
        status: str = "pending",
        not_before: dt.datetime | None = None,
    ) -> Task:
        """Create a task (``status`` "pending" or "queued"). With an ``idempotency_key`` that was used
        before, return that earlier task unchanged instead of creating another one.

        ``not_before`` (a timezone-aware datetime) delays it: no :meth:`claim` takes it before that time,
        by the claimer's clock (a time in the past: due at once)."""
        new = rules.new_task(
            self.codec,
            title,
            workflow_id=workflow_id,
            parent_task_id=parent_task_id,
            priority=priority,
            max_retries=max_retries,
            metadata=metadata,
            idempotency_key=idempotency_key,
            description=description,
            status=status,
            not_before=not_before,
        )
        record, _created = await self.backend.create_task(
            new, audit=lambda out: [created_note(out[0], "create")] if out[1] else []
        )
        return record

    async def get(self, task_id: str) -> Task | None:
        """The task, or None if it does not exist (a failed read raises)."""
        check_key(task_id, "task_id")
        return await self.backend.get_task(task_id)

    async def _require(self, task_id: str) -> Task:
        task = await self.backend.get_task(task_id)
        if task is None:
            raise NotFound(f"task {task_id!r} does not exist", task_id=task_id)
        return task

    async def list(
        self,
        workflow_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Tasks oldest first; pass ``next_cursor`` of a page as ``cursor`` to get the next one."""
        if workflow_id is not None:
            check_key(workflow_id, "workflow_id")
        if status is not None:
            check_status(status)
        check_int(limit, "limit", minimum=1)
        if cursor is not None and type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str from a previous page, got {cursor!r}")
        return await self.backend.list_tasks(
            workflow_id=workflow_id, status=status, limit=limit, cursor=cursor
        )

    def iter(
        self, workflow_id: str | None = None, status: str | None = None, *, page_size: int = 500
    ) -> AsyncIterator[TaskRecord]:
        """Every task (``TaskRecord``), oldest first, read a page at a time.

        async for task in store.tasks.iter(status="running"):
            print(task.id, task.title)

        Arguments are checked at the call, before anything is read.
        """
        if workflow_id is not None:
            check_key(workflow_id, "workflow_id")
        if status is not None:
            check_status(status)
        check_int(page_size, "page_size", minimum=1)
        return every_item(
            lambda cursor: self.backend.list_tasks(
                workflow_id=workflow_id, status=status, limit=page_size, cursor=cursor
            )
        )

    async def transition(
        self,
        task_id: str,
        new_status: str,
        *,
        expected_version: int | None = None,
        result: Any = None,
        error: Any = None,
        worker_id: str | None = None,
        lease_epoch: int | None = None,
        actor: str | None = None,
        not_before: dt.datetime | None = None,
        retry_after: float | None = None,
    ) -> Task:
        """Move the task to ``new_status`` if the transition is legal (else ``InvalidTransition``), with one
        conditional UPDATE (``ConflictError`` if it changed meanwhile, or is not at ``expected_version``).

        A worker passes its ``lease_epoch`` (and ``worker_id``) from :meth:`claim`: if the task was taken
        over or its lease expired since (by this process's clock, whether or not :meth:`expire_leases` ran),
        the transition is refused with ``LeaseLost`` (fencing).
        Moving a task to running here (not by :meth:`claim`) starts a new ``lease_epoch`` with no owner, so
        whoever held it before is fenced out; the returned task carries the new epoch.

        The change and its ``task.transitioned`` audit entry commit together; the entry's actor is
        ``actor``, else ``worker_id``, else "unspecified".

        A transition whose answer was lost raises ``BackendUnavailable(outcome="unknown")``; retrying the
        same call (same task, status, ``lease_epoch`` and ``expected_version``) on this manager settles
        it: the task its change left if that change landed, else the change made now.

        A move back to queued (a retry of a failed task, or of an interrupted or suspended one) may be
        delayed: ``not_before`` (an aware datetime) or ``retry_after`` (seconds from now, e.g.
        :func:`statekeel.tasks.backoff` of the task's ``retry_count``) sets the task's ``not_before``, and
        no :meth:`claim` takes it before then. Without either, the task keeps the ``not_before`` it had.
        Either one with another ``new_status``, or both at once, is refused (``InvalidArgument``).
        """
        check_key(task_id, "task_id")
        check_status(new_status, "new_status")
        if expected_version is not None:
            check_int(expected_version, "expected_version", minimum=1)
        if worker_id is not None:
            check_key(worker_id, "worker_id")
        if lease_epoch is not None:
            check_int(lease_epoch, "lease_epoch", minimum=1)
        if actor is not None:
            check_key(actor, "actor")
        due = _due(new_status, not_before, retry_after)
        who = actor or worker_id or UNSPECIFIED_ACTOR
        result_raw = None if result is None else self.codec.encode(result, where="result")
        error_raw = None if error is None else self.codec.encode(error, where="error")
        tries = 1 if expected_version is not None else _TRANSITION_TRIES
        fenced = worker_id is not None or lease_epoch is not None
        # A transition whose answer was lost is retried with its id: if its change landed, the retry says
        # so instead of refusing it as fenced out or changed meanwhile (the change was its own).
        key = (task_id, new_status, lease_epoch, expected_version)
        transition_id = self.unheard_transitions.get(key) or secrets.token_hex(12)
        for _ in range(tries):
            current = await self._require(task_id)
            if current.transition_id == transition_id and current.status == new_status:
                rules.remember_unheard(self.unheard_transitions, key, transition_id, None)
                return current
            now = rules.utcnow()
            _check_fence(current, worker_id, lease_epoch, now)
            if expected_version is not None and current.version != expected_version:
                raise ConflictError(
                    f"task {task_id!r} is at version {current.version}, not the expected {expected_version}",
                    task_id=task_id,
                    expected=expected_version,
                    current=current.version,
                )
            change = plan_transition(
                current, new_status, result=result_raw, error=error_raw, now=now, not_before=due
            )
            try:
                updated = await self.backend.update_task(
                    task_id,
                    expected_status=current.status,
                    expected_version=current.version,
                    change=dataclasses.replace(change, transition_id=transition_id),
                    lease_valid_at=now if fenced else None,
                    audit=rules.transition_notes(
                        who,
                        current.status,
                        "transition",
                        None if due is None else {"not_before": due.isoformat()},
                    ),
                )
            except BaseException as exc:
                rules.remember_unheard(self.unheard_transitions, key, transition_id, exc)
                raise
            rules.remember_unheard(self.unheard_transitions, key, transition_id, None)
            if updated is not None:
                return updated
        latest = await self._require(task_id)
        _check_fence(latest, worker_id, lease_epoch, rules.utcnow())
        raise ConflictError(
            f"task {task_id!r} changed while moving it to {new_status} (now {latest.status}, version "
            f"{latest.version})",
            task_id=task_id,
            current=latest.version,
            status=latest.status,
        )

    # --- leases -------------------------------------------------------------------------------------

    async def claim(
        self, worker_id: str, *, lease_seconds: float = 30, workflow_id: str | None = None
    ) -> Task | None:
        """Take the next queued task (highest priority first, then oldest) for ``worker_id``: it becomes
        running under a lease of ``lease_seconds`` with a new ``lease_epoch``. A task whose
        ``not_before`` is later than now (this process's clock) is left queued. None when no queued task
        is due."""
        check_key(worker_id, "worker_id")
        seconds = check_lease_seconds(lease_seconds)
        if workflow_id is not None:
            check_key(workflow_id, "workflow_id")
        now = rules.utcnow()
        return await self.backend.claim_task(
            worker_id,
            lease_expires_at=now + dt.timedelta(seconds=seconds),
            workflow_id=workflow_id,
            audit=rules.transition_notes(worker_id, "queued", "claim"),
            now=now,
        )

    async def heartbeat(
        self, task_id: str, worker_id: str, lease_epoch: int, *, lease_seconds: float = 30
    ) -> Task:
        """Extend the lease by ``lease_seconds`` from now, only for the worker and epoch that hold it and
        only while it lasts: ``LeaseLost`` otherwise (the task was taken over, finished, or its lease
        expired — by this process's clock, whether or not :meth:`expire_leases` ran)."""
        check_key(task_id, "task_id")
        check_key(worker_id, "worker_id")
        check_int(lease_epoch, "lease_epoch", minimum=1)
        seconds = check_lease_seconds(lease_seconds)
        now = rules.utcnow()
        expires = now + dt.timedelta(seconds=seconds)
        task = await self.backend.heartbeat_task(
            task_id, worker_id, lease_epoch, lease_expires_at=expires, now=now
        )
        if task is None:
            current = await self._require(task_id)
            _check_fence(current, worker_id, lease_epoch, now)
            raise LeaseLost(f"task {task_id!r}: the lease of {worker_id!r} at epoch {lease_epoch} is gone")
        return task

    async def expire_leases(self, now: dt.datetime | None = None) -> builtins.list[Task]:
        """Move running tasks whose lease ended before ``now`` to interrupted and return them."""
        when = rules.utcnow() if now is None else check_aware(now, "now")
        return await self.backend.expire_task_leases(
            when,
            audit=lambda out: [
                transition_note(LEASE_EXPIRY_ACTOR, "running", task, "lease_expired") for task in out
            ],
        )

    # --- step journal -------------------------------------------------------------------------------

    async def step(
        self,
        task_id: str,
        step_key: str,
        fn: StepFn,
        *,
        idempotent: bool = False,
        lease_epoch: int | None = None,
        actor: str | None = None,
    ) -> Any:
        """Run ``fn`` (a callable, sync or async, or an awaitable) once for this task and step key.

        Already succeeded: its recorded result is returned and ``fn`` is not called. Otherwise a *started*
        record is committed, ``fn`` runs, and its result (or error) is committed. A step found *started*
        (the process died in between) is re-run if ``idempotent``; else ``StepInDoubt`` is raised, carrying
        the record, until :meth:`resolve_step` settles it. The result is returned as stored (decoded).

        A worker passes its ``lease_epoch`` from :meth:`claim`: once its lease was taken over or expired (by
        this process's clock, whether or not :meth:`expire_leases` ran), ``LeaseLost`` is raised before
        anything is recorded or run (even for a step that already succeeded).

        A sync ``fn`` runs on the event loop's thread; pass an async function for long blocking work.
        Refused inside an ``atomic()`` block (``StepInTransaction``, nothing written or run): the
        *started* record must commit on its own before ``fn`` runs.

        Each record written (started, succeeded, failed) commits with its audit entry, whose actor is
        ``actor`` (else "unspecified").
        """
        check_step_args(task_id, step_key, fn, idempotent, lease_epoch, actor)
        try:
            check_outside_transaction(
                self.backend.in_atomic(),
                f"step {step_key!r} of task {task_id!r}",
                task_id=task_id,
                step_key=step_key,
            )
        except StepInTransaction:
            discard(fn)
            raise
        step = TaskStep(self, task_id, step_key, idempotent, lease_epoch, actor or UNSPECIFIED_ACTOR)
        return await run_step(step, fn, self.codec)

    async def resolve_step(
        self,
        task_id: str,
        step_key: str,
        outcome: str | None = None,
        *,
        succeeded: bool | None = None,
        result: Any = None,
        error: Any = None,
        actor: str | None = None,
        lease_epoch: int | None = None,
        force: bool = False,
    ) -> StepRecord:
        """Settle a step in doubt: ``succeeded=True`` (later calls return ``result``) or ``succeeded=False``
        (the next call runs ``fn`` again; ``error`` is recorded). ``outcome`` "succeeded" or "failed" says
        the same positionally; give one of the two. Only a *started* step can be resolved
        (``InvalidTransition`` otherwise, ``NotFound`` for an unknown one); the change commits with its
        ``task.step.resolved`` audit entry (actor: ``actor``, else "unspecified").

        While the task runs under a live lease its worker may still be running the step and record its
        own result: ``ConflictError`` (nothing written), unless the caller is that lease's holder (it
        passes the ``lease_epoch`` it claimed the task at) or passes ``force=True``, which the audit entry
        records (``forced``, with the lease owner and epoch it overrode). The worker's own finish after a
        resolution raises ``ConflictError``; it never replaces the resolved outcome.

            await store.tasks.resolve_step(task.id, "charge-card", succeeded=True, result={"ok": 1},
                                           actor="alice")
        """
        return await _ops.resolve_step(
            self, task_id, step_key, outcome, succeeded, result, error, actor, lease_epoch, force
        )

    async def requeue(self, task_id: str, *, actor: str) -> Task:
        """Put a task back in the queue for a worker to claim: a pending, suspended, interrupted or failed
        one (a failed task uses one of its retries; ``InvalidTransition`` when none is left, or for a
        running, succeeded or cancelled task; ``NotFound`` for an unknown one). The change commits with its
        ``task.transitioned`` audit entry (``via`` "requeue", actor ``actor``).

            await store.tasks.requeue(task.id, actor="alice")
        """
        return await _ops.requeue(self, task_id, actor)

    async def cancel(self, task_id: str, *, actor: str, reason: str) -> Task:
        """Cancel a task that has not finished (``InvalidTransition`` for a succeeded, failed or cancelled
        one). A running task's worker is fenced out: its next heartbeat, step or transition with its lease
        raises ``LeaseLost``. The change commits with its ``task.transitioned`` audit entry (``via``
        "cancel", actor ``actor``, the ``reason``); the task's error holds the reason too.

            await store.tasks.cancel(task.id, actor="alice", reason="duplicate of #12")
        """
        return await _ops.cancel(self, task_id, actor, reason)

    async def get_step(self, task_id: str, step_key: str) -> StepRecord | None:
        """One journal entry, or None."""
        check_key(task_id, "task_id")
        check_key(step_key, "step_key")
        return await self.backend.get_step(task_id, step_key)

    async def steps(self, task_id: str) -> builtins.list[StepRecord]:
        """The task's journal, in the order its steps were first started."""
        check_key(task_id, "task_id")
        return await self.backend.list_steps(task_id)

    async def steps_in_doubt(self, now: dt.datetime | None = None) -> builtins.list[StepRecord]:
        """Steps started but never finished whose task is not running under a live lease (for recovery)."""
        when = rules.utcnow() if now is None else check_aware(now, "now")
        return await self.backend.steps_in_doubt(when)


def _due(new_status: str, not_before: Any, retry_after: Any) -> dt.datetime | None:
    """The ``not_before`` a transition sets (None: keep the stored one), checked before anything is read."""
    if not_before is None and retry_after is None:
        return None
    if not_before is not None and retry_after is not None:
        raise InvalidArgument("pass not_before (a time) or retry_after (seconds from now), not both")
    if new_status != "queued":
        raise InvalidArgument(
            f"not_before and retry_after delay a move back to queued; a move to {new_status} cannot be "
            "delayed",
            status=new_status,
        )
    if not_before is not None:
        return rules.check_not_before(not_before)
    return rules.utcnow() + dt.timedelta(seconds=rules.check_retry_after(retry_after))


def _check_fence(
    current: TaskRecord, worker_id: str | None, lease_epoch: int | None, now: dt.datetime
) -> None:
    if worker_id is None and lease_epoch is None:
        return
    if (
        current.status == "running"
        and (lease_epoch is None or current.lease_epoch == lease_epoch)
        and (worker_id is None or current.lease_owner == worker_id)
    ):
        expires = current.lease_expires_at
        if expires is None or expires > now:
            return
        raise LeaseLost(
            f"task {current.id!r}: the lease of {current.lease_owner!r} at epoch {current.lease_epoch} "
            f"expired at {expires.isoformat()}",
            task_id=current.id,
            owner=current.lease_owner,
            lease_epoch=current.lease_epoch,
            status=current.status,
            expired_at=expires,
        )
    raise LeaseLost(
        f"task {current.id!r} is {current.status} under {current.lease_owner!r} at lease epoch "
        f"{current.lease_epoch}; the caller ({worker_id!r}, epoch {lease_epoch}) no longer holds it",
        task_id=current.id,
        owner=current.lease_owner,
        lease_epoch=current.lease_epoch,
        status=current.status,
    )
