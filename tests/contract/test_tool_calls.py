"""Sessions' tool calls on every backend: run once through the journal, the result in the call's own
format, calls in doubt after a crash, and the interrupted repair of what a process that is gone left.

A "process that is gone" is simulated in-process by a second ``SessionManager`` on the same backend that
is closed (its heartbeat is removed), or by an owner id of another host whose heartbeat expired.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import pydantic
import pytest

import statekeel
from helpers import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    Message,
    assert_accepted,
    chat_result,
    model_calls,
    type_errors,
    user,
)
from statekeel.backends.base import NewMessage
from statekeel.transcripts import INTERRUPTED_TEXT, Dialect, analyze, plan_repair

# run_tool commits a save and its step together: one atomic() block of one session (on NATS, one event).
pytestmark = pytest.mark.kinds("sessions", "tool_calls")

DIALECTS = [CHAT, RESPONSES, ANTHROPIC]
TABLES = ("sessions", "messages", "session_steps")
ELSEWHERE = "another-host|1|4242|777|deadbeef"  # an owner id of a process on another machine


def result_of(dialect: Dialect, call_id: str, text: str) -> Message:
    """The result message run_tool appends for ``text``, in ``dialect``."""
    if dialect is CHAT:
        return chat_result(call_id, text)
    if dialect is ANTHROPIC:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}
    return {"type": "function_call_output", "call_id": call_id, "output": text}


async def counts(store: statekeel.Store) -> dict[str, int]:
    return {t: await store.backend.count_rows(t) for t in TABLES}


async def stored(store: statekeel.Store, key: str) -> list[Any]:
    return [m.payload for m in await store.backend.read_messages(key)]


async def asked(store: statekeel.Store, key: str, dialect: Dialect, *ids: str) -> statekeel.Session:
    """A session of this store whose last turn asks for the tools ``ids``, saved."""
    session = await store.sessions.get_or_create(key)
    session.add_message("user", "run the tests")
    for message in model_calls(dialect, *ids):
        session.add_item(message)
    await store.sessions.save(session)
    return session


async def left_by_gone_process(store: statekeel.Store, key: str, dialect: Dialect, *ids: str) -> None:
    """The calls ``ids`` saved by another process of this store, which then stopped."""
    other = statekeel.SessionManager(store.backend, store.codec)
    session = await other.get_or_create(key)
    session.add_message("user", "run the tests")
    for message in model_calls(dialect, *ids):
        session.add_item(message)
    await other.save(session)
    await other.close()


def fresh(store: statekeel.Store) -> statekeel.SessionManager:
    """A manager without this store's cache: what another process would load."""
    return statekeel.SessionManager(store.backend, store.codec)


# --- run_tool --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_run_tool_appends_the_result_in_the_calls_own_format_and_records_the_step(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    session = await asked(store, "s", dialect, "c1")
    assert [c.call_id for c in session.pending_calls()] == ["c1"]
    assert await store.sessions.run_tool(session, "c1", lambda: "3 passed") == "3 passed"
    assert session.pending_calls() == []
    messages = await stored(store, "s")
    assert messages == [
        user("run the tests"),
        *model_calls(dialect, "c1"),
        result_of(dialect, "c1", "3 passed"),
    ]
    assert_accepted(provider_types, dialect, messages)
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None
    assert (step.status, step.attempt, step.result_seq) == ("succeeded", 1, len(messages) - 1)
    record = await store.backend.load_session("s")
    assert record is not None and (record.open_calls, record.calls_owner) == (0, None)


async def test_the_call_and_its_started_record_are_committed_before_the_tool_runs(
    store: statekeel.Store,
) -> None:
    session = await store.sessions.get_or_create("s")
    session.add_message("user", "run the tests")
    session.add_item(model_calls(CHAT, "c1")[0])  # not saved: run_tool saves it with the started record
    seen: dict[str, Any] = {}

    async def tool() -> str:
        seen["messages"] = await stored(store, "s")
        seen["step"] = await store.backend.get_session_step("s", "c1")
        seen["row"] = await store.backend.load_session("s")
        return "ok"

    await store.sessions.run_tool(session, "c1", tool)
    assert seen["messages"] == [user("run the tests"), *model_calls(CHAT, "c1")]
    assert (seen["step"].status, seen["step"].owner) == ("started", store.sessions.owner_id)
    assert (seen["row"].open_calls, seen["row"].calls_owner) == (1, store.sessions.owner_id)


