"""Real LangGraph graphs compiled with StatekeelSaver, on every backend: interrupted and resumed (also by a
new store on the same database), forked, run in each durability mode, retried after a failing node, and
called through LangGraph's sync API."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import os
import threading
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import statekeel
from statekeel.integrations.langgraph import StatekeelSaver


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int
    checked: bool


class Inner(TypedDict):
    checked: bool


def _build(
    ran: list[str], *, fail_once: set[str] | None = None, fail_after: threading.Event | None = None
) -> StateGraph[Any]:
    """plan -> (research || draft) -> review (asks a human) -> publish; review runs a subgraph first.
    A node of ``fail_once`` fails its first run, once ``fail_after`` is set (when given)."""
    failing = fail_once if fail_once is not None else set()

    def node(name: str, **update: Any) -> Any:
        def run(state: State) -> dict[str, Any]:
            ran.append(name)
            if name in failing:
                failing.discard(name)
                # Nodes run in worker threads: this one waits here, off the event loop, for its cue.
                assert fail_after is None or fail_after.wait(30), "the cue to fail never came"
                raise RuntimeError(f"{name} failed")
            return {"log": [name], **update}

        return run

    def check(state: Inner) -> dict[str, Any]:
        ran.append("check")
        return {"checked": True}

    inner = StateGraph(Inner)
    inner.add_node("check", check)
    inner.add_edge(START, "check")
    inner.add_edge("check", END)

    def review(state: State) -> dict[str, Any]:
        ran.append("review")
        answer = interrupt({"question": "publish?", "n": state["n"]})
        return {"log": [f"review:{answer}"]}

    builder = StateGraph(State)
    builder.add_node("plan", node("plan", n=1))
    builder.add_node("research", node("research"))
    builder.add_node("draft", node("draft"))
    builder.add_node("inner", inner.compile())
    builder.add_node("review", review)
    builder.add_node("publish", node("publish"))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "research")
    builder.add_edge("plan", "draft")
    builder.add_edge(["research", "draft"], "inner")
    builder.add_edge("inner", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder


CFG = {"configurable": {"thread_id": "run-1"}}
FINAL = ["plan", "draft", "research", "review:yes", "publish"]


def _sorted_log(values: dict[str, Any]) -> list[str]:
    # research and draft run in one step; their order in the log is LangGraph's, not ours
    log = list(values["log"])
    log[1:3] = sorted(log[1:3])
    return log


async def test_graph_interrupts_and_resumes_from_the_store(store: statekeel.Store) -> None:
    ran: list[str] = []
    graph = _build(ran).compile(checkpointer=StatekeelSaver(store))
    out = await graph.ainvoke({"log": [], "n": 0}, CFG)
    assert out["__interrupt__"][0].value == {"question": "publish?", "n": 1}
    state = await graph.aget_state(CFG)
    assert state.next == ("review",)
    assert sorted(ran) == sorted(["plan", "research", "draft", "check", "review"])
    ran.clear()
    out = await graph.ainvoke(Command(resume="yes"), CFG)
    assert _sorted_log(out) == FINAL
    assert ran == ["review", "publish"]  # nothing before the interrupt ran again
    assert (await graph.aget_state(CFG)).next == ()


async def test_graph_resumes_with_a_new_store_on_the_same_database(store_url: str, tmp_path: Any) -> None:
    fallback = os.path.join(os.fspath(tmp_path), "fb")
    # memory:// lives as long as its store: there the second saver is a new one on the same open store
    shared = (
        await statekeel.open_store(store_url, fallback_dir=fallback) if store_url == "memory://" else None
    )

    def open_saver() -> Any:
        if shared is not None:
            return contextlib.nullcontext(StatekeelSaver(shared))
        return StatekeelSaver.from_url(store_url, fallback_dir=fallback)

    ran: list[str] = []
    try:
        async with open_saver() as saver:
            await _build(ran).compile(checkpointer=saver).ainvoke({"log": [], "n": 0}, CFG)
        ran.clear()
        async with open_saver() as saver:
            graph = _build(ran).compile(checkpointer=saver)
            assert (await graph.aget_state(CFG)).next == ("review",)
            out = await graph.ainvoke(Command(resume="yes"), CFG)
    finally:
        if shared is not None:
            await shared.close()
    assert _sorted_log(out) == FINAL
    assert ran == ["review", "publish"]


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_graph_ends_as_with_langgraphs_own_saver_in_every_durability_mode(
    store: statekeel.Store, durability: str
) -> None:
    async def run(saver: Any) -> tuple[dict[str, Any], int]:
        graph = _build([]).compile(checkpointer=saver)
        await graph.ainvoke({"log": [], "n": 0}, CFG, durability=durability)  # type: ignore[arg-type]
        out = await graph.ainvoke(Command(resume="yes"), CFG, durability=durability)  # type: ignore[arg-type]
        history = [s async for s in graph.aget_state_history(CFG)]
        return out, len(history)

    ours, ours_history = await run(StatekeelSaver(store))
    theirs, their_history = await run(InMemorySaver())
    assert _sorted_log(ours) == _sorted_log(theirs) == FINAL
    assert ours_history == their_history


class _TellsWhenSaved(StatekeelSaver):
    """A saver that sets ``saved`` once the writes of the node ``node`` are committed."""

    def __init__(self, store: statekeel.Store, node: str, saved: threading.Event) -> None:
        super().__init__(store)
        self._node, self._saved = node, saved

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await super().aput_writes(config, writes, task_id, task_path)
        if ("log", [self._node]) in writes:
            self._saved.set()


async def test_failed_node_is_retried_alone_and_finished_siblings_are_not_rerun(
    store: statekeel.Store,
) -> None:
    # LangGraph cancels the siblings still running when a node fails (their results are dropped and they
    # run again on the retry, with any saver): draft fails only once research's result is committed.
    ran: list[str] = []
    saved = threading.Event()
    saver = _TellsWhenSaved(store, "research", saved)
    graph = _build(ran, fail_once={"draft"}, fail_after=saved).compile(checkpointer=saver)
    with pytest.raises(RuntimeError, match="draft failed"):
        await graph.ainvoke({"log": [], "n": 0}, CFG, durability="sync")
    assert sorted(ran) == ["draft", "plan", "research"]
    ran.clear()
    # research's result was kept as a pending write of the failed step: only draft runs again
    out = await graph.ainvoke(None, CFG)
    assert out["__interrupt__"]
    assert ran == ["draft", "check", "review"]


async def test_forking_an_earlier_checkpoint_keeps_both_branches(store: statekeel.Store) -> None:
    graph = _build([]).compile(checkpointer=StatekeelSaver(store))
    await graph.ainvoke({"log": [], "n": 0}, CFG)
    await graph.ainvoke(Command(resume="yes"), CFG)
    history = [s async for s in graph.aget_state_history(CFG)]
    after_plan = next(iter(s for s in history if set(s.next) == {"draft", "research"}))
    fork = await graph.aupdate_state(after_plan.config, {"n": 100})
    out = await graph.ainvoke(None, fork)
    assert out["__interrupt__"][0].value["n"] == 100
    # the original branch still reads as it was: same values at the same checkpoints
    again = {s.config["configurable"]["checkpoint_id"]: s.values for s in history}
    for snap in [s async for s in graph.aget_state_history(CFG)]:
        cid = snap.config["configurable"]["checkpoint_id"]
        if cid in again:
            assert snap.values == again[cid]
    assert (await graph.aget_state(after_plan.config)).values["n"] == 1


async def _lineage(graph: Any, config: Any) -> list[str]:
    """The checkpoint ids from ``config``'s checkpoint back to the thread's first, by parent links."""
    ids: list[str] = []
    snap = await graph.aget_state(config)
    while True:
        ids.append(snap.config["configurable"]["checkpoint_id"])
        if snap.parent_config is None:
            return ids
        snap = await graph.aget_state(snap.parent_config)


async def test_two_forks_of_one_checkpoint_keep_their_own_histories_and_resume_on_their_own(
    store: statekeel.Store,
) -> None:
    graph = _build([]).compile(checkpointer=StatekeelSaver(store))
    await graph.ainvoke({"log": [], "n": 0}, CFG)
    done = await graph.ainvoke(Command(resume="yes"), CFG)
    original = (await graph.aget_state(CFG)).config
    after_plan = next(
        s for s in [s async for s in graph.aget_state_history(CFG)] if set(s.next) == {"draft", "research"}
    )
    point = after_plan.config["configurable"]["checkpoint_id"]
    tips = []
    for n in (100, 200):
        fork = await graph.aupdate_state(after_plan.config, {"n": n})
        out = await graph.ainvoke(None, fork)
        assert out["__interrupt__"][0].value["n"] == n
        tips.append((await graph.aget_state(CFG)).config)  # the thread's newest: this branch's tip
    lines = [await _lineage(graph, c) for c in (original, *tips)]
    # Each branch reads back through the fork point to the start; none passes through another's steps.
    for line in lines:
        assert point in line and line[-1] == lines[0][-1]
        assert line[line.index(point) :] == lines[0][lines[0].index(point) :]
    own = [set(line[: line.index(point)]) for line in lines]
    assert not (own[0] & own[1]) and not (own[0] & own[2]) and not (own[1] & own[2])
    # The first fork resumes from its own tip while the second is newer; the second still waits.
    finished = await graph.ainvoke(Command(resume="no"), tips[0])
    assert finished["n"] == 100 and finished["log"][-2:] == ["review:no", "publish"]
    waiting = await graph.aget_state(tips[1])
    assert waiting.next == ("review",) and waiting.values["n"] == 200
    assert (await graph.aget_state(original)).values == done
    assert _sorted_log(done) == FINAL


async def test_sync_api_works_from_another_thread_and_is_refused_on_the_loop(store: statekeel.Store) -> None:
    saver = StatekeelSaver(store)
    graph = _build([]).compile(checkpointer=saver)
    await graph.ainvoke({"log": [], "n": 0}, CFG)
    from_thread = await asyncio.to_thread(graph.get_state, CFG)
    assert from_thread.values == (await graph.aget_state(CFG)).values
    history = await asyncio.to_thread(lambda: list(graph.get_state_history(CFG)))
    assert len(history) == len([s async for s in graph.aget_state_history(CFG)])
    # LangGraph's sync run (put, put_writes, get_tuple) from a worker thread finishes the thread
    out = await asyncio.to_thread(graph.invoke, Command(resume="yes"), CFG)
    assert _sorted_log(out) == FINAL
    assert (await graph.aget_state(CFG)).values == out
    with pytest.raises(statekeel.SyncCallRefused) as info:
        graph.get_state(CFG)
    assert isinstance(info.value, asyncio.InvalidStateError)
    assert "aget_tuple" in str(info.value)
    with pytest.raises(statekeel.SyncCallRefused):
        next(iter(saver.list(CFG)))


def test_sync_call_after_the_loop_ended_is_refused(tmp_path: Any) -> None:
    url = f"sqlite:///{os.path.join(os.fspath(tmp_path), 'agent.db')}"

    async def make() -> StatekeelSaver:
        saver = await StatekeelSaver.from_url(url)
        await saver.aput(CFG, _checkpoint(), {"source": "input", "step": -1}, {})
        await saver.aclose()
        return saver

    saver = asyncio.run(make())
    with pytest.raises(statekeel.SyncCallRefused, match="not running"):
        saver.get_tuple(CFG)


def _checkpoint() -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    return empty_checkpoint()


def _extend(state: list[int] | None, writes: list[list[int]]) -> list[int]:
    out = list(state or [])
    for batch in writes:
        out.extend(batch)
    return out


class Counting(TypedDict):
    items: Annotated[list[int], DeltaChannel(_extend, snapshot_frequency=7)]
    step: int


async def test_delta_channel_is_rebuilt_from_stored_writes(store: statekeel.Store) -> None:
    def work(state: Counting) -> dict[str, Any]:
        return {"items": [state["step"] + 1], "step": state["step"] + 1}

    builder = StateGraph(Counting)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: END if s["step"] % 20 == 0 else "work")
    saver = StatekeelSaver(store)
    config: Any = {"configurable": {"thread_id": "delta"}, "recursion_limit": 100}
    await builder.compile(checkpointer=saver).ainvoke({"items": [], "step": 0}, config)
    # A fresh graph (nothing in memory) rebuilds the list from the stored writes and snapshots
    out = await builder.compile(checkpointer=saver).ainvoke({"step": 20}, config)
    assert out == {"items": list(range(1, 41)), "step": 40}
    history = [s async for s in builder.compile(checkpointer=saver).aget_state_history(config)]
    for snap in history:
        if "step" in snap.values:
            assert snap.values["items"] == list(range(1, snap.values["step"] + 1))
    # The list is stored as snapshots every 7 updates, not whole at every step.
    items = 0
    after = None
    while page := (await store.backend.export_rows("checkpoint_blobs", after=after)).rows:
        items += sum(len(row[5] or b"") for row in page if row[2] == "items")
        after = page[-1][:4]
    whole = sum(len(saver.serde.dumps_typed(list(range(1, k + 1)))[1]) for k in range(1, 41))
    assert 0 < items < whole / 2


class TwoLists(TypedDict):
    items: Annotated[list[int], DeltaChannel(_extend, snapshot_frequency=1000)]
    marks: Annotated[list[int], DeltaChannel(_extend, snapshot_frequency=9)]
    step: int


async def test_delta_channel_history_equals_the_base_walk_across_pages_and_forks(
    store: statekeel.Store,
) -> None:
    def work(state: TwoLists) -> dict[str, Any]:
        step = state["step"] + 1
        return {"items": [step], "marks": [step] if step % 3 == 0 else [], "step": step}

    def side(state: TwoLists) -> dict[str, Any]:
        return {"items": [-state["step"]]}  # a second writer to the same channel in the same step

    builder = StateGraph(TwoLists)
    builder.add_node("work", work)
    builder.add_node("side", side)
    builder.add_edge(START, "work")
    builder.add_edge(START, "side")
    builder.add_conditional_edges("work", lambda s: END if s["step"] >= 130 else "work")
    saver = StatekeelSaver(store)
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "walk"}, "recursion_limit": 300}
    await graph.ainvoke({"items": [], "marks": [], "step": 0}, config)
    history = [s async for s in graph.aget_state_history(config)]
    fork = await graph.aupdate_state(history[60].config, {"items": [1000]})
    await graph.ainvoke(None, {**fork, "recursion_limit": 300})
    configs = [s.config async for s in graph.aget_state_history(config)] + [config]
    assert len(configs) > 150  # the main chain is longer than one page (100) of ancestors
    for cfg in [*configs[:3], *configs[40:200:40], *configs[-3:]]:
        ours = await saver.aget_delta_channel_history(config=cfg, channels=["items", "marks", "absent"])
        walked = await BaseCheckpointSaver.aget_delta_channel_history(
            saver, config=cfg, channels=["items", "marks", "absent"]
        )
        assert ours == walked
    final = await graph.aget_state(config)
    assert final.values["items"][-1] == 130 and 1000 in final.values["items"]
    # LangGraph's sync API takes the same path from a worker thread
    assert await asyncio.to_thread(
        saver.get_delta_channel_history, config=config, channels=["marks"]
    ) == await saver.aget_delta_channel_history(config=config, channels=["marks"])


async def test_threads_are_listed_with_their_checkpoints_and_counted_by_info(store: statekeel.Store) -> None:
    saver = StatekeelSaver(store)
    await _build([]).compile(checkpointer=saver).ainvoke({"log": [], "n": 0}, CFG)
    other = {"configurable": {"thread_id": "run-2"}}
    await _build([]).compile(checkpointer=saver).ainvoke({"log": [], "n": 0}, other)
    threads = await store.backend.list_checkpoint_threads()
    assert [t.thread_id for t in threads] == ["run-2", "run-1"]  # the most recently checkpointed first
    history = [s async for s in _build([]).compile(checkpointer=saver).aget_state_history(CFG)]
    first = threads[1]
    assert first.namespaces == 2  # the graph's and the inner subgraph's
    assert first.checkpoints >= len(history)
    stored = await store.backend.list_checkpoints(thread_id="run-1", limit=1000)
    assert first.checkpoints == len(stored)
    assert first.latest_checkpoint_id == max(r.checkpoint_id for r in stored)
    assert first.latest_at <= threads[0].latest_at
    assert [t.thread_id for t in await store.backend.list_checkpoint_threads(limit=1)] == ["run-2"]
    counts = (await store.info(check_integrity=False)).counts
    assert counts is not None and counts.checkpoint_threads == 2
    assert counts.checkpoints == sum(t.checkpoints for t in threads)
    with pytest.raises(statekeel.InvalidArgument, match="limit"):
        await store.backend.list_checkpoint_threads(limit=0)
