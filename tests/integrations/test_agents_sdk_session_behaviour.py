"""The OpenAI Agents SDK's session behaviours, each run against the SDK's own ``SQLiteSession`` (the
reference) and ``StatekeelSession``: what one stores, the other stores and returns, unchanged and in order.

The behaviours are those the SDK's session test suites check (SQLite, SQLAlchemy, Redis, advanced
sessions): items in order, ``limit`` and ``session_settings``, ``pop_item``, ``clear_session``, separate
sessions, unicode and SQL-looking text, writers in threads each with an event loop of its own, ``Runner``'s
``run``, ``run_sync`` and ``run_streamed`` across turns — and the sequences a strict transcript would refuse
but the SDK stores: an output whose call is not in the session, a call id reused in a later turn, an output
added again after ``pop_item``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, SQLiteSession, set_tracing_disabled
from agents.memory import SessionSettings

import statekeel
from sdk_fakes import ScriptedModel, add, call, said
from statekeel.integrations.openai_agents import StatekeelSession
from statekeel.transcripts import INTERRUPTED_TEXT, analyze, plan_repair

Factory = Callable[..., Any]
KINDS = ["SQLiteSession", "StatekeelSession-sqlite", "StatekeelSession-memory"]


@pytest.fixture(autouse=True)
def _no_sdk_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would otherwise export spans to OpenAI over the network


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Makes sessions of one kind, sessions of one test sharing one database; closes them after."""
    made: list[Any] = []

    def factory(session_id: str = "s1", **kwargs: Any) -> Any:
        if request.param == "SQLiteSession":
            session: Any = SQLiteSession(session_id, tmp_path / "sdk.db", **kwargs)
        elif request.param == "StatekeelSession-sqlite":
            session = StatekeelSession(session_id, f"sqlite:///{tmp_path / 'sk.db'}", **kwargs)
        else:
            session = StatekeelSession(session_id, "memory://", **kwargs)
        made.append(session)
        return session

    yield factory
    for session in made:
        session.close()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def fcall(call_id: str, name: str = "add") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": '{"a": 1, "b": 2}'}


# --- items, in order -----------------------------------------------------------------------------------


async def test_items_come_back_in_the_order_they_were_added(make: Factory) -> None:
    session = make()
    await session.add_items([user("Hello"), {"role": "assistant", "content": "Hi there!"}])
    await session.add_items([user("again")])
    assert await session.get_items() == [
        user("Hello"),
        {"role": "assistant", "content": "Hi there!"},
        user("again"),
    ]


async def test_an_empty_batch_adds_nothing_and_an_unknown_session_is_empty(make: Factory) -> None:
    session = make()
    await session.add_items([])
    assert await session.get_items() == []
    assert await session.pop_item() is None


async def test_limit_returns_the_latest_items_in_order(make: Factory) -> None:
    session = make()
    items = [user(f"m{i}") for i in range(6)]
    await session.add_items(items)
    assert await session.get_items(limit=2) == items[4:]
    assert await session.get_items(limit=4) == items[2:]
    assert await session.get_items(limit=10) == items
    assert await session.get_items(limit=0) == []


async def test_session_settings_limit_is_the_default_and_an_explicit_limit_wins(make: Factory) -> None:
    session = make(session_settings=SessionSettings(limit=3))
    assert session.session_settings.limit == 3
    items = [user(f"m{i}") for i in range(10)]
    await session.add_items(items)
    assert await session.get_items() == items[7:]
    assert await session.get_items(limit=2) == items[8:]
    assert make("s2").session_settings == SessionSettings()


async def test_unicode_and_sql_looking_text_come_back_unchanged(make: Factory) -> None:
    session = make()
    items = [
        user("こんにちは"),
        {"role": "assistant", "content": "😊👍"},
        user("O'Reilly"),
        {"role": "assistant", "content": "Robert'); DROP TABLE students;--"},
        user('"SELECT * FROM users WHERE name = "admin";"'),
    ]
    await session.add_items(items)
    assert await session.get_items() == items


async def test_sessions_of_one_database_keep_separate_histories(make: Factory) -> None:
    one, two = make("s1"), make("s2")
    await one.add_items([user("one")])
    await two.add_items([user("two a"), user("two b")])
    assert await two.pop_item() == user("two b")
    assert await one.get_items() == [user("one")]
    assert await two.get_items() == [user("two a")]


# --- pop_item and clear_session --------------------------------------------------------------------------


