"""The rules of tasks that the manager, the step journal and the operator's operations share: the
statuses and their transitions, the checks of a new task and its lease, the clock, and the audit entries
of task changes. It imports none of them."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import uuid
from collections.abc import Callable
from typing import Any

from ..backends.base import TASK_STATUSES, AuditNote, NewTask, StepRecord, TaskChange, TaskRecord
from ..codec import Codec, canonical
from ..errors import InvalidArgument, InvalidTransition
from ..validation import check_aware, check_int, check_key, check_text

Task = TaskRecord
"""A task as stored: see :class:`statekeel.backends.base.TaskRecord`."""

TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"queued", "running", "cancelled"}),
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"success", "failed", "cancelled", "suspended", "interrupted"}),
    "suspended": frozenset({"queued", "running", "cancelled"}),
    "interrupted": frozenset({"queued", "running", "failed", "cancelled"}),
    "failed": frozenset({"queued"}),
    "success": frozenset(),
    "cancelled": frozenset(),
}
FINISHED = frozenset({"success", "failed", "cancelled"})
MAX_LEASE_SECONDS = 7 * 24 * 3600
MAX_RETRY_AFTER = 366 * 24 * 3600
"""The longest delay ``transition(..., retry_after=)`` takes, in seconds (a year and a day)."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# Actors of the audit entries of changes statekeel makes by itself.
LEASE_EXPIRY_ACTOR = "statekeel.lease-expiry"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


UNSPECIFIED_ACTOR = "unspecified"


def digest(raw: bytes | None) -> str | None:
    return None if raw is None else hashlib.sha256(raw).hexdigest()


# The audit entries of task changes are built here and appended by the backend in the change's own
# transaction (``audit=`` of the backend's task methods): one write, one commit.


def task_note(kind: str, actor: str, task_id: str, data: dict[str, Any]) -> AuditNote:
    """The audit entry of a change to task ``task_id``: subject ``task:<id>``, ``data`` with the id."""
    return kind, actor, f"task:{task_id}", canonical({"task_id": task_id, **data}).decode("utf-8")


def transition_note(
    actor: str, before: str, task: TaskRecord, via: str, extra: dict[str, Any] | None = None
) -> AuditNote:
    """The ``task.transitioned`` entry of ``task`` (as the change left it), from status ``before``."""
    data: dict[str, Any] = {"from": before, "to": task.status, "version": task.version, "via": via}
    data.update(extra or {})
    if task.status == "running":
        data["lease_epoch"] = task.lease_epoch
        data["lease_owner"] = task.lease_owner
    if task.status == "failed" or before == "failed":
        data["retry_count"] = task.retry_count
    return task_note("task.transitioned", actor, task.id, data)


def created_note(task: TaskRecord, via: str) -> AuditNote:
    """The ``task.created`` entry of a new task."""
    data: dict[str, Any] = {
        "status": task.status,
        "workflow_id": task.workflow_id,
        "version": task.version,
        "via": via,
    }
    if task.not_before is not None:
        data["not_before"] = task.not_before.isoformat()
    return task_note("task.created", UNSPECIFIED_ACTOR, task.id, data)


def transition_notes(
    actor: str, before: str, via: str, extra: dict[str, Any] | None = None
) -> Callable[[TaskRecord | None], list[AuditNote]]:
    """The entry of the transition a task write returned (none when its condition did not hold)."""
    return lambda task: [] if task is None else [transition_note(actor, before, task, via, extra)]


def step_notes(kind: str, actor: str, **extra: Any) -> Callable[[StepRecord | None], list[AuditNote]]:
    """The entry of a step record a journal write returned (none when it wrote nothing)."""

    def notes(step: StepRecord | None) -> list[AuditNote]:
        if step is None:
            return []
        data = {"step_key": step.step_key, "attempt": step.attempt, "status": step.status, **extra}
        return [task_note(kind, actor, step.task_id, data)]

    return notes


def check_status(status: Any, what: str = "status") -> str:
    """Return ``status`` if it is one of :data:`TASK_STATUSES`."""
    if status not in TASK_STATUSES or type(status) is not str:
        raise InvalidArgument(
            f"{what} {status!r} is not a task status; use one of {', '.join(TASK_STATUSES)}", status=status
        )
    return status


def check_not_before(value: Any, what: str = "not_before") -> dt.datetime:
    """``value`` (an aware datetime from 1970 on, in UTC) as UTC: the earliest time a claim takes a task."""
    when = check_aware(value, what).astimezone(dt.UTC)
    if when < _EPOCH:
        raise InvalidArgument(
            f"{what} {value!r} is before 1970; give a time from 1970 on (a time in the past makes the task "
            "due at once)",
            value=value,
        )
    return when


def check_retry_after(value: Any) -> float:
    """``value`` as a delay in seconds: a finite number in [0, :data:`MAX_RETRY_AFTER`]."""
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_RETRY_AFTER:
        raise InvalidArgument(
            f"retry_after must be a number of seconds in [0, {MAX_RETRY_AFTER}], got {value!r}", value=value
        )
    return float(value)