async def test_a_tool_that_raises_is_recorded_failed_and_its_call_runs_again_next_time(
    store: statekeel.Store,
) -> None:
    session = await asked(store, "s", CHAT, "c1")

    def broken() -> str:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        await store.sessions.run_tool(session, "c1", broken)
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and step.status == "failed"
    assert step.error == {"type": "builtins.RuntimeError", "message": "disk full"}
    assert [c.call_id for c in session.pending_calls()] == ["c1"]
    assert await store.sessions.run_tool(session, "c1", lambda: "ok") == "ok"
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and (step.status, step.attempt) == ("succeeded", 2)


async def test_an_async_tool_and_an_awaitable_each_run_once(store: statekeel.Store) -> None:
    session = await asked(store, "s", CHAT, "c1", "c2")
    runs: list[str] = []

    async def tool(name: str) -> str:
        runs.append(name)
        return name

    assert await store.sessions.run_tool(session, "c1", lambda: tool("a")) == "a"
    assert await store.sessions.run_tool(session, "c2", tool("b")) == "b"
    assert runs == ["a", "b"]
    assert [m.get("content") for m in (await stored(store, "s"))[-2:]] == ["a", "b"]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_tool_calls_of_one_turn_run_together_each_get_one_result(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    session = await asked(store, "s", dialect, "c1", "c2", "c3")

    async def tool(n: int) -> str:
        await asyncio.sleep(0.01 * (3 - n))  # finish in the reverse order
        return f"r{n}"

    results = await asyncio.gather(
        *(store.sessions.run_tool(session, f"c{n}", lambda n=n: tool(n)) for n in (1, 2, 3))
    )
    assert results == ["r1", "r2", "r3"]
    messages = await stored(store, "s")
    assert analyze(messages).consistent
    assert_accepted(provider_types, dialect, messages)
    assert messages == session.messages


async def test_a_tool_may_return_a_complete_result_item_or_any_json_value(store: statekeel.Store) -> None:
    session = await asked(store, "s", RESPONSES, "c1", "c2")
    item = {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "hi"}]}
    await store.sessions.run_tool(session, "c1", lambda: item)
    await store.sessions.run_tool(session, "c2", lambda: {"passed": 3, "failed": []})
    assert (await stored(store, "s"))[-2:] == [
        item,
        {"type": "function_call_output", "call_id": "c2", "output": '{"passed":3,"failed":[]}'},
    ]


# --- in doubt, and settled by the caller -------------------------------------------------------------------


async def started_by_gone_process(store: statekeel.Store, key: str, call_id: str) -> None:
    """The state a crash between "started" and "result appended" leaves: a started row of a gone owner."""
    gone = fresh(store)  # never writes a heartbeat: its owner counts as gone
    assert await store.backend.start_session_step(key, call_id, owner=gone.owner_id, expected_attempt=None)


async def test_a_call_started_by_a_process_that_died_is_in_doubt_not_repaired_until_resolved(
    store: statekeel.Store,
) -> None:
    await left_by_gone_process(store, "s", CHAT, "c1")
    await started_by_gone_process(store, "s", "c1")
    session = await store.sessions.load("s")
    assert session is not None and session.repaired == ()
    assert [c.call_id for c in session.pending_calls()] == ["c1"]
    assert session.history() == [user("run the tests")]  # never a call without its result
    runs: list[int] = []
    with pytest.raises(statekeel.StepInDoubt) as info:
        await store.sessions.run_tool(session, "c1", lambda: runs.append(1))
    assert (info.value.session_key, info.value.call_id) == ("s", "c1")
    assert info.value.record.status == "started"
    assert runs == []
    report = await store.recover()
    assert [(s.session_key, s.call_id) for s in report.tool_calls_in_doubt] == [("s", "c1")]
    assert report.orphaned_tool_calls == {}

    message = await store.sessions.resolve_tool(session, "c1", result="charged once")
    assert message == chat_result("c1", "charged once")
    assert (await stored(store, "s"))[-1] == message
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and (step.status, step.result_seq) == ("succeeded", 2)
    with pytest.raises(statekeel.ToolCallAlreadyAnswered):
        await store.sessions.run_tool(session, "c1", lambda: runs.append(1))
    assert runs == [] and (await store.recover()).tool_calls_in_doubt == []


