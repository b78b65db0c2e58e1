"""Schedules (``store.schedules``): recurring work, one task per slot, each slot exactly once.

    await store.schedules.create("triage", cron="0 9 * * 1-5", timezone="Europe/Berlin",
                                 task={"title": "triage new failures", "priority": 7})
    tasks = await store.schedules.tick()          # from any number of processes, as often as you like

A slot's task has the idempotency key ``schedule:<schedule id>:<slot>``, and the schedule's record of the
slots it handled (``fired_through``) advances by a conditional update in the transaction that inserts the
task: two processes ticking at once create one task per slot, and a process killed mid-tick leaves both
or neither. See ``docs/schedules.md`` for catch-up, overlap, DST and the clock.

**Audited.** Each change commits with its entry, subject ``schedule:<name>``: ``schedule.created``,
``schedule.updated``, ``schedule.paused``, ``schedule.resumed``, ``schedule.deleted`` (actor: the
caller's), ``schedule.fired`` for each slot that created its task (with the task's ``task.created``) and
``schedule.skipped`` for slots left out by the catch-up or overlap policy (actor
``statekeel.scheduler``).
"""

from __future__ import annotations

import builtins
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from ..backends.base import (
    CATCH_UP_POLICIES,
    OVERLAP_POLICIES,
    AuditNote,
    FiredSchedule,
    NewSchedule,
    Page,
    ScheduleChange,
    ScheduleFire,
    ScheduleRecord,
    ScheduleSlot,
    StorageBackend,
    TaskRecord,
)
from ..codec import Codec, canonical
from ..errors import ConflictError, InvalidArgument, NotFound
from ..tasks import Task, new_task, task_note
from ..validation import check_int, check_key
from .slots import Slots, check_cron, check_every, check_timezone

Schedule = ScheduleRecord
"""A schedule as stored: see :class:`statekeel.backends.base.ScheduleRecord`."""

SCHEDULER_ACTOR = "statekeel.scheduler"
# A tick fires at most this many slots of one schedule (catch_up="all"); the next tick goes on.
MAX_SLOTS_PER_TICK = 100
DEFAULT_WINDOWS = {"skip": 60.0, "one": 0.0, "all": 86_400.0}
_TEMPLATE_KEYS = frozenset({"title", "description", "priority", "max_retries", "metadata"})
_TRIES = 5
_UNSET: Any = object()


def utcnow() -> dt.datetime:
    """The clock the schedules read (tests move it)."""
    return dt.datetime.now(dt.UTC)


def _note(kind: str, actor: str, schedule: ScheduleRecord, data: dict[str, Any]) -> AuditNote:
    body = {"schedule_id": schedule.id, "name": schedule.name, **data}
    return kind, actor, f"schedule:{schedule.name}", canonical(body).decode("utf-8")


def _definition(schedule: ScheduleRecord) -> dict[str, Any]:
    return {
        "cron": schedule.cron,
        "every": schedule.every_seconds,
        "timezone": schedule.timezone,
        "catch_up": schedule.catch_up,
        "catch_up_window": schedule.catch_up_window,
        "overlap": schedule.overlap,
        "version": schedule.version,
    }


