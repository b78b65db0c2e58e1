"""The in-memory Session: message validation and the LLM-safe history window."""

from __future__ import annotations

from typing import Any

import pytest

import statekeel
from statekeel.codec import Codec
from statekeel.sessions import Session


def new_session() -> Session:
    return Session("s", owner=object(), codec=Codec(max_record_bytes=1000))


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def test_add_message_keeps_extra_fields_and_numbers_by_position() -> None:
    s = new_session()
    m = s.add_message("assistant", None, tool_calls=[{"id": "c1"}])
    assert m == {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    assert s.head_seq == 1 and s.unsaved() == [m]


@pytest.mark.parametrize("role", ["", None, 3, b"user"])
def test_role_that_is_not_a_non_empty_string_is_refused_and_nothing_added(role: Any) -> None:
    s = new_session()
    with pytest.raises(statekeel.InvalidArgument):
        s.add_message(role, "x")
    assert s.messages == []


def test_unencodable_content_is_refused_with_its_path_and_nothing_added() -> None:
    s = new_session()
    s.add_message("user", "ok")
    with pytest.raises(statekeel.SerializationError) as info:
        s.add_message("user", {"bad": {1, 2}})
    assert info.value.path == "messages[1].content.bad"
    assert len(s.messages) == 1


def test_oversized_message_is_refused() -> None:
    s = new_session()
    with pytest.raises(statekeel.PayloadTooLarge):
        s.add_message("user", "x" * 2000)
    assert s.messages == []


def test_history_starts_at_a_user_message_in_range() -> None:
    s = new_session()
    s.add_message("user", "q1")
    s.add_message("assistant", None, tool_calls=[{"id": "c1"}])
    s.add_message("tool", "r1", tool_call_id="c1")
    s.add_message("assistant", "a1")
    s.add_message("user", "q2")
    s.add_message("assistant", "a2")
    # A window of 4 starts at the tool result; it must start at the user message instead.
    assert roles(s.history(4)) == ["user", "assistant"]
    assert roles(s.history(500)) == roles(s.messages)


def test_history_without_a_user_message_never_starts_with_an_orphaned_tool_result() -> None:
    s = new_session()
    s.add_message("assistant", None, tool_calls=[{"id": "c1"}, {"id": "c2"}])
    s.add_message("tool", "r1", tool_call_id="c1")
    s.add_message("tool", "r2", tool_call_id="c2")
    s.add_message("assistant", "done")
    assert roles(s.history(3)) == ["assistant"]
    assert roles(s.history(4)) == ["assistant", "tool", "tool", "assistant"]


def test_history_of_only_tool_results_is_empty() -> None:
    s = new_session()
    s.messages.append({"role": "tool", "tool_call_id": "c1", "content": "r1"})  # as stored, call archived
    assert s.history() == []


def test_a_tool_result_for_a_call_the_session_never_made_is_refused_and_nothing_added() -> None:
    s = new_session()
    with pytest.raises(statekeel.UnknownToolCall):
        s.add_message("tool", "r1", tool_call_id="c1")
    assert s.messages == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_history_rejects_a_bad_max_messages(bad: Any) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        new_session().history(bad)


def test_a_result_the_transcript_does_not_expect_is_kept_as_it_is_when_not_strict() -> None:
    session = new_session()
    orphan = {"type": "function_call_output", "call_id": "elsewhere", "output": "42"}
    with pytest.raises(statekeel.UnknownToolCall):
        session.add_item(orphan)
    assert session.messages == []
    assert session.add_item(orphan, strict=False) == orphan
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}
    session.add_item(call)
    session.add_item({"type": "function_call_output", "call_id": "c1", "output": "3"})
    again = {"type": "function_call_output", "call_id": "c1", "output": "3 again"}
    with pytest.raises(statekeel.ToolCallAlreadyAnswered):
        session.add_item(again)
    session.add_item(again, strict=False)
    assert [m.get("output") for m in session.messages] == ["42", None, "3", "3 again"]
    assert session.pending_calls() == []
    with pytest.raises(statekeel.InvalidArgument, match="strict"):
        session.add_item(again, strict="no")  # type: ignore[arg-type]
    with pytest.raises(statekeel.InvalidArgument):
        session.add_item({"content": "no role"}, strict=False)  # still a message, or refused
