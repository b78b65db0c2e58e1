"""The step journal: two-phase records, replay, steps in doubt, resolution, failing steps whose error is
large or unprintable — on every backend."""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import os
from typing import Any

import pytest

import statekeel
import statekeel.tasks.operations
from lost_reply import lose_the_next_write_reply

Store = statekeel.Store


class Counter:
    """A side effect we can count."""

    def __init__(self, value: Any = "done") -> None:
        self.calls = 0
        self.value = value

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


async def _running(store: Store) -> statekeel.Task:
    await store.tasks.create("t", status="queued")
    task = await store.tasks.claim("w")
    assert task is not None
    return task


async def test_a_step_runs_once_and_later_calls_return_the_recorded_result(store: Store) -> None:
    task = await _running(store)
    fn = Counter({"sent": 3, "at": dt.datetime(2024, 5, 1, tzinfo=dt.UTC)})
    first = await store.tasks.step(task.id, "send-mail", fn)
    again = await store.tasks.step(task.id, "send-mail", fn)
    assert fn.calls == 1
    assert first == again == fn.value
    [record] = await store.tasks.steps(task.id)
    assert (record.status, record.attempt, record.result) == ("succeeded", 1, fn.value)
    assert record.finished_at is not None


async def test_async_functions_and_awaitables_are_steps_too(store: Store) -> None:
    task = await _running(store)
    calls = []

    async def fetch() -> int:
        calls.append(1)
        return 42

    assert await store.tasks.step(task.id, "a", fetch) == 42
    assert await store.tasks.step(task.id, "b", fetch()) == 42
    assert await store.tasks.step(task.id, "a", fetch) == 42
    # A coroutine passed for a step that already succeeded is closed, not run.
    assert await store.tasks.step(task.id, "b", fetch()) == 42
    assert len(calls) == 2


async def test_a_failing_step_records_its_error_and_runs_again_next_time(store: Store) -> None:
    task = await _running(store)

    def boom() -> None:
        raise ValueError("disk full")

    with pytest.raises(ValueError, match="disk full"):
        await store.tasks.step(task.id, "write", boom)
    record = await store.tasks.get_step(task.id, "write")
    assert record is not None and record.status == "failed"
    assert record.error == {"type": "builtins.ValueError", "message": "disk full"}
    fn = Counter(7)
    assert await store.tasks.step(task.id, "write", fn) == 7
    assert fn.calls == 1
    record = await store.tasks.get_step(task.id, "write")
    assert record is not None and (record.status, record.attempt) == ("succeeded", 2)


async def _crash_after_start(store: Store, task_id: str, step_key: str) -> None:
    """What a process that died inside ``fn`` leaves behind: a committed *started* record."""
    _, run = await store.backend.begin_step(task_id, step_key, rerun_started=False)
    assert run


async def test_a_started_non_idempotent_step_is_in_doubt_and_fn_is_not_called(store: Store) -> None:
    task = await _running(store)
    await _crash_after_start(store, task.id, "charge")
    fn = Counter()
    with pytest.raises(statekeel.StepInDoubt) as info:
        await store.tasks.step(task.id, "charge", fn)
    assert fn.calls == 0
    assert info.value.record.status == "started" and info.value.step_key == "charge"


async def test_a_step_start_whose_answer_was_lost_is_recognised_by_its_retry_and_fn_runs_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _running(store)
    fn = Counter("charged")
    with (
        lose_the_next_write_reply(store, monkeypatch) as lost,
        pytest.raises(statekeel.BackendUnavailable) as info,
    ):
        await store.tasks.step(task.id, "charge", fn, lease_epoch=task.lease_epoch)
    assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
    assert lost.landed and fn.calls == 0  # the started record landed; fn never ran
    [started] = await store.tasks.steps(task.id)
    assert started.status == "started"
    # The same worker's retry finds its own start (not a start in doubt) and runs fn, once.
    assert await store.tasks.step(task.id, "charge", fn, lease_epoch=task.lease_epoch) == "charged"
    assert fn.calls == 1
    [done] = await store.tasks.steps(task.id)
    assert (done.status, done.attempt) == ("succeeded", 1)
    entries = await store.audit.query(subject=f"task:{task.id}", kind="task.step.started")
    assert len(entries) == 1  # its start was recorded once
    assert (await store.audit.verify()).ok