class ScheduleManager:
    """Creates, edits, pauses, resumes and deletes schedules, and fires their slots (:meth:`tick`)."""

    def __init__(self, backend: StorageBackend, codec: Codec) -> None:
        self.backend = backend
        self.codec = codec

    # --- definition ---------------------------------------------------------------------------------

    def _template(self, task: Any) -> bytes:
        """The task template, checked as ``tasks.create`` checks a task, encoded."""
        if type(task) is str:
            task = {"title": task}
        if type(task) is not dict:
            raise InvalidArgument(
                "task must be a title or a dict with title (and description, priority, max_retries, "
                f"metadata), got {task!r}"
            )
        unknown = set(task) - _TEMPLATE_KEYS
        if unknown:
            raise InvalidArgument(
                f"task has unknown fields {sorted(unknown)}; use {', '.join(sorted(_TEMPLATE_KEYS))}",
                fields=sorted(unknown),
            )
        if "title" not in task:
            raise InvalidArgument("task needs a title")
        new_task(self.codec, **task, status="queued")  # the checks of tasks.create
        if "schedule" in (task.get("metadata") or {}):
            raise InvalidArgument("task metadata may not use the key 'schedule': each task's names its slot")
        return self.codec.encode(task, where="task")

    def _rule(
        self, cron: Any, every: Any, timezone: Any, catch_up: Any, catch_up_window: Any, overlap: Any
    ) -> tuple[str | None, int | None, str, str, float, str]:
        if (cron is None) == (every is None):
            raise InvalidArgument("give a schedule either cron= (an expression) or every= (seconds)")
        cron_text = None if cron is None else check_cron(cron)
        every_seconds = None if every is None else check_every(every)
        check_timezone(timezone)
        if catch_up not in CATCH_UP_POLICIES or type(catch_up) is not str:
            raise InvalidArgument(
                f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}, got {catch_up!r}", value=catch_up
            )
        if overlap not in OVERLAP_POLICIES or type(overlap) is not str:
            raise InvalidArgument(
                f"overlap must be one of {', '.join(OVERLAP_POLICIES)}, got {overlap!r}", value=overlap
            )
        if catch_up_window is None:
            window = DEFAULT_WINDOWS[catch_up]
        elif type(catch_up_window) in (int, float) and 0 <= catch_up_window <= 366 * 86_400:
            window = float(catch_up_window)
        else:
            raise InvalidArgument(
                f"catch_up_window must be seconds in [0, {366 * 86_400}], got {catch_up_window!r}"
            )
        slots = Slots(cron_text, every_seconds, timezone)
        if slots.after(utcnow()) is None:
            raise InvalidArgument(f"cron {cron!r} never fires (no such date)", value=cron)
        return cron_text, every_seconds, timezone, catch_up, window, overlap

    async def create(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: float | dt.timedelta | None = None,
        timezone: str = "UTC",
        task: dict[str, Any] | str,
        catch_up: str = "one",
        catch_up_window: float | None = None,
        overlap: str = "skip",
        actor: str | None = None,
    ) -> Schedule:
        """Create a schedule that creates a queued task from ``task`` (a title, or a dict of title,
        description, priority, max_retries, metadata) at each slot of ``cron`` (five fields, read in
        ``timezone``) or of ``every`` (seconds, or a timedelta: the multiples of it since the Unix epoch).
        Slots before now never fire.

        ``catch_up`` says what a tick does with slots it missed (the store was down, nobody ticked):
        "skip" fires a slot only within ``catch_up_window`` seconds of it (default 60); "one" fires only
        the latest missed slot (default); "all" fires each missed slot no older than ``catch_up_window``
        (default a day), oldest first. ``overlap`` "skip" (default) skips a slot while the task of the
        previous one has not finished; "queue" creates it anyway.

        ``ConflictError`` when a schedule of that name exists; ``InvalidArgument`` (nothing written) for
        a bad argument. Audited (``schedule.created``, actor ``actor`` or "unspecified").
        """
        check_key(name, "name")
        who = _actor(actor)
        encoded = self._template(task)
        rule = self._rule(cron, every, timezone, catch_up, catch_up_window, overlap)
        now = utcnow()
        slots = Slots(rule[0], rule[1], rule[2])
        new = NewSchedule(
            id=str(uuid.uuid4()),
            name=name,
            cron=rule[0],
            every_seconds=rule[1],
            timezone=rule[2],
            task=encoded,
            catch_up=rule[3],
            catch_up_window=rule[4],
            overlap=rule[5],
            fired_through=now,
            next_fire_at=slots.after(now),
        )
        created = await self.backend.create_schedule(
            new,
            audit=lambda out: [] if out is None else [_note("schedule.created", who, out, _definition(out))],
        )
        if created is None:
            raise ConflictError(
                f"a schedule named {name!r} exists; pick another name, or update() or delete() it",
                name=name,
            )
        return created

    async def get(self, name: str) -> Schedule | None:
        """The schedule, or None."""
        check_key(name, "name")
        return await self.backend.get_schedule(name)

    async def _require(self, name: str) -> Schedule:
        schedule = await self.backend.get_schedule(name)
        if schedule is None:
            raise NotFound(f"schedule {name!r} does not exist", name=name)
        return schedule

    async def list(self, *, limit: int = 100, cursor: str | None = None) -> Page:
        """Schedules by name; pass a page's ``next_cursor`` as ``cursor`` for the next one."""
        check_int(limit, "limit", minimum=1)
        if cursor is not None and type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str from a previous page, got {cursor!r}")
        return await self.backend.list_schedules(limit=limit, cursor=cursor)

    async def update(
        self,
        name: str,
        *,
        cron: Any = _UNSET,
        every: Any = _UNSET,
        timezone: Any = _UNSET,
        task: Any = _UNSET,
        catch_up: Any = _UNSET,
        catch_up_window: Any = _UNSET,
        overlap: Any = _UNSET,
        actor: str | None = None,
    ) -> Schedule:
        """Change the named fields of a schedule (those not given stay; pass ``cron=`` with
        ``every=None`` to switch kinds). The slots already handled stay handled; the next slot follows
        the new rule. A tick firing meanwhile either committed before (its slot used the old definition)
        or plans again with the new one. Audited (``schedule.updated``)."""
        check_key(name, "name")
        who = _actor(actor)
        encoded = None if task is _UNSET else self._template(task)
        fields = {"cron": cron, "every": every, "timezone": timezone, "catch_up": catch_up}
        fields |= {"catch_up_window": catch_up_window, "overlap": overlap}
        if cron is not _UNSET and every is _UNSET:
            fields["every"] = None
        if every is not _UNSET and cron is _UNSET:
            fields["cron"] = None

        def change(current: ScheduleRecord) -> ScheduleChange:
            given = {k: v for k, v in fields.items() if v is not _UNSET}
            merged = {**_definition(current), **given}
            if "catch_up" in given and "catch_up_window" not in given:
                merged["catch_up_window"] = None
            rule = self._rule(
                merged["cron"],
                merged["every"],
                merged["timezone"],
                merged["catch_up"],
                merged["catch_up_window"],
                merged["overlap"],
            )
            return _change(
                current,
                rule,
                encoded or self.codec.encode(current.task, where="task"),
                paused=current.paused,
                fired_through=current.fired_through,
            )

        return await self._update(name, change, who, "schedule.updated")

    async def pause(self, name: str, *, actor: str) -> Schedule:
        """Stop firing: no slot fires while paused. Audited (``schedule.paused``)."""
        check_key(name, "name")
        check_key(actor, "actor")

        def change(current: ScheduleRecord) -> ScheduleChange:
            return _change(
                current,
                _rule_of(current),
                self.codec.encode(current.task, where="task"),
                paused=True,
                fired_through=current.fired_through,
            )

        return await self._update(name, change, actor, "schedule.paused")

    async def resume(self, name: str, *, actor: str) -> Schedule:
        """Fire again from now on: the slots that passed while it was paused never fire. Audited
        (``schedule.resumed``)."""
        check_key(name, "name")
        check_key(actor, "actor")
        now = utcnow()

        def change(current: ScheduleRecord) -> ScheduleChange:
            return _change(
                current,
                _rule_of(current),
                self.codec.encode(current.task, where="task"),
                paused=False,
                fired_through=max(current.fired_through, now) if current.paused else current.fired_through,
            )

        return await self._update(name, change, actor, "schedule.resumed")

    async def _update(self, name: str, change: Any, who: str, kind: str) -> Schedule:
        for _ in range(_TRIES):
            current = await self._require(name)
            planned: ScheduleChange = change(current)
            updated = await self.backend.update_schedule(
                name,
                expected_version=current.version,
                change=planned,
                audit=lambda out: [] if out is None else [_note(kind, who, out, _definition(out))],
            )
            if updated is not None:
                return updated
        raise ConflictError(f"schedule {name!r} kept changing while being changed; try again", name=name)

    async def delete(self, name: str, *, actor: str) -> None:
        """Delete the schedule; the tasks it created stay. ``NotFound`` if there is none. Audited
        (``schedule.deleted``)."""
        check_key(name, "name")
        check_key(actor, "actor")
        current = await self._require(name)
        gone = await self.backend.delete_schedule(
            name,
            schedule_id=current.id,
            audit=lambda out: [_note("schedule.deleted", actor, current, {})] if out else [],
        )
        if not gone:
            raise NotFound(f"schedule {name!r} does not exist (deleted meanwhile)", name=name)

    async def next_fires(self, name: str, n: int = 5) -> builtins.list[dt.datetime]:
        """The next ``n`` slots of the schedule, in its timezone ([] while paused). A slot that its
        overlap policy skips when it comes is listed all the same."""
        check_key(name, "name")
        check_int(n, "n", minimum=1, maximum=1000)
        schedule = await self._require(name)
        if schedule.paused:
            return []
        slots = Slots(schedule.cron, schedule.every_seconds, schedule.timezone)
        return slots.upcoming(max(schedule.fired_through, utcnow()), n)

    # --- firing -------------------------------------------------------------------------------------

    async def tick(self, *, now: dt.datetime | None = None) -> builtins.list[Task]:
        """Fire every slot that is due at ``now`` (default: this process's clock) and return the tasks
        created, oldest slot first. Safe to call from any number of processes at once: each slot creates
        its task exactly once (unless its catch-up or overlap policy skips it)."""
        if now is not None and (type(now) is not dt.datetime or now.utcoffset() is None):
            raise InvalidArgument(f"now must be a timezone-aware datetime, got {now!r}")
        when = (now or utcnow()).astimezone(dt.UTC)
        created: builtins.list[Task] = []
        after: tuple[dt.datetime, str] | None = None
        while True:
            due = await self.backend.due_schedules(when, after=after, limit=500)
            for schedule in due:
                created.extend(await self._fire(schedule, when))
            if len(due) < 500:
                return created
            last = due[-1]
            assert last.next_fire_at is not None
            after = (last.next_fire_at, last.id)

    async def _fire(self, schedule: ScheduleRecord, when: dt.datetime) -> builtins.list[Task]:
        """Fire the due slots of ``schedule``; planned again from a fresh read when it changed since."""
        current: ScheduleRecord | None = schedule
        for _ in range(_TRIES):
            if current is None or current.paused:
                return []
            plan = self._plan(current, when)
            if plan is None:
                return []
            fire, skipped = plan
            fired = await self.backend.fire_schedule(
                current.id,
                expected_version=current.version,
                fire=fire,
                audit=_fire_audit(skipped, current),
            )
            if fired is not None:
                return [task for _, task, new in fired.tasks if new]
            current = await self.backend.get_schedule(schedule.name)
            if current is not None and current.id != schedule.id:
                return []  # deleted and made again under that name: its own tick fires it
        return []  # kept changing: the next tick fires what is still due

    def _plan(
        self, schedule: ScheduleRecord, when: dt.datetime
    ) -> tuple[ScheduleFire, dict[str, Any] | None] | None:
        """What a tick at ``when`` does to ``schedule``: the slots to fire, how far it advances, and the
        range of slots the catch-up policy skips (None when nothing is due: a clock behind the schedule's
        last handled slot fires nothing)."""
        if when <= schedule.fired_through:
            return None
        slots = Slots(schedule.cron, schedule.every_seconds, schedule.timezone)
        latest = slots.at_or_before(when)
        first = slots.after(schedule.fired_through)
        if latest is None or first is None or latest <= schedule.fired_through:
            if schedule.next_fire_at is not None and schedule.next_fire_at <= when:
                fire = ScheduleFire((), schedule.fired_through, first, schedule.overlap)
                return fire, None  # the next slot moved (an edit): only the index entry changes
            return None
        window = dt.timedelta(seconds=schedule.catch_up_window)
        chosen: builtins.list[dt.datetime] = []
        through = when
        if schedule.catch_up == "one":
            chosen = [latest]
        elif schedule.catch_up == "skip":
            chosen = [latest] if when - latest <= window else []
        else:
            at: dt.datetime | None = slots.after(max(schedule.fired_through, when - window) - _TINY)
            while at is not None and at <= when and len(chosen) < MAX_SLOTS_PER_TICK:
                if at > schedule.fired_through:
                    chosen.append(at)
                at = slots.after(at)
            if at is not None and at <= when:
                through = chosen[-1]  # capped: the rest on the next tick
        skipped = None
        limit = chosen[0] - _TINY if chosen else through
        if first <= limit:
            skipped = {
                "reason": "catch_up",
                "policy": schedule.catch_up,
                "from": first.isoformat(),
                "to": (slots.at_or_before(limit) or first).isoformat(),
            }
        template = schedule.task
        fire_slots = tuple(ScheduleSlot(at, self._slot_task(schedule, template, at)) for at in chosen)
        return ScheduleFire(fire_slots, through, slots.after(through), schedule.overlap), skipped

    def _slot_task(self, schedule: ScheduleRecord, template: dict[str, Any], at: dt.datetime) -> Any:
        metadata = dict(template.get("metadata") or {})
        metadata["schedule"] = {"name": schedule.name, "id": schedule.id, "slot": at.isoformat()}
        return new_task(
            self.codec,
            template["title"],
            description=template.get("description"),
            priority=template.get("priority", 5),
            max_retries=template.get("max_retries", 3),
            metadata=metadata,
            idempotency_key=f"schedule:{schedule.id}:{at.isoformat()}",
            status="queued",
        )


