"""Schedules: each slot creates its task exactly once (however many ticks race, whatever the clock does),
catch-up and overlap policies, pause, resume, delete, next fires, DST, audit — on every SQL backend.

Time is the clock ``statekeel.schedules.manager`` reads, set by the test; races are forced by a hook on the
backend's fire, never by sleeping.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import zoneinfo
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import statekeel
import statekeel.schedules.manager
from statekeel.store import Store as StoreClass
from statekeel.store import StoreOptions

Store = statekeel.Store
UTC = dt.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
T0 = dt.datetime(2030, 1, 7, 8, 0, 30, tzinfo=UTC)  # a Monday, 30 s past a minute


class Clock:
    """The clock the schedules module reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: dt.datetime = T0) -> None:
        self.now = at
        monkeypatch.setattr(statekeel.schedules.manager, "utcnow", lambda: self.now)

    def at(self, seconds: float) -> dt.datetime:
        self.now = T0 + dt.timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def minute(n: int) -> dt.datetime:
    """The n-th whole minute after T0 (T0 is 30 s past one)."""
    return T0.replace(second=0) + dt.timedelta(minutes=n)


async def _tasks(store: Store) -> list[statekeel.Task]:
    return list((await store.tasks.list(limit=1000)).items)


async def _entries(store: Store, name: str) -> list[Any]:
    return await store.audit.query(subject=f"schedule:{name}", limit=1000)