async def test_a_lost_start_restarted_by_another_runner_meanwhile_is_in_doubt_for_its_retry(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _running(store)
    fn = Counter()
    with (
        lose_the_next_write_reply(store, monkeypatch),
        pytest.raises(statekeel.BackendUnavailable),
    ):
        await store.tasks.step(task.id, "charge", fn)
    # Another runner starts it again (its own attempt): its function may be running now.
    _, run = await store.backend.begin_step(task.id, "charge", rerun_started=True)
    assert run
    with pytest.raises(statekeel.StepInDoubt) as info:
        await store.tasks.step(task.id, "charge", fn)
    assert fn.calls == 0 and info.value.record.attempt == 2


async def test_a_started_idempotent_step_is_run_again(store: Store) -> None:
    task = await _running(store)
    await _crash_after_start(store, task.id, "read")
    fn = Counter("content")
    assert await store.tasks.step(task.id, "read", fn, idempotent=True) == "content"
    assert fn.calls == 1
    record = await store.tasks.get_step(task.id, "read")
    assert record is not None and (record.status, record.attempt) == ("succeeded", 2)


async def test_resolve_step_settles_a_step_in_doubt(store: Store) -> None:
    task = await _running(store)
    await _crash_after_start(store, task.id, "charge")
    await _crash_after_start(store, task.id, "refund")
    fn = Counter("new")
    settled = await store.tasks.resolve_step(
        task.id, "charge", "succeeded", result={"charge_id": "ch_1"}, lease_epoch=task.lease_epoch
    )
    assert settled.status == "succeeded"
    assert await store.tasks.step(task.id, "charge", fn) == {"charge_id": "ch_1"}
    await store.tasks.resolve_step(
        task.id, "refund", "failed", error="never reached the bank", lease_epoch=task.lease_epoch
    )
    assert await store.tasks.step(task.id, "refund", fn) == "new"
    assert fn.calls == 1
    with pytest.raises(statekeel.InvalidTransition):
        await store.tasks.resolve_step(task.id, "charge", "failed", lease_epoch=task.lease_epoch)
    with pytest.raises(statekeel.NotFound):
        await store.tasks.resolve_step(task.id, "unknown", "failed", lease_epoch=task.lease_epoch)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.resolve_step(task.id, "charge", "maybe")


async def test_steps_in_doubt_lists_started_steps_whose_runner_is_gone(store: Store) -> None:
    live = await _running(store)
    await _crash_after_start(store, live.id, "busy")
    assert await store.tasks.steps_in_doubt() == []  # its task still holds a live lease
    await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    [doubt] = await store.tasks.steps_in_doubt()
    assert (doubt.task_id, doubt.step_key, doubt.status) == (live.id, "busy", "started")


async def test_an_unstorable_result_raises_and_leaves_the_step_in_doubt(store: Store) -> None:
    task = await _running(store)
    fn = Counter({"handle": object()})
    with pytest.raises(statekeel.SerializationError, match="handle"):
        await store.tasks.step(task.id, "open", fn)
    record = await store.tasks.get_step(task.id, "open")
    assert record is not None and record.status == "started"
    with pytest.raises(statekeel.StepInDoubt):
        await store.tasks.step(task.id, "open", fn)
    assert fn.calls == 1


async def test_bad_step_arguments_raise_typed_errors_and_write_nothing(store: Store) -> None:
    task = await _running(store)
    with pytest.raises(statekeel.InvalidKey):
        await store.tasks.step(task.id, "", Counter())
    with pytest.raises(statekeel.InvalidArgument, match="callable or an awaitable"):
        await store.tasks.step(task.id, "k", 42)  # type: ignore[arg-type]
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.step(task.id, "k", Counter(), idempotent="yes")  # type: ignore[arg-type]
    with pytest.raises(statekeel.NotFound):
        await store.tasks.step("no-such-task", "k", Counter())
    assert await store.tasks.steps(task.id) == []
    assert await store.tasks.step(task.id, "k", Counter(1)) == 1


async def test_a_worker_whose_lease_was_taken_over_cannot_start_a_step(store: Store) -> None:
    zombie = await _running(store)
    assert await store.tasks.step(zombie.id, "early", Counter(1), lease_epoch=zombie.lease_epoch) == 1
    await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    await store.tasks.transition(zombie.id, "queued")
    heir = await store.tasks.claim("heir")
    assert heir is not None and heir.lease_epoch == zombie.lease_epoch + 1
    fn = Counter()
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.step(zombie.id, "late", fn, lease_epoch=zombie.lease_epoch)
    assert fn.calls == 0 and await store.tasks.get_step(zombie.id, "late") is None
    assert await store.tasks.step(heir.id, "late", fn, lease_epoch=heir.lease_epoch) == "done"
    assert fn.calls == 1


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


async def test_each_step_record_is_in_the_audit_log_with_the_digest_of_its_outcome(store: Store) -> None:
    task = await _running(store)
    assert await store.tasks.step(task.id, "read", Counter({"lines": 3}), actor="agent-7") == {"lines": 3}
    assert await store.tasks.step(task.id, "read", Counter()) == {"lines": 3}  # a replay writes nothing

    def boom() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        await store.tasks.step(task.id, "write", boom, actor="agent-7")
    await _crash_after_start(store, task.id, "charge")
    await store.tasks.resolve_step(
        task.id, "charge", "succeeded", result={"id": 1}, actor="alice", lease_epoch=task.lease_epoch
    )

    entries = [
        (e.kind, e.actor, e.data) for e in await store.audit.query(subject=f"task:{task.id}", limit=100)
    ]
    steps = [(k, a, d["step_key"], d["attempt"]) for k, a, d in entries if k.startswith("task.step.")]
    assert steps[:4] == [
        ("task.step.started", "agent-7", "read", 1),
        ("task.step.succeeded", "agent-7", "read", 1),
        ("task.step.started", "agent-7", "write", 1),
        ("task.step.failed", "agent-7", "write", 1),
    ]
    assert steps[-1] == ("task.step.resolved", "alice", "charge", 1)
    succeeded = next(d for k, _, d in entries if k == "task.step.succeeded")
    stored = store.codec.encode({"lines": 3}, where="result")
    assert succeeded["result_sha256"] == hashlib.sha256(stored).hexdigest()
    failed = next(d for k, _, d in entries if k == "task.step.failed")
    assert failed["status"] == "failed" and len(failed["error_sha256"]) == 64
    assert (await store.audit.verify()).ok


async def test_a_step_whose_audit_entry_fails_is_not_started_and_fn_does_not_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _running(store)

    # The entry is built after the change's statement ran, in its transaction: failing there must undo it.
    def refuse(*args: object) -> None:
        raise statekeel.BackendUnavailable("the audit log is not writable")

    monkeypatch.setattr("statekeel.tasks.rules.task_note", refuse)
    fn = Counter()
    with pytest.raises(statekeel.BackendUnavailable):
        await store.tasks.step(task.id, "charge", fn)
    monkeypatch.undo()
    assert fn.calls == 0 and await store.tasks.get_step(task.id, "charge") is None


async def test_a_step_inside_an_atomic_block_is_refused_so_a_rollback_never_makes_it_run_twice(
    store: Store,
) -> None:
    task = await _running(store)
    fn = Counter("charged")
    entries = (await store.audit.verify()).count
    with pytest.raises(RuntimeError, match="the caller's block fails"):
        async with store.backend.atomic():
            with pytest.raises(statekeel.StepInTransaction, match="outside the block"):
                await store.tasks.step(task.id, "charge", fn)
            raise RuntimeError("the caller's block fails")
    assert fn.calls == 0  # refused before anything was written or run
    assert await store.tasks.steps(task.id) == []
    assert (await store.audit.verify()).count == entries
    # Outside the block the step runs once, and a later call (in a block or not) replays nothing twice.
    assert await store.tasks.step(task.id, "charge", fn) == "charged"
    assert await store.tasks.step(task.id, "charge", fn) == "charged"
    assert fn.calls == 1


async def test_a_coroutine_given_to_a_step_refused_inside_an_atomic_block_is_closed(store: Store) -> None:
    task = await _running(store)
    ran = []

    async def charge() -> str:
        ran.append(1)
        return "charged"

    coroutine = charge()
    async with store.backend.atomic():
        with pytest.raises(statekeel.StepInTransaction):
            await store.tasks.step(task.id, "charge", coroutine)
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED and ran == []


async def test_resolve_step_refuses_while_a_live_lease_holder_runs_the_step_and_keeps_its_result(
    store: Store,
) -> None:
    task = await _running(store)  # worker "w" holds a live lease
    refused: list[BaseException] = []

    async def charge() -> str:
        # Someone resolves the step while the worker's function runs: refused, nothing written.
        with pytest.raises(statekeel.ConflictError, match="live lease") as info:
            await store.tasks.resolve_step(task.id, "charge", "succeeded", result="by hand", actor="ops")
        refused.append(info.value)
        return "by the worker"

    assert await store.tasks.step(task.id, "charge", charge, lease_epoch=task.lease_epoch) == "by the worker"
    assert len(refused) == 1 and refused[0].fields["lease_owner"] == "w"
    record = await store.tasks.get_step(task.id, "charge")
    assert record is not None and (record.status, record.result) == ("succeeded", "by the worker")
    kinds = [e.kind for e in await store.audit.query(subject=f"task:{task.id}", limit=100)]
    assert "task.step.resolved" not in kinds


async def test_a_forced_resolve_step_is_audited_and_the_workers_own_finish_raises_not_dropped(
    store: Store,
) -> None:
    task = await _running(store)

    async def charge() -> str:
        await store.tasks.resolve_step(
            task.id, "charge", "succeeded", result="by hand", actor="ops", force=True
        )
        return "by the worker"

    with pytest.raises(statekeel.ConflictError, match="was not recorded"):
        await store.tasks.step(task.id, "charge", charge, lease_epoch=task.lease_epoch)
    record = await store.tasks.get_step(task.id, "charge")
    assert record is not None and (record.status, record.result) == ("succeeded", "by hand")
    [resolved] = [
        e
        for e in await store.audit.query(subject=f"task:{task.id}", limit=100)
        if e.kind == "task.step.resolved"
    ]
    assert resolved.actor == "ops"
    assert resolved.data["forced"] is True
    assert (resolved.data["lease_owner"], resolved.data["lease_epoch"]) == ("w", task.lease_epoch)
    assert (await store.audit.verify()).ok


async def test_resolve_step_after_the_lease_ended_needs_no_force(store: Store) -> None:
    task = await _running(store)
    await _crash_after_start(store, task.id, "charge")
    with pytest.raises(statekeel.ConflictError):
        await store.tasks.resolve_step(task.id, "charge", "failed")  # the lease is still live
    await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    settled = await store.tasks.resolve_step(task.id, "charge", "failed")
    assert settled.status == "failed"
    [resolved] = [
        e
        for e in await store.audit.query(subject=f"task:{task.id}", limit=100)
        if e.kind == "task.step.resolved"
    ]
    assert "forced" not in resolved.data


async def test_resolve_step_never_settles_a_run_started_again_after_it_judged_the_step(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await _running(store)
    await _crash_after_start(store, task.id, "read")
    await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    judge = statekeel.tasks.operations.live_lease

    async def rerun_in_between(*args: Any) -> Any:
        overridden = await judge(*args)
        # Between the judgement and the write, a worker re-runs the idempotent step (attempt 2).
        _, run = await store.backend.begin_step(task.id, "read", rerun_started=True)
        assert run
        return overridden

    monkeypatch.setattr(statekeel.tasks.operations, "live_lease", rerun_in_between)
    with pytest.raises(statekeel.ConflictError, match="started again"):
        await store.tasks.resolve_step(task.id, "read", "succeeded", result="by hand")
    record = await store.tasks.get_step(task.id, "read")
    assert record is not None and (record.status, record.attempt) == ("started", 2)


async def test_resolve_step_takes_succeeded_as_a_keyword_with_the_actor(store: Store) -> None:
    task = await _running(store)
    await _crash_after_start(store, task.id, "charge")
    await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.resolve_step(task.id, "charge", "succeeded", succeeded=True)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.resolve_step(task.id, "charge")
    settled = await store.tasks.resolve_step(
        task.id, "charge", succeeded=True, result={"n": 1}, actor="alice"
    )
    assert settled.status == "succeeded"
    assert await store.tasks.step(task.id, "charge", Counter()) == {"n": 1}
    [entry] = [
        e
        for e in await store.audit.query(subject=f"task:{task.id}", limit=100)
        if e.kind == "task.step.resolved"
    ]
    assert entry.actor == "alice"
