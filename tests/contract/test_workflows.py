"""Workflows: DAG validation at create, advancing through dependencies, failure and cancellation."""

from __future__ import annotations

import asyncio

import pytest

import statekeel
from statekeel import WorkflowStep

Store = statekeel.Store


def _status(wf: statekeel.Workflow) -> dict[str, str]:
    return {s.name: s.task.status for s in wf.steps}


async def _finish(store: Store, wf: statekeel.Workflow, name: str, outcome: str = "success") -> None:
    [task] = [s.task for s in wf.steps if s.name == name]
    claimed = await store.tasks.claim("w", workflow_id=wf.id)
    assert claimed is not None and claimed.id == task.id, f"{name} was not the next queued step"
    await store.tasks.transition(task.id, outcome, lease_epoch=claimed.lease_epoch)


DIAMOND = [
    {"name": "fetch"},
    {"name": "lint", "depends_on": ["fetch"]},
    {"name": "test", "depends_on": ["fetch"], "priority": 9},
    WorkflowStep("publish", depends_on=("lint", "test"), title="publish the wheel"),
]


async def test_create_turns_each_step_into_a_pending_task_of_the_workflow(store: Store) -> None:
    wf = await store.workflows.create("release", DIAMOND, metadata={"v": "1.0"})
    assert (wf.status, wf.metadata, wf.version) == ("pending", {"v": "1.0"}, 1)
    assert [s.name for s in wf.steps] == ["fetch", "lint", "test", "publish"]
    assert set(_status(wf).values()) == {"pending"}
    assert wf.steps[3].depends_on == ("lint", "test") and wf.steps[3].task.title == "publish the wheel"
    assert wf.steps[2].task.priority == 9
    assert all(s.task.workflow_id == wf.id for s in wf.steps)
    assert await store.workflows.get(wf.id) == wf


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        ([{"name": "a", "depends_on": ["b"]}, {"name": "b", "depends_on": ["a"]}], "cycle: a -> b -> a"),
        ([{"name": "a", "depends_on": ["a"]}], "cycle"),
        ([{"name": "a"}, {"name": "b", "depends_on": ["c"]}, {"name": "c", "depends_on": ["b"]}], "cycle"),
        ([{"name": "a", "depends_on": ["ghost"]}], "ghost"),
        ([{"name": "a"}, {"name": "a"}], "unique"),
        ([{"name": "a", "retries": 3}], "unknown keys"),
        ([{"name": ""}], "empty"),
        ([{"name": "a", "depends_on": "b"}], "list of step names"),
        ([], "non-empty"),
        ([{"name": "a", "metadata": {"x": object()}}], "metadata"),
    ],
)
async def test_a_malformed_dag_is_refused_at_create_and_nothing_is_written(
    store: Store, steps: list[dict[str, object]], match: str
) -> None:
    with pytest.raises(statekeel.InvalidArgument, match=match):
        await store.workflows.create("bad", steps)
    assert await store.workflows.list() == []
    assert (await store.tasks.list()).items == []


async def test_start_queues_the_roots_and_advance_follows_the_dependencies(store: Store) -> None:
    wf = await store.workflows.create("release", DIAMOND)
    wf = await store.workflows.start(wf.id)
    assert wf.status == "running" and wf.started_at is not None
    assert _status(wf) == {"fetch": "queued", "lint": "pending", "test": "pending", "publish": "pending"}
    await _finish(store, wf, "fetch")
    wf = await store.workflows.advance(wf.id)
    assert _status(wf) == {"fetch": "success", "lint": "queued", "test": "queued", "publish": "pending"}
    await _finish(store, wf, "test")  # higher priority is claimed first
    wf = await store.workflows.advance(wf.id)
    assert _status(wf)["publish"] == "pending"
    await _finish(store, wf, "lint")
    wf = await store.workflows.advance(wf.id)
    assert _status(wf)["publish"] == "queued"
    await _finish(store, wf, "publish")
    wf = await store.workflows.advance(wf.id)
    assert wf.status == "success" and wf.completed_at is not None
    assert await store.workflows.advance(wf.id) == wf  # settled: nothing more to do


async def test_a_step_that_fails_for_good_cancels_its_dependents_and_fails_the_workflow(store: Store) -> None:
    wf = await store.workflows.create(
        "w",
        [
            {"name": "a", "max_retries": 0},
            {"name": "b", "depends_on": ["a"]},
            {"name": "c", "depends_on": ["b"]},
            {"name": "side"},
        ],
    )
    wf = await store.workflows.start(wf.id)
    await _finish(store, wf, "a", "failed")
    wf = await store.workflows.advance(wf.id)
    assert _status(wf) == {"a": "failed", "b": "cancelled", "c": "cancelled", "side": "queued"}
    assert wf.status == "running"  # "side" still runs
    [b] = [s.task for s in wf.steps if s.name == "b"]
    assert b.error == {"reason": "dependency did not succeed", "dependencies": ["a"]}
    await _finish(store, wf, "side")
    wf = await store.workflows.advance(wf.id)
    assert wf.status == "failed"


