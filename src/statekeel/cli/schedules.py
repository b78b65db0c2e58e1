"""``statekeel schedules list|pause|resume|delete|next``: the schedules of the store and what an operator
does to them. Each is one library call (``schedules.list``, ``pause``, ``resume``, ``delete``,
``next_fires``); a change's audit entry names the ``--actor`` (default ``$USER``) and commits with it;
what the store does not allow is refused in one line, exit 1, nothing written."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Coroutine
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..backends.base import ScheduleRecord, every_item
from ..store import Store, redact_url
from ..wording import counted
from .common import (
    Keys,
    collect,
    console,
    echo_json,
    json_option,
    listing_console,
    open_for_reading,
    run,
    store_keys,
    store_options,
    store_url,
)
from .group import main
from .operate import actor_option, who_acts


def _when(value: dt.datetime | None) -> str:
    return "" if value is None else value.isoformat(sep=" ", timespec="seconds")


def _on(
    db: str | None, key_file: str | None, doing: str, action: Callable[[Store], Coroutine[Any, Any, Any]]
) -> Any:
    """Run ``action`` on the store named by ``--db`` (never created nor migrated)."""
    url, keys = store_url(db), store_keys(key_file)

    async def go(url: str, keys: Keys | None) -> Any:
        async with open_for_reading(url, keys) as store:
            return await action(store)

    return run(go(url, keys), f"{doing} in {redact_url(url)}")


@main.group()
def schedules() -> None:
    """Schedules: recurring work that creates a task per slot (see docs/schedules.md)."""


@schedules.command("list")
@store_options
@json_option
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many. Default: all.")
def schedules_list(db: str | None, key_file: str | None, as_json: bool, limit: int | None) -> None:
    """The schedules of the store by name: rule, timezone, policies, paused, next slot, last slot and the
    task it created."""

    async def every(store: Store) -> list[ScheduleRecord]:
        return await collect(every_item(lambda cursor: store.schedules.list(limit=500, cursor=cursor)), limit)

    found = _on(db, key_file, "cannot list the schedules", every)
    out = listing_console(found, as_json, "no schedules")
    if out is None:
        return
    table = Table(show_edge=False)
    for column in ("schedule", "rule", "timezone", "catch-up", "overlap", "state", "next", "last", "task"):
        table.add_column(column, no_wrap=column in ("schedule", "task"))
    for s in found:
        rule = s.cron if s.cron is not None else f"every {s.every_seconds}s"
        table.add_row(
            escape(s.name),
            escape(rule),
            s.timezone,
            s.catch_up,
            s.overlap,
            "paused" if s.paused else "active",
            "" if s.paused else _when(s.next_fire_at),
            _when(s.last_slot),
            s.last_task_id or "",
        )
    out.print(table)
    out.print(counted(len(found), "schedule"))


def _print_schedule(schedule: ScheduleRecord, as_json: bool, who: str, what: str) -> None:
    if as_json:
        echo_json(
            {"name": schedule.name, "paused": schedule.paused, "version": schedule.version, "actor": who}
        )
        return
    console().print(f"schedule {schedule.name}: {what} (by {who})", markup=False)


@schedules.command("pause")
@store_options
@json_option
@actor_option
@click.argument("name")
def schedules_pause(
    db: str | None, key_file: str | None, as_json: bool, actor: str | None, name: str
) -> None:
    """Pause schedule NAME: no slot fires until it is resumed. schedules.pause(), audited with the --actor."""
    who = who_acts(actor)
    done = _on(db, key_file, f"cannot pause schedule {name!r}", lambda s: s.schedules.pause(name, actor=who))
    _print_schedule(done, as_json, who, "paused")


@schedules.command("resume")
@store_options
@json_option
@actor_option
@click.argument("name")
def schedules_resume(
    db: str | None, key_file: str | None, as_json: bool, actor: str | None, name: str
) -> None:
    """Resume schedule NAME: it fires from now on (the slots that passed while it was paused never fire).
    schedules.resume(), audited with the --actor."""
    who = who_acts(actor)
    done = _on(
        db, key_file, f"cannot resume schedule {name!r}", lambda s: s.schedules.resume(name, actor=who)
    )
    _print_schedule(done, as_json, who, f"active, next slot {_when(done.next_fire_at)}")


@schedules.command("delete")
@store_options
@json_option
@actor_option
@click.argument("name")
def schedules_delete(
    db: str | None, key_file: str | None, as_json: bool, actor: str | None, name: str
) -> None:
    """Delete schedule NAME (the tasks it created stay). schedules.delete(), audited with the --actor.

    Refused (exit 1) for a schedule that does not exist.
    """
    who = who_acts(actor)
    _on(db, key_file, f"cannot delete schedule {name!r}", lambda s: s.schedules.delete(name, actor=who))
    if as_json:
        echo_json({"name": name, "deleted": True, "actor": who})
        return
    console().print(f"schedule {name}: deleted (by {who})", markup=False)


@schedules.command("next")
@store_options
@json_option
@click.argument("name")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True, help="How many.")
def schedules_next(db: str | None, key_file: str | None, as_json: bool, name: str, count: int) -> None:
    """The next slots of schedule NAME, in its timezone (none while it is paused)."""
    fires = _on(db, key_file, f"cannot read schedule {name!r}", lambda s: s.schedules.next_fires(name, count))
    if as_json:
        echo_json([f.isoformat() for f in fires])
        return
    out = console()
    if not fires:
        out.print(f"schedule {name} is paused: no slot fires", markup=False)
    for fire in fires:
        out.print(fire.isoformat(), markup=False)