_TINY = dt.timedelta(microseconds=1)


def _actor(actor: Any) -> str:
    if actor is None:
        return "unspecified"
    return check_key(actor, "actor")


def _rule_of(schedule: ScheduleRecord) -> tuple[str | None, int | None, str, str, float, str]:
    return (
        schedule.cron,
        schedule.every_seconds,
        schedule.timezone,
        schedule.catch_up,
        schedule.catch_up_window,
        schedule.overlap,
    )


def _change(
    current: ScheduleRecord,
    rule: tuple[str | None, int | None, str, str, float, str],
    task: bytes,
    *,
    paused: bool,
    fired_through: dt.datetime,
) -> ScheduleChange:
    slots = Slots(rule[0], rule[1], rule[2])
    return ScheduleChange(
        cron=rule[0],
        every_seconds=rule[1],
        timezone=rule[2],
        task=task,
        catch_up=rule[3],
        catch_up_window=rule[4],
        overlap=rule[5],
        paused=paused,
        fired_through=fired_through,
        next_fire_at=slots.after(fired_through),
    )


def _fire_audit(
    skipped: dict[str, Any] | None, planned: ScheduleRecord
) -> Callable[[FiredSchedule | None], builtins.list[AuditNote]]:
    return lambda fired: _fire_notes(fired, skipped, planned)