async def test_an_idempotent_call_in_doubt_runs_again(store: statekeel.Store) -> None:
    await left_by_gone_process(store, "s", CHAT, "c1")
    await started_by_gone_process(store, "s", "c1")
    session = await store.sessions.load("s")
    assert session is not None
    assert await store.sessions.run_tool(session, "c1", lambda: "page", idempotent=True) == "page"
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and (step.status, step.attempt) == ("succeeded", 2)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_resolve_tool_interrupted_answers_in_the_calls_own_format(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    await left_by_gone_process(store, "s", dialect, "c1")
    await started_by_gone_process(store, "s", "c1")
    session = await store.sessions.load("s")
    assert session is not None
    await store.sessions.resolve_tool(session, "c1", interrupted=True)
    messages = await stored(store, "s")
    assert INTERRUPTED_TEXT in str(messages[-1])
    assert_accepted(provider_types, dialect, messages)
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and step.status == "interrupted"


async def test_a_call_running_in_a_live_process_is_neither_run_nor_resolved_here(
    store: statekeel.Store,
) -> None:
    await left_by_gone_process(store, "s", CHAT, "c1")
    await store.backend.put_heartbeat(ELSEWHERE, dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    assert await store.backend.start_session_step("s", "c1", owner=ELSEWHERE, expected_attempt=None)
    session = await store.sessions.load("s")
    assert session is not None
    before = await counts(store)
    with pytest.raises(statekeel.ConflictError):
        await store.sessions.run_tool(session, "c1", lambda: "twice", idempotent=True)
    with pytest.raises(statekeel.ConflictError):
        await store.sessions.resolve_tool(session, "c1", interrupted=True)
    assert await counts(store) == before
    assert [c.call_id for c in session.pending_calls()] == ["c1"]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"result": "x", "interrupted": True}, {"interrupted": "yes"}],
    ids=["none", "both", "not-bool"],
)
async def test_resolve_tool_takes_a_result_or_interrupted(store: statekeel.Store, kwargs: Any) -> None:
    session = await asked(store, "s", CHAT, "c1")
    with pytest.raises(statekeel.InvalidArgument):
        await store.sessions.resolve_tool(session, "c1", **kwargs)


# --- bad input: typed errors, nothing written --------------------------------------------------------------


@pytest.mark.parametrize(
    ("call_id", "error"),
    [
        ("", statekeel.InvalidKey),
        (None, statekeel.InvalidKey),
        ("nobody", statekeel.UnknownToolCall),
        ("answered", statekeel.ToolCallAlreadyAnswered),
    ],
    ids=["empty", "none", "unknown", "answered"],
)
async def test_run_tool_refuses_a_call_id_that_is_empty_unknown_or_answered_and_writes_nothing(
    store: statekeel.Store, call_id: Any, error: type[Exception]
) -> None:
    session = await asked(store, "s", CHAT, "answered", "open")
    await store.sessions.run_tool(session, "answered", lambda: "ok")
    session.add_message("user", "unsaved: must not be written by a refused call")
    before = await counts(store)
    runs: list[int] = []

    async def tool() -> None:
        runs.append(1)

    with pytest.raises(error):
        await store.sessions.run_tool(session, call_id, tool())  # the coroutine is closed, not run
    with pytest.raises(error):
        await store.sessions.resolve_tool(session, call_id, result="x")
    assert runs == [] and await counts(store) == before


@pytest.mark.parametrize(
    ("fn", "idempotent"), [(42, False), (lambda: "ok", "yes")], ids=["fn-not-callable", "idempotent-not-bool"]
)
async def test_run_tool_refuses_bad_arguments_and_writes_nothing(
    store: statekeel.Store, fn: Any, idempotent: Any
) -> None:
    session = await asked(store, "s", CHAT, "c1")
    before = await counts(store)
    with pytest.raises(statekeel.InvalidArgument):
        await store.sessions.run_tool(session, "c1", fn, idempotent=idempotent)
    assert await counts(store) == before


async def test_a_result_for_a_call_that_does_not_exist_is_refused_and_nothing_is_written(
    store: statekeel.Store,
) -> None:
    session = await asked(store, "s", CHAT, "c1")
    before = await counts(store)
    with pytest.raises(statekeel.UnknownToolCall):
        session.add_message("tool", "42", tool_call_id="nobody")
    with pytest.raises(statekeel.UnknownToolCall):
        session.add_item({"type": "function_call_output", "call_id": "nobody", "output": "42"})
    with pytest.raises(statekeel.UnknownToolCall):
        session.add_item({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]})
    with pytest.raises(statekeel.TranscriptError):
        session.add_item({"type": "function_call", "call_id": "", "name": "run", "arguments": "{}"})
    with pytest.raises(statekeel.SerializationError):
        session.add_item({"type": "function_call_output", "call_id": "c1", "output": {1, 2}})
    with pytest.raises(statekeel.InvalidArgument):
        session.add_item({"content": "neither role nor type"})
    await store.sessions.save(session)
    assert await counts(store) == before
    assert [c.call_id for c in session.pending_calls()] == ["c1"]