async def test_advance_requeues_a_failed_step_that_has_retries_left(store: Store) -> None:
    wf = await store.workflows.start(
        (await store.workflows.create("w", [{"name": "a", "max_retries": 1}])).id
    )
    await _finish(store, wf, "a", "failed")
    wf = await store.workflows.advance(wf.id)
    assert _status(wf) == {"a": "queued"} and wf.steps[0].task.retry_count == 1
    await _finish(store, wf, "a", "failed")
    wf = await store.workflows.advance(wf.id)
    assert wf.status == "failed"


async def test_cancel_cancels_every_unfinished_step_and_the_workflow(store: Store) -> None:
    wf = await store.workflows.start((await store.workflows.create("w", DIAMOND)).id)
    await _finish(store, wf, "fetch")
    wf = await store.workflows.advance(wf.id)
    running = await store.tasks.claim("w", workflow_id=wf.id)
    assert running is not None
    wf = await store.workflows.cancel(wf.id, reason="user stopped it")
    assert wf.status == "cancelled"
    assert _status(wf) == {
        "fetch": "success",
        "lint": "cancelled",
        "test": "cancelled",
        "publish": "cancelled",
    }
    with pytest.raises(statekeel.LeaseLost):
        await store.tasks.transition(running.id, "success", lease_epoch=running.lease_epoch)
    with pytest.raises(statekeel.InvalidTransition):
        await store.workflows.cancel(wf.id)


async def test_workflow_transitions_are_legal_only(store: Store) -> None:
    wf = await store.workflows.create("w", [{"name": "a"}])
    assert await store.workflows.advance(wf.id) == wf  # not started: unchanged
    await store.workflows.start(wf.id)
    with pytest.raises(statekeel.InvalidTransition):
        await store.workflows.start(wf.id)
    with pytest.raises(statekeel.NotFound):
        await store.workflows.start("missing")
    with pytest.raises(statekeel.NotFound):
        await store.workflows.advance("missing")


async def test_concurrent_advances_queue_each_step_once(store: Store) -> None:
    wf = await store.workflows.start(
        (await store.workflows.create("w", [{"name": "a"}, {"name": "b", "depends_on": ["a"]}])).id
    )
    await _finish(store, wf, "a")
    results = await asyncio.gather(
        *(store.workflows.advance(wf.id) for _ in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, statekeel.Workflow) for r in results), results
    final = await store.workflows.get(wf.id)
    assert final is not None and _status(final) == {"a": "success", "b": "queued"}
    assert final.steps[1].task.version == 2  # pending -> queued exactly once


async def test_list_and_unfinished_report_workflows_by_status(store: Store) -> None:
    a = await store.workflows.create("a", [{"name": "x"}])
    b = await store.workflows.start((await store.workflows.create("b", [{"name": "x"}])).id)
    c = await store.workflows.cancel((await store.workflows.create("c", [{"name": "x"}])).id)
    assert [w.id for w in await store.workflows.list()] == [a.id, b.id, c.id]
    assert [w.id for w in await store.workflows.list(status="running")] == [b.id]
    assert {w.id for w in await store.workflows.unfinished()} == {a.id, b.id}
    with pytest.raises(statekeel.InvalidArgument):
        await store.workflows.list(status="done")


async def test_workflow_step_objects_are_validated_like_dicts(store: Store) -> None:
    with pytest.raises(statekeel.InvalidArgument, match="list of step names"):
        await store.workflows.create("w", [WorkflowStep("a"), WorkflowStep("b", depends_on="a")])  # type: ignore[arg-type]
    wf = await store.workflows.create("w", [WorkflowStep("a"), WorkflowStep("b", depends_on=["a"])])  # type: ignore[arg-type]
    assert wf.steps[1].depends_on == ("a",)


async def test_the_task_changes_a_workflow_makes_are_in_the_audit_log(store: Store) -> None:
    wf = await store.workflows.create(
        "release", [{"name": "build"}, {"name": "test", "depends_on": ["build"]}]
    )
    wf = await store.workflows.start(wf.id)
    await _finish(store, wf, "build", "failed")
    for _ in range(3):  # each retry fails too, until the retries are used up
        wf = await store.workflows.advance(wf.id)
        await _finish(store, wf, "build", "failed")
    wf = await store.workflows.advance(wf.id)  # the dependent step is cancelled, the workflow failed
    assert wf.status == "failed"
    test_task = next(s.task for s in wf.steps if s.name == "test")
    kinds = [
        (e.kind, e.actor, e.data.get("to")) for e in await store.audit.query(subject=f"task:{test_task.id}")
    ]
    assert kinds == [
        ("task.created", "unspecified", None),
        ("task.transitioned", "statekeel.workflow", "cancelled"),
    ]
    build = next(s.task for s in wf.steps if s.name == "build")
    requeued = [
        e.data
        for e in await store.audit.query(subject=f"task:{build.id}")
        if e.kind == "task.transitioned" and e.data["via"] == "workflow"
    ]
    assert [(d["from"], d["to"]) for d in requeued] == [("pending", "queued")] + [("failed", "queued")] * 3
    assert (await store.audit.verify()).ok
