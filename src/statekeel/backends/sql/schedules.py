"""Schedules: the operations every SQL dialect shares.

The slot arithmetic (cron, timezones, catch-up) lives in ``statekeel.schedules``; here a fire is one
transaction: the conditional advance of the schedule (on the version the tick planned from), then the
task of each slot, inserted by its idempotency key, then the audit entries. Two ticks racing, or a tick and
an edit, cannot both advance a schedule; a process killed in between leaves neither.
"""

from __future__ import annotations

import datetime as dt

from ..base import (
    AuditNotes,
    FiredSchedule,
    NewSchedule,
    Page,
    ScheduleBackend,
    ScheduleChange,
    ScheduleFire,
    ScheduleRecord,
    TaskRecord,
)
from . import Row, SqlBackend, Tx, utcnow
from .audit import audited
from .tasks import insert_task, ts_in_or_none, ts_or_none

# A task in one of these statuses no longer runs: the next slot of an overlap="skip" schedule may fire.
_FINISHED = frozenset({"success", "failed", "cancelled"})
_DUE_START = (dt.datetime(1970, 1, 1, tzinfo=dt.UTC), "")


def schedule_from_row(tx: Tx, row: Row) -> ScheduleRecord:
    every = row["every_seconds"]
    return ScheduleRecord(
        id=row["id"],
        name=row["name"],
        cron=row["cron"],
        every_seconds=None if every is None else int(every),
        timezone=row["timezone"],
        task=tx.json_out(row["task"]),
        catch_up=row["catch_up"],
        catch_up_window=float(row["catch_up_window"]),
        overlap=row["overlap"],
        paused=bool(row["paused"]),
        fired_through=tx.ts_out(row["fired_through"]),
        next_fire_at=ts_or_none(tx, row["next_fire_at"]),
        last_slot=ts_or_none(tx, row["last_slot"]),
        last_task_id=row["last_task_id"],
        version=int(row["version"]),
        created_at=tx.ts_out(row["created_at"]),
        updated_at=tx.ts_out(row["updated_at"]),
    )


async def op_create_schedule(tx: Tx, new: NewSchedule) -> ScheduleRecord | None:
    row = await tx.fetchone(
        "schedule_insert",
        new.id,
        new.name,
        new.cron,
        new.every_seconds,
        new.timezone,
        tx.json_in(new.task),
        new.catch_up,
        new.catch_up_window,
        new.overlap,
        tx.ts_in(new.fired_through),
        ts_in_or_none(tx, new.next_fire_at),
        tx.ts_in(utcnow()),
    )
    return None if row is None else schedule_from_row(tx, row)


async def op_get_schedule(tx: Tx, name: str) -> ScheduleRecord | None:
    row = await tx.fetchone("schedule_get", name)
    return None if row is None else schedule_from_row(tx, row)


async def op_list_schedules(tx: Tx, limit: int, cursor: str | None) -> Page:
    rows = await tx.fetchall("schedule_list", cursor or "", limit + 1)
    items = [schedule_from_row(tx, r) for r in rows[:limit]]
    return Page(items=items, next_cursor=items[-1].name if len(rows) > limit else None)


async def op_due_schedules(
    tx: Tx, now: dt.datetime, after: tuple[dt.datetime, str] | None, limit: int
) -> list[ScheduleRecord]:
    at, after_id = after or _DUE_START
    rows = await tx.fetchall("schedule_due", tx.ts_in(now), tx.ts_in(at), after_id, limit)
    return [schedule_from_row(tx, r) for r in rows]


async def op_update_schedule(
    tx: Tx, name: str, expected_version: int, change: ScheduleChange
) -> ScheduleRecord | None:
    row = await tx.fetchone(
        "schedule_update",
        change.cron,
        change.every_seconds,
        change.timezone,
        tx.json_in(change.task),
        change.catch_up,
        change.catch_up_window,
        change.overlap,
        change.paused,
        tx.ts_in(change.fired_through),
        ts_in_or_none(tx, change.next_fire_at),
        tx.ts_in(utcnow()),
        name,
        expected_version,
    )
    return None if row is None else schedule_from_row(tx, row)