# --- items without a role, pydantic models -----------------------------------------------------------------


async def test_responses_items_without_a_role_are_stored_as_they_are(store: statekeel.Store) -> None:
    session = await store.sessions.get_or_create("s")
    items = [
        {"role": "user", "content": "run it"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    for item in items:
        session.add_item(item)
    await store.sessions.save(session)
    rows = await store.backend.read_messages("s")
    assert [r.payload for r in rows] == items
    assert [r.role for r in rows] == ["user", "reasoning", "function_call", "function_call_output"]
    loaded = await fresh(store).load("s")
    assert loaded is not None and loaded.messages == items


async def test_pydantic_items_are_stored_as_their_json_and_load_back_as_equal_dicts(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]]
) -> None:
    import anthropic.types as anthropic_types
    import openai.types.responses as responses_types

    session = await store.sessions.get_or_create("s")
    call = responses_types.ResponseFunctionToolCall(
        type="function_call", call_id="c1", name="run", arguments="{}", id="fc_1", status="completed"
    )
    stored_call = session.add_item(call)
    assert stored_call == call.model_dump(mode="json", exclude_unset=True)
    block = anthropic_types.ToolUseBlock(type="tool_use", id="toolu_1", name="run", input={"path": "a"})
    session.add_message("assistant", [block])
    await store.sessions.run_tool(session, "toolu_1", lambda: "ok")  # Anthropic: the next user turn
    await store.sessions.run_tool(session, "c1", lambda: "ok")  # Responses: anywhere after its call
    loaded = await fresh(store).load("s")
    assert loaded is not None and loaded.messages == session.messages
    assert responses_types.ResponseFunctionToolCall.model_validate(loaded.messages[0]) == call
    assert anthropic_types.ToolUseBlock.model_validate(loaded.messages[1]["content"][0]) == block
    assert type_errors(provider_types, RESPONSES, [loaded.messages[0], loaded.messages[3]]) == []
    assert type_errors(provider_types, ANTHROPIC, loaded.messages[1:3]) == []


# --- the repair where a transcript is handed out -----------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_load_answers_the_calls_a_gone_process_left_once_in_their_own_format(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    await left_by_gone_process(store, "s", dialect, "c1", "c2")
    head = (await store.backend.load_session("s")).head_seq  # type: ignore[union-attr]
    session = await store.sessions.load("s")
    assert session is not None
    assert [c.call_id for c in session.repaired] == ["c1", "c2"]
    assert session.pending_calls() == [] and not session.unsaved()
    messages = await stored(store, "s")
    assert messages == session.messages and messages == session.history()
    assert_accepted(provider_types, dialect, messages)
    assert analyze(messages).consistent
    assert all(INTERRUPTED_TEXT in str(m) for m in messages[head:])
    record = await store.backend.load_session("s")
    assert record is not None and record.open_calls == 0
    again = await fresh(store).load("s")  # written once: a second load finds nothing to do
    assert again is not None and again.repaired == () and again.messages == messages


async def test_open_and_get_or_create_repair_too_and_repair_false_turns_it_off(
    store: statekeel.Store,
) -> None:
    await left_by_gone_process(store, "a", CHAT, "c1")
    await left_by_gone_process(store, "b", CHAT, "c1")
    await left_by_gone_process(store, "c", CHAT, "c1")
    untouched = await store.sessions.load("a", repair=False)
    assert untouched is not None and untouched.repaired == ()
    assert [c.call_id for c in untouched.pending_calls()] == ["c1"]
    assert len(await stored(store, "a")) == 2
    async with store.sessions.open("a") as session:
        assert [c.call_id for c in session.repaired] == ["c1"]
    assert [c.call_id for c in (await store.sessions.get_or_create("b")).repaired] == ["c1"]
    async with store.sessions.open("c", repair=False) as session:
        assert session.repaired == ()
    assert [len(await stored(store, k)) for k in "abc"] == [3, 3, 2]
    with pytest.raises(statekeel.InvalidArgument):
        await store.sessions.load("c", repair="no")  # type: ignore[arg-type]


async def test_load_never_answers_the_calls_of_a_live_process(store: statekeel.Store) -> None:
    live = fresh(store)
    session = await live.get_or_create("s")
    session.add_message("user", "run the tests")
    session.add_item(model_calls(CHAT, "c1")[0])
    await live.save(session)  # its tool now runs outside any lock
    loaded = await store.sessions.load("s")
    assert loaded is not None and loaded.repaired == ()
    assert loaded.history() == [user("run the tests")]  # the waiting call is left out
    report = await store.recover()
    assert report.sessions_busy == ["s"] and report.orphaned_tool_calls == {}
    assert len(await stored(store, "s")) == 2
    await live.close()  # now it is gone
    again = await store.sessions.load("s")
    assert again is not None and [c.call_id for c in again.repaired] == ["c1"]


