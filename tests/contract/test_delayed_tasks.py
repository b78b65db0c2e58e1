"""Delayed tasks and retries with backoff: a claim never takes a task before its ``not_before``, on every
backend. Time is moved by the clock the task manager reads (the claimer's clock decides), never by sleeping.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest

import statekeel
import statekeel.tasks.rules
from statekeel.tasks import MAX_RETRY_AFTER, backoff

Store = statekeel.Store


class Clock:
    """The task manager's clock, set by the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        monkeypatch.setattr(statekeel.tasks.rules, "utcnow", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


async def test_a_claim_never_takes_a_task_before_its_not_before(store: Store, clock: Clock) -> None:
    later = clock.now + dt.timedelta(hours=1)
    delayed = await store.tasks.create("send digest", status="queued", priority=9, not_before=later)
    assert delayed.not_before == later
    ready = await store.tasks.create("index", status="queued", priority=1)
    claimed = await store.tasks.claim("w1")
    assert claimed is not None and claimed.id == ready.id  # the higher priority is not due yet
    assert await store.tasks.claim("w1") is None
    assert (await store.tasks.get(delayed.id)).status == "queued"  # type: ignore[union-attr]


async def test_a_delayed_task_is_claimed_from_its_not_before_on_to_the_microsecond(
    store: Store, clock: Clock
) -> None:
    due = clock.now + dt.timedelta(minutes=5)
    task = await store.tasks.create("report", status="queued", not_before=due)
    clock.now = due - dt.timedelta(microseconds=1)
    assert await store.tasks.claim("w1") is None
    clock.now = due
    claimed = await store.tasks.claim("w1")
    assert claimed is not None and claimed.id == task.id and claimed.status == "running"


async def test_a_not_before_in_another_zone_or_the_past_is_kept_in_utc(store: Store, clock: Clock) -> None:
    tokyo = dt.timezone(dt.timedelta(hours=9))
    at = (clock.now + dt.timedelta(hours=2)).astimezone(tokyo)
    task = await store.tasks.create("t", status="queued", not_before=at)
    assert task.not_before == at and task.not_before.utcoffset() == dt.timedelta(0)  # type: ignore[union-attr]
    assert await store.tasks.get(task.id) == task
    past = await store.tasks.create("p", status="queued", not_before=clock.now - dt.timedelta(days=3))
    claimed = await store.tasks.claim("w1")
    assert claimed is not None and claimed.id == past.id


async def test_a_delayed_task_of_a_workflow_is_not_claimed_for_that_workflow_before_its_time(
    store: Store, clock: Clock
) -> None:
    flow = await store.workflows.create("nightly", [{"name": "a"}])
    await store.workflows.start(flow.id)
    step = (await store.workflows.get(flow.id)).steps[0].task  # type: ignore[union-attr]
    running = await store.tasks.claim("w1", workflow_id=flow.id)
    assert running is not None and running.id == step.id
    await store.tasks.transition(step.id, "interrupted")
    await store.tasks.transition(step.id, "queued", retry_after=60)
    assert await store.tasks.claim("w1", workflow_id=flow.id) is None
    clock.advance(60)
    again = await store.tasks.claim("w1", workflow_id=flow.id)
    assert again is not None and again.id == step.id


async def test_a_failed_task_retried_with_retry_after_waits_its_backoff_and_the_audit_says_until_when(
    store: Store, clock: Clock
) -> None:
    task = await store.tasks.create("call api", status="queued", max_retries=3)
    for attempt in range(3):
        claimed = await store.tasks.claim("w1")
        assert claimed is not None and claimed.id == task.id
        failed = await store.tasks.transition(task.id, "failed", error={"e": attempt})
        delay = backoff(failed.retry_count, base=10)
        retried = await store.tasks.transition(task.id, "queued", retry_after=delay)
        assert retried.retry_count == attempt + 1
        assert retried.not_before == clock.now + dt.timedelta(seconds=delay)
        clock.advance(delay - 1)
        assert await store.tasks.claim("w1") is None
        clock.advance(1)
    assert [backoff(n, base=10) for n in range(3)] == [10, 20, 40]
    entries = await store.audit.query(subject=f"task:{task.id}", kind="task.transitioned", limit=100)
    delayed = [e.data for e in entries if e.data["to"] == "queued"]
    assert [d.get("not_before") for d in delayed][-1] == retried.not_before.isoformat()  # type: ignore[union-attr]
    assert len(delayed) == 3