async def test_pop_item_returns_the_latest_down_to_an_empty_session(make: Factory) -> None:
    session = make()
    items = [user("Hello"), {"role": "assistant", "content": "Hi"}, user("How are you?")]
    await session.add_items(items)
    assert await session.pop_item() == items[2]
    assert await session.get_items() == items[:2]
    assert await session.pop_item() == items[1]
    assert await session.pop_item() == items[0]
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_an_item_added_after_pop_item_takes_the_popped_items_place(make: Factory) -> None:
    session = make()
    await session.add_items([user("a"), user("b")])
    await session.pop_item()
    await session.add_items([user("c")])
    assert await session.get_items() == [user("a"), user("c")]


async def test_an_output_popped_then_added_again_comes_back_once(make: Factory) -> None:
    session = make()
    await session.add_items([user("add"), fcall("call_1"), output("call_1", "3")])
    assert await session.pop_item() == output("call_1", "3")
    await session.add_items([output("call_1", "three")])
    assert await session.get_items() == [user("add"), fcall("call_1"), output("call_1", "three")]


async def test_a_call_popped_then_added_again_with_its_output_comes_back(make: Factory) -> None:
    session = make()
    await session.add_items([user("add"), fcall("call_1")])
    assert await session.pop_item() == fcall("call_1")
    assert await session.get_items() == [user("add")]
    await session.add_items([fcall("call_1"), output("call_1", "3")])
    assert await session.get_items() == [user("add"), fcall("call_1"), output("call_1", "3")]


async def test_an_output_added_after_its_call_was_popped_is_kept(make: Factory) -> None:
    session = make()
    await session.add_items([user("add"), fcall("call_1")])
    await session.pop_item()
    await session.add_items([output("call_1", "3")])
    assert await session.get_items() == [user("add"), output("call_1", "3")]


async def test_clear_session_empties_it_and_it_can_be_used_again(make: Factory) -> None:
    session = make()
    await session.add_items([user("a"), {"role": "assistant", "content": "b"}])
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.add_items([user("again")])
    assert await session.get_items() == [user("again")]


CLOSED_OPERATIONS: dict[str, Callable[[Any], Any]] = {
    "get_items": lambda s: s.get_items(),
    "get_items(limit=1)": lambda s: s.get_items(limit=1),
    "add_items": lambda s: s.add_items([user("late")]),
    "add_items([])": lambda s: s.add_items([]),
    "pop_item": lambda s: s.pop_item(),
    "clear_session": lambda s: s.clear_session(),
}


@pytest.mark.parametrize("used", [True, False], ids=["used", "never-used"])
@pytest.mark.parametrize("operation", list(CLOSED_OPERATIONS))
async def test_every_operation_after_close_raises_runtime_error(
    make: Factory, operation: str, used: bool
) -> None:
    session = make()
    if used:
        await session.add_items([user("a")])
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        await CLOSED_OPERATIONS[operation](session)
    session.close()  # a second close is no error


async def test_a_closed_session_on_the_applications_store_refuses_and_leaves_the_store_open(
    tmp_path: Path,
) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'app.db'}") as store:
        session = StatekeelSession.from_store(store, "s1")
        await session.add_items([user("a")])
        session.close()
        for operation in CLOSED_OPERATIONS.values():
            with pytest.raises(statekeel.SessionClosed):
                await operation(session)
        loaded = await store.sessions.load("s1")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["a"]


# --- sequences a strict transcript refuses and the SDK stores ------------------------------------------


async def test_an_output_whose_call_is_not_in_the_session_is_stored_as_it_is(make: Factory) -> None:
    session = make()
    items = [user("hi"), output("call_elsewhere", "42")]
    await session.add_items(items)
    assert await session.get_items() == items


async def test_a_call_id_reused_in_a_later_turn_keeps_both_turns_in_order(make: Factory) -> None:
    session = make()
    turn = [user("add"), fcall("call_1"), output("call_1", "3")]
    await session.add_items(turn)
    await session.add_items(turn)
    assert await session.get_items() == turn + turn
    # A result answers the latest call of its id still without one: both calls are answered.
    state = analyze(await session.get_items())
    assert state.unanswered == () and state.orphans == ()
    assert [r.call_index for r in state.results] == [1, 4]