async def test_calls_of_another_host_are_answered_once_its_heartbeat_expired(store: statekeel.Store) -> None:
    await store.backend.append_messages(
        "s",
        0,
        [NewMessage(m["role"], store.codec.encode(m)) for m in [user("go"), *model_calls(CHAT, "c1")]],
        create=True,
        open_calls=1,
        calls_owner=ELSEWHERE,
    )
    now = dt.datetime.now(dt.UTC)
    await store.backend.put_heartbeat(ELSEWHERE, now + dt.timedelta(minutes=5))
    loaded = await store.sessions.load("s")
    assert loaded is not None and loaded.repaired == ()
    await store.backend.put_heartbeat(ELSEWHERE, now - dt.timedelta(seconds=1))
    loaded = await store.sessions.load("s")
    assert loaded is not None and [c.call_id for c in loaded.repaired] == ["c1"]


async def test_load_leaves_a_session_whose_lock_a_live_holder_has_alone(store: statekeel.Store) -> None:
    await left_by_gone_process(store, "s", CHAT, "c1")
    holder = fresh(store)
    async with holder.lock("s"):
        loaded = await store.sessions.load("s")
        assert loaded is not None and loaded.repaired == ()
        assert len(await stored(store, "s")) == 2
    await holder.close()


async def test_loads_racing_to_repair_write_the_answer_once(store: statekeel.Store) -> None:
    await left_by_gone_process(store, "s", ANTHROPIC, "c1", "c2")
    managers = [fresh(store) for _ in range(4)]
    sessions = await asyncio.gather(*(m.load("s") for m in managers))
    messages = await stored(store, "s")
    assert len(messages) == 3 and analyze(messages).consistent
    assert all(s is not None and s.messages == messages for s in sessions)
    assert sum(1 for s in sessions if s is not None and s.repaired) >= 1
    for m in managers:
        await m.close()


# --- the stored count of waiting calls, and recover() ------------------------------------------------------


async def test_every_save_stores_how_many_calls_wait_and_recover_reads_only_those_sessions(
    store: statekeel.Store,
) -> None:
    await asked(store, "waiting", RESPONSES, "c1", "c2")
    done = await asked(store, "done", CHAT, "c1")
    await store.sessions.run_tool(done, "c1", lambda: "ok")
    plain = await store.sessions.get_or_create("plain")
    plain.add_message("user", "hello")
    await store.sessions.save(plain)
    rows = {k: await store.backend.load_session(k) for k in ("waiting", "done", "plain")}
    assert {k: r.open_calls for k, r in rows.items() if r} == {"waiting": 2, "done": 0, "plain": 0}
    assert [s.key for s in await store.backend.sessions_with_open_calls()] == ["waiting"]


async def test_sessions_stored_without_a_count_are_counted_once(store: statekeel.Store) -> None:
    def batch(messages: list[Message]) -> list[NewMessage]:
        return [NewMessage(m.get("role") or m["type"], store.codec.encode(m)) for m in messages]

    # Appended by a writer that does not read transcripts (as before the count was kept): unknown (-1).
    await store.backend.append_messages(
        "whole", 0, batch([user(), *model_calls(CHAT, "c1"), chat_result("c1")]), create=True
    )
    await store.backend.append_messages("cut", 0, batch([user(), *model_calls(CHAT, "c1")]), create=True)
    assert {s.key: s.open_calls for s in await store.backend.sessions_with_open_calls()} == {
        "whole": -1,
        "cut": -1,
    }
    report = await store.recover(repair=False)
    assert report.orphaned_tool_calls == {"cut": ["c1"]}
    assert len(await store.backend.sessions_with_open_calls()) == 2  # repair=False writes nothing
    report = await store.recover()
    assert report.orphaned_tool_calls == {"cut": ["c1"]}
    assert await store.backend.sessions_with_open_calls() == []
    assert (await store.recover()).orphaned_tool_calls == {}