def _before_fire(
    monkeypatch: pytest.MonkeyPatch, store: Store, hook: Callable[[], Awaitable[object]]
) -> list[int]:
    """Run ``hook`` once, between the first tick's plan and its write (what another process would do in
    that gap); returns the list of calls seen, for the test to check the hook ran."""
    original = store.backend.fire_schedule
    calls: list[int] = []

    async def fire(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            await hook()
        return await original(*args, **kwargs)

    monkeypatch.setattr(store.backend, "fire_schedule", fire)
    return calls


async def test_an_interval_schedule_creates_a_queued_task_per_slot_from_its_template(
    store: Store, clock: Clock
) -> None:
    made = await store.schedules.create(
        "digest",
        every=60,
        task={"title": "send digest", "priority": 7, "max_retries": 1, "metadata": {"team": "a"}},
        overlap="queue",
    )
    assert (made.cron, made.every_seconds, made.next_fire_at) == (None, 60, minute(1))
    assert await store.schedules.tick(now=minute(1) - dt.timedelta(microseconds=1)) == []
    [task] = await store.schedules.tick(now=minute(1))
    assert (task.title, task.status, task.priority, task.max_retries) == ("send digest", "queued", 7, 1)
    slot = minute(1).isoformat()
    assert task.metadata == {"team": "a", "schedule": {"name": "digest", "id": made.id, "slot": slot}}
    assert task.idempotency_key == f"schedule:{made.id}:{slot}"
    assert await store.schedules.tick(now=minute(1) + dt.timedelta(seconds=30)) == []
    [second] = await store.schedules.tick(now=minute(2))
    assert second.metadata["schedule"]["slot"] == minute(2).isoformat()
    after = await store.schedules.get("digest")
    assert after is not None and (after.last_slot, after.last_task_id) == (minute(2), second.id)
    assert after.next_fire_at == minute(3)
    assert len(await _tasks(store)) == 2


async def test_two_ticks_racing_for_a_slot_create_its_task_once(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.schedules.create("race", every=60, task="t", overlap="queue")
    other: list[statekeel.Task] = []

    async def other_ticker() -> None:
        other.extend(await store.schedules.tick(now=minute(1)))

    calls = _before_fire(monkeypatch, store, other_ticker)
    mine = await store.schedules.tick(now=minute(1))
    assert len(calls) >= 2 and len(other) == 1 and mine == []  # it planned first, the other wrote first
    assert [t.id for t in await _tasks(store)] == [other[0].id]
    fired = [e for e in await _entries(store, "race") if e.kind == "schedule.fired"]
    assert len(fired) == 1


async def test_ticks_from_several_stores_at_once_create_one_task_per_slot(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Clock(monkeypatch)
    stores = [await statekeel.open_store(shared_url) for _ in range(3)]
    try:
        await stores[0].schedules.create("many", every=60, task="t", catch_up="all", overlap="queue")
        for n in range(1, 6):
            made = await asyncio.gather(*(s.schedules.tick(now=minute(n)) for s in stores for _ in range(2)))
            assert sum(len(m) for m in made) == 1, n
        slots = sorted(t.metadata["schedule"]["slot"] for t in await _tasks(stores[0]))
        assert slots == [minute(n).isoformat() for n in range(1, 6)]
    finally:
        for s in stores:
            await s.close()


async def test_a_schedule_edited_while_its_slot_fires_fires_the_slot_once_with_the_new_definition(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.schedules.create("edit", every=60, task="old title")

    async def edit() -> None:
        await store.schedules.update("edit", task={"title": "new title", "priority": 9}, actor="alice")

    calls = _before_fire(monkeypatch, store, edit)
    [task] = await store.schedules.tick(now=minute(1))
    assert len(calls) == 2  # its first write was refused: the edit changed the version it planned from
    assert (task.title, task.priority) == ("new title", 9)
    assert len(await _tasks(store)) == 1
    kinds = [e.kind for e in await _entries(store, "edit")]
    assert kinds == ["schedule.created", "schedule.updated", "schedule.fired"]


async def test_a_clock_that_jumps_back_fires_no_slot_twice_and_slots_resume_once_it_passes_them(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("clock", every=60, task="t", catch_up="all", overlap="queue")
    clock.at(140)  # past minute(1) and minute(2)
    first = await store.schedules.tick()
    assert [t.metadata["schedule"]["slot"] for t in first] == [minute(1).isoformat(), minute(2).isoformat()]
    clock.at(-3600)  # an hour back
    assert await store.schedules.tick() == []
    clock.at(100)  # still before what was handled
    assert await store.schedules.tick() == []
    clock.at(140)
    assert await store.schedules.tick() == []
    clock.at(170)
    [third] = await store.schedules.tick()
    assert third.metadata["schedule"]["slot"] == minute(3).isoformat()
    assert len(await _tasks(store)) == 3


async def test_catch_up_one_fires_only_the_latest_missed_slot_and_audits_the_skipped_ones(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("one", every=60, task="t")  # catch_up="one" by default
    [task] = await store.schedules.tick(now=minute(10) + dt.timedelta(seconds=5))
    assert task.metadata["schedule"]["slot"] == minute(10).isoformat()
    [skipped] = [e for e in await _entries(store, "one") if e.kind == "schedule.skipped"]
    assert skipped.data["reason"] == "catch_up" and skipped.data["policy"] == "one"
    assert (skipped.data["from"], skipped.data["to"]) == (minute(1).isoformat(), minute(9).isoformat())


async def test_catch_up_skip_fires_a_slot_only_within_its_window(store: Store, clock: Clock) -> None:
    await store.schedules.create("skip", every=60, task="t", catch_up="skip", catch_up_window=10)
    assert await store.schedules.tick(now=minute(1) + dt.timedelta(seconds=11)) == []
    [late] = await store.schedules.tick(now=minute(2) + dt.timedelta(seconds=10))
    assert late.metadata["schedule"]["slot"] == minute(2).isoformat()
    assert (await store.schedules.get("skip")).catch_up_window == 10  # type: ignore[union-attr]


async def test_catch_up_all_fires_each_missed_slot_within_its_window_oldest_first(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create(
        "all", every=60, task="t", catch_up="all", catch_up_window=300, overlap="queue"
    )
    made = await store.schedules.tick(now=minute(20))
    assert [t.metadata["schedule"]["slot"] for t in made] == [minute(n).isoformat() for n in range(15, 21)]
    [skipped] = [e for e in await _entries(store, "all") if e.kind == "schedule.skipped"]
    assert (skipped.data["from"], skipped.data["to"]) == (minute(1).isoformat(), minute(14).isoformat())


async def test_catch_up_all_fires_at_most_a_batch_per_tick_and_the_next_tick_goes_on(
    store: Store, clock: Clock
) -> None:
    cap = statekeel.schedules.MAX_SLOTS_PER_TICK
    await store.schedules.create(
        "burst", every=1, task="t", catch_up="all", catch_up_window=3600, overlap="queue"
    )
    now = T0 + dt.timedelta(seconds=cap + 50)
    first = await store.schedules.tick(now=now)
    second = await store.schedules.tick(now=now)
    assert (len(first), len(second)) == (cap, 50)
    slots = [t.metadata["schedule"]["slot"] for t in first + second]
    assert len(set(slots)) == cap + 50 and slots == sorted(slots)


async def test_overlap_skip_skips_a_slot_while_the_last_slots_task_is_unfinished(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("overlap", every=60, task="t")  # overlap="skip" by default
    [first] = await store.schedules.tick(now=minute(1))
    claimed = await store.tasks.claim("w1")
    assert claimed is not None and claimed.id == first.id
    assert await store.schedules.tick(now=minute(2)) == []
    [skipped] = [e for e in await _entries(store, "overlap") if e.kind == "schedule.skipped"]
    assert skipped.data == {
        "schedule_id": first.metadata["schedule"]["id"],
        "name": "overlap",
        "reason": "overlap",
        "slot": minute(2).isoformat(),
        "running_task_id": first.id,
    }
    await store.tasks.transition(first.id, "success", lease_epoch=claimed.lease_epoch)
    [third] = await store.schedules.tick(now=minute(3))
    assert third.metadata["schedule"]["slot"] == minute(3).isoformat()


async def test_overlap_queue_creates_the_slots_task_while_the_last_one_runs(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("queue", every=60, task="t", overlap="queue")
    await store.schedules.tick(now=minute(1))
    assert await store.tasks.claim("w1") is not None
    assert len(await store.schedules.tick(now=minute(2))) == 1


async def test_a_paused_schedule_fires_nothing_and_resumed_it_skips_what_passed_meanwhile(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("p", every=60, task="t")
    paused = await store.schedules.pause("p", actor="alice")
    assert paused.paused and await store.schedules.next_fires("p") == []
    assert await store.schedules.tick(now=minute(5)) == []
    clock.now = minute(5) + dt.timedelta(seconds=1)
    resumed = await store.schedules.resume("p", actor="alice")
    assert not resumed.paused and resumed.next_fire_at == minute(6)
    assert await store.schedules.tick(now=minute(5) + dt.timedelta(seconds=30)) == []
    [task] = await store.schedules.tick(now=minute(6))
    assert task.metadata["schedule"]["slot"] == minute(6).isoformat()
    entries = [(e.kind, e.actor) for e in await _entries(store, "p")]
    assert ("schedule.paused", "alice") in entries and ("schedule.resumed", "alice") in entries


async def test_a_deleted_schedule_fires_nothing_its_tasks_stay_and_its_name_can_be_used_again(
    store: Store, clock: Clock
) -> None:
    old = await store.schedules.create("d", every=60, task="t")
    [task] = await store.schedules.tick(now=minute(1))
    await store.schedules.delete("d", actor="alice")
    assert await store.schedules.get("d") is None
    assert await store.schedules.tick(now=minute(2)) == []
    assert await store.tasks.get(task.id) == task
    with pytest.raises(statekeel.NotFound):
        await store.schedules.delete("d", actor="alice")
    clock.now = minute(1) + dt.timedelta(seconds=1)
    again = await store.schedules.create("d", every=60, task="t")
    assert again.id != old.id
    [fresh] = await store.schedules.tick(now=minute(2))
    assert fresh.id != task.id
    kinds = [e.kind for e in await _entries(store, "d")]
    assert kinds.count("schedule.deleted") == 1 and kinds.count("schedule.created") == 2


async def test_next_fires_lists_the_coming_slots_in_the_schedules_timezone(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("weekdays", cron="0 9 * * 1-5", timezone="Europe/Berlin", task="t")
    fires = await store.schedules.next_fires("weekdays", 6)  # 09:00 of Monday 7th passed 30 s ago
    assert [f.isoformat() for f in fires] == [
        "2030-01-08T09:00:00+01:00",
        "2030-01-09T09:00:00+01:00",
        "2030-01-10T09:00:00+01:00",
        "2030-01-11T09:00:00+01:00",
        "2030-01-14T09:00:00+01:00",
        "2030-01-15T09:00:00+01:00",
    ]
    assert (await store.schedules.get("weekdays")).next_fire_at == fires[0]  # type: ignore[union-attr]


async def test_a_local_time_the_clocks_skip_fires_at_the_next_valid_instant_and_a_repeated_one_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch, dt.datetime(2030, 3, 30, 12, tzinfo=BERLIN))  # spring forward: 31 March
    await store.schedules.create(
        "nightly", cron="30 2 * * *", timezone="Europe/Berlin", task="t", catch_up="all",
        catch_up_window=3 * 86_400, overlap="queue",
    )  # fmt: skip
    spring = await store.schedules.tick(now=dt.datetime(2030, 4, 2, 12, tzinfo=BERLIN))
    assert [t.metadata["schedule"]["slot"] for t in spring] == [
        "2030-03-31T01:00:00+00:00",  # 02:30 does not exist that night: 03:00 CEST, the next instant
        "2030-04-01T00:30:00+00:00",
        "2030-04-02T00:30:00+00:00",
    ]
    clock.now = dt.datetime(2030, 10, 26, 12, tzinfo=BERLIN)  # fall back: 27 October
    await store.schedules.pause("nightly", actor="t")
    await store.schedules.resume("nightly", actor="t")  # what passed meanwhile is handled
    autumn = await store.schedules.tick(now=dt.datetime(2030, 10, 28, 12, tzinfo=BERLIN))
    assert [t.metadata["schedule"]["slot"] for t in autumn] == [
        "2030-10-27T00:30:00+00:00",  # 02:30 happens twice that night: once, at the first (CEST)
        "2030-10-28T01:30:00+00:00",
    ]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task": "t"}, "either cron"),
        ({"task": "t", "cron": "* * * * *", "every": 60}, "either cron"),
        ({"task": "t", "cron": "61 * * * *"}, "not a valid cron"),
        ({"task": "t", "cron": "* * * *"}, "five fields"),
        ({"task": "t", "cron": "0 0 30 2 *"}, "never fires"),
        ({"task": "t", "every": 0}, "every must be"),
        ({"task": "t", "every": 1.5}, "every must be"),
        ({"task": "t", "every": dt.timedelta(milliseconds=1500)}, "every must be"),
        ({"task": "t", "every": 60, "timezone": "Mars/Olympus"}, "not a known IANA"),
        ({"task": {"priority": 3}, "every": 60}, "needs a title"),
        ({"task": {"title": "t", "owner": "x"}, "every": 60}, "unknown fields"),
        ({"task": {"title": "t", "priority": "high"}, "every": 60}, "priority"),
        ({"task": {"title": "t", "metadata": {"schedule": 1}}, "every": 60}, "schedule"),
        ({"task": 5, "every": 60}, "task must be"),
        ({"task": "t", "every": 60, "catch_up": "some"}, "catch_up must be"),
        ({"task": "t", "every": 60, "overlap": "allow"}, "overlap must be"),
        ({"task": "t", "every": 60, "catch_up_window": -1}, "catch_up_window"),
    ],
)
async def test_a_bad_schedule_is_refused_before_anything_is_written(
    store: Store, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(statekeel.InvalidArgument, match=match):
        await store.schedules.create("bad", **kwargs)
    assert (await store.schedules.list()).items == []
    assert await _entries(store, "bad") == []


async def test_a_second_schedule_of_one_name_is_a_conflict_and_changes_nothing(store: Store) -> None:
    first = await store.schedules.create("dup", every=60, task="t")
    with pytest.raises(statekeel.ConflictError, match="exists"):
        await store.schedules.create("dup", every=3600, task="other")
    assert await store.schedules.get("dup") == first
    assert [e.kind for e in await _entries(store, "dup")] == ["schedule.created"]


async def test_an_update_switches_the_rule_and_the_next_slot_follows_it(store: Store, clock: Clock) -> None:
    await store.schedules.create("switch", every=60, task="t")
    updated = await store.schedules.update("switch", cron="0 12 * * *", actor="bob")
    assert (updated.cron, updated.every_seconds, updated.version) == ("0 12 * * *", None, 2)
    assert updated.next_fire_at == T0.replace(hour=12, minute=0, second=0)
    back = await store.schedules.update("switch", every=3600, catch_up="all", actor="bob")
    assert (back.cron, back.every_seconds, back.catch_up_window) == (None, 3600, 86_400.0)
    with pytest.raises(statekeel.NotFound):
        await store.schedules.update("nope", every=60, actor="bob")
    with pytest.raises(statekeel.InvalidArgument):
        await store.schedules.update("switch", every=-1, actor="bob")
    assert await store.schedules.get("switch") == back


async def test_every_schedule_change_is_audited_with_its_actor_and_the_chain_verifies(
    store: Store, clock: Clock
) -> None:
    await store.schedules.create("audited", every=60, task="t", actor="ops")
    await store.schedules.update("audited", task="u", actor="ann")
    await store.schedules.pause("audited", actor="bob")
    await store.schedules.resume("audited", actor="cid")
    [task] = await store.schedules.tick(now=minute(1))
    await store.schedules.delete("audited", actor="dee")
    entries = await _entries(store, "audited")
    assert [(e.kind, e.actor) for e in entries] == [
        ("schedule.created", "ops"),
        ("schedule.updated", "ann"),
        ("schedule.paused", "bob"),
        ("schedule.resumed", "cid"),
        ("schedule.fired", "statekeel.scheduler"),
        ("schedule.deleted", "dee"),
    ]
    assert entries[4].data["task_id"] == task.id
    [created] = await store.audit.query(subject=f"task:{task.id}", kind="task.created")
    assert created.data["via"] == "schedule"
    assert (await store.audit.verify()).ok


async def test_a_list_of_schedules_pages_by_name(store: Store) -> None:
    for name in ("c", "a", "b"):
        await store.schedules.create(name, every=60, task="t")
    page = await store.schedules.list(limit=2)
    assert [s.name for s in page.items] == ["a", "b"] and page.next_cursor is not None
    rest = await store.schedules.list(limit=2, cursor=page.next_cursor)
    assert [s.name for s in rest.items] == ["c"] and rest.next_cursor is None


async def test_an_export_carries_the_schedules_and_their_progress(
    store: Store, clock: Clock, tmp_path: Any
) -> None:
    await store.schedules.create("kept", cron="*/5 * * * *", timezone="Europe/Berlin", task="t")
    await store.schedules.tick(now=minute(5))
    original = await store.schedules.get("kept")
    export = tmp_path / "store.jsonl"
    await statekeel.export_store(store, export)
    async with statekeel.open_store("memory://") as copy:
        await statekeel.import_store(copy, export)
        assert await copy.schedules.get("kept") == original
        assert await copy.schedules.tick(now=minute(5)) == []  # the slot fired in the source


def test_a_nats_store_refuses_schedules_as_it_refuses_tasks() -> None:
    nats = StoreClass("nats://127.0.0.1:4222?prefix=never_opened", StoreOptions())
    assert not nats.holds("schedules")
    with pytest.raises(statekeel.Unsupported, match="does not hold schedules"):
        nats.schedules  # noqa: B018 - opening it is what raises
