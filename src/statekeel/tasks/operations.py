"""What an operator does to tasks (``tasks.resolve_step``, ``tasks.requeue``, ``tasks.cancel``): each one
conditional write that commits with its audit entry naming the ``actor``.
:class:`~statekeel.tasks.TaskManager` is the API; this module holds the bodies of those methods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backends.base import StepRecord, TaskRecord
from ..errors import ConflictError, InvalidArgument, InvalidTransition, NotFound
from ..validation import check_bool, check_int, check_key, check_text
from . import rules

if TYPE_CHECKING:
    from .manager import TaskManager

# A requeue or cancel re-judges a task changed between its read and its write this many times.
_TRIES = 3


def _outcome(outcome: Any, succeeded: Any) -> str:
    if outcome is not None and succeeded is not None:
        raise InvalidArgument("pass succeeded=True/False or outcome, not both")
    if succeeded is not None:
        check_bool(succeeded, "succeeded")
        return "succeeded" if succeeded else "failed"
    if outcome not in ("succeeded", "failed"):
        raise InvalidArgument(
            f"say how the step ended: succeeded=True or succeeded=False (outcome 'succeeded' or 'failed'), "
            f"got {outcome!r}",
            outcome=outcome,
        )
    return str(outcome)


async def resolve_step(
    tasks: TaskManager,
    task_id: Any,
    step_key: Any,
    outcome: Any,
    succeeded: Any,
    result: Any,
    error: Any,
    actor: Any,
    lease_epoch: Any,
    force: Any,
) -> StepRecord:
    """See ``TaskManager.resolve_step``."""
    check_key(task_id, "task_id")
    check_key(step_key, "step_key")
    if actor is not None:
        check_key(actor, "actor")
    if lease_epoch is not None:
        check_int(lease_epoch, "lease_epoch", minimum=1)
    check_bool(force, "force")
    outcome = _outcome(outcome, succeeded)
    if outcome == "failed" and error is None:
        error = {"type": "resolved", "message": "resolved as failed by resolve_step()"}
    result_raw = tasks.codec.encode(result, where="result") if outcome == "succeeded" else None
    error_raw = tasks.codec.encode(error, where="error") if outcome == "failed" else None
    backend = tasks.backend
    seen = await backend.get_step(task_id, step_key)
    if seen is None:
        raise NotFound(f"task {task_id!r} has no step {step_key!r}", task_id=task_id, step_key=step_key)
    if seen.status != "started":
        raise InvalidTransition(
            f"step {step_key!r} of task {task_id!r} is {seen.status}, not in doubt; only a started step can "
            "be resolved",
            task_id=task_id,
            step_key=step_key,
            current=seen.status,
        )
    overridden = await live_lease(tasks, task_id, step_key, lease_epoch, force)
    extra: dict[str, Any] = {}
    if overridden is not None:
        extra = {"forced": True, "lease_owner": overridden.lease_owner, "lease_epoch": overridden.lease_epoch}
    notes = rules.step_notes(
        "task.step.resolved",
        actor or rules.UNSPECIFIED_ACTOR,
        result_sha256=rules.digest(result_raw),
        error_sha256=rules.digest(error_raw),
        **extra,
    )
    # Conditional on the attempt judged above: a run started again meanwhile is not settled blindly.
    done = await backend.finish_step(
        task_id,
        step_key,
        status=outcome,
        attempt=seen.attempt,
        result=result_raw,
        error=error_raw,
        audit=notes,
    )
    if done is not None:
        return done
    current = await backend.get_step(task_id, step_key)
    if current is not None and current.status == "started":
        raise ConflictError(
            f"step {step_key!r} of task {task_id!r} was started again (attempt {current.attempt}) while "
            "it was being resolved; nothing was written: its new run records its own outcome",
            task_id=task_id,
            step_key=step_key,
            attempt=current.attempt,
        )
    raise InvalidTransition(
        f"step {step_key!r} of task {task_id!r} is {'gone' if current is None else current.status}; only "
        "a started step can be resolved",
        task_id=task_id,
        step_key=step_key,
        current=None if current is None else current.status,
    )


async def live_lease(
    tasks: TaskManager, task_id: str, step_key: str, lease_epoch: int | None, force: bool
) -> TaskRecord | None:
    """For :func:`resolve_step`: refuse while another worker's live lease may still finish the step; the
    task whose lease ``force`` overrides (None when no live lease of another was in the way)."""
    task = await tasks.backend.get_task(task_id)
    if task is None:
        raise NotFound(f"task {task_id!r} does not exist", task_id=task_id)
    expires = task.lease_expires_at
    if task.status != "running" or (expires is not None and expires <= rules.utcnow()):
        return None  # no live worker: the step's runner is gone
    if lease_epoch is not None and lease_epoch == task.lease_epoch:
        return None  # the lease's own holder: it knows its function is not running
    if force:
        return task
    until = "" if expires is None else f" until {expires.isoformat()}"
    raise ConflictError(
        f"step {step_key!r} of task {task_id!r} may still be running: the task holds a live lease of "
        f"{task.lease_owner!r} (epoch {task.lease_epoch}){until}, whose worker would record its own "
        "outcome. Resolve it once the lease has ended (the worker stopped, expire_leases() or cancel), "
        "as the lease's holder (lease_epoch=...), or with force=True (recorded in the audit log)",
        task_id=task_id,
        step_key=step_key,
        lease_owner=task.lease_owner,
        lease_epoch=task.lease_epoch,
    )


async def _move(
    tasks: TaskManager,
    task_id: str,
    to: str,
    actor: str,
    via: str,
    extra: dict[str, Any],
    error: bytes | None = None,
) -> TaskRecord:
    """Move the task to ``to`` with one conditional UPDATE on the status and version it was judged at,
    its audit entry in the same transaction; a change committed in between is judged again."""
    for _ in range(_TRIES):
        current = await tasks.backend.get_task(task_id)
        if current is None:
            raise NotFound(f"task {task_id!r} does not exist", task_id=task_id)
        change = rules.plan_transition(current, to, error=error)
        updated = await tasks.backend.update_task(
            task_id,
            expected_status=current.status,
            expected_version=current.version,
            change=change,
            lease_valid_at=None,
            audit=rules.transition_notes(actor, current.status, via, extra),
        )
        if updated is not None:
            return updated
    raise ConflictError(
        f"task {task_id!r} kept changing while it was being moved to {to}; nothing was written: try again",
        task_id=task_id,
    )


async def requeue(tasks: TaskManager, task_id: Any, actor: Any) -> TaskRecord:
    """See ``TaskManager.requeue``."""
    check_key(task_id, "task_id")
    check_key(actor, "actor")
    return await _move(tasks, task_id, "queued", actor, "requeue", {})


async def cancel(tasks: TaskManager, task_id: Any, actor: Any, reason: Any) -> TaskRecord:
    """See ``TaskManager.cancel``."""
    check_key(task_id, "task_id")
    check_key(actor, "actor")
    check_text(reason, "reason")
    error = tasks.codec.encode({"type": "cancelled", "reason": reason, "by": actor}, where="error")
    return await _move(tasks, task_id, "cancelled", actor, "cancel", {"reason": reason}, error)
