"""``kill -9`` of a real agent-loop process at every point between "the model asked for a tool" and "its
result is appended", in each transcript format: after a restart the next model call would be valid (the
history passes the providers' type definitions and pairing rules), and a non-idempotent tool ran at most
once (a counter file outside the store counts its side effects).

The points, in order: the model's reply is in memory only (``replied``); the reply is saved without the
tool having started (``call-saved``); ``run_tool`` committed the call and its *started* record but the
tool has not done anything (``step-started``); the tool did its side effect (``inside-fn``); the tool
returned and its result is inside the transaction that appends it, not committed (``before-commit``);
the result is committed (``after-commit``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pydantic
import pytest

import statekeel
from helpers import ANTHROPIC, CHAT, RESPONSES, assert_accepted, kill9_when, model_calls, user
from statekeel.transcripts import INTERRUPTED_TEXT, Dialect, analyze

POINTS = ["replied", "call-saved", "step-started", "inside-fn", "before-commit", "after-commit"]
IN_DOUBT = {"step-started", "inside-fn", "before-commit"}

CHILD = """
import asyncio, json, os, sys, time
import statekeel

url, calls, point, counter, reached, idempotent = sys.argv[1:7]

def hang():
    with open(reached, "w") as fh:  # the parent kills this process once it sees the file
        fh.write(point)
    time.sleep(600)

def tool():
    if point == "step-started":
        hang()
    with open(counter, "a") as fh:  # the side effect, outside the store
        fh.write("ran\\n")
        fh.flush()
        os.fsync(fh.fileno())
    if point == "inside-fn":
        hang()
    return "3 passed"

async def main():
    async with statekeel.open_store(url) as store:
        async with store.sessions.open("agent") as session:
            session.add_message("user", "run the tests")
            await store.sessions.save(session)
            for message in json.loads(calls):  # the model asked for a tool
                session.add_item(message)
            if point == "replied":
                hang()
            if point == "call-saved":
                await store.sessions.save(session)
                hang()
            if point == "before-commit":
                async def stuck(*args, **kwargs):  # inside the result's transaction, before its commit
                    hang()
                store.backend.finish_session_step = stuck
            call = session.pending_calls()[0]
            await store.sessions.run_tool(session, call.call_id, tool, idempotent=idempotent == "1")
            hang()

asyncio.run(main())
"""


def _runs(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def kill_agent_at(
    url: str, dialect: Dialect, point: str, tmp_path: Path, *, idempotent: bool = False
) -> Path:
    """Run the agent loop in a child process and SIGKILL it at ``point``; returns the counter file."""
    counter, reached = tmp_path / "side-effects.txt", tmp_path / "reached.txt"
    calls = json.dumps(model_calls(dialect, "call_1"))
    args = [CHILD, url, calls, point, os.fspath(counter), os.fspath(reached), "1" if idempotent else "0"]
    kill9_when(args, reached.exists, point)
    return counter


async def restart_and_check(
    url: str,
    dialect: Dialect,
    point: str,
    counter: Path,
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    async with (
        statekeel.open_store(url) as store,
        store.sessions.open("agent") as session,
    ):
        # The next model call sends this: valid for the provider whatever the crash left.
        history = session.history()
        assert_accepted(provider_types, dialect, history, window=True)
        waiting = [c.call_id for c in session.pending_calls()]
        tool_runs: list[int] = []
        if point == "replied":  # nothing of the reply reached the store: the model is asked again
            assert session.messages == [user("run the tests")] and waiting == []
        elif point == "call-saved":  # the tool never started: the call is answered as interrupted
            assert [c.call_id for c in session.repaired] == ["call_1"] and waiting == []
            assert INTERRUPTED_TEXT in str(session.messages[-1])
        elif point in IN_DOUBT:  # it may have run: in doubt, never run again behind the caller's back
            assert session.repaired == () and waiting == ["call_1"]
            assert history == [user("run the tests")]
            with pytest.raises(statekeel.StepInDoubt) as info:
                await store.sessions.run_tool(session, "call_1", lambda: tool_runs.append(1))
            assert (info.value.session_key, info.value.call_id) == ("agent", "call_1")
            report = await store.recover()
            assert [s.call_id for s in report.tool_calls_in_doubt] == ["call_1"]
            await store.sessions.resolve_tool(session, "call_1", interrupted=True)
        else:  # the result was committed: nothing to do
            assert session.repaired == () and waiting == []
            assert "3 passed" in str(session.messages[-1])
        assert tool_runs == []
        # Whatever happened, the whole transcript now has one result per call, as the provider wants.
        assert analyze(session.messages).consistent
        assert_accepted(provider_types, dialect, session.messages)
        assert session.messages == [m.payload for m in await store.backend.read_messages("agent")]
    expected_runs = {"replied": 0, "call-saved": 0, "step-started": 0}.get(point, 1)
    assert _runs(counter) == expected_runs  # the non-idempotent tool ran at most once


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("dialect", [CHAT, RESPONSES, ANTHROPIC])
async def test_an_agent_loop_killed_anywhere_around_a_tool_call_resumes_with_a_valid_transcript(
    tmp_path: Path,
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
    dialect: Dialect,
    point: str,
) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    counter = kill_agent_at(url, dialect, point, tmp_path)
    await restart_and_check(url, dialect, point, counter, provider_types)


@pytest.mark.postgres
@pytest.mark.parametrize("point", POINTS)
async def test_an_agent_loop_on_postgres_killed_anywhere_around_a_tool_call_resumes_with_a_valid_transcript(
    tmp_path: Path, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], pg_migrated: str, point: str
) -> None:
    counter = kill_agent_at(pg_migrated, CHAT, point, tmp_path)
    await restart_and_check(pg_migrated, CHAT, point, counter, provider_types)


@pytest.mark.parametrize("dialect", [CHAT, RESPONSES, ANTHROPIC])
async def test_an_idempotent_tool_killed_while_it_ran_runs_again_on_restart(
    tmp_path: Path, provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect
) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    counter = kill_agent_at(url, dialect, "inside-fn", tmp_path, idempotent=True)
    async with statekeel.open_store(url) as store, store.sessions.open("agent") as session:
        assert [c.call_id for c in session.pending_calls()] == ["call_1"]
        assert (
            await store.sessions.run_tool(session, "call_1", lambda: "3 passed", idempotent=True)
            == "3 passed"
        )
        assert_accepted(provider_types, dialect, session.messages)
        step = await store.backend.get_session_step("agent", "call_1")
        assert step is not None and (step.status, step.attempt) == ("succeeded", 2)
    assert _runs(counter) == 1  # the killed run's side effect; the re-run here is the caller's lambda
