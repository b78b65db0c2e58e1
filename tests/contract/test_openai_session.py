"""StatekeelSession, the OpenAI Agents SDK's ``Session`` on a statekeel session, on every backend.

The SDK's documented session behaviour (items in order, ``limit`` = the latest N, ``pop_item`` the most
recent, ``clear_session``) with real SDK items and a ``Runner.run`` on a fake model; then statekeel's
guarantees: one transaction per ``add_items``, no interleaving between processes, typed errors before any
write, and a run killed with a tool call waiting comes back with a valid transcript.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, RunState, set_tracing_disabled
from agents.memory import Session as SdkSession
from agents.memory import SessionSettings

import statekeel
from helpers import assert_accepted, kill9_when, run_together
from sdk_fakes import ScriptedModel, add, call, reasoning, remove, said
from statekeel.integrations.openai_agents import HIDDEN_KEY, StatekeelSession
from statekeel.transcripts import INTERRUPTED_TEXT, Dialect


@pytest.fixture(autouse=True)
def _no_sdk_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would otherwise export spans to OpenAI over the network


@pytest.fixture
async def session(store: statekeel.Store) -> AsyncIterator[StatekeelSession]:
    yield StatekeelSession.from_store(store, "user-42")


def dumped(item: Any) -> dict[str, Any]:
    return dict(item.model_dump(mode="json", by_alias=True, exclude_unset=True))


async def stored(store: statekeel.Store, key: str = "user-42") -> list[dict[str, Any]]:
    found = await store.sessions.load(key, repair=False)
    return [] if found is None else found.messages


async def _last_rewind(store: statekeel.Store, key: str = "user-42") -> str:
    rewinds = await store.sessions.rewinds(key)
    assert rewinds, "no rewind record"
    return rewinds[-1].compression_id


# --- the SDK's documented behaviour ------------------------------------------------------------------


async def test_it_is_an_sdk_session(session: StatekeelSession) -> None:
    assert isinstance(session, SdkSession)
    assert session.session_id == "user-42"
    assert session.session_settings == SessionSettings()


async def test_items_come_back_in_order_as_the_sdk_added_them(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    items: list[Any] = [
        {"role": "user", "content": "add 1 and 2"},
        reasoning(),
        call("call_1"),
        {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        said("3"),
    ]
    await session.add_items(items[:3])
    await session.add_items(items[3:])
    expected = [items[0], *map(dumped, items[1:3]), items[3], dumped(items[4])]
    assert await session.get_items() == expected
    assert await stored(store) == expected  # the statekeel session's messages, as `statekeel show` reads
    assert await StatekeelSession.from_store(store, "user-42").get_items() == expected


async def test_limit_returns_the_latest_items_in_order(store: statekeel.Store) -> None:
    session = StatekeelSession.from_store(store, "s", session_settings={"limit": 2})
    await session.add_items([{"role": "user", "content": str(i)} for i in range(5)])
    assert [i["content"] for i in await session.get_items()] == ["3", "4"]  # the settings' limit
    assert [i["content"] for i in await session.get_items(limit=3)] == ["2", "3", "4"]
    assert await session.get_items(limit=0) == []
    assert len(await session.get_items(limit=50)) == 5


async def test_pop_item_returns_the_latest_and_keeps_it_in_the_stored_history(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    await session.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert await session.pop_item() == {"role": "user", "content": "b"}
    assert await session.get_items() == [{"role": "user", "content": "a"}]
    await session.add_items([{"role": "user", "content": "c"}])
    assert [i["content"] for i in await session.get_items()] == ["a", "c"]
    # Rewound, not deleted: b is in the archive under its rewind record, and c took its place.
    assert [m["content"] for m in await stored(store)] == ["a", "c"]
    rewound = await store.backend.read_archive("user-42", compression_id=await _last_rewind(store))
    assert [(m.seq, m.payload["content"]) for m in rewound] == [(1, "b")]
    loaded = await store.sessions.load("user-42")
    assert loaded is not None and HIDDEN_KEY not in loaded.metadata
    assert await session.pop_item() == {"role": "user", "content": "c"}
    assert await session.pop_item() == {"role": "user", "content": "a"}
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_a_hidden_position_names_the_popped_item_even_after_another_caller_rewinds_below_it(
    session: StatekeelSession, store: statekeel.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await session.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise statekeel.BackendUnavailable("the database is down (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(store.backend, "append_messages", unavailable)
        await session.add_items([{"role": "user", "content": "c"}])  # acknowledged to the fallback file
        assert await session.pop_item() == {"role": "user", "content": "c"}  # hidden: seq 2
    assert (await store.sessions.replay_fallback()).ok
    assert [i["content"] for i in await session.get_items()] == ["a", "b"]
    # Another caller rewinds the session below the hidden seq; new items take seqs 1 and 2 again.
    await store.sessions.rewind("user-42", 1, reason="another caller goes back")
    await session.add_items([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])
    assert [i["content"] for i in await session.get_items()] == ["a", "x", "y"]  # y is not the popped c
    assert await session.pop_item() == {"role": "user", "content": "y"}
    assert [i["content"] for i in await session.get_items()] == ["a", "x"]


async def test_a_popped_call_is_answered_out_of_sight_so_no_repair_shows_it_and_a_later_output_is_kept(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    await session.add_items([{"role": "user", "content": "hi"}, dumped(call("call_1"))])
    assert (await session.pop_item())["call_id"] == "call_1"  # type: ignore[index]
    assert await session.get_items() == [{"role": "user", "content": "hi"}]
    # The popped call left the live transcript with its rewind: nothing waits, nothing is repaired.
    assert await stored(store) == [{"role": "user", "content": "hi"}]
    rewound = await store.backend.read_archive("user-42", compression_id=await _last_rewind(store))
    assert [m.payload["call_id"] for m in rewound] == ["call_1"]
    loaded = await store.sessions.load("user-42")
    assert loaded is not None and HIDDEN_KEY not in loaded.metadata and loaded.repaired == ()
    output = {"type": "function_call_output", "call_id": "call_1", "output": "3"}
    await session.add_items([output])  # as SQLiteSession keeps it
    assert await session.get_items() == [{"role": "user", "content": "hi"}, output]


async def test_clear_session_moves_the_items_into_the_archive(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    await session.add_items([{"role": "user", "content": "a"}, said("b")])
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    assert [m.payload["role"] for m in await store.sessions.archived("user-42")] == ["user", "assistant"]
    await session.add_items([{"role": "user", "content": "again"}])
    assert await session.get_items() == [{"role": "user", "content": "again"}]


async def test_an_unknown_session_is_empty_and_reading_it_creates_nothing(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.clear_session()
    assert await store.sessions.load("user-42") is None


async def test_runner_run_keeps_the_conversation_across_runs(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    model = ScriptedModel([reasoning(), call("call_1")], [said("3")], [said("you asked to add 1 and 2")])
    agent = Agent(name="calc", model=model, tools=[add])
    first = await Runner.run(agent, "add 1 and 2", session=session)
    assert first.final_output == "3"
    items = await session.get_items()
    kinds = [None, "reasoning", "function_call", "function_call_output", "message"]
    assert [i.get("type") for i in items] == kinds
    assert items[3] == {"call_id": "call_1", "output": "3", "type": "function_call_output"}
    second = await Runner.run(agent, "what did I ask?", session=session)
    assert second.final_output == "you asked to add 1 and 2"
    assert model.inputs[-1][:5] == items  # the second run sent the stored history to the model
    assert len(await stored(store)) == 7


async def test_a_streamed_run_keeps_its_items(session: StatekeelSession) -> None:
    model = ScriptedModel([call("call_1")], [said("3")])
    result = Runner.run_streamed(Agent(name="calc", model=model, tools=[add]), "add 1 and 2", session=session)
    async for _ in result.stream_events():
        pass
    assert result.final_output == "3"
    items = await session.get_items()
    assert [i.get("type") for i in items] == [None, "function_call", "function_call_output", "message"]


async def test_an_approval_waits_in_the_session_and_the_resumed_run_answers_it(
    session: StatekeelSession,
) -> None:
    model = ScriptedModel([call("call_rm", "remove", '{"path": "x"}')], [said("x is gone")])
    agent = Agent(name="ops", model=model, tools=[remove])
    first = await Runner.run(agent, "remove x", session=session)
    assert len(first.interruptions) == 1
    waiting = await session.get_items()  # this process is alive: its waiting call is not repaired
    assert [i.get("type") for i in waiting] == [None, "function_call"]
    state = first.to_state()
    state.approve(first.interruptions[0])
    second = await Runner.run(agent, state, session=session)
    assert second.final_output == "x is gone"
    items = await session.get_items()
    assert items[2] == {"call_id": "call_rm", "output": "removed x", "type": "function_call_output"}
    assert len(items) == 4


async def test_one_line_from_a_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    async with StatekeelSession("user-42", url) as session:
        await session.add_items([{"role": "user", "content": "hi"}])
    again = StatekeelSession("user-42", url)
    try:
        assert await again.get_items() == [{"role": "user", "content": "hi"}]
    finally:
        await again.aclose()


# --- bad input: typed errors, nothing written --------------------------------------------------------


async def test_an_unserializable_item_writes_nothing_of_its_batch(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    await session.add_items([{"role": "user", "content": "kept"}])
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": {1, 2}}]
    with pytest.raises(statekeel.UnserializableValue) as caught:
        await session.add_items(bad)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    assert "items[1]" in str(caught.value)
    assert await session.get_items() == [{"role": "user", "content": "kept"}]
    assert len(await stored(store)) == 1
    await session.add_items([{"role": "user", "content": "next"}])  # the session is still usable
    assert len(await stored(store)) == 2


async def test_an_output_answering_no_call_is_stored_as_it_is(
    session: StatekeelSession, store: statekeel.Store
) -> None:
    orphan = {"type": "function_call_output", "call_id": "nope", "output": ""}
    batch = [{"role": "user", "content": "a"}, orphan]
    await session.add_items(batch)
    assert await stored(store) == batch
    assert await session.get_items() == batch
    assert statekeel.transcripts.analyze(await stored(store)).orphans[0].call_id == "nope"


@pytest.mark.parametrize(
    ("call_args", "message"),
    [
        (("",), "session_id is empty"),
        ((42,), "session_id must be a str"),
        (("a\x00b",), "contains NUL"),
    ],
)
async def test_a_bad_session_id_is_a_value_error(
    store: statekeel.Store, call_args: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(statekeel.InvalidConfig, match=message) as caught:
        StatekeelSession.from_store(store, *call_args)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("hello", "items must be a list"),
        ([{"content": "no role"}], r"items\[0\]: a message needs a non-empty str 'role'"),
        ([42], r"items\[0\]: a message must be a dict"),
    ],
)
async def test_malformed_items_are_value_errors(
    session: StatekeelSession, store: statekeel.Store, items: Any, message: str
) -> None:
    with pytest.raises(statekeel.InvalidConfig, match=message) as caught:
        await session.add_items(items)
    assert isinstance(caught.value, ValueError)
    assert await store.sessions.load("user-42") is None


async def test_bad_options_are_value_errors(store: statekeel.Store) -> None:
    with pytest.raises(statekeel.InvalidConfig, match="repair must be True or False"):
        StatekeelSession.from_store(store, "s", repair="yes")  # type: ignore[arg-type]
    with pytest.raises(statekeel.InvalidConfig, match="lock_timeout must be None or a number"):
        StatekeelSession.from_store(store, "s", lock_timeout=-1)
    with pytest.raises(statekeel.InvalidConfig, match="apply to a URL"):
        StatekeelSession("s", store, durability="full")
    with pytest.raises(statekeel.InvalidConfig, match="needs a store URL or an open statekeel Store"):
        StatekeelSession("s", 42)  # type: ignore[arg-type]


async def test_a_negative_limit_is_a_value_error(session: StatekeelSession) -> None:
    with pytest.raises(ValueError, match="limit must be None or an int >= 0"):
        await session.get_items(limit=-1)


# --- two writers, and a killed run -------------------------------------------------------------------


async def test_a_held_session_makes_another_writer_wait(shared_url: str) -> None:
    # Two stores on one database: two writers as two processes would be.
    async with statekeel.open_store(shared_url) as a, statekeel.open_store(shared_url) as b:
        holder = StatekeelSession.from_store(a, "shared")
        other = StatekeelSession.from_store(b, "shared", lock_timeout=0.2)
        async with holder.hold():
            await holder.add_items([{"role": "user", "content": "mine"}])
            with pytest.raises(statekeel.LockTimeout):
                await other.add_items([{"role": "user", "content": "theirs"}])
        await other.add_items([{"role": "user", "content": "theirs"}])
        assert [i["content"] for i in await holder.get_items()] == ["mine", "theirs"]


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from statekeel.integrations.openai_agents import StatekeelSession

    async def main(url, name):
        async with StatekeelSession("shared", url) as session:
            print("ready", flush=True)
            sys.stdin.readline()
            for n in range(15):
                await session.add_items([{"role": "user", "content": f"{name}-{n}-{k}"} for k in range(3)])

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_two_processes_never_interleave_their_batches(shared_url: str) -> None:
    await asyncio.to_thread(
        run_together, [[sys.executable, "-c", WRITER, shared_url, name] for name in "ab"], timeout=120
    )
    async with StatekeelSession("shared", shared_url) as session:
        contents = [i["content"] for i in await session.get_items()]
    assert len(contents) == 90
    batches = [contents[i : i + 3] for i in range(0, 90, 3)]
    for batch in batches:  # each add_items is contiguous: same writer, same n, k = 0, 1, 2
        prefixes = {c.rsplit("-", 1)[0] for c in batch}
        assert len(prefixes) == 1 and [c.rsplit("-", 1)[1] for c in batch] == ["0", "1", "2"]
    for name in "ab":
        assert [b[0] for b in batches if b[0].startswith(name)] == [f"{name}-{n}-0" for n in range(15)]


WAITING_FOR_APPROVAL = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from pathlib import Path
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseFunctionToolCall
    from statekeel.integrations.openai_agents import StatekeelSession

    class Asks(Model):
        async def get_response(self, *args, **kwargs):
            item = ResponseFunctionToolCall(id="fc_1", call_id="call_rm", name="remove",
                                            arguments='{"path": "x"}', type="function_call",
                                            status="completed")
            return ModelResponse(output=[item], usage=Usage(), response_id=None)
        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    @function_tool(needs_approval=True)
    async def remove(path: str) -> str:
        return f"removed {path}"

    async def main(url, flag):
        set_tracing_disabled(True)
        async with StatekeelSession("user-42", url) as session:
            agent = Agent(name="ops", model=Asks(), tools=[remove])
            result = await Runner.run(agent, "remove x", session=session)
            assert result.interruptions, "the run should wait for an approval"
            # The run's state, kept for whoever resumes it after the approval (written whole, then named).
            Path(flag + ".tmp").write_text(json.dumps(result.to_state().to_json()))
            os.replace(flag + ".tmp", flag)
            time.sleep(3600)  # waits for a human, and is killed

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def kill_while_waiting_for_approval(url: str, tmp_path: Path) -> str:
    """Run an agent whose tool needs an approval in a child process, kill it while it waits; the state
    of its run, as JSON."""
    flag = tmp_path / "state.json"
    await asyncio.to_thread(
        kill9_when, [WAITING_FOR_APPROVAL, url, str(flag)], flag.exists, "the approval wait"
    )
    return flag.read_text()


async def test_a_run_killed_with_a_tool_call_waiting_comes_back_with_a_valid_transcript(
    shared_url: str, tmp_path: Path, provider_types: Any
) -> None:
    await kill_while_waiting_for_approval(shared_url, tmp_path)
    async with StatekeelSession("user-42", shared_url) as session:
        items = await session.get_items()
        assert [i.get("type") for i in items] == [None, "function_call", "function_call_output"]
        assert items[2]["call_id"] == "call_rm" and items[2]["output"] == INTERRUPTED_TEXT
        assert items[1]["name"] == "remove"
        assert_accepted(provider_types, Dialect.OPENAI_RESPONSES, items)
        model = ScriptedModel([said("the removal was interrupted; shall I retry?")])
        result = await Runner.run(Agent(name="ops", model=model), "what happened?", session=session)
        assert result.final_output == "the removal was interrupted; shall I retry?"
        assert model.inputs[0][:3] == items  # the model got every call with its output
        assert len(await session.get_items()) == 5
    async with statekeel.open_store(shared_url) as check:
        outputs = [m for m in await stored(check) if m.get("type") == "function_call_output"]
    assert len(outputs) == 1  # the repair was stored once, not made again by every read


async def test_without_repair_a_killed_run_waiting_for_approval_is_resumed_from_its_state(
    shared_url: str, tmp_path: Path
) -> None:
    state_json = await kill_while_waiting_for_approval(shared_url, tmp_path)
    async with StatekeelSession("user-42", shared_url, repair=False) as session:
        assert [i.get("type") for i in await session.get_items()] == [None, "function_call"]  # still waiting
        agent = Agent(name="ops", model=ScriptedModel([said("x is gone")]), tools=[remove])
        state = await RunState.from_json(agent, json.loads(state_json))
        state.approve(state.get_interruptions()[0])
        result = await Runner.run(agent, state, session=session)
        assert result.final_output == "x is gone"
        items = await session.get_items()
        assert items[2] == {"call_id": "call_rm", "output": "removed x", "type": "function_call_output"}
        assert [i.get("type") for i in items] == [None, "function_call", "function_call_output", "message"]