async def test_the_count_is_set_only_on_the_head_it_was_computed_for(store: statekeel.Store) -> None:
    session = await asked(store, "s", CHAT, "c1")
    record = await store.backend.load_session("s")
    assert record is not None and record.open_calls == 1
    kwargs = {"expected_created_at": record.created_at, "open_calls": 0, "calls_owner": None}
    assert not await store.backend.set_open_calls("s", expected_head=record.head_seq + 1, **kwargs)
    [found] = await store.backend.sessions_with_open_calls()
    stale = dataclasses.replace(found, head_seq=found.head_seq - 1, open_calls=0)
    assert await store.backend.set_open_calls_many([stale]) == 0
    assert (await store.backend.load_session("s")).open_calls == 1  # type: ignore[union-attr]
    assert await store.backend.set_open_calls("s", expected_head=record.head_seq, **kwargs)
    assert await store.backend.sessions_with_open_calls() == []
    assert session.pending_calls()  # the count is only an index: the transcript is unchanged


@pytest.mark.parametrize("owner", [42, "", {"host": "x"}], ids=["int", "empty", "dict"])
async def test_a_calls_owner_that_is_not_a_non_empty_str_is_refused_and_nothing_is_written(
    store: statekeel.Store, owner: Any
) -> None:
    await asked(store, "s", CHAT, "c1")
    record = await store.backend.load_session("s")
    assert record is not None
    before = await counts(store)
    with pytest.raises(statekeel.InvalidArgument):
        await store.backend.append_messages(
            "s",
            record.head_seq,
            [NewMessage("user", store.codec.encode(user()))],
            open_calls=1,
            calls_owner=owner,
        )
    with pytest.raises(statekeel.InvalidArgument):
        await store.backend.set_open_calls(
            "s",
            expected_head=record.head_seq,
            expected_created_at=record.created_at,
            open_calls=1,
            calls_owner=owner,
        )
    [found] = await store.backend.sessions_with_open_calls()
    good = dataclasses.replace(found, open_calls=0)
    with pytest.raises(statekeel.InvalidArgument):
        await store.backend.set_open_calls_many([good, dataclasses.replace(found, calls_owner=owner)])
    assert await counts(store) == before
    assert await store.backend.load_session("s") == record


async def test_a_process_with_waiting_calls_keeps_a_heartbeat_until_its_store_closes(
    store: statekeel.Store,
) -> None:
    other = fresh(store)
    assert await store.backend.read_heartbeat(other.owner_id) is None
    session = await other.get_or_create("s")
    session.add_message("user", "go")
    await other.save(session)  # no waiting call: no heartbeat needed
    assert await store.backend.read_heartbeat(other.owner_id) is None
    session.add_item(model_calls(CHAT, "c1")[0])
    await other.save(session)
    until = await store.backend.read_heartbeat(other.owner_id)
    assert until is not None and until > dt.datetime.now(dt.UTC)
    assert (await store.backend.load_session("s")).calls_owner == other.owner_id  # type: ignore[union-attr]
    await other.close()
    assert await store.backend.read_heartbeat(other.owner_id) is None