async def test_a_reused_call_id_still_waiting_is_the_one_a_repair_answers(make: Factory) -> None:
    session = make()
    await session.add_items([user("add"), fcall("call_1"), output("call_1", "3"), user("again")])
    await session.add_items([fcall("call_1")])
    items = await session.get_items()
    assert items[-1] == fcall("call_1")
    plan = plan_repair(items)
    assert [c.index for c in plan.calls] == [4]
    assert plan.append == ({"type": "function_call_output", "call_id": "call_1", "output": INTERRUPTED_TEXT},)


async def test_a_model_that_reuses_a_call_id_in_the_next_run_keeps_both_runs(make: Factory) -> None:
    session = make()
    model = ScriptedModel([call("call_1")], [said("3")], [call("call_1")], [said("3 again")])
    agent = Agent(name="calc", model=model, tools=[add])
    await Runner.run(agent, "add 1 and 2", session=session)
    result = await Runner.run(agent, "once more", session=session)
    assert result.final_output == "3 again"
    kinds = [i.get("type") for i in await session.get_items()]
    assert kinds == [None, "function_call", "function_call_output", "message"] * 2
    assert [i.get("output") for i in await session.get_items()][2::4] == ["3", "3"]


# --- runs, threads and event loops ------------------------------------------------------------------------


def _run_sync_in_own_loop(agent: Agent[Any], text: str, **kwargs: Any) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, text, **kwargs)
    finally:
        loop.close()
        asyncio.set_event_loop(None)


async def _run(how: str, agent: Agent[Any], text: Any, **kwargs: Any) -> Any:
    if how == "run":
        return await Runner.run(agent, text, **kwargs)
    if how == "run_sync":
        return await asyncio.to_thread(_run_sync_in_own_loop, agent, text, **kwargs)
    result = Runner.run_streamed(agent, text, **kwargs)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("how", ["run", "run_sync", "run_streamed"])
async def test_a_second_run_sees_the_first(make: Factory, how: str) -> None:
    session = make()
    model = ScriptedModel([said("San Francisco")], [said("California")])
    agent = Agent(name="geo", model=model)
    first = await _run(how, agent, "Which city is the Golden Gate Bridge in?", session=session)
    assert first.final_output == "San Francisco"
    second = await _run(how, agent, "Which state?", session=session)
    assert second.final_output == "California"
    assert model.inputs[1][0].get("content") == "Which city is the Golden Gate Bridge in?"
    assert len(model.inputs[1]) == 3


@pytest.mark.parametrize("how", ["run", "run_sync", "run_streamed"])
async def test_a_list_input_is_appended_to_the_history(make: Factory, how: str) -> None:
    session = make()
    history = [user("Earlier message"), {"role": "assistant", "content": "Saved reply"}]
    await session.add_items(history)
    model = ScriptedModel([said("ok")])
    await _run(how, Agent(name="a", model=model), [user("Test message")], session=session)
    assert model.inputs[0] == [*history, user("Test message")]


async def test_a_session_input_callback_chooses_what_the_model_sees(make: Factory) -> None:
    session = make()
    history = [user("Hello there."), {"role": "assistant", "content": "Hi."}]
    await session.add_items(history)
    model = ScriptedModel([said("I'm a model")])

    def only_users(old: list[Any], new: list[Any]) -> list[Any]:
        return [i for i in old if i.get("role") == "user"] + new

    config = RunConfig(session_input_callback=only_users)
    await Runner.run(Agent(name="a", model=model), [user("Your name?")], session=session, run_config=config)
    assert model.inputs[0] == [history[0], user("Your name?")]


async def test_run_config_session_settings_override_the_sessions(make: Factory) -> None:
    session = make(session_settings=SessionSettings(limit=100))
    await session.add_items([user(f"turn {i}") for i in range(10)])
    model = ScriptedModel([said("got it")])
    config = RunConfig(session_settings=SessionSettings(limit=2))
    await Runner.run(Agent(name="a", model=model), "new question", session=session, run_config=config)
    assert [i.get("content") for i in model.inputs[0]] == ["turn 8", "turn 9", "new question"]


def test_writers_in_threads_each_with_their_own_event_loop_lose_nothing(make: Factory) -> None:
    session = make()
    items = [user(f"Message {i}") for i in range(10)]

    def add_one(item: dict[str, Any]) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(session.add_items([item]))
        finally:
            loop.close()

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add_one, items))
    got = asyncio.run(session.get_items())
    assert sorted(i["content"] for i in got) == sorted(i["content"] for i in items)


