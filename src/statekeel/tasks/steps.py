"""The step journal of tasks (``tasks.step``): each step's ``task_steps`` record, fenced by the task's
lease, and the audit entries its records commit with. :class:`~statekeel.tasks.TaskManager` is the API."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from ..backends.base import StepRecord
from ..errors import ConflictError, InvalidArgument, SerializationError, StepInDoubt
from ..journal import check_fn, discard
from ..validation import check_bool, check_int, check_key
from . import rules

if TYPE_CHECKING:
    from .manager import TaskManager


def check_step_args(
    task_id: Any, step_key: Any, fn: Any, idempotent: Any, lease_epoch: Any, actor: Any
) -> None:
    try:
        check_key(task_id, "task_id")
        check_key(step_key, "step_key")
        check_bool(idempotent, "idempotent")
        if lease_epoch is not None:
            check_int(lease_epoch, "lease_epoch", minimum=1)
        if actor is not None:
            check_key(actor, "actor")
    except InvalidArgument:
        discard(fn)  # a coroutine passed as fn is closed, not left to warn "never awaited"
        raise
    check_fn(fn, step_key=step_key)


class TaskStep:
    """A task's step in the journal: the ``task_steps`` row of (task, step key), fenced by the lease."""

    def __init__(
        self,
        tasks: TaskManager,
        task_id: str,
        step_key: str,
        idempotent: bool,
        lease_epoch: int | None,
        actor: str,
    ) -> None:
        self.backend = tasks.backend
        self.codec = tasks.codec
        self.task_id = task_id
        self.step_key = step_key
        self.idempotent = idempotent
        self.lease_epoch = lease_epoch
        self.actor = actor
        self.starts = tasks.unheard_starts

    async def begin(self) -> tuple[StepRecord, bool]:
        started = rules.step_notes("task.step.started", self.actor)
        # A start whose answer was lost is retried with its attempt id: if its record landed, it is this
        # start's (fn never ran) and fn runs now, instead of the record being taken for a start in doubt.
        unheard = self.starts
        key = (self.task_id, self.step_key, self.lease_epoch)
        attempt_id = unheard.get(key) or secrets.token_hex(12)
        try:
            out = await self.backend.begin_step(
                self.task_id,
                self.step_key,
                rerun_started=self.idempotent,
                lease_epoch=self.lease_epoch,
                now=rules.utcnow(),
                # run is True when a started record was written (a first run or a re-run); a replay
                # writes nothing.
                audit=lambda out: started(out[0] if out[1] else None),
                attempt_id=attempt_id,
            )
        except BaseException as exc:
            rules.remember_unheard(unheard, key, attempt_id, exc)
            raise
        rules.remember_unheard(unheard, key, attempt_id, None)
        return out

    def recorded(self, record: StepRecord) -> Any:
        """The outcome of a step that is not run again: its result if it succeeded, else ``StepInDoubt``."""
        if record.status == "succeeded":
            return record.result
        raise StepInDoubt(
            f"step {record.step_key!r} of task {record.task_id!r} was started (attempt {record.attempt}, at "
            f"{record.started_at.isoformat()}) but its outcome was never recorded",
            record=record,
            task_id=record.task_id,
            step_key=record.step_key,
        )

    async def failed(self, record: StepRecord, error: bytes) -> None:
        await self.backend.finish_step(
            record.task_id,
            record.step_key,
            status="failed",
            attempt=record.attempt,
            error=error,
            audit=rules.step_notes("task.step.failed", self.actor, error_sha256=rules.digest(error)),
        )

    async def succeeded(self, record: StepRecord, value: Any) -> Any:
        """Commit a step's result and return it as stored (decoded)."""
        task_id, step_key = record.task_id, record.step_key
        try:
            raw = self.codec.encode(value, where="result")
        except SerializationError as exc:
            # fn ran, so its side effect may have happened: the step stays in doubt rather than failed.
            raise type(exc)(
                f"step {step_key!r} of task {task_id!r} ran but returned a value that cannot be stored "
                f"({exc}); the step is left in doubt: settle it with resolve_step()",
                **exc.fields,
            ) from None
        done = await self.backend.finish_step(
            task_id,
            step_key,
            status="succeeded",
            attempt=record.attempt,
            result=raw,
            audit=rules.step_notes("task.step.succeeded", self.actor, result_sha256=rules.digest(raw)),
        )
        if done is None:
            current = await self.backend.get_step(task_id, step_key)
            if current is not None and current.status == "succeeded" and current.attempt > record.attempt:
                return current.result  # a concurrent re-run of this idempotent step recorded first
            # Resolved (resolve_step) while fn ran, or re-run and not finished: this result is not stored.
            raise ConflictError(
                f"step {step_key!r} of task {task_id!r} was settled or re-run by someone else while it ran "
                f"(now {'missing' if current is None else current.status}, attempt "
                f"{'-' if current is None else current.attempt}); the result of this run was not recorded",
                task_id=task_id,
                step_key=step_key,
                current=None if current is None else current.status,
            )
        return self.codec.decode(raw)


__all__ = ["TaskStep", "check_step_args"]
