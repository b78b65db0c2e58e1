"""Google ADK's session-service behaviours, each run against ADK's ``InMemorySessionService`` (the
reference) and ``StatekeelSessionService``; then what only a persistent service does (a second store on
the same database, the stale-writer check) and a real ADK ``Runner`` on a fake model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

import statekeel
from helpers import kill9_when
from statekeel.integrations.adk import StaleSession, StatekeelSessionService
from statekeel.transcripts import INTERRUPTED_TEXT

KINDS = ["InMemorySessionService", "StatekeelSessionService-memory", "StatekeelSessionService-sqlite"]


@pytest.fixture(params=KINDS)
async def service(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "InMemorySessionService":
        yield InMemorySessionService()
        return
    url = "memory://" if request.param.endswith("memory") else f"sqlite:///{tmp_path / 'adk.db'}"
    made = StatekeelSessionService(url)
    try:
        yield made
    finally:
        await made.aclose()


def event(text: str, *, delta: dict[str, Any] | None = None, at: float | None = None, **kw: Any) -> Event:
    return Event(
        invocation_id="inv-1",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=delta or {}),
        timestamp=time.time() if at is None else at,
        **kw,
    )


def texts(events: list[Event]) -> list[str]:
    return [e.content.parts[0].text for e in events if e.content and e.content.parts]  # type: ignore[misc]


# --- create, get, list, delete ---------------------------------------------------------------------------


async def test_a_created_session_is_read_back(service: Any) -> None:
    made = await service.create_session(app_name="shop", user_id="u1", state={"k": "v"}, session_id="s1")
    assert (made.app_name, made.user_id, made.id, made.state) == ("shop", "u1", "s1", {"k": "v"})
    got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    assert got is not None and got.id == "s1" and got.state == {"k": "v"} and got.events == []


async def test_a_session_without_an_id_gets_a_generated_one(service: Any) -> None:
    one = await service.create_session(app_name="shop", user_id="u1")
    two = await service.create_session(app_name="shop", user_id="u1")
    assert one.id and two.id and one.id != two.id
    assert await service.get_session(app_name="shop", user_id="u1", session_id=one.id) is not None


async def test_creating_an_existing_session_id_is_refused(service: Any) -> None:
    await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name="shop", user_id="u1", session_id="s1")


async def test_an_unknown_session_is_none(service: Any) -> None:
    assert await service.get_session(app_name="shop", user_id="u1", session_id="nope") is None
    await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    assert await service.get_session(app_name="shop", user_id="u2", session_id="s1") is None
    assert await service.get_session(app_name="other", user_id="u1", session_id="s1") is None


async def test_list_sessions_of_a_user_or_of_the_app_without_events(service: Any) -> None:
    for user, sid in [("u1", "a"), ("u1", "b"), ("u2", "c")]:
        made = await service.create_session(app_name="shop", user_id=user, session_id=sid)
        await service.append_event(made, event(f"hi from {sid}"))
    mine = (await service.list_sessions(app_name="shop", user_id="u1")).sessions
    assert sorted(s.id for s in mine) == ["a", "b"] and all(s.events == [] for s in mine)
    everyone = (await service.list_sessions(app_name="shop")).sessions
    assert sorted(s.id for s in everyone) == ["a", "b", "c"]
    assert [s.id for s in everyone] == [s.id for s in sorted(everyone, key=lambda s: s.last_update_time)]
    assert (await service.list_sessions(app_name="elsewhere")).sessions == []
    assert (await service.list_sessions(app_name="shop", user_id="nobody")).sessions == []


async def test_a_deleted_session_is_gone_and_deleting_it_again_is_fine(service: Any) -> None:
    await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    await service.create_session(app_name="shop", user_id="u1", session_id="s2")
    await service.delete_session(app_name="shop", user_id="u1", session_id="s1")
    assert await service.get_session(app_name="shop", user_id="u1", session_id="s1") is None
    await service.delete_session(app_name="shop", user_id="u1", session_id="s1")
    assert [s.id for s in (await service.list_sessions(app_name="shop", user_id="u1")).sessions] == ["s2"]


# --- events and state scopes ----------------------------------------------------------------------------


async def test_events_come_back_in_order_with_their_content(service: Any) -> None:
    session = await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    for text in ["one", "two", "three"]:
        await service.append_event(session, event(text))
    assert texts(session.events) == ["one", "two", "three"]
    got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    assert texts(got.events) == ["one", "two", "three"]
    assert [e.id for e in got.events] == [e.id for e in session.events]


async def test_a_partial_event_is_not_stored(service: Any) -> None:
    session = await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    await service.append_event(session, event("streaming…", partial=True))
    got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    assert got.events == []


async def test_an_event_appended_twice_is_stored_once(service: Any) -> None:
    session = await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    once = event("once")
    await service.append_event(session, once)
    fresh = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    await service.append_event(fresh, once)
    got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    assert texts(got.events) == ["once"]


async def test_app_user_and_temp_state_follow_adk_scopes(service: Any) -> None:
    one = await service.create_session(
        app_name="shop", user_id="u1", session_id="s1", state={"app:theme": "dark", "user:lang": "fr"}
    )
    await service.append_event(
        one, event("set", delta={"count": 1, "app:version": 2, "user:name": "Ann", "temp:scratch": "x"})
    )
    assert one.state["temp:scratch"] == "x"  # the running invocation sees it
    assert one.events[-1].actions.state_delta == {"count": 1, "app:version": 2, "user:name": "Ann"}
    got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    assert got.state == {
        "count": 1,
        "app:theme": "dark",
        "app:version": 2,
        "user:lang": "fr",
        "user:name": "Ann",
    }
    assert "temp:scratch" not in got.events[-1].actions.state_delta
    same_user = await service.create_session(app_name="shop", user_id="u1", session_id="s2")
    assert same_user.state == {"app:theme": "dark", "app:version": 2, "user:lang": "fr", "user:name": "Ann"}
    other_user = await service.create_session(app_name="shop", user_id="u2", session_id="s3")
    assert other_user.state == {"app:theme": "dark", "app:version": 2}
    other_app = await service.create_session(app_name="blog", user_id="u1", session_id="s4")
    assert other_app.state == {}
    assert await service.get_user_state(app_name="shop", user_id="u1") == {"lang": "fr", "name": "Ann"}


async def test_temp_state_given_at_creation_is_not_kept(service: Any) -> None:
    await service.create_session(app_name="shop", user_id="u1", session_id="s1", state={"temp:x": 1, "y": 2})
    got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
    assert got.state == {"y": 2}


async def test_get_session_config_limits_the_events(service: Any) -> None:
    session = await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    base = time.time()
    for n in range(5):
        await service.append_event(session, event(f"e{n}", at=base + n))

    async def get(**config: Any) -> list[str]:
        found = await service.get_session(
            app_name="shop", user_id="u1", session_id="s1", config=GetSessionConfig(**config)
        )
        return texts(found.events)

    assert await get(num_recent_events=2) == ["e3", "e4"]
    assert await get(num_recent_events=0) == []
    assert await get(num_recent_events=10) == ["e0", "e1", "e2", "e3", "e4"]
    assert await get(after_timestamp=base + 2) == ["e2", "e3", "e4"]
    assert await get(after_timestamp=base + 100) == []
    assert await get(num_recent_events=2, after_timestamp=base + 4) == ["e4"]


async def test_appending_to_a_deleted_session_is_refused(service: Any) -> None:
    session = await service.create_session(app_name="shop", user_id="u1", session_id="s1")
    await service.delete_session(app_name="shop", user_id="u1", session_id="s1")
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, event("late"))


# --- what only a persistent service does --------------------------------------------------------------


async def test_a_second_store_on_the_database_reads_the_sessions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'adk.db'}"
    first = StatekeelSessionService(url)
    session = await first.create_session(app_name="shop", user_id="u1", session_id="s1", state={"app:a": 1})
    await first.append_event(session, event("kept", delta={"k": "v"}))
    await first.aclose()
    again = StatekeelSessionService(url)
    try:
        got = await again.get_session(app_name="shop", user_id="u1", session_id="s1")
        assert got is not None and texts(got.events) == ["kept"] and got.state == {"k": "v", "app:a": 1}
        assert got.last_update_time == session.last_update_time
    finally:
        await again.aclose()


async def test_a_second_writer_on_one_session_conflicts_and_never_interleaves(tmp_path: Path) -> None:
    service = StatekeelSessionService(f"sqlite:///{tmp_path / 'adk.db'}")
    try:
        await service.create_session(app_name="shop", user_id="u1", session_id="s1")
        mine = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        theirs = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        await service.append_event(theirs, event("theirs", delta={"who": "them"}))
        with pytest.raises(StaleSession) as caught:
            await service.append_event(mine, event("mine", delta={"who": "me"}))
        assert isinstance(caught.value, statekeel.ConflictError) and isinstance(caught.value, ValueError)
        got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        assert texts(got.events) == ["theirs"] and got.state == {"who": "them"}
        await service.append_event(got, event("mine again"))  # a fresh read appends
        assert texts((await service.get_session(app_name="shop", user_id="u1", session_id="s1")).events) == [
            "theirs",
            "mine again",
        ]
    finally:
        await service.aclose()


async def test_state_the_codec_refuses_writes_nothing(tmp_path: Path) -> None:
    service = StatekeelSessionService(f"sqlite:///{tmp_path / 'adk.db'}")
    try:
        session = await service.create_session(app_name="shop", user_id="u1", session_id="s1")
        with pytest.raises(statekeel.UnserializableValue):
            await service.append_event(session, event("bad", delta={"k": float("nan")}))
        got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        assert got.events == [] and got.state == {}
        await service.append_event(got, event("good", delta={"k": 1}))
        got = await service.get_session(app_name="shop", user_id="u1", session_id="s1")
        assert texts(got.events) == ["good"] and got.state == {"k": 1}
    finally:
        await service.aclose()


# --- ADK's Runner -------------------------------------------------------------------------------------------


class ScriptedLlm(BaseLlm):
    """A model answering from a script, one reply per call; keeps the requests' contents."""

    replies: list[str] = []
    seen: list[list[str]] = []

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.seen.append([p.text or "" for c in llm_request.contents for p in (c.parts or [])])
        text = self.replies.pop(0)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


