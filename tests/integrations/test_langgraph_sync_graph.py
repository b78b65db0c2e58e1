"""A sync LangGraph graph (``graph.invoke``, ``get_state``, ``get_state_history``) on
``with StatekeelSaver.from_url(url) as saver:``, run next to LangGraph's own ``SqliteSaver`` (the
reference), and the threads and checkpoints it leaves counted by ``statekeel status``."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")
pytest.importorskip("langgraph.checkpoint.sqlite")

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import statekeel
from helpers import run_statekeel
from statekeel.integrations.langgraph import StatekeelSaver

KINDS = ["SqliteSaver", "StatekeelSaver-sqlite", "StatekeelSaver-memory"]


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(ran: list[str]) -> StateGraph[Any]:
    def node(name: str) -> Callable[[State], dict[str, Any]]:
        def run(state: State) -> dict[str, Any]:
            ran.append(name)
            return {"log": [name]}

        return run

    def ask(state: State) -> dict[str, Any]:
        ran.append("ask")
        return {"log": [f"ask:{interrupt('go on?')}"]}

    builder = StateGraph(State)
    builder.add_node("plan", node("plan"))
    builder.add_node("ask", ask)
    builder.add_node("act", node("act"))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "ask")
    builder.add_edge("ask", "act")
    builder.add_edge("act", END)
    return builder


def _saver(kind: str, tmp_path: Path) -> contextlib.AbstractContextManager[Any]:
    if kind == "SqliteSaver":
        return SqliteSaver.from_conn_string(str(tmp_path / "lg.db"))
    if kind == "StatekeelSaver-sqlite":
        return StatekeelSaver.from_url(f"sqlite:///{tmp_path / 'sk.db'}")
    return StatekeelSaver.from_url("memory://")


@pytest.fixture(params=KINDS)
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with _saver(request.param, tmp_path) as opened:
        yield opened


CFG: Any = {"configurable": {"thread_id": "t1"}}


def test_a_sync_graph_interrupts_resumes_and_reads_its_history(saver: Any) -> None:
    ran: list[str] = []
    graph = _graph(ran).compile(checkpointer=saver)
    out = graph.invoke({"log": []}, CFG)
    assert out["__interrupt__"][0].value == "go on?"
    assert graph.get_state(CFG).next == ("ask",)
    ran.clear()
    out = graph.invoke(Command(resume="yes"), CFG)
    assert out == {"log": ["plan", "ask:yes", "act"]}
    assert ran == ["ask", "act"]  # plan did not run again
    state = graph.get_state(CFG)
    assert state.next == () and state.values == out
    history = list(graph.get_state_history(CFG))
    assert history[0].values == {"log": ["plan", "ask:yes", "act"]}
    assert len(history) == 5  # input, plan, ask (interrupted), ask, act
    assert [s.values for s in graph.get_state_history(CFG, limit=2)] == [h.values for h in history[:2]]


def test_sync_put_get_list_and_delete_thread(saver: Any) -> None:
    graph = _graph([]).compile(checkpointer=saver)
    graph.invoke({"log": []}, CFG)
    graph.invoke({"log": []}, {"configurable": {"thread_id": "t2"}})
    latest = saver.get_tuple(CFG)
    assert latest is not None and latest.checkpoint["channel_values"]["log"] == ["plan"]
    assert len(list(saver.list(CFG))) == 3
    saver.delete_thread("t1")
    assert saver.get_tuple(CFG) is None and list(saver.list(CFG)) == []
    assert saver.get_tuple({"configurable": {"thread_id": "t2"}}) is not None


def test_sync_graphs_in_several_threads_keep_their_own_threads(saver: Any) -> None:
    graph = _graph([]).compile(checkpointer=saver)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        config = {"configurable": {"thread_id": f"worker-{n}"}}
        try:
            graph.invoke({"log": []}, config)
            graph.invoke(Command(resume=str(n)), config)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for n in range(4):
        values = graph.get_state({"configurable": {"thread_id": f"worker-{n}"}}).values
        assert values == {"log": ["plan", f"ask:{n}", "act"]}


def test_a_sync_saver_closes_with_its_block_and_refuses_afterwards(tmp_path: Path) -> None:
    with StatekeelSaver.from_url(f"sqlite:///{tmp_path / 'sk.db'}") as saver:
        _graph([]).compile(checkpointer=saver).invoke({"log": []}, CFG)
    with pytest.raises(statekeel.SyncCallRefused):
        saver.get_tuple(CFG)
    with StatekeelSaver.from_url(f"sqlite:///{tmp_path / 'sk.db'}") as again:
        assert _graph([]).compile(checkpointer=again).get_state(CFG).next == ("ask",)


def test_status_counts_langgraph_threads_and_checkpoints(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    with StatekeelSaver.from_url(url) as saver:
        graph = _graph([]).compile(checkpointer=saver)
        graph.invoke({"log": []}, CFG)
        graph.invoke({"log": []}, {"configurable": {"thread_id": "t2"}})

    async def counts() -> Any:
        async with statekeel.open_store(url) as store:
            return (await store.info(check_integrity=False)).counts

    found = asyncio.run(counts())
    assert (found.checkpoint_threads, found.checkpoints) == (2, 6)
    result = run_statekeel("status", "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "langgraph threads: 2, checkpoints: 6" in result.stdout