def _fire_notes(
    fired: FiredSchedule | None, skipped: dict[str, Any] | None, planned: ScheduleRecord
) -> builtins.list[AuditNote]:
    if fired is None:
        return []
    schedule = fired.schedule
    notes: builtins.list[AuditNote] = []
    if skipped is not None:
        notes.append(_note("schedule.skipped", SCHEDULER_ACTOR, schedule, skipped))
    for at in fired.overlapped:
        data = {"reason": "overlap", "slot": at.isoformat(), "running_task_id": planned.last_task_id}
        notes.append(_note("schedule.skipped", SCHEDULER_ACTOR, schedule, data))
    for at, task, new in fired.tasks:
        if not new:
            continue
        notes.append(_task_created(task, schedule))
        notes.append(_note("schedule.fired", SCHEDULER_ACTOR, schedule, _fired(at, task)))
    return notes


def _task_created(task: TaskRecord, schedule: ScheduleRecord) -> AuditNote:
    data = {"status": task.status, "workflow_id": None, "version": task.version, "via": "schedule"}
    return task_note("task.created", SCHEDULER_ACTOR, task.id, {**data, "schedule_id": schedule.id})


def _fired(at: dt.datetime, task: TaskRecord) -> dict[str, Any]:
    return {"slot": at.isoformat(), "task_id": task.id}