async def test_closing_a_process_removes_its_heartbeat_when_the_renewal_it_stops_answers_anyway(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = fresh(store)
    other.lease_seconds = 0.3
    session = await other.get_or_create("s")
    session.add_item(model_calls(CHAT, "c1")[0])
    await other.save(session)  # a waiting call: the heartbeat is written and renewed in the background
    beating = asyncio.Event()
    put = store.backend.put_heartbeat

    async def renewal_whose_answer_comes_with_the_cancellation(*args: Any) -> None:
        # Python 3.11's asyncio.wait_for (the NATS client's request, some database drivers) returns an
        # answer that arrives with the cancellation and drops the cancellation.
        beating.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass
        await put(*args)

    monkeypatch.setattr(store.backend, "put_heartbeat", renewal_whose_answer_comes_with_the_cancellation)
    async with asyncio.timeout(10):
        await beating.wait()
    async with asyncio.timeout(10):  # never returned before: the heartbeat went on beating
        await other.close()
    assert await store.backend.read_heartbeat(other.owner_id) is None


async def test_run_tool_inside_an_atomic_block_is_refused_so_a_rollback_never_makes_it_run_twice(
    store: statekeel.Store,
) -> None:
    session = await asked(store, "s", CHAT, "c1")
    before = await counts(store)
    ran = []
    with pytest.raises(RuntimeError, match="the caller's block fails"):
        async with store.backend.atomic():
            with pytest.raises(statekeel.StepInTransaction, match="outside the block"):
                await store.sessions.run_tool(session, "c1", lambda: ran.append(1) or "charged")
            raise RuntimeError("the caller's block fails")
    assert ran == [] and await counts(store) == before  # nothing written, nothing run
    assert await store.backend.get_session_step("s", "c1") is None
    assert [c.call_id for c in session.pending_calls()] == ["c1"]
    assert await store.sessions.run_tool(session, "c1", lambda: ran.append(1) or "charged") == "charged"
    assert ran == [1]


@pytest.mark.parametrize("dialect", [CHAT, ANTHROPIC])
async def test_history_after_an_unanswered_call_and_a_new_user_turn_keeps_the_earlier_turns(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    session = await store.sessions.get_or_create("s")
    earlier = [user("fix the build"), {"role": "assistant", "content": "which file?"}, user("main.py")]
    for message in earlier:
        session.add_item(message)
    for message in model_calls(dialect, "c1"):
        session.add_item(message)
    await store.sessions.save(session)
    # The agent was killed before running the tool; the user writes again before any repair.
    again = await fresh(store).load("s", repair=False)
    assert again is not None
    again.add_message("user", "are you there?")
    window = again.history()
    assert window[: len(earlier)] == earlier  # what was said before the call is still sent
    assert window[-1] == user("are you there?")
    assert_accepted(provider_types, dialect, window, window=True)
    assert not any(c.call_id == "c1" for c in analyze(window).calls)  # only the unanswered call is out


async def test_resolve_tool_by_key_answers_the_stored_session_and_audits_the_actor(
    store: statekeel.Store,
) -> None:
    await left_by_gone_process(store, "by-key", CHAT, "c1")
    message = await store.sessions.resolve_tool("by-key", "c1", result="done by hand", actor="alice")
    payloads = await stored(store, "by-key")
    assert payloads[-1] == message and message["tool_call_id"] == "c1"
    [entry] = [e for e in await store.audit.query(subject="session:by-key") if e.kind == "tool_call.resolved"]
    assert entry.actor == "alice"
    assert entry.data == {
        "session_key": "by-key",
        "call_id": "c1",
        "seq": len(payloads) - 1,
        "rewinds": 0,
        "answer": "result",
    }
    assert "done by hand" not in str(entry.data)  # ids, never the result
    with pytest.raises(statekeel.InvalidArgument):
        await store.sessions.resolve_tool("by-key", "c1", interrupted=True, actor="alice")
    assert await stored(store, "by-key") == payloads


@pytest.mark.kinds("store")  # rewinds need sessions in a SQL store
async def test_a_resolved_audit_entry_names_the_rewind_count_its_seq_belongs_to(
    store: statekeel.Store,
) -> None:
    s = await store.sessions.get_or_create("s")
    s.add_message("user", "first try")
    s.add_message("user", "a turn taken back")
    await store.sessions.save(s)
    await store.sessions.rewind("s", 1, reason="take the turn back")  # seq 1 is held twice from now on
    s.add_message(
        "assistant",
        None,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    )
    await store.sessions.save(s)
    await store.sessions.close()  # the process that made the call is gone
    later = statekeel.SessionManager(store.backend, store.codec)
    try:
        message = await later.resolve_tool(
            "s",
            "c1",
            result="done by hand",
            actor="alice",
        )
    finally:
        await later.close()
    [entry] = [e for e in await store.audit.query(subject="session:s") if e.kind == "tool_call.resolved"]
    assert entry.data["seq"] == 2 and entry.data["rewinds"] == 1
    # (key, rewinds, seq) names the answer: the live transcript of that rewind count holds it there.
    assert (await store.backend.read_messages("s", start=2, end=3))[0].payload == message


async def test_resolve_tool_by_key_refuses_an_unknown_session_and_creates_nothing(
    store: statekeel.Store,
) -> None:
    before = await counts(store)
    with pytest.raises(statekeel.NotFound):
        await store.sessions.resolve_tool("nobody", "c1", interrupted=True, actor="alice")
    with pytest.raises(statekeel.InvalidArgument):
        await store.sessions.resolve_tool("nobody", "c1", interrupted=True, actor="")
    assert await counts(store) == before


EARLIER = [user("fix the build"), {"role": "assistant", "content": "which file?"}, user("main.py")]


async def followed_by_a_user_turn(
    manager: statekeel.SessionManager, key: str, dialect: Dialect
) -> statekeel.Session:
    """A call saved by ``manager``, then a user turn saved after it before the call got its result (the
    tool never ran; the user wrote again)."""
    session = await manager.get_or_create(key)
    for message in [*EARLIER, *model_calls(dialect, "c1")]:
        session.add_item(message)
    await manager.save(session)
    session.add_message("user", "are you there?")
    await manager.save(session)
    return session


async def waiting_in_row(store: statekeel.Store, key: str) -> tuple[int, str | None]:
    record = await store.backend.load_session(key)
    assert record is not None
    return record.open_calls, record.calls_owner


@pytest.mark.parametrize("dialect", [CHAT, ANTHROPIC])
async def test_a_call_followed_by_a_user_turn_stays_counted_until_resolve_tool_answers_it_after_that_turn(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    session = await followed_by_a_user_turn(store.sessions, "s", dialect)
    assert await waiting_in_row(store, "s") == (1, store.sessions.owner_id)
    assert [s.key for s in await store.backend.sessions_with_open_calls()] == ["s"]
    assert session.pending_calls() == []  # appending can no longer answer it in place
    before = await counts(store)
    with pytest.raises(statekeel.TranscriptError):
        await store.sessions.run_tool(session, "c1", lambda: "ran")  # running it now would surprise
    assert await counts(store) == before

    message = await store.sessions.resolve_tool(session, "c1", result="3 passed")
    assert message == result_of(dialect, "c1", "3 passed")
    messages = await stored(store, "s")
    assert messages[-1] == message and len(messages) == 6  # appended after the user turn
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and (step.status, step.result_seq) == ("succeeded", 5)
    assert await waiting_in_row(store, "s") == (0, None)
    assert await store.backend.sessions_with_open_calls() == []
    with pytest.raises(statekeel.ToolCallAlreadyAnswered):
        await store.sessions.resolve_tool(session, "c1", interrupted=True)
    with pytest.raises(statekeel.ToolCallAlreadyAnswered):
        session.add_item(result_of(dialect, "c1", "again"))
    # One message and the step's settled row were written; the refusals wrote nothing.
    assert await counts(store) == {**before, "messages": before["messages"] + 1, "session_steps": 1}

    window = session.history()
    assert window == [*EARLIER, user("are you there?")]  # the call and its late result both left out
    assert_accepted(provider_types, dialect, window, window=True)
    repaired = plan_repair(messages).apply(messages)  # the real result moved right after its call
    assert repaired[3:5] == [*model_calls(dialect, "c1"), result_of(dialect, "c1", "3 passed")]
    assert analyze(repaired).consistent and INTERRUPTED_TEXT not in str(repaired)
    assert_accepted(provider_types, dialect, repaired)
    again = await fresh(store).load("s")
    assert again is not None and again.repaired == () and again.messages == messages


@pytest.mark.parametrize("dialect", [CHAT, ANTHROPIC])
async def test_load_answers_a_call_followed_by_a_user_turn_as_interrupted_once_its_process_is_gone(
    store: statekeel.Store, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    gone = fresh(store)
    await followed_by_a_user_turn(gone, "s", dialect)
    alive = await store.sessions.load("s")
    assert alive is not None and alive.repaired == ()  # its process still runs: left alone
    await gone.close()
    session = await store.sessions.load("s")
    assert session is not None and [c.call_id for c in session.repaired] == ["c1"]
    messages = await stored(store, "s")
    assert len(messages) == 6 and messages == session.messages
    assert analyze([messages[3], messages[5]]).consistent and INTERRUPTED_TEXT in str(messages[5])
    assert await waiting_in_row(store, "s") == (0, None)
    assert session.history() == [*EARLIER, user("are you there?")]
    repaired = plan_repair(messages).apply(messages)
    assert repaired[:4] == messages[:4] and repaired[5] == user("are you there?")
    assert analyze(repaired).consistent and INTERRUPTED_TEXT in str(repaired[4])
    assert_accepted(provider_types, dialect, repaired)
    again = await fresh(store).load("s")  # answered once
    assert again is not None and again.repaired == () and again.messages == messages


async def test_a_call_in_doubt_followed_by_a_user_turn_is_reported_until_resolved(
    store: statekeel.Store,
) -> None:
    gone = fresh(store)
    await followed_by_a_user_turn(gone, "s", CHAT)
    await started_by_gone_process(store, "s", "c1")
    await gone.close()
    session = await store.sessions.load("s")
    assert session is not None and session.repaired == ()  # it may have run: not answered for you
    report = await store.recover()
    assert [(s.session_key, s.call_id) for s in report.tool_calls_in_doubt] == [("s", "c1")]
    assert len(await stored(store, "s")) == 5
    await store.sessions.resolve_tool(session, "c1", interrupted=True)
    step = await store.backend.get_session_step("s", "c1")
    assert step is not None and (step.status, step.result_seq) == ("interrupted", 5)
    report = await store.recover()
    assert report.tool_calls_in_doubt == [] and report.orphaned_tool_calls == {}
    assert await store.backend.sessions_with_open_calls() == []