def backoff(retry_count: int, *, base: float = 1.0, factor: float = 2.0, cap: float = 3600.0) -> float:
    """The delay in seconds before retry number ``retry_count + 1`` under exponential backoff:
    ``min(cap, base * factor ** retry_count)``. Pass it as ``retry_after`` of a failed task's retry:

        failed = await store.tasks.get(task_id)
        await store.tasks.transition(task_id, "queued", retry_after=backoff(failed.retry_count))
    """
    check_int(retry_count, "retry_count")
    for name, number in (("base", base), ("factor", factor), ("cap", cap)):
        if type(number) not in (int, float) or not math.isfinite(number) or number < 0:
            raise InvalidArgument(f"{name} must be a finite number >= 0, got {number!r}", value=number)
    if factor < 1:
        raise InvalidArgument(f"factor must be at least 1 (a delay that grows), got {factor!r}", value=factor)
    cap = min(float(cap), float(MAX_RETRY_AFTER))
    try:
        delay = float(base) * float(factor) ** retry_count
    except OverflowError:  # factor ** retry_count beyond a float: far past any cap
        return cap
    return min(cap, delay)


def check_lease_seconds(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 < value <= MAX_LEASE_SECONDS:
        raise InvalidArgument(
            f"lease_seconds must be a number of seconds in (0, {MAX_LEASE_SECONDS}], got {value!r}",
            value=value,
        )
    return float(value)


def plan_transition(
    current: TaskRecord,
    new_status: str,
    *,
    result: bytes | None = None,
    error: bytes | None = None,
    now: dt.datetime | None = None,
    not_before: dt.datetime | None = None,
) -> TaskChange:
    """The field values ``current`` gets by moving to ``new_status``; ``InvalidTransition`` if illegal."""
    allowed = TRANSITIONS[current.status]
    if new_status not in allowed:
        options = ", ".join(sorted(allowed)) or "none: it is terminal"
        raise InvalidTransition(
            f"task {current.id!r} is {current.status}; it cannot become {new_status} (allowed: {options})",
            task_id=current.id,
            current=current.status,
            requested=new_status,
        )
    now = now or utcnow()
    retry_count = current.retry_count
    if current.status == "failed":
        if retry_count >= current.max_retries:
            raise InvalidTransition(
                f"task {current.id!r} failed and used all its {current.max_retries} retries; it stays failed",
                task_id=current.id,
                current=current.status,
                requested=new_status,
            )
        retry_count += 1
    return TaskChange(
        status=new_status,
        retry_count=retry_count,
        # Only claim() grants a lease; leaving "running" ends it.
        lease_expires_at=None,
        started_at=current.started_at or (now if new_status == "running" else None),
        completed_at=now if new_status in FINISHED else None,
        result=result,
        error=error,
        not_before=not_before,
    )


def new_task(
    codec: Codec,
    title: Any,
    *,
    workflow_id: Any = None,
    parent_task_id: Any = None,
    priority: Any = 5,
    max_retries: Any = 3,
    metadata: Any = None,
    idempotency_key: Any = None,
    description: Any = None,
    status: Any = "pending",
    not_before: Any = None,
) -> NewTask:
    """A validated :class:`NewTask` (typed error before anything is written), its metadata encoded by
    ``codec``: what ``TaskManager.create`` and a workflow's tasks insert."""
    check_text(title, "title")
    if workflow_id is not None:
        check_key(workflow_id, "workflow_id")
    if parent_task_id is not None:
        check_key(parent_task_id, "parent_task_id")
    if idempotency_key is not None:
        check_key(idempotency_key, "idempotency_key")
    check_int(priority, "priority", minimum=None)
    if not -(2**31) <= priority < 2**31:
        raise InvalidArgument(f"priority must fit in 32 bits, got {priority}", value=priority)
    check_int(max_retries, "max_retries", minimum=0)
    if max_retries >= 2**31:
        raise InvalidArgument(f"max_retries must fit in 32 bits, got {max_retries}", value=max_retries)
    if description is not None:
        check_text(description, "description", allow_empty=True)
    if status not in ("pending", "queued"):
        check_status(status)
        raise InvalidArgument(f"a new task starts pending or queued, not {status}", status=status)
    if metadata is not None and type(metadata) is not dict:
        raise InvalidArgument(f"metadata must be a dict, got {type(metadata).__name__}")
    due = None if not_before is None else check_not_before(not_before)
    return NewTask(
        id=str(uuid.uuid4()),
        title=title,
        status=status,
        description=description,
        priority=priority,
        max_retries=max_retries,
        metadata=codec.encode(metadata or {}, where="metadata"),
        workflow_id=workflow_id,
        parent_task_id=parent_task_id,
        idempotency_key=idempotency_key,
        not_before=due,
    )


# At most this many lost answers are remembered per manager (the oldest forgotten first: its retry, if
# any ever comes, is then judged as anyone else's would be).
UNHEARD_LIMIT = 1024


def remember_unheard(unheard: dict[Any, str], key: Any, attempt_id: str, exc: BaseException | None) -> None:
    """Keep ``attempt_id`` for ``key`` when ``exc`` says the outcome of the write is unknown, so the
    retry sends the same id and learns whether it landed; forget it after any other outcome."""
    if exc is not None and getattr(exc, "outcome", None) == "unknown":
        if key not in unheard and len(unheard) >= UNHEARD_LIMIT:
            unheard.pop(next(iter(unheard)))
        unheard[key] = attempt_id
    else:
        unheard.pop(key, None)