async def _unfinished(tx: Tx, task_id: str | None) -> bool:
    if task_id is None:
        return False
    row = await tx.fetchone("task_get", task_id)
    return row is not None and row["status"] not in _FINISHED


async def op_fire_schedule(
    tx: Tx, schedule_id: str, expected_version: int, fire: ScheduleFire
) -> FiredSchedule | None:
    now = utcnow()
    # First the slot record, conditional on the version planned from: PostgreSQL and MariaDB hold the
    # row from here to the COMMIT, so a racing tick waits, then finds the version moved and writes nothing.
    row = await tx.fetchone(
        "schedule_advance",
        tx.ts_in(fire.fired_through),
        ts_in_or_none(tx, fire.next_fire_at),
        tx.ts_in(now),
        schedule_id,
        expected_version,
    )
    if row is None:
        return None
    schedule = schedule_from_row(tx, row)
    last_task_id, last_slot = schedule.last_task_id, schedule.last_slot
    tasks: list[tuple[dt.datetime, TaskRecord, bool]] = []
    overlapped: list[dt.datetime] = []
    for slot in fire.slots:
        if fire.overlap == "skip" and await _unfinished(tx, last_task_id):
            overlapped.append(slot.at)
            continue
        task, created = await insert_task(tx, slot.task, now)
        tasks.append((slot.at, task, created))
        last_task_id, last_slot = task.id, slot.at
    if tasks:
        row = await tx.fetchone("schedule_last_task", ts_in_or_none(tx, last_slot), last_task_id, schedule_id)
        assert row is not None  # the row is this transaction's since schedule_advance
        schedule = schedule_from_row(tx, row)
    return FiredSchedule(schedule=schedule, tasks=tuple(tasks), overlapped=tuple(overlapped))


async def op_delete_schedule(tx: Tx, name: str, schedule_id: str) -> bool:
    return await tx.execute("schedule_delete", name, schedule_id) > 0


class SqlSchedules(SqlBackend, ScheduleBackend):
    """The schedule contract over the shared operations above."""

    async def create_schedule(
        self, schedule: NewSchedule, *, audit: AuditNotes | None = None
    ) -> ScheduleRecord | None:
        op = audited(op_create_schedule, audit, self.audit_key, self.audit_outbox)
        return await self._write(op, schedule)

    async def get_schedule(self, name: str) -> ScheduleRecord | None:
        return await self._read(op_get_schedule, name)

    async def list_schedules(self, *, limit: int = 100, cursor: str | None = None) -> Page:
        return await self._read(op_list_schedules, limit, cursor)

    async def due_schedules(
        self, now: dt.datetime, *, after: tuple[dt.datetime, str] | None = None, limit: int = 500
    ) -> list[ScheduleRecord]:
        return await self._read(op_due_schedules, now, after, limit)

    async def update_schedule(
        self,
        name: str,
        *,
        expected_version: int,
        change: ScheduleChange,
        audit: AuditNotes | None = None,
    ) -> ScheduleRecord | None:
        op = audited(op_update_schedule, audit, self.audit_key, self.audit_outbox)
        return await self._write(op, name, expected_version, change)

    async def fire_schedule(
        self,
        schedule_id: str,
        *,
        expected_version: int,
        fire: ScheduleFire,
        audit: AuditNotes | None = None,
    ) -> FiredSchedule | None:
        op = audited(op_fire_schedule, audit, self.audit_key, self.audit_outbox)
        return await self._write(op, schedule_id, expected_version, fire)

    async def delete_schedule(self, name: str, *, schedule_id: str, audit: AuditNotes | None = None) -> bool:
        op = audited(op_delete_schedule, audit, self.audit_key, self.audit_outbox)
        return await self._write(op, name, schedule_id)