async def test_adks_runner_keeps_the_conversation_in_the_service(service: Any) -> None:
    model = ScriptedLlm(model="scripted", replies=["Paris", "France"], seen=[])
    agent = LlmAgent(name="geo", model=model, instruction="answer", output_key="last_answer")
    runner = Runner(agent=agent, app_name="geo", session_service=service)
    await service.create_session(app_name="geo", user_id="u1", session_id="s1")

    async def ask(text: str) -> list[Event]:
        message = types.Content(role="user", parts=[types.Part(text=text)])
        return [e async for e in runner.run_async(user_id="u1", session_id="s1", new_message=message)]

    await ask("capital?")
    await ask("country?")
    assert model.seen[1] == ["capital?", "Paris", "country?"]
    got = await service.get_session(app_name="geo", user_id="u1", session_id="s1")
    assert texts(got.events) == ["capital?", "Paris", "country?", "France"]
    assert got.state["last_answer"] == "France"


async def test_adks_rewind_takes_the_invocation_and_what_followed_out_of_the_conversation(
    service: Any,
) -> None:
    model = ScriptedLlm(model="scripted", replies=["Paris", "France", "Lyon"], seen=[])
    agent = LlmAgent(name="geo", model=model, instruction="answer", output_key="last_answer")
    runner = Runner(agent=agent, app_name="geo", session_service=service)
    await service.create_session(app_name="geo", user_id="u1", session_id="s1")

    async def ask(text: str) -> list[Event]:
        message = types.Content(role="user", parts=[types.Part(text=text)])
        return [e async for e in runner.run_async(user_id="u1", session_id="s1", new_message=message)]

    await ask("capital?")
    second = await ask("country?")
    await runner.rewind_async(
        user_id="u1", session_id="s1", rewind_before_invocation_id=second[0].invocation_id
    )
    got = await service.get_session(app_name="geo", user_id="u1", session_id="s1")
    assert got.state["last_answer"] == "Paris"  # the state as it was before the rewound invocation
    await ask("second city?")
    # The model sees the conversation without the rewound invocation, whatever the service.
    assert model.seen[2] == ["capital?", "Paris", "second city?"]
    got = await service.get_session(app_name="geo", user_id="u1", session_id="s1")
    assert got.state["last_answer"] == "Lyon"
    live = [t for t in texts(got.events) if t]
    if isinstance(service, StatekeelSessionService):
        # A statekeel rewind: the rewound events are out of the live transcript, under a rewind record.
        assert live == ["capital?", "Paris", "second city?", "Lyon"]
        store = await service.store()
        (rewind,) = await store.sessions.rewinds("adk/geo/u1/s1")
        archived = await store.sessions.archived("adk/geo/u1/s1", rewind.compression_id)
        assert [a.payload["event"]["content"]["parts"][0]["text"] for a in archived] == ["country?", "France"]
        assert rewind.reason == f"ADK rewind before invocation {second[0].invocation_id}"
    else:
        assert live == ["capital?", "Paris", "country?", "France", "second city?", "Lyon"]


