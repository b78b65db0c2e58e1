"""Schedules (:class:`ScheduleManager`, ``store.schedules``): a cron expression in a timezone, or an
interval, that creates a task per slot, each slot exactly once however many processes tick.
``slots.py`` holds the slot arithmetic (the only module that imports croniter), ``manager.py`` the
manager; see ``docs/schedules.md``."""

from __future__ import annotations

from .manager import (
    DEFAULT_WINDOWS,
    MAX_SLOTS_PER_TICK,
    SCHEDULER_ACTOR,
    Schedule,
    ScheduleManager,
)
from .slots import Slots, check_cron, check_every, check_timezone

__all__ = [
    "DEFAULT_WINDOWS",
    "MAX_SLOTS_PER_TICK",
    "SCHEDULER_ACTOR",
    "Schedule",
    "ScheduleManager",
    "Slots",
    "check_cron",
    "check_every",
    "check_timezone",
]
