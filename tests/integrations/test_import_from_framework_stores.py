"""``statekeel import --from openai-agents-sqlite|langgraph-sqlite``, on databases the real
``SQLiteSession`` and ``SqliteSaver`` wrote in the test: everything copied, counts checked, a re-run adds
nothing, a database of the wrong shape writes nothing."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("agents")
pytest.importorskip("langgraph.checkpoint.sqlite")

from agents import SQLiteSession
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import statekeel
from helpers import one_line_error, run_statekeel
from statekeel.integrations.importers import import_langgraph_sqlite, import_openai_agents_sqlite
from statekeel.integrations.langgraph import StatekeelSaver
from statekeel.integrations.openai_agents import StatekeelSession


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


SDK_ITEMS = {
    "alice": [
        user("add 1 and 2"),
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        user("again"),
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},  # a reused id
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
    ],
    "bob": [user("hi"), {"type": "function_call_output", "call_id": "elsewhere", "output": "42"}],
}


def write_sdk_database(path: Path) -> None:
    async def fill() -> None:
        for sid, items in SDK_ITEMS.items():
            session = SQLiteSession(sid, path)
            await session.add_items([*items, user("popped")])
            await session.pop_item()  # its row is deleted: not imported
            session.close()

    asyncio.run(fill())


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def graph(saver: Any) -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"log": [f"ask:{interrupt('ok?')}"]}

    builder = StateGraph(State)
    builder.add_node("plan", lambda state: {"log": ["plan"]})
    builder.add_node("ask", ask)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def write_langgraph_database(path: Path) -> list[Any]:
    with SqliteSaver.from_conn_string(str(path)) as saver:
        g = graph(saver)
        g.invoke({"log": []}, {"configurable": {"thread_id": "done"}})
        g.invoke(Command(resume="yes"), {"configurable": {"thread_id": "done"}})
        g.invoke({"log": []}, {"configurable": {"thread_id": "waiting"}})  # interrupted: a pending write
        return [list(g.get_state_history({"configurable": {"thread_id": t}})) for t in ("done", "waiting")]


def count_sessions(url: str) -> int:
    async def count() -> int:
        async with statekeel.open_store(url) as store:
            info = await store.info(check_integrity=False)
            assert info.counts is not None
            return sum(info.counts.sessions.values()) + info.counts.checkpoints

    return asyncio.run(count())


# --- the OpenAI Agents SDK's SQLiteSession -------------------------------------------------------------


def test_sdk_sessions_are_imported_unchanged_and_a_rerun_adds_nothing(tmp_path: Path) -> None:
    source = tmp_path / "sdk.db"
    write_sdk_database(source)
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    result = run_statekeel("import", "--from", "openai-agents-sqlite", str(source), "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "imported 2 sessions, 8 items" in result.stdout and "8 added, 0 already there" in result.stdout
    for sid, items in SDK_ITEMS.items():
        session = StatekeelSession(sid, url)
        try:
            assert asyncio.run(session.get_items()) == items  # what StatekeelSession reads, in order
        finally:
            session.close()
    again = run_statekeel("import", "--from", "openai-agents-sqlite", str(source), "--db", url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 added, 8 already there" in again.stdout


async def test_one_sdk_session_and_what_was_added_since_are_imported(tmp_path: Path) -> None:
    source = tmp_path / "sdk.db"
    await asyncio.to_thread(write_sdk_database, source)
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'sk.db'}") as store:
        report = await import_openai_agents_sqlite(store, source, session_id="bob")
        assert (report.units, report.records, report.added) == (1, 2, 2)
        assert await store.sessions.load("alice") is None
        later = SQLiteSession("bob", source)
        await later.add_items([user("later")])
        later.close()
        seen: list[tuple[int, int]] = []
        report = await import_openai_agents_sqlite(store, source, progress=lambda d, t: seen.append((d, t)))
        assert (report.added, report.skipped) == (7, 2)
        assert seen[-1] == (2, 2)
        bob = await store.sessions.load("bob", repair=False)
        assert bob is not None and bob.messages == [*SDK_ITEMS["bob"], user("later")]


async def test_an_sdk_session_whose_history_diverged_is_reported_a_conflict_and_the_others_imported(
    tmp_path: Path,
) -> None:
    source = tmp_path / "sdk.db"
    await asyncio.to_thread(write_sdk_database, source)
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'sk.db'}") as store:
        own = await store.sessions.get_or_create("bob")
        own.add_message("user", "something else")
        await store.sessions.save(own)
        report = await import_openai_agents_sqlite(store, source)
        outcomes = {s.key: s for s in report.sessions}
        assert outcomes["bob"].outcome == "conflict" and "diverged at item 0" in outcomes["bob"].reason
        assert outcomes["alice"].outcome == "imported"
        bob = await store.sessions.load("bob")
        assert bob is not None and [m["content"] for m in bob.messages] == ["something else"]
        alice = await store.sessions.load("alice")
        assert alice is not None and alice.messages == SDK_ITEMS["alice"]


def test_an_import_run_again_after_the_session_went_on_in_statekeel_adds_only_what_is_new(
    tmp_path: Path,
) -> None:
    source = tmp_path / "sdk.db"
    write_sdk_database(source)
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    first = run_statekeel("import", "--from", "openai-agents-sqlite", str(source), "--db", url, cwd=tmp_path)
    assert first.returncode == 0, first.stderr

    async def continue_alice_in_statekeel() -> None:
        session = StatekeelSession("alice", url)
        try:
            await session.add_items([user("went on in statekeel")])
        finally:
            session.close()

    asyncio.run(continue_alice_in_statekeel())

    async def add_to_bob_in_the_source() -> None:
        session = SQLiteSession("bob", source)
        try:
            await session.add_items([user("new in the source")])
        finally:
            session.close()

    asyncio.run(add_to_bob_in_the_source())
    again = run_statekeel("import", "--from", "openai-agents-sqlite", str(source), "--db", url, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    out = " ".join(again.stdout.split())
    assert f"session alice: skipped: the store holds all {len(SDK_ITEMS['alice'])} of its items" in out
    assert f"session bob: imported 1 new item after the {len(SDK_ITEMS['bob'])} the store held" in out

    async def read() -> dict[str, list[Any]]:
        async with statekeel.open_store(url) as store:
            out = {}
            for key in ("alice", "bob"):
                loaded = await store.sessions.load(key)
                assert loaded is not None
                out[key] = loaded.messages
            return out

    held = asyncio.run(read())
    assert held["alice"] == [*SDK_ITEMS["alice"], user("went on in statekeel")]
    assert held["bob"] == [*SDK_ITEMS["bob"], user("new in the source")]


# --- LangGraph's SqliteSaver -------------------------------------------------------------------------


def test_langgraph_checkpoints_are_imported_and_the_graph_resumes_from_them(tmp_path: Path) -> None:
    source = tmp_path / "lg.db"
    histories = write_langgraph_database(source)
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    result = run_statekeel("import", "--from", "langgraph-sqlite", str(source), "--db", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    total = sum(len(h) for h in histories)
    assert f"imported 2 threads, {total} checkpoints" in result.stdout
    assert f"{total} added, 0 already there" in result.stdout
    with StatekeelSaver.from_url(url) as saver:
        g = graph(saver)
        for thread, theirs in zip(("done", "waiting"), histories, strict=True):
            ours = list(g.get_state_history({"configurable": {"thread_id": thread}}))
            assert [s.values for s in ours] == [s.values for s in theirs]
            assert [s.next for s in ours] == [s.next for s in theirs]
            assert [s.config["configurable"]["checkpoint_id"] for s in ours] == [
                s.config["configurable"]["checkpoint_id"] for s in theirs
            ]
        out = g.invoke(Command(resume="sure"), {"configurable": {"thread_id": "waiting"}})
        assert out == {"log": ["plan", "ask:sure"]}
    again = run_statekeel("import", "--from", "langgraph-sqlite", str(source), "--db", url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"0 added, {total} already there" in again.stdout


async def test_the_langgraph_importer_reports_progress_per_checkpoint(tmp_path: Path) -> None:
    source = tmp_path / "lg.db"
    histories = await asyncio.to_thread(write_langgraph_database, source)
    seen: list[tuple[int, int]] = []
    async with statekeel.open_store("memory://") as store:
        report = await import_langgraph_sqlite(store, source, progress=lambda d, t: seen.append((d, t)))
    total = sum(len(h) for h in histories)
    assert report.records == total and report.writes > 0
    assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) == total + 1


# --- bad input: typed errors, nothing written -------------------------------------------------------


def test_a_database_of_the_wrong_shape_writes_nothing(tmp_path: Path) -> None:
    sdk, lg = tmp_path / "sdk.db", tmp_path / "lg.db"
    write_sdk_database(sdk)
    write_langgraph_database(lg)
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    run_statekeel("status", "--db", url, cwd=tmp_path)  # nothing yet
    wrong = run_statekeel("import", "--from", "openai-agents-sqlite", str(lg), "--db", url, cwd=tmp_path)
    assert "has no 'agent_sessions' table" in one_line_error(wrong)
    wrong = run_statekeel("import", "--from", "langgraph-sqlite", str(sdk), "--db", url, cwd=tmp_path)
    assert "has no 'checkpoints' table" in one_line_error(wrong)
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some text that is long enough" * 20)
    wrong = run_statekeel("import", "--from", "langgraph-sqlite", str(text), "--db", url, cwd=tmp_path)
    assert "not a SQLite database" in one_line_error(wrong)
    assert count_sessions(url) == 0


async def test_an_item_statekeel_cannot_store_refuses_the_whole_import(tmp_path: Path) -> None:
    source = tmp_path / "sdk.db"
    await asyncio.to_thread(write_sdk_database, source)
    with sqlite3.connect(source) as conn:  # what a SQLiteSession would hold after add_items([{"x": 1}])
        conn.execute("INSERT INTO agent_messages (session_id, message_data) VALUES ('bob', '{\"x\": 1}')")
    async with statekeel.open_store("memory://") as store:
        with pytest.raises(statekeel.InvalidImportSource, match="item 2 of session 'bob'") as caught:
            await import_openai_agents_sqlite(store, source)
        assert isinstance(caught.value, ValueError)
        assert await store.sessions.load("alice") is None


def test_an_unknown_source_and_a_plain_file_without_an_export_reader_are_usage_errors(tmp_path: Path) -> None:
    source = tmp_path / "sdk.db"
    write_sdk_database(source)
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    unknown = run_statekeel("import", "--from", "redis", str(source), "--db", url, cwd=tmp_path)
    assert unknown.returncode == 2 and "Invalid value for '--from'" in unknown.stderr
    wrong = run_statekeel(
        "import", "--from", "langgraph-sqlite", str(source), "--session", "bob", "--db", url, cwd=tmp_path
    )
    assert wrong.returncode == 2 and "--session applies to" in wrong.stderr
    if not hasattr(statekeel, "import_store"):
        plain = run_statekeel("import", str(source), "--db", url, cwd=tmp_path)
        assert plain.returncode == 2 and "pass --from" in plain.stderr


async def test_the_library_refuses_an_unknown_source_or_a_missing_file_before_writing(
    tmp_path: Path,
) -> None:
    from statekeel.integrations.importers import import_from

    async with statekeel.open_store("memory://") as store:
        with pytest.raises(statekeel.InvalidImportSource, match="unknown import source 'redis'"):
            await import_from(store, "redis", tmp_path / "x.db")
        with pytest.raises(statekeel.InvalidImportSource, match="is not a file"):
            await import_from(store, "langgraph-sqlite", tmp_path / "missing.db")
        with pytest.raises(statekeel.InvalidImportSource, match="--session applies"):
            await import_from(store, "langgraph-sqlite", tmp_path / "x.db", session_id="s")
        counts = (await store.info(check_integrity=False)).counts
        assert counts is not None and sum(counts.sessions.values()) == 0 and counts.checkpoints == 0
