"""``kill -9`` of a process running a LangGraph graph on StatekeelSaver: a new process resumes the thread
from its last checkpoint; the steps that finished before the kill do not run again.

Side-effect counter files (one line per run of a node) show how often each node ran.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from helpers import kill9_when

pytest.importorskip("langgraph.graph")

GRAPH = """
import operator, os, sys, time
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph

class State(TypedDict):
    log: Annotated[list[str], operator.add]

def build(counters: str, hang_in_write: bool):
    def node(name):
        def run(state):
            with open(os.path.join(counters, name), "a") as fh:
                fh.write("ran\\n")
                fh.flush()
                os.fsync(fh.fileno())
            if name == "write" and hang_in_write:
                time.sleep(600)  # killed in here
            return {"log": [name]}
        return run
    b = StateGraph(State)
    for name in ("fetch", "plan", "write"):
        b.add_node(name, node(name))
    b.add_edge(START, "fetch")
    b.add_edge("fetch", "plan")
    b.add_edge("plan", "write")
    b.add_edge("write", END)
    return b
"""

CHILD = """
import asyncio, sys
sys.path.insert(0, sys.argv[3])
from lg_graph import build
from statekeel.integrations.langgraph import StatekeelSaver

async def main(url, counters):
    async with StatekeelSaver.from_url(url) as saver:
        graph = build(counters, hang_in_write=True).compile(checkpointer=saver)
        # durability="sync": each step's checkpoint is committed before the next step starts
        await graph.ainvoke({"log": []}, {"configurable": {"thread_id": "job-7"}}, durability="sync")

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'graph.db'}"
    return str(request.getfixturevalue("pg_migrated"))


def _runs(counters: Path, name: str) -> int:
    path = counters / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_inside_write(url: str, counters: Path, module_dir: Path) -> None:
    args = [CHILD, url, os.fspath(counters), os.fspath(module_dir)]
    kill9_when(args, lambda: _runs(counters, "write") > 0, "the write node")


async def test_graph_killed_mid_step_resumes_without_rerunning_finished_steps(
    shared_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekeel.integrations.langgraph import StatekeelSaver

    (tmp_path / "lg_graph.py").write_text(GRAPH)
    spec = importlib.util.spec_from_file_location("lg_graph", tmp_path / "lg_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lg_graph", module)  # LangGraph resolves State's annotations there
    spec.loader.exec_module(module)
    counters = tmp_path / "counters"
    counters.mkdir()
    _kill_inside_write(shared_url, counters, tmp_path)
    assert [_runs(counters, n) for n in ("fetch", "plan", "write")] == [1, 1, 1]

    config = {"configurable": {"thread_id": "job-7"}}
    async with StatekeelSaver.from_url(shared_url) as saver:
        graph = module.build(os.fspath(counters), False).compile(checkpointer=saver)
        state = await graph.aget_state(config)
        assert state.values == {"log": ["fetch", "plan"]} and state.next == ("write",)
        out = await graph.ainvoke(None, config)
    assert out == {"log": ["fetch", "plan", "write"]}
    # fetch and plan ran once; only the step the kill interrupted ran again
    assert [_runs(counters, n) for n in ("fetch", "plan", "write")] == [1, 1, 2]
