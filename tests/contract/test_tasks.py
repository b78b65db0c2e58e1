"""Tasks: the state machine, conditional transitions, leases and fencing, on every backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools

import pytest

import statekeel
from helpers import BAD_TEXT
from statekeel.backends.base import TASK_STATUSES
from statekeel.tasks import TRANSITIONS

Store = statekeel.Store


async def _all_tasks(store: Store) -> list[statekeel.Task]:
    return list((await store.tasks.list(limit=1000)).items)


async def _at(store: Store, status: str) -> statekeel.Task:
    """A task brought to ``status`` through legal transitions only."""
    paths = {
        "pending": [],
        "queued": ["queued"],
        "running": ["running"],
        "suspended": ["running", "suspended"],
        "interrupted": ["running", "interrupted"],
        "success": ["running", "success"],
        "failed": ["running", "failed"],
        "cancelled": ["cancelled"],
    }
    task = await store.tasks.create(f"to {status}")
    for step in paths[status]:
        task = await store.tasks.transition(task.id, step)
    assert task.status == status
    return task


async def test_create_returns_a_pending_task_with_defaults(store: Store) -> None:
    task = await store.tasks.create("index the repo", metadata={"repo": "x"}, description="all of it")
    assert (task.status, task.priority, task.max_retries, task.retry_count) == ("pending", 5, 3, 0)
    assert (task.version, task.lease_epoch, task.lease_owner) == (1, 0, None)
    assert task.metadata == {"repo": "x"} and task.description == "all of it"
    assert await store.tasks.get(task.id) == task


async def test_create_twice_with_one_idempotency_key_returns_the_same_task(store: Store) -> None:
    first = await store.tasks.create("charge card", idempotency_key="order-17")
    again = await store.tasks.create("charge card", idempotency_key="order-17")
    assert again == first
    concurrent = await asyncio.gather(
        *(store.tasks.create("other", idempotency_key="order-18") for _ in range(5))
    )
    assert len({t.id for t in concurrent}) == 1
    assert len(await _all_tasks(store)) == 2


async def test_every_legal_transition_is_applied_and_bumps_the_version(store: Store) -> None:
    for source, targets in TRANSITIONS.items():
        for target in sorted(targets):
            task = await _at(store, source)
            moved = await store.tasks.transition(task.id, target, expected_version=task.version)
            assert (moved.status, moved.version) == (target, task.version + 1)
            assert await store.tasks.get(task.id) == moved


async def test_an_illegal_transition_raises_invalid_transition_and_changes_nothing(store: Store) -> None:
    illegal = [(a, b) for a, b in itertools.product(TASK_STATUSES, TASK_STATUSES) if b not in TRANSITIONS[a]]
    assert ("success", "queued") in illegal and ("pending", "success") in illegal
    for source, target in illegal:
        task = await _at(store, source)
        with pytest.raises(statekeel.InvalidTransition) as info:
            await store.tasks.transition(task.id, target)
        assert info.value.current == source
        assert await store.tasks.get(task.id) == task


async def test_transition_out_of_a_terminal_status_is_refused(store: Store) -> None:
    for terminal in ("success", "cancelled"):
        task = await _at(store, terminal)
        for target in TASK_STATUSES:
            with pytest.raises(statekeel.InvalidTransition):
                await store.tasks.transition(task.id, target)
        assert (await store.tasks.get(task.id)) == task


async def test_transition_at_a_stale_version_raises_conflict_and_keeps_the_newer_state(store: Store) -> None:
    task = await store.tasks.create("t")
    queued = await store.tasks.transition(task.id, "queued", expected_version=1)
    with pytest.raises(statekeel.ConflictError) as info:
        await store.tasks.transition(task.id, "cancelled", expected_version=1)
    assert info.value.current == 2
    assert await store.tasks.get(task.id) == queued


async def test_two_racing_transitions_from_one_version_never_both_succeed(store: Store) -> None:
    for _ in range(5):
        task = await _at(store, "running")
        outcomes = await asyncio.gather(
            store.tasks.transition(task.id, "success", expected_version=task.version, result="a"),
            store.tasks.transition(task.id, "failed", expected_version=task.version, error="b"),
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, statekeel.Task)]
        losers = [o for o in outcomes if isinstance(o, statekeel.ConflictError)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert await store.tasks.get(task.id) == winners[0]


async def test_success_stores_the_result_and_failure_the_error(store: Store) -> None:
    ok = await store.tasks.transition(
        (await _at(store, "running")).id, "success", result={"files": 3, "at": dt.date(2024, 1, 2)}
    )
    assert ok.result == {"files": 3, "at": dt.date(2024, 1, 2)} and ok.completed_at is not None
    bad = await store.tasks.transition((await _at(store, "running")).id, "failed", error="disk full")
    assert bad.error == "disk full"


async def test_a_failed_task_is_retried_at_most_max_retries_times(store: Store) -> None:
    task = await store.tasks.create("flaky", max_retries=2)
    for attempt in range(1, 3):
        task = await store.tasks.transition(task.id, "running")
        task = await store.tasks.transition(task.id, "failed", error=f"try {attempt}")
        task = await store.tasks.transition(task.id, "queued")
        assert task.retry_count == attempt
    task = await store.tasks.transition(task.id, "running")
    task = await store.tasks.transition(task.id, "failed")
    with pytest.raises(statekeel.InvalidTransition, match="retries"):
        await store.tasks.transition(task.id, "queued")
    assert (await store.tasks.get(task.id)) == task


async def test_bad_arguments_raise_typed_errors_and_write_nothing(store: Store) -> None:
    bad_creates = [
        {"title": ""},
        {"title": 3},
        {"title": "t", "priority": "high"},
        {"title": "t", "priority": True},
        {"title": "t", "max_retries": -1},
        {"title": "t", "metadata": {"f": object()}},
        {"title": "t", "metadata": [1]},
        {"title": "t", "idempotency_key": ""},
        {"title": "t", "status": "running"},
        {"title": "t", "status": "bogus"},
    ]
    for kwargs in bad_creates:
        with pytest.raises(statekeel.InvalidArgument):
            await store.tasks.create(**kwargs)
    with pytest.raises(statekeel.NotFound):
        await store.tasks.create("t", workflow_id="no-such-workflow")
    with pytest.raises(statekeel.NotFound):
        await store.tasks.create("t", parent_task_id="no-such-task")
    assert await _all_tasks(store) == []

    task = await store.tasks.create("t")
    with pytest.raises(statekeel.InvalidArgument, match="not a task status"):
        await store.tasks.transition(task.id, "done")
    with pytest.raises(statekeel.SerializationError, match="result"):
        await store.tasks.transition(task.id, "running", result={1, 2})
    with pytest.raises(statekeel.NotFound):
        await store.tasks.transition("missing", "queued")
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.list(status="nope")
    assert await store.tasks.get(task.id) == task
    # The store stays usable.
    assert (await store.tasks.transition(task.id, "queued")).status == "queued"


@pytest.mark.parametrize("text", BAD_TEXT, ids=["nul", "surrogate"])
async def test_task_and_workflow_text_with_nul_or_a_surrogate_is_refused_and_nothing_written(
    store: Store, text: str
) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.create(text)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.create("t", description=text)
    with pytest.raises(statekeel.InvalidArgument):
        await store.workflows.create(text, [{"name": "build"}])
    with pytest.raises(statekeel.InvalidArgument):
        await store.workflows.create("release", [{"name": "build", "title": text}])
    assert (await store.tasks.list()).items == []
    assert await store.workflows.list() == []
    # The store stays usable, and ordinary text (empty description included) still goes through.
    task = await store.tasks.create("é 🚀", description="")
    assert (task.title, task.description) == ("é 🚀", "")


async def test_list_filters_by_status_and_workflow_and_paginates_oldest_first(store: Store) -> None:
    made = [await store.tasks.create(f"t{i}", status="queued" if i % 2 else "pending") for i in range(7)]
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.tasks.list(limit=3, cursor=cursor)
        seen.extend(t.id for t in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [t.id for t in made]
    queued = await store.tasks.list(status="queued")
    assert [t.id for t in queued.items] == [t.id for t in made if t.status == "queued"]
    wf = await store.workflows.create("w", [{"name": "only"}])
    in_wf = await store.tasks.list(workflow_id=wf.id)
    assert [t.id for t in in_wf.items] == [wf.steps[0].task.id]
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.list(cursor="garbage")


async def test_claim_takes_the_highest_priority_then_the_oldest_queued_task(store: Store) -> None:
    low = await store.tasks.create("low", priority=1, status="queued")
    old = await store.tasks.create("old", priority=9, status="queued")
    new = await store.tasks.create("new", priority=9, status="queued")
    await store.tasks.create("pending", priority=100)
    order = [await store.tasks.claim(f"w{i}") for i in range(4)]
    assert [t.id if t else None for t in order] == [old.id, new.id, low.id, None]
    first = order[0]
    assert first is not None
    assert (first.status, first.lease_owner, first.lease_epoch) == ("running", "w0", 1)
    assert first.lease_expires_at is not None and first.started_at is not None


async def test_claim_can_be_limited_to_one_workflow(store: Store) -> None:
    await store.tasks.create("outside", status="queued", priority=100)
    wf = await store.workflows.start((await store.workflows.create("w", [{"name": "a"}])).id)
    got = await store.tasks.claim("w", workflow_id=wf.id)
    assert got is not None and got.id == wf.steps[0].task.id
    assert await store.tasks.claim("w", workflow_id=wf.id) is None


async def test_concurrent_claims_take_each_task_exactly_once(store: Store) -> None:
    for i in range(30):
        await store.tasks.create(f"t{i}", status="queued")

    async def worker(name: str) -> list[str]:
        got = []
        while (task := await store.tasks.claim(name)) is not None:
            got.append(task.id)
        return got

    results = await asyncio.gather(*(worker(f"w{i}") for i in range(4)))
    claimed = [tid for r in results for tid in r]
    assert len(claimed) == 30 and len(set(claimed)) == 30


async def test_heartbeat_extends_the_lease_only_for_the_current_owner_and_epoch(store: Store) -> None:
    await store.tasks.create("t", status="queued")
    task = await store.tasks.claim("w1", lease_seconds=5)
    assert task is not None and task.lease_expires_at is not None
    longer = await store.tasks.heartbeat(task.id, "w1", task.lease_epoch, lease_seconds=600)
    assert longer.lease_expires_at is not None and longer.lease_expires_at > task.lease_expires_at
    for worker, epoch in (("w2", task.lease_epoch), ("w1", task.lease_epoch + 1)):
        with pytest.raises(statekeel.LeaseLost):
            await store.tasks.heartbeat(task.id, worker, epoch)
    assert await store.tasks.get(task.id) == longer


async def test_a_zombie_whose_lease_was_taken_over_cannot_complete_the_task(store: Store) -> None:
    await store.tasks.create("t", status="queued")
    zombie = await store.tasks.claim("zombie", lease_seconds=1)
    assert zombie is not None
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    expired = await store.tasks.expire_leases(now=later)
    assert [t.id for t in expired] == [zombie.id] and expired[0].status == "interrupted"
    await store.tasks.transition(zombie.id, "queued")
    heir = await store.tasks.claim("heir")
    assert heir is not None and heir.id == zombie.id and heir.lease_epoch == zombie.lease_epoch + 1
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(zombie.id, "success", lease_epoch=zombie.lease_epoch, worker_id="zombie")
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.heartbeat(zombie.id, "zombie", zombie.lease_epoch)
    assert await store.tasks.get(zombie.id) == heir
    done = await store.tasks.transition(heir.id, "success", lease_epoch=heir.lease_epoch, worker_id="heir")
    assert done.status == "success"


async def test_a_worker_whose_lease_expired_cannot_complete_the_interrupted_task(store: Store) -> None:
    await store.tasks.create("t", status="queued")
    task = await store.tasks.claim("w", lease_seconds=1)
    assert task is not None
    await store.tasks.expire_leases(now=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5))
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(task.id, "success", lease_epoch=task.lease_epoch)
    assert (await store.tasks.get(task.id)).status == "interrupted"  # type: ignore[union-attr]


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
    # A later claim fences by the next epoch.
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


async def test_expire_leases_leaves_live_leases_and_unleased_tasks_alone(store: Store) -> None:
    await store.tasks.create("a", status="queued")
    leased = await store.tasks.claim("w", lease_seconds=60)
    unleased = await store.tasks.transition((await store.tasks.create("b")).id, "running")
    assert await store.tasks.expire_leases() == []
    assert leased is not None and (await store.tasks.get(leased.id)) == leased
    assert await store.tasks.get(unleased.id) == unleased


async def test_bad_lease_arguments_are_refused_before_anything_is_written(store: Store) -> None:
    queued = await store.tasks.create("t", status="queued")
    for kwargs in ({"lease_seconds": -1}, {"lease_seconds": 0}, {"lease_seconds": float("nan")}):
        with pytest.raises(statekeel.InvalidArgument):
            await store.tasks.claim("w", **kwargs)  # type: ignore[arg-type]
    for worker in ("", None, 7):
        with pytest.raises(statekeel.InvalidArgument):
            await store.tasks.claim(worker)  # type: ignore[arg-type]
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.expire_leases(now=dt.datetime(2030, 1, 1))  # naive
    assert await store.tasks.get(queued.id) == queued
    claimed = await store.tasks.claim("w")
    assert claimed is not None
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.heartbeat(claimed.id, "w", claimed.lease_epoch, lease_seconds=-5)
    assert await store.tasks.get(claimed.id) == claimed


async def test_tasks_iter_pages_through_every_task_in_order(store: Store) -> None:
    made = [await store.tasks.create(f"task {i}") for i in range(7)]
    wf = await store.workflows.create(
        "release", [{"name": "build"}, {"name": "ship", "depends_on": ["build"]}]
    )
    every = [t.id async for t in store.tasks.iter(page_size=2)]
    assert every[:7] == [t.id for t in made] and len(every) == 9
    pending = [t.title async for t in store.tasks.iter(status="pending", page_size=3)]
    assert pending[:7] == [f"task {i}" for i in range(7)]
    assert sorted([t.title async for t in store.tasks.iter(workflow_id=wf.id)]) == ["build", "ship"]
    with pytest.raises(statekeel.InvalidArgument):
        store.tasks.iter(status="napping")
    with pytest.raises(statekeel.InvalidArgument):
        store.tasks.iter(page_size=0)


# --- the audit log -------------------------------------------------------------------------------------


async def _task_entries(store: Store, task_id: str) -> list[tuple[str, str, dict[str, object]]]:
    return [(e.kind, e.actor, e.data) for e in await store.audit.query(subject=f"task:{task_id}")]


async def test_each_task_change_is_in_the_audit_log_and_the_chain_verifies(store: Store) -> None:
    task = await store.tasks.create("deploy")
    await store.tasks.transition(task.id, "queued", actor="alice")
    claimed = await store.tasks.claim("worker-1")
    assert claimed is not None
    done = await store.tasks.transition(
        task.id, "success", worker_id="worker-1", lease_epoch=claimed.lease_epoch, result={"ok": True}
    )
    entries = await _task_entries(store, task.id)
    assert [(kind, actor) for kind, actor, _ in entries] == [
        ("task.created", "unspecified"),
        ("task.transitioned", "alice"),
        ("task.transitioned", "worker-1"),
        ("task.transitioned", "worker-1"),
    ]
    assert [(d.get("from"), d.get("to", d.get("status")), d["version"]) for _, _, d in entries] == [
        (None, "pending", 1),
        ("pending", "queued", 2),
        ("queued", "running", 3),
        ("running", "success", done.version),
    ]
    assert entries[2][2]["via"] == "claim" and entries[2][2]["lease_epoch"] == claimed.lease_epoch
    assert all(d["task_id"] == task.id for _, _, d in entries)
    verification = await store.audit.verify()
    assert verification.ok and verification.count == 4


async def test_a_refused_transition_appends_no_audit_entry(store: Store) -> None:
    task = await store.tasks.create("deploy")
    with pytest.raises(statekeel.InvalidTransition):
        await store.tasks.transition(task.id, "success")
    with pytest.raises(statekeel.ConflictError):
        await store.tasks.transition(task.id, "queued", expected_version=7)
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.transition(task.id, "queued", actor="")
    assert [kind for kind, _, _ in await _task_entries(store, task.id)] == ["task.created"]
    # An idempotent create that returns the earlier task created nothing: no second entry.
    first = await store.tasks.create("once", idempotency_key="k-1")
    again = await store.tasks.create("once", idempotency_key="k-1")
    assert again.id == first.id
    assert len(await _task_entries(store, first.id)) == 1


async def test_expired_leases_are_audited_as_interrupted_by_lease_expiry(store: Store) -> None:
    await store.tasks.create("long", status="queued")
    claimed = await store.tasks.claim("worker-gone", lease_seconds=1)
    assert claimed is not None
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    [expired] = await store.tasks.expire_leases(now=later)
    kind, actor, data = (await _task_entries(store, claimed.id))[-1]
    assert (kind, actor) == ("task.transitioned", "statekeel.lease-expiry")
    assert (data["from"], data["to"], data["via"], data["version"]) == (
        "running",
        "interrupted",
        "lease_expired",
        expired.version,
    )
    assert (await store.audit.verify()).ok


async def test_leases_expired_in_one_sweep_each_get_their_entry_in_one_unbroken_chain(store: Store) -> None:
    for name in ("a", "b", "c"):
        await store.tasks.create(name, status="queued")
    claimed = [await store.tasks.claim(f"worker-{i}", lease_seconds=1) for i in range(3)]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    expired = await store.tasks.expire_leases(now=later)
    assert sorted(t.id for t in expired) == sorted(t.id for t in claimed if t is not None)
    entries = await store.audit.query(kind="task.transitioned")
    swept = [e for e in entries if e.actor == "statekeel.lease-expiry"]
    assert sorted(e.data["task_id"] for e in swept) == sorted(t.id for t in expired)
    assert [e.seq for e in swept] == list(range(swept[0].seq, swept[0].seq + 3))
    verification = await store.audit.verify()
    assert verification.ok and verification.count == 9


async def test_a_transition_whose_audit_entry_fails_is_not_made(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await store.tasks.create("deploy", status="queued")

    # The entry is built after the change's statement ran, in its transaction: failing there must undo it.
    def refuse(*args: object) -> None:
        raise statekeel.BackendUnavailable("the audit log is not writable")

    monkeypatch.setattr("statekeel.tasks.rules.task_note", refuse)
    with pytest.raises(statekeel.BackendUnavailable):
        await store.tasks.transition(task.id, "running")
    with pytest.raises(statekeel.BackendUnavailable):
        await store.tasks.claim("worker-1")
    monkeypatch.undo()
    after = await store.tasks.get(task.id)
    assert after is not None and (after.status, after.version, after.lease_epoch) == ("queued", 1, 0)
    assert [kind for kind, _, _ in await _task_entries(store, task.id)] == ["task.created"]


# --- an operator's requeue and cancel -------------------------------------------------------------------


async def _transitions(store: Store, task_id: str) -> list[statekeel.AuditEntry]:
    found = await store.audit.query(subject=f"task:{task_id}", limit=1000)
    return [e for e in found if e.kind == "task.transitioned"]


@pytest.mark.parametrize("status", ["pending", "suspended", "interrupted", "failed"])
async def test_requeue_queues_the_task_with_an_audit_entry_naming_the_actor(
    store: Store, status: str
) -> None:
    task = await _at(store, status)
    requeued = await store.tasks.requeue(task.id, actor="alice")
    assert requeued.status == "queued" and requeued.version == task.version + 1
    last = (await _transitions(store, task.id))[-1]
    assert (last.actor, last.data["via"], last.data["from"], last.data["to"]) == (
        "alice",
        "requeue",
        status,
        "queued",
    )
    claimed = await store.tasks.claim("w2")
    assert claimed is not None and claimed.id == task.id


@pytest.mark.parametrize("status", ["queued", "running", "success", "cancelled"])
async def test_requeue_refuses_a_task_that_cannot_be_queued_and_writes_nothing(
    store: Store, status: str
) -> None:
    task = await _at(store, status)
    before = await _transitions(store, task.id)
    with pytest.raises(statekeel.InvalidTransition):
        await store.tasks.requeue(task.id, actor="alice")
    after = await store.tasks.get(task.id)
    assert after is not None and (after.status, after.version) == (status, task.version)
    assert await _transitions(store, task.id) == before


async def test_cancel_records_the_reason_fences_the_worker_and_refuses_a_finished_task(store: Store) -> None:
    await store.tasks.create("t", status="queued")
    task = await store.tasks.claim("w", lease_seconds=60)
    assert task is not None
    cancelled = await store.tasks.cancel(task.id, actor="bob", reason="duplicate of #12")
    assert cancelled.status == "cancelled" and cancelled.error == {
        "type": "cancelled",
        "reason": "duplicate of #12",
        "by": "bob",
    }
    last = (await _transitions(store, task.id))[-1]
    assert (last.actor, last.data["via"], last.data["reason"]) == ("bob", "cancel", "duplicate of #12")
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.heartbeat(task.id, "w", task.lease_epoch)
    with pytest.raises(statekeel.InvalidTransition):
        await store.tasks.cancel(task.id, actor="bob", reason="again")
    with pytest.raises(statekeel.NotFound):
        await store.tasks.cancel("no-such-task", actor="bob", reason="x")


@pytest.mark.parametrize(
    "kwargs", [{"actor": ""}, {"actor": 7}, {"actor": "bob", "reason": ""}, {"actor": "bob", "reason": None}]
)
async def test_cancel_and_requeue_check_their_arguments_before_writing(store: Store, kwargs: dict) -> None:
    task = await _at(store, "pending")
    with pytest.raises(statekeel.InvalidArgument):
        await store.tasks.cancel(task.id, **{"reason": "r", **kwargs})
    if "reason" not in kwargs:
        with pytest.raises(statekeel.InvalidArgument):
            await store.tasks.requeue(task.id, **kwargs)
    after = await store.tasks.get(task.id)
    assert after is not None and after.status == "pending" and after.version == task.version