def test_asyncio_run_in_one_thread_after_another_reads_what_the_last_wrote(make: Factory) -> None:
    session = make()
    for n in range(3):
        thread = threading.Thread(target=asyncio.run, args=(session.add_items([user(f"m{n}")]),))
        thread.start()
        thread.join()
    assert [i["content"] for i in asyncio.run(session.get_items())] == ["m0", "m1", "m2"]


def test_run_sync_from_worker_threads_keeps_every_run(make: Factory) -> None:
    sessions = [make(f"user-{n}") for n in range(3)]

    def run(n: int) -> Any:
        model = ScriptedModel([said(f"answer {n}")])
        return _run_sync_in_own_loop(Agent(name="a", model=model), f"question {n}", session=sessions[n])

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(run, range(3)))
    assert [r.final_output for r in results] == ["answer 0", "answer 1", "answer 2"]
    for n, session in enumerate(sessions):
        items = asyncio.run(session.get_items())
        assert items[0].get("content") == f"question {n}"
        assert len(items) == 2


# --- StatekeelSession only: a store the application opened ---------------------------------------------


@pytest.fixture
async def app_store(tmp_path: Path) -> AsyncIterator[statekeel.Store]:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'app.db'}") as store:
        yield store


async def test_a_session_on_the_applications_store_serves_a_worker_thread_with_its_own_loop(
    app_store: statekeel.Store,
) -> None:
    session = StatekeelSession.from_store(app_store, "s1")
    await session.add_items([user("from the loop")])

    def in_thread() -> list[Any]:
        async def work() -> list[Any]:
            await session.add_items([user("from a thread")])
            return list(await session.get_items())

        return asyncio.run(work())

    got = await asyncio.to_thread(in_thread)
    assert got == [user("from the loop"), user("from a thread")]
    assert await session.get_items() == got


def test_a_session_on_a_store_whose_loop_is_closed_refuses_at_once(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(statekeel.open_store(f"sqlite:///{tmp_path / 'app.db'}"))

    async def make_session() -> StatekeelSession:
        session = StatekeelSession.from_store(store, "s1")
        await session.add_items([user("hi")])
        return session

    session = loop.run_until_complete(make_session())
    loop.run_until_complete(store.close())
    loop.close()
    with pytest.raises(statekeel.SyncCallRefused, match="closed"):
        asyncio.run(session.get_items())


def test_a_closed_url_session_refuses_at_once(tmp_path: Path) -> None:
    session = StatekeelSession("s1", f"sqlite:///{tmp_path / 'sk.db'}")
    asyncio.run(session.add_items([user("hi")]))
    session.close()
    with pytest.raises(statekeel.SyncCallRefused, match="closed"):
        asyncio.run(session.get_items())
    reopened = StatekeelSession("s1", f"sqlite:///{tmp_path / 'sk.db'}")
    try:
        assert asyncio.run(reopened.get_items()) == [user("hi")]
    finally:
        reopened.close()


async def test_items_saved_to_the_fallback_file_while_the_database_is_locked_are_returned(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    fallback = tmp_path / "fallback"
    async with statekeel.open_store(
        f"sqlite:///{db}", fallback_dir=str(fallback), busy_timeout_ms=50
    ) as store:
        session = StatekeelSession.from_store(store, "s1")
        await session.add_items([user("before")])
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            async with session.hold():  # the session's lease is taken before the outage
                blocker.execute("BEGIN EXCLUSIVE")  # every write fails now: saves go to the fallback file
                await session.add_items([user("during the outage")])
                assert len(list(fallback.iterdir())) == 1
                assert await session.get_items() == [user("before"), user("during the outage")]
                assert await session.pop_item() == user("during the outage")
                assert await session.get_items() == [user("before")]
                blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert (await store.sessions.replay_fallback()).ok
        assert await session.get_items() == [user("before")]
        assert await StatekeelSession.from_store(store, "s1").get_items() == [user("before")]


async def test_a_url_session_held_from_another_loop_makes_another_writer_wait(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sk.db'}"
    mine = StatekeelSession("s1", url)
    other = StatekeelSession("s1", url, lock_timeout=0.2)
    try:
        async with mine.hold():
            await mine.add_items([user("mine, held")])
            with pytest.raises(statekeel.LockTimeout):
                await other.add_items([user("theirs")])
            await mine.add_items([user("mine again")])
        await other.add_items([user("theirs, after")])
        got = [i["content"] for i in await other.get_items()]
        assert got == ["mine, held", "mine again", "theirs, after"]
    finally:
        mine.close()
        other.close()