async def test_a_rewind_of_an_invocation_that_is_not_live_only_appends_the_event(tmp_path: Path) -> None:
    service = StatekeelSessionService(f"sqlite:///{tmp_path / 'adk.db'}")
    try:
        session = await service.create_session(app_name="a", user_id="u", session_id="s")
        await service.append_event(session, event("hello"))
        rewind = Event(
            invocation_id="inv-r", author="user", actions=EventActions(rewind_before_invocation_id="inv-gone")
        )
        await service.append_event(session, rewind)
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert [e.invocation_id for e in got.events] == ["inv-1", "inv-r"]
        assert await (await service.store()).sessions.rewinds("adk/a/u/s") == []
    finally:
        await service.aclose()


async def test_a_rewind_whose_state_cannot_be_stored_rewinds_nothing(tmp_path: Path) -> None:
    service = StatekeelSessionService(f"sqlite:///{tmp_path / 'adk.db'}")
    try:
        session = await service.create_session(app_name="a", user_id="u", session_id="s")
        await service.append_event(session, event("hello", delta={"k": 1}))
        again = event("again")
        again.invocation_id = "inv-2"
        await service.append_event(session, again)
        bad = Event(
            invocation_id="inv-r",
            author="user",
            actions=EventActions(rewind_before_invocation_id="inv-2", state_delta={"k": float("nan")}),
        )
        with pytest.raises(statekeel.UnserializableValue):
            await service.append_event(session, bad)
        # The rewind and the event are one transaction: neither happened.
        got = await service.get_session(app_name="a", user_id="u", session_id="s")
        assert texts(got.events) == ["hello", "again"] and got.state == {"k": 1}
        assert await (await service.store()).sessions.rewinds("adk/a/u/s") == []
    finally:
        await service.aclose()