async def test_a_retry_with_not_before_waits_until_that_time(store: Store, clock: Clock) -> None:
    task = await store.tasks.create("sync", status="queued")
    await store.tasks.claim("w1")
    await store.tasks.transition(task.id, "failed")
    at = clock.now + dt.timedelta(minutes=10)
    retried = await store.tasks.transition(task.id, "queued", not_before=at)
    assert retried.not_before == at
    assert await store.tasks.claim("w1") is None
    clock.now = at
    assert (await store.tasks.claim("w1")) is not None


async def test_a_move_back_to_queued_without_a_delay_keeps_the_not_before_it_had(
    store: Store, clock: Clock
) -> None:
    due = clock.now + dt.timedelta(hours=1)
    task = await store.tasks.create("later", not_before=due)  # pending: not claimable yet anyway
    queued = await store.tasks.transition(task.id, "queued")
    assert queued.not_before == due
    assert await store.tasks.claim("w1") is None
    made_due = await store.tasks.transition(
        (await store.tasks.transition(task.id, "running")).id, "suspended"
    )
    assert made_due.not_before == due
    now_due = await store.tasks.transition(task.id, "queued", not_before=clock.now)
    assert now_due.not_before == clock.now and (await store.tasks.claim("w1")) is not None


@pytest.mark.parametrize(
    "bad",
    [
        dt.datetime(2030, 1, 1),  # naive
        "2030-01-01T00:00:00Z",
        1_900_000_000,
        dt.datetime(1969, 12, 31, 23, 59, tzinfo=dt.UTC),
        dt.date(2030, 1, 1),
    ],
)
async def test_a_bad_not_before_is_refused_before_anything_is_written(store: Store, bad: Any) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="not_before"):
        await store.tasks.create("t", status="queued", not_before=bad)
    assert (await store.tasks.list()).items == []
    task = await store.tasks.create("t", status="queued")
    await store.tasks.claim("w1")
    failed = await store.tasks.transition(task.id, "failed")
    with pytest.raises(statekeel.InvalidArgument, match="not_before"):
        await store.tasks.transition(task.id, "queued", not_before=bad)
    assert await store.tasks.get(task.id) == failed


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "10", True, None, MAX_RETRY_AFTER + 1])
async def test_a_bad_retry_after_is_refused_before_anything_is_written(store: Store, bad: Any) -> None:
    task = await store.tasks.create("t", status="queued")
    await store.tasks.claim("w1")
    failed = await store.tasks.transition(task.id, "failed")
    kwargs: dict[str, Any] = {"retry_after": bad}
    if bad is None:  # both a time and a delay
        kwargs = {"retry_after": 5, "not_before": dt.datetime.now(dt.UTC)}
    with pytest.raises(statekeel.InvalidArgument, match="retry_after"):
        await store.tasks.transition(task.id, "queued", **kwargs)
    assert await store.tasks.get(task.id) == failed


async def test_a_delay_on_a_move_to_any_status_but_queued_is_refused(store: Store) -> None:
    task = await store.tasks.create("t", status="queued")
    for status in ("running", "cancelled"):
        with pytest.raises(statekeel.InvalidArgument, match="delay"):
            await store.tasks.transition(task.id, status, retry_after=10)
        with pytest.raises(statekeel.InvalidArgument, match="delay"):
            await store.tasks.transition(task.id, status, not_before=dt.datetime.now(dt.UTC))
    assert (await store.tasks.get(task.id)).version == task.version  # type: ignore[union-attr]


def test_backoff_doubles_from_its_base_up_to_its_cap() -> None:
    assert [backoff(n) for n in range(5)] == [1, 2, 4, 8, 16]
    assert backoff(3, base=5, factor=3) == 135
    assert backoff(20, cap=60) == 60
    assert backoff(2**31 - 1) == 3600  # no overflow
    assert backoff(10, cap=10 * MAX_RETRY_AFTER) == 1024
    assert backoff(40, cap=10 * MAX_RETRY_AFTER) == MAX_RETRY_AFTER  # always a valid retry_after
    for bad in ({"base": -1}, {"factor": 0.5}, {"cap": math.inf}, {"base": "1"}):
        with pytest.raises(statekeel.InvalidArgument):
            backoff(1, **bad)
    with pytest.raises(statekeel.InvalidArgument):
        backoff(-1)
