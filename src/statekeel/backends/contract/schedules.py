"""Schedules: recurring work that creates a task per slot, each slot exactly once."""

from __future__ import annotations

import abc
import datetime as dt
from dataclasses import dataclass
from typing import Any

from statekeel.backends.contract.store import Page
from statekeel.backends.contract.tasks import AuditNotes, NewTask, TaskRecord

__all__ = [
    "CATCH_UP_POLICIES",
    "OVERLAP_POLICIES",
    "FiredSchedule",
    "NewSchedule",
    "ScheduleBackend",
    "ScheduleChange",
    "ScheduleFire",
    "ScheduleRecord",
    "ScheduleSlot",
]

CATCH_UP_POLICIES = ("skip", "one", "all")
OVERLAP_POLICIES = ("skip", "queue")


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A schedule's row. Exactly one of ``cron`` (with ``timezone``) and ``every_seconds`` is set.

    ``fired_through``: every slot at or before it has been handled (fired or skipped), so a slot fires
    only if it is later. ``next_fire_at``: the first slot after ``fired_through`` (None: never again).
    ``last_slot`` and ``last_task_id``: the latest slot that created a task, and that task.
    ``task`` is the template of the tasks it creates (title, description, priority, max_retries,
    metadata)."""

    id: str
    name: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    task: dict[str, Any]
    catch_up: str
    catch_up_window: float
    overlap: str
    paused: bool
    fired_through: dt.datetime
    next_fire_at: dt.datetime | None
    last_slot: dt.datetime | None
    last_task_id: str | None
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A schedule to insert; ``task`` is the codec-encoded template."""

    id: str
    name: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    task: bytes
    catch_up: str
    catch_up_window: float
    overlap: str
    fired_through: dt.datetime
    next_fire_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class ScheduleChange:
    """The new values of a schedule's definition and state, written by one conditional update."""

    cron: str | None
    every_seconds: int | None
    timezone: str
    task: bytes
    catch_up: str
    catch_up_window: float
    overlap: str
    paused: bool
    fired_through: dt.datetime
    next_fire_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class ScheduleSlot:
    """A slot to fire and the task it creates (its idempotency key names the schedule and the slot)."""

    at: dt.datetime
    task: NewTask


@dataclass(frozen=True, slots=True)
class ScheduleFire:
    """What one tick does to one schedule: the slots it fires, in order, and how far it advances."""

    slots: tuple[ScheduleSlot, ...]
    fired_through: dt.datetime
    next_fire_at: dt.datetime | None
    overlap: str


@dataclass(frozen=True, slots=True)
class FiredSchedule:
    """What a fire wrote: the schedule after it, the tasks the slots created (in slot order, with a slot
    whose task existed already returned as that task, ``created`` False), and the slots skipped because
    the previous slot's task was still unfinished (``overlap="skip"``)."""

    schedule: ScheduleRecord
    tasks: tuple[tuple[dt.datetime, TaskRecord, bool], ...]
    overlapped: tuple[dt.datetime, ...]


class ScheduleBackend(abc.ABC):
    """Schedules. Every write takes ``audit`` (see :data:`AuditNotes`): its entries commit with it."""

    @abc.abstractmethod
    async def create_schedule(
        self, schedule: NewSchedule, *, audit: AuditNotes | None = None
    ) -> ScheduleRecord | None:
        """Insert the schedule; None (nothing written) when its name is taken."""

    @abc.abstractmethod
    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        """The schedule of that name, or None."""

    @abc.abstractmethod
    async def list_schedules(self, *, limit: int = 100, cursor: str | None = None) -> Page:
        """Schedules by name, cursor-paginated."""

    @abc.abstractmethod
    async def due_schedules(
        self, now: dt.datetime, *, after: tuple[dt.datetime, str] | None = None, limit: int = 500
    ) -> list[ScheduleRecord]:
        """Unpaused schedules whose ``next_fire_at`` is at or before ``now``, by (next_fire_at, id),
        after the (next_fire_at, id) ``after``."""

    @abc.abstractmethod
    async def update_schedule(
        self,
        name: str,
        *,
        expected_version: int,
        change: ScheduleChange,
        audit: AuditNotes | None = None,
    ) -> ScheduleRecord | None:
        """Apply ``change`` if the schedule is still at ``expected_version`` (bumping it); else None."""

    @abc.abstractmethod
    async def fire_schedule(
        self,
        schedule_id: str,
        *,
        expected_version: int,
        fire: ScheduleFire,
        audit: AuditNotes | None = None,
    ) -> FiredSchedule | None:
        """In one transaction: advance the schedule to ``fire.fired_through`` if it is still at
        ``expected_version`` (else None, nothing written), and insert the task of each slot (by its
        idempotency key: a slot's task is never created twice). With ``fire.overlap`` "skip" a slot
        whose previous slot's task is unfinished creates none."""

    @abc.abstractmethod
    async def delete_schedule(self, name: str, *, schedule_id: str, audit: AuditNotes | None = None) -> bool:
        """Delete the schedule of that name if it is still the one with ``schedule_id``; its tasks stay.
        False when it was not there."""