# --- a run killed inside a tool ---------------------------------------------------------------------------

KILLED_IN_A_TOOL = """
import asyncio, sys, time
from google.adk.events.event import Event
from google.genai import types
from statekeel.integrations.adk import StatekeelSessionService

async def main(url, flag):
    service = StatekeelSessionService(url)
    session = await service.create_session(app_name="ops", user_id="u1", session_id="s1")
    ask = types.Content(role="user", parts=[types.Part(text="remove x")])
    await service.append_event(session, Event(invocation_id="inv-1", author="user", content=ask))
    call = types.FunctionCall(id="call_rm", name="remove", args={"path": "x"})
    made = types.Content(role="model", parts=[types.Part(function_call=call)])
    await service.append_event(session, Event(invocation_id="inv-1", author="ops", content=made))
    open(flag, "w").write("in the tool")
    time.sleep(600)  # the tool runs: killed here

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_run_killed_inside_a_tool_comes_back_with_an_answered_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'adk.db'}"
    flag = tmp_path / "flag"
    await asyncio.to_thread(kill9_when, [KILLED_IN_A_TOOL, url, str(flag)], flag.exists, "the tool")
    service = StatekeelSessionService(url)
    try:
        got = await service.get_session(app_name="ops", user_id="u1", session_id="s1")
        assert got is not None and len(got.events) == 3
        answer = got.events[2].get_function_responses()
        assert [(r.id, r.name) for r in answer] == [("call_rm", "remove")]
        assert answer[0].response == {"error": INTERRUPTED_TEXT}
        assert got.events[2].author == "ops" and got.events[2].invocation_id == "inv-1"
        again = await service.get_session(app_name="ops", user_id="u1", session_id="s1")
        assert len(again.events) == 3  # answered once, not at every read
        model = ScriptedLlm(model="scripted", replies=["the removal was interrupted"], seen=[])
        runner = Runner(agent=LlmAgent(name="ops", model=model), app_name="ops", session_service=service)
        message = types.Content(role="user", parts=[types.Part(text="what happened?")])
        events = [e async for e in runner.run_async(user_id="u1", session_id="s1", new_message=message)]
        assert texts(events)[-1] == "the removal was interrupted"
    finally:
        await service.aclose()


async def test_a_call_of_a_live_run_is_left_waiting(tmp_path: Path) -> None:
    service = StatekeelSessionService(f"sqlite:///{tmp_path / 'adk.db'}")
    try:
        session = await service.create_session(app_name="ops", user_id="u1", session_id="s1")
        call = types.FunctionCall(id="call_1", name="remove", args={})
        made = types.Content(role="model", parts=[types.Part(function_call=call)])
        await service.append_event(session, Event(invocation_id="inv-1", author="ops", content=made))
        got = await service.get_session(app_name="ops", user_id="u1", session_id="s1")
        assert len(got.events) == 1  # this process runs it: no interrupted answer
    finally:
        await service.aclose()
