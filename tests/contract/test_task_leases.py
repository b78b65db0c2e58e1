"""Lease fencing at the moment of the write: once a task's lease has expired, its old holder's heartbeat,
step and transition are refused with LeaseLost, whether or not ``expire_leases()`` ran — on every backend.

Time is moved by the clock statekeel's task manager reads (the writer's clock decides, as in production),
never by sleeping.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

import faults
import statekeel
import statekeel.tasks.rules
from lost_reply import lose_the_next_write_reply

Store = statekeel.Store


def _clock_ahead(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Callable[[], dt.datetime]:
    """Move the task manager's clock ``seconds`` ahead of the real one; return the moved clock."""
    real = statekeel.tasks.rules.utcnow

    def moved() -> dt.datetime:
        return real() + dt.timedelta(seconds=seconds)

    monkeypatch.setattr(statekeel.tasks.rules, "utcnow", moved)
    return moved


async def _claimed(store: Store, lease_seconds: float = 30) -> statekeel.Task:
    await store.tasks.create("deploy", status="queued")
    task = await store.tasks.claim("w1", lease_seconds=lease_seconds)
    assert task is not None and task.lease_expires_at is not None
    return task


async def test_heartbeat_after_the_lease_expired_is_lease_lost_without_a_reaper(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    _clock_ahead(monkeypatch, 31)
    with pytest.raises(statekeel.LeaseLost) as info:
        await store.tasks.heartbeat(task.id, "w1", task.lease_epoch, lease_seconds=600)
    assert info.value.task_id == task.id  # type: ignore[attr-defined]
    assert "expired" in str(info.value)
    after = await store.tasks.get(task.id)
    assert after is not None
    # Not extended: the lease still ends when it did, and the task waits for a reaper or a new claim.
    assert (after.status, after.lease_expires_at, after.version) == ("running", task.lease_expires_at, 1 + 1)


async def test_step_after_the_lease_expired_is_lease_lost_and_its_function_never_runs(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    assert await store.tasks.step(task.id, "before", lambda: "ok", lease_epoch=task.lease_epoch) == "ok"
    _clock_ahead(monkeypatch, 31)
    calls: list[int] = []
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.step(task.id, "send-mail", lambda: calls.append(1), lease_epoch=task.lease_epoch)
    assert calls == []
    assert await store.tasks.get_step(task.id, "send-mail") is None  # nothing recorded either
    # Even a step that already succeeded is not answered to a worker that lost its lease.
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.step(task.id, "before", lambda: "again", lease_epoch=task.lease_epoch)


async def test_transition_after_the_lease_expired_is_lease_lost_and_the_task_is_unchanged(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    _clock_ahead(monkeypatch, 31)
    for fence in ({"worker_id": "w1", "lease_epoch": task.lease_epoch}, {"lease_epoch": task.lease_epoch}):
        with pytest.raises(statekeel.LeaseLost):
            await store.tasks.transition(task.id, "success", result={"done": True}, **fence)  # type: ignore[arg-type]
    after = await store.tasks.get(task.id)
    assert after == task  # not a field changed
    # The reaper, when it runs, interrupts it as usual.
    assert [t.id for t in await store.tasks.expire_leases()] == [task.id]


async def test_a_live_lease_is_honoured_up_to_its_expiry(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    _clock_ahead(monkeypatch, 29)
    renewed = await store.tasks.heartbeat(task.id, "w1", task.lease_epoch, lease_seconds=30)
    assert renewed.lease_expires_at is not None and task.lease_expires_at is not None
    assert renewed.lease_expires_at > task.lease_expires_at
    assert await store.tasks.step(task.id, "s", lambda: 1, lease_epoch=task.lease_epoch) == 1
    done = await store.tasks.transition(task.id, "success", worker_id="w1", lease_epoch=task.lease_epoch)
    assert done.status == "success"


async def test_the_backend_checks_the_expiry_in_the_write_itself(store: Store) -> None:
    """The condition is part of the conditional write, so a lease that runs out between the manager's
    read and its write is refused as well."""
    task = await _claimed(store)
    assert task.lease_expires_at is not None
    after_expiry = task.lease_expires_at + dt.timedelta(microseconds=1)
    backend = store.backend
    assert (
        await backend.heartbeat_task(
            task.id,
            "w1",
            task.lease_epoch,
            lease_expires_at=after_expiry + dt.timedelta(seconds=30),
            now=after_expiry,
        )
        is None
    )
    change = statekeel.tasks.plan_transition(task, "success")
    refused = await backend.update_task(
        task.id,
        expected_status="running",
        expected_version=task.version,
        change=change,
        lease_valid_at=after_expiry,
    )
    assert refused is None
    with pytest.raises(statekeel.LeaseLost):
        await backend.begin_step(
            task.id, "s", rerun_started=False, lease_epoch=task.lease_epoch, now=after_expiry
        )
    assert await backend.get_step(task.id, "s") is None
    # The same writes a moment before the expiry go through.
    before_expiry = task.lease_expires_at - dt.timedelta(microseconds=1)
    record, run = await backend.begin_step(
        task.id, "s", rerun_started=False, lease_epoch=task.lease_epoch, now=before_expiry
    )
    assert run and record.status == "started"
    updated = await backend.update_task(
        task.id,
        expected_status="running",
        expected_version=task.version,
        change=change,
        lease_valid_at=before_expiry,
    )
    assert updated is not None and updated.status == "success"


async def test_a_task_run_without_a_lease_is_not_fenced_by_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await store.tasks.create("manual")
    running = await store.tasks.transition(task.id, "running")
    assert running.lease_expires_at is None
    _clock_ahead(monkeypatch, 3600)
    assert await store.tasks.step(running.id, "s", lambda: 2, lease_epoch=running.lease_epoch) == 2
    done = await store.tasks.transition(running.id, "success", lease_epoch=running.lease_epoch)
    assert done.status == "success"


@pytest.mark.parametrize("second_worker", ["w1", "w2"])
async def test_a_stale_epoch_transition_after_a_re_claim_is_lease_lost(
    store: Store, monkeypatch: pytest.MonkeyPatch, second_worker: str
) -> None:
    """The first holder's lease expired, the task was requeued and claimed again (by the same worker id
    or another): the first holder's transition, at its old epoch, is refused and changes nothing — the
    new lease is live, so only the epoch (the fence) tells them apart."""
    first = await _claimed(store)
    _clock_ahead(monkeypatch, 31)
    assert [t.id for t in await store.tasks.expire_leases()] == [first.id]
    await store.tasks.transition(first.id, "queued")
    second = await store.tasks.claim(second_worker, lease_seconds=600)
    assert second is not None and second.id == first.id
    assert second.lease_epoch > first.lease_epoch
    fences: list[dict[str, object]] = [
        {"worker_id": "w1", "lease_epoch": first.lease_epoch},
        {"lease_epoch": first.lease_epoch},
    ]
    for fence in fences:
        for status in ("success", "failed", "queued"):
            with pytest.raises(statekeel.LeaseLost):
                await store.tasks.transition(first.id, status, **fence)  # type: ignore[arg-type]
    assert await store.tasks.get(first.id) == second  # not a field changed
    # The new holder, at its own epoch, finishes it.
    done = await store.tasks.transition(
        first.id, "success", worker_id=second_worker, lease_epoch=second.lease_epoch
    )
    assert done.status == "success"


async def test_a_transition_whose_answer_was_lost_is_settled_by_its_retry_not_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    with (
        lose_the_next_write_reply(store, monkeypatch) as lost,
        pytest.raises(statekeel.BackendUnavailable) as info,
    ):
        await store.tasks.transition(
            task.id, "success", result={"ok": 1}, worker_id="w1", lease_epoch=task.lease_epoch
        )
    assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
    assert lost.landed and (await store.tasks.get(task.id)).status == "success"
    # The worker's retry learns that its own completion landed: no LeaseLost "stop work".
    done = await store.tasks.transition(
        task.id, "success", result={"ok": 1}, worker_id="w1", lease_epoch=task.lease_epoch
    )
    assert (done.status, done.result, done.version) == ("success", {"ok": 1}, task.version + 1)
    entries = await store.audit.query(subject=f"task:{task.id}", kind="task.transitioned")
    assert [e.data["to"] for e in entries].count("success") == 1  # the change was made once
    assert (await store.audit.verify()).ok


async def test_a_lost_transition_that_did_not_land_is_made_by_its_retry(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    with (
        lose_the_next_write_reply(store, monkeypatch, landed=False) as lost,
        pytest.raises(statekeel.BackendUnavailable),
    ):
        await store.tasks.transition(task.id, "success", worker_id="w1", lease_epoch=task.lease_epoch)
    assert not lost.landed and (await store.tasks.get(task.id)).status == "running"
    done = await store.tasks.transition(task.id, "success", worker_id="w1", lease_epoch=task.lease_epoch)
    assert done.status == "success"


async def test_a_lost_transition_overtaken_by_another_change_is_not_reported_as_its_own(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _claimed(store)
    with (
        lose_the_next_write_reply(store, monkeypatch),
        pytest.raises(statekeel.BackendUnavailable),
    ):
        await store.tasks.transition(task.id, "suspended", worker_id="w1", lease_epoch=task.lease_epoch)
    # An operator resumes the task meanwhile: the retry's own change is no longer the task's state.
    await store.tasks.transition(task.id, "queued", actor="operator")
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(task.id, "suspended", worker_id="w1", lease_epoch=task.lease_epoch)


@pytest.mark.parametrize("landed", [True, False])
async def test_a_transition_whose_commit_answer_the_driver_lost_is_settled_by_its_retry(
    store: Store, backend_name: str, landed: bool
) -> None:
    if backend_name not in ("postgres", "mariadb"):
        pytest.skip(f"{backend_name} has no network reply to lose (the write-hook test above covers it)")
    task = await _claimed(store)
    with (
        faults.lose_reply(backend_name, landed=landed) as fault,
        pytest.raises(statekeel.BackendUnavailable) as info,
    ):
        await store.tasks.transition(task.id, "success", worker_id="w1", lease_epoch=task.lease_epoch)
    assert fault.fired == 1 and info.value.outcome == "unknown"  # type: ignore[attr-defined]
    assert (await store.tasks.get(task.id)).status == ("success" if landed else "running")
    # The worker's retry: its own completion if it landed (never LeaseLost "stop work"), else made now.
    done = await store.tasks.transition(task.id, "success", worker_id="w1", lease_epoch=task.lease_epoch)
    assert (done.status, done.version) == ("success", task.version + 1)
    entries = await store.audit.query(subject=f"task:{task.id}", kind="task.transitioned")
    assert [e.data["to"] for e in entries].count("success") == 1
