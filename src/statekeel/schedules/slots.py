"""The slots of a schedule: when a cron expression in a timezone, or an interval, fires. The only module
of statekeel that imports croniter.

- An interval (``every`` seconds) fires at the multiples of ``every`` since the Unix epoch (UTC): every
  3600 seconds is on the hour, whatever the timezone; daylight saving time does not move it.
- A cron expression (five fields, or ``@hourly``, ``@daily`` …) is read in its timezone's wall clock. A
  local time that does not exist (skipped when the clocks go forward) fires at the next valid instant
  (``30 2 * * *`` on the spring-forward night of Europe/Berlin fires at 03:00 local). A local time that
  happens twice (when the clocks go back) fires once, at its first occurrence.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

from croniter import CroniterBadDateError, CroniterError, croniter

from ..errors import InvalidArgument

UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MAX_EVERY_SECONDS = 366 * 24 * 3600
# croniter steps through candidate times; a rule that finds none in this many steps never fires.
_MAX_STEPS = 1000


def check_timezone(value: Any) -> zoneinfo.ZoneInfo:
    """The IANA timezone named ``value`` (e.g. "Europe/Berlin")."""
    if type(value) is not str or not value or len(value) > 128:
        raise InvalidArgument(f"timezone must be an IANA timezone name such as 'UTC', got {value!r}")
    try:
        return zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(
            f"timezone {value!r} is not a known IANA timezone; use a name such as 'UTC' or 'Europe/Berlin'",
            value=value,
        ) from None


def check_cron(value: Any) -> str:
    """``value`` if it is a five-field cron expression (or an ``@`` alias such as ``@daily``)."""
    if type(value) is not str or len(value) > 1024:
        raise InvalidArgument(f"cron must be a cron expression such as '0 9 * * 1-5', got {value!r}")
    fields = value.split()
    if not (len(fields) == 5 or (len(fields) == 1 and fields[0].startswith("@"))):
        raise InvalidArgument(
            f"cron {value!r} must have five fields (minute hour day-of-month month day-of-week), e.g. "
            "'0 9 * * 1-5', or be an alias such as '@daily'",
            value=value,
        )
    if not croniter.is_valid(value):
        raise InvalidArgument(f"cron {value!r} is not a valid cron expression", value=value)
    return " ".join(fields)


def check_every(value: Any) -> int:
    """``value`` (seconds, or a ``timedelta``) as whole seconds in [1, a year and a day]."""
    seconds: Any = value
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
        if value % dt.timedelta(seconds=1):
            seconds = None
    if type(seconds) is float:
        seconds = int(seconds) if seconds.is_integer() else None
    if type(seconds) is not int or not 1 <= seconds <= MAX_EVERY_SECONDS:
        raise InvalidArgument(
            f"every must be a whole number of seconds in [1, {MAX_EVERY_SECONDS}] (or a timedelta of "
            f"whole seconds), got {value!r}",
            value=value,
        )
    return int(seconds)


class Slots:
    """The slot rule of one schedule. Times in and out are aware datetimes; out in UTC."""

    def __init__(self, cron: str | None, every_seconds: int | None, timezone: str) -> None:
        self.cron = cron
        self.every_us = None if every_seconds is None else every_seconds * 1_000_000
        self.zone = check_timezone(timezone)

    def after(self, at: dt.datetime) -> dt.datetime | None:
        """The first slot strictly after ``at`` (None: the rule fires never again)."""
        if self.every_us is not None:
            return _from_us((_us(at) // self.every_us + 1) * self.every_us)
        return self._cron_step(at, forward=True)

    def at_or_before(self, at: dt.datetime) -> dt.datetime | None:
        """The latest slot at or before ``at`` (None: none since the epoch)."""
        if self.every_us is not None:
            return _from_us(_us(at) // self.every_us * self.every_us)
        return self._cron_step(at, forward=False)

    def upcoming(self, after: dt.datetime, n: int) -> list[dt.datetime]:
        """The next ``n`` slots after ``after``, in the schedule's timezone."""
        out: list[dt.datetime] = []
        at: dt.datetime | None = after
        while len(out) < n and at is not None:
            at = self.after(at)
            if at is not None:
                out.append(at.astimezone(self.zone))
        return out

    def _cron_step(self, at: dt.datetime, *, forward: bool) -> dt.datetime | None:
        assert self.cron is not None
        utc = at.astimezone(UTC)
        # Going back, start a second later so a slot exactly at ``at`` is found.
        start = (utc if forward else utc + dt.timedelta(seconds=1)).astimezone(self.zone)
        steps = croniter(self.cron, start)
        for _ in range(_MAX_STEPS):
            try:
                local = steps.get_next(dt.datetime) if forward else steps.get_prev(dt.datetime)
            except CroniterBadDateError:
                return None
            except (CroniterError, OverflowError, ValueError):
                return None
            slot: dt.datetime = local.astimezone(UTC)
            if (slot <= utc) if forward else (slot > utc):
                continue  # a repeated or skipped local hour made croniter step in place
            if _second_occurrence(slot.astimezone(self.zone)):
                continue  # an ambiguous local time fires once: at its first occurrence
            return slot
        return None


def _second_occurrence(local: dt.datetime) -> bool:
    """Whether ``local`` is the second time its wall-clock reading happens (the clocks went back)."""
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _us(at: dt.datetime) -> int:
    delta = at.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_us(value: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=value)
