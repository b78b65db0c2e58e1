"""Review findings on tasks and the step journal: fencing when a task re-enters running without a claim,
and a failing step whose error is large or unprintable (every backend)."""

from __future__ import annotations

import datetime as dt
import inspect
import os

import pytest

import statekeel

Store = statekeel.Store


async def _expired_zombie(store: Store) -> statekeel.Task:
    """A task claimed by "zombie" whose lease then expired (the task is interrupted)."""
    await store.tasks.create("t", status="queued")
    zombie = await store.tasks.claim("zombie", lease_seconds=1)
    assert zombie is not None
    expired = await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5))
    assert [t.id for t in expired] == [zombie.id]
    return zombie


async def test_a_zombie_cannot_heartbeat_complete_or_step_a_task_resumed_without_a_claim(
    store: Store,
) -> None:
    zombie = await _expired_zombie(store)
    # An operator (or recovery) resumes the interrupted task directly: interrupted -> running is legal.
    resumed = await store.tasks.transition(zombie.id, "running")
    assert resumed.lease_epoch > zombie.lease_epoch and resumed.lease_owner is None
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.heartbeat(zombie.id, "zombie", zombie.lease_epoch)
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(zombie.id, "success", worker_id="zombie", lease_epoch=zombie.lease_epoch)
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(zombie.id, "success", worker_id="zombie")
    calls: list[int] = []
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.step(zombie.id, "send", lambda: calls.append(1), lease_epoch=zombie.lease_epoch)
    assert calls == [] and await store.tasks.steps(zombie.id) == []
    assert await store.tasks.get(zombie.id) == resumed


async def test_a_worker_that_suspended_its_task_is_fenced_once_the_task_is_resumed(store: Store) -> None:
    await store.tasks.create("t", status="queued")
    worker = await store.tasks.claim("w1")
    assert worker is not None
    await store.tasks.transition(worker.id, "suspended", worker_id="w1", lease_epoch=worker.lease_epoch)
    resumed = await store.tasks.transition(worker.id, "running")
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.heartbeat(worker.id, "w1", worker.lease_epoch)
    assert await store.tasks.get(worker.id) == resumed
    # A later claim still fences by epoch as before.
    await store.tasks.transition(worker.id, "suspended")
    await store.tasks.transition(worker.id, "queued")
    heir = await store.tasks.claim("w2")
    assert heir is not None and heir.lease_epoch == resumed.lease_epoch + 1 and heir.lease_owner == "w2"


async def test_leaving_running_keeps_the_owner_and_epoch_for_the_record(store: Store) -> None:
    await store.tasks.create("t", status="queued")
    task = await store.tasks.claim("w1")
    assert task is not None
    done = await store.tasks.transition(task.id, "success", worker_id="w1", lease_epoch=task.lease_epoch)
    assert (done.lease_owner, done.lease_epoch) == ("w1", task.lease_epoch)


async def _running(store: Store) -> statekeel.Task:
    await store.tasks.create("t", status="queued")
    task = await store.tasks.claim("w")
    assert task is not None
    return task


async def test_a_step_that_raises_with_an_oversized_message_is_recorded_failed_and_reraised(
    store_url: str, tmp_path: os.PathLike[str]
) -> None:
    fallback = os.path.join(os.fspath(tmp_path), "fallback")
    async with statekeel.open_store(store_url, fallback_dir=fallback, max_record_bytes=64 * 1024) as store:
        task = await _running(store)
        huge = "x" * (200 * 1024)  # e.g. a tool's whole output in the exception text

        def fail() -> None:
            raise RuntimeError(huge)

        with pytest.raises(RuntimeError) as caught:
            await store.tasks.step(task.id, "call-tool", fail)
        assert str(caught.value) == huge  # the caller's own exception, not PayloadTooLarge
        record = await store.tasks.get_step(task.id, "call-tool")
        assert record is not None and record.status == "failed"
        assert record.error["type"] == "builtins.RuntimeError"
        assert record.error["message"].startswith("xxxx") and "truncated" in record.error["message"]
        # fn raised, so its outcome is known: the next call runs it again rather than StepInDoubt.
        assert await store.tasks.step(task.id, "call-tool", lambda: "ok") == "ok"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


async def test_a_step_that_raises_an_unprintable_exception_is_recorded_failed_and_reraised(
    store: Store,
) -> None:
    task = await _running(store)

    def fail() -> None:
        raise _Unprintable()

    with pytest.raises(_Unprintable):
        await store.tasks.step(task.id, "s", fail)
    record = await store.tasks.get_step(task.id, "s")
    assert record is not None and record.status == "failed"
    assert record.error["type"].endswith("_Unprintable") and "str()" in record.error["message"]


async def test_a_coroutine_given_to_step_with_bad_arguments_is_closed_not_left_unawaited(
    store: Store,
) -> None:
    task = await _running(store)

    async def send() -> int:
        return 1

    for bad in ({"step_key": ""}, {"step_key": "s", "idempotent": 1}, {"step_key": "s", "lease_epoch": 0}):
        coro = send()
        with pytest.raises(statekeel.InvalidArgument):
            await store.tasks.step(task.id, fn=coro, **bad)  # type: ignore[arg-type]
        assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
    assert await store.tasks.steps(task.id) == []


class _NoOffset(dt.tzinfo):
    """A tzinfo that knows no offset: datetimes carrying it are naive although tzinfo is set."""

    def utcoffset(self, _: dt.datetime | None) -> None:
        return None

    def dst(self, _: dt.datetime | None) -> None:
        return None

    def tzname(self, _: dt.datetime | None) -> str:
        return "?"


async def test_a_datetime_whose_tzinfo_has_no_offset_is_refused_as_naive(store: Store) -> None:
    naive = dt.datetime(2999, 1, 1, tzinfo=_NoOffset())
    with pytest.raises(statekeel.InvalidArgument):
        await store.approvals.request("task:1", "shell", {}, "agent", expires_at=naive)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.expire_leases(now=naive)
    with pytest.raises(statekeel.InvalidArgument):
        await store.audit.query(since=naive)
    assert await store.approvals.pending() == [] and (await store.audit.verify()).count == 0
