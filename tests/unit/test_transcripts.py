"""Transcript dialects: tool calls, their results, the interrupted repair and the LLM-safe window.

Every repaired transcript is checked twice, without network: against the providers' own type definitions
(the ``openai`` and ``anthropic`` packages' TypedDicts, validated by pydantic with unknown keys refused), and
against the pairing rules each API enforces, written here independently of the module.
"""

from __future__ import annotations

import itertools
from typing import Any

import anthropic.types as anthropic_types
import openai.types.chat as chat_types
import openai.types.responses as responses_types
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statekeel
from helpers import (
    ANTHROPIC,
    CHAT,
    RESPONSES,
    RESPONSES_KINDS,
    Message,
    assert_accepted,
    assistant,
    chat_calls,
    chat_result,
    responses_call,
    responses_output,
    tool_results,
    tool_use,
    type_errors,
    user,
)
from statekeel.codec import Codec
from statekeel.transcripts import (
    INTERRUPTED_TEXT,
    Dialect,
    ToolCall,
    TranscriptIndex,
    analyze,
    dialect_of,
    interrupted_answer,
    normalize_item,
    plan_repair,
    safe_window,
)


def reasoning(n: int) -> Message:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": []}


@st.composite
def transcripts(draw: st.DrawFn, dialect: Dialect) -> list[Message]:
    """A consistent transcript: user turns, each with zero or more tool rounds and a final answer."""
    ids = (f"call_{n}" for n in itertools.count())
    messages: list[Message] = []
    for _ in range(draw(st.integers(1, 4))):
        messages.append(user())
        for _ in range(draw(st.integers(0, 3))):
            calls = [next(ids) for _ in range(draw(st.integers(1, 3)))]
            order = draw(st.permutations(calls))
            if dialect is CHAT:
                messages.append(chat_calls(*calls))
                messages.extend(chat_result(c) for c in order)
            elif dialect is RESPONSES:
                kinds = {c: draw(st.sampled_from(RESPONSES_KINDS)) for c in calls}
                if draw(st.booleans()):
                    messages.append(reasoning(len(messages)))
                messages.extend(responses_call(kinds[c], c) for c in calls)
                messages.extend(
                    responses_output(kinds[c], c, legacy_local_shell=draw(st.booleans())) for c in order
                )
            else:
                if draw(st.booleans()):  # the turn split over two assistant messages
                    messages.append(assistant("let me look"))
                messages.append(tool_use(*calls, text=draw(st.sampled_from([None, "calling"]))))
                cut = draw(st.integers(1, len(order)))  # results over one or two user messages
                parts = [order[:cut], order[cut:]] if cut < len(order) else [order]
                for n, part in enumerate(parts):
                    last = n == len(parts) - 1
                    messages.append(
                        tool_results(*part, text="and go on" if last and draw(st.booleans()) else None)
                    )
        messages.append(assistant())
    return messages


DIALECTS = [CHAT, RESPONSES, ANTHROPIC]
# No example database: the suite writes nothing into the working tree.
PROPERTY = settings(max_examples=60, deadline=None, database=None)


def over_dialects(test: Any) -> Any:
    """A property test run for each dialect, drawing its examples from ``data``."""
    return pytest.mark.parametrize("dialect", DIALECTS)(PROPERTY(given(data=st.data())(test)))


# --- properties over every dialect -------------------------------------------------------------------------


@over_dialects
def test_generated_transcripts_are_consistent_for_the_module_and_the_provider(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    messages = data.draw(transcripts(dialect))
    assert analyze(messages).consistent
    assert not plan_repair(messages)
    assert_accepted(provider_types, dialect, messages, window=True)


@over_dialects
def test_a_transcript_cut_anywhere_is_repaired_by_appending_into_one_the_provider_accepts(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    messages = data.draw(transcripts(dialect))
    cut = data.draw(st.integers(0, len(messages)))
    prefix = messages[:cut]
    repair = plan_repair(prefix)
    assert repair.insert == ()  # a crash only ever leaves the last turn open
    repaired = prefix + list(repair.append)
    assert repair.apply(prefix) == repaired
    assert_accepted(provider_types, dialect, repaired)
    assert analyze(repaired).consistent
    assert not plan_repair(repaired)  # idempotent: a second pass finds nothing
    assert {c.call_id for c in repair.calls} == {c.call_id for c in analyze(prefix).unanswered}


@over_dialects
def test_a_turn_abandoned_after_a_crash_is_repaired_by_inserting_its_results_where_the_provider_wants_them(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    messages = data.draw(transcripts(dialect))
    prefix = messages[: data.draw(st.integers(0, len(messages)))]
    continued = [*prefix, user("are you there?"), assistant("yes")]  # resumed without a repair
    repaired = plan_repair(continued).apply(continued)
    assert_accepted(provider_types, dialect, repaired)
    assert analyze(repaired).consistent


@st.composite
def damaged(draw: st.DrawFn, dialect: Dialect) -> list[Message]:
    """A transcript cut anywhere, resumed or not, with stray results and unreadable messages mixed in."""
    messages = draw(transcripts(dialect))
    messages = messages[: draw(st.integers(0, len(messages)))]
    if draw(st.booleans()):
        messages += [user("again"), assistant("ok")]
    strays = {
        CHAT: [chat_result("nobody"), {"role": "tool", "content": "no id"}, chat_calls("call_0")],
        RESPONSES: [responses_output("function_call", "nobody"), {"type": "function_call", "name": "x"}],
        ANTHROPIC: [
            tool_results("nobody"),
            tool_results("call_0", text="x"),
            {"role": "user", "content": [{"type": "tool_result"}]},
        ],
    }[dialect]
    for stray in draw(st.lists(st.sampled_from(strays), max_size=3)):
        messages.insert(draw(st.integers(0, len(messages))), stray)
    return messages


@over_dialects
def test_the_history_window_is_in_tail_order_and_the_provider_accepts_it_whatever_the_transcript(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    messages = data.draw(damaged(dialect))
    limit = data.draw(st.integers(1, len(messages) + 2))
    window = safe_window(messages, limit)
    assert len(window) <= limit
    # Each message of the window is, in order, a stored one of the last ``limit`` — as it is, or a copy
    # with a call that never got its result (or its result out of place) left out.
    tail = iter(messages[max(0, len(messages) - limit) :])
    for m in window:
        assert any(m is stored or _part_of(m, stored) for stored in tail)
    assert_accepted(provider_types, dialect, window, window=True)


def _part_of(message: Message, stored: Message) -> bool:
    """Whether ``message`` is ``stored`` with some of its tool calls or results left out."""
    if message.get("role") != stored.get("role") or not set(message) <= set(stored):
        return False
    for field in ("tool_calls", "content"):
        part, whole = message.get(field), stored.get(field)
        if type(part) is list and type(whole) is list:
            if not all(any(p is w for w in whole) for p in part):
                return False
        elif field in message and part != whole:
            return False
    return True


@over_dialects
def test_the_history_window_of_a_consistent_transcript_is_all_of_it_from_a_user_message(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    messages = data.draw(transcripts(dialect))
    assert safe_window(messages, len(messages)) == messages
    limit = data.draw(st.integers(1, len(messages)))
    window = safe_window(messages, limit)
    users = [i for i in range(len(messages) - limit, len(messages)) if messages[i] == user()]
    if users:  # the existing rule: start at the first user message in range
        assert window == messages[users[0] :]


@over_dialects
def test_the_index_built_one_message_at_a_time_agrees_with_the_whole_transcript(
    dialect: Dialect, data: st.DataObject
) -> None:
    messages = data.draw(transcripts(dialect))
    messages = messages[: data.draw(st.integers(0, len(messages)))]
    index = TranscriptIndex()
    for m in messages:
        index.check(m)
        index.add(m)
    assert index.state() == analyze(messages)
    assert len(index) == len(messages)


# --- the crash points of an agent loop, one example per dialect --------------------------------------------


def test_chat_call_without_result_gets_an_interrupted_tool_message(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    messages = [user(), chat_calls("a", "b"), chat_result("a")]
    repair = plan_repair(messages)
    assert [c.call_id for c in repair.calls] == ["b"]
    assert repair.append == ({"role": "tool", "tool_call_id": "b", "content": INTERRUPTED_TEXT},)
    assert_accepted(provider_types, CHAT, repair.apply(messages))


def test_chat_calls_followed_by_a_user_message_get_their_results_inserted_before_it(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    messages = [user(), chat_calls("a", "b"), chat_result("a"), user("still there?")]
    repair = plan_repair(messages)
    assert repair.append == ()
    assert repair.insert == ((3, {"role": "tool", "tool_call_id": "b", "content": INTERRUPTED_TEXT}),)
    repaired = repair.apply(messages)
    assert [m["role"] for m in repaired] == ["user", "assistant", "tool", "tool", "user"]
    assert_accepted(provider_types, CHAT, repaired)


def test_a_chat_result_stored_after_a_user_message_is_moved_before_it_not_answered_twice(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    real = chat_result("a")
    messages = [user(), chat_calls("a", "b"), user("still there?"), real, assistant()]
    repair = plan_repair(messages)
    repaired = repair.apply(messages)
    interrupted = {"role": "tool", "tool_call_id": "b", "content": INTERRUPTED_TEXT}
    assert repaired == [user(), chat_calls("a", "b"), real, interrupted, user("still there?"), assistant()]
    assert analyze(repaired).consistent  # each call exactly one result: its real one where there is one
    assert_accepted(provider_types, CHAT, repaired)
    assert messages[3] is real and len(messages) == 5  # the stored list is not changed


def test_an_anthropic_result_stored_after_a_text_block_is_moved_first_in_the_turn_not_answered_twice(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    real = tool_results("t1")["content"][0]
    late = {"role": "user", "content": [{"type": "text", "text": "and?"}, real]}
    messages = [user(), tool_use("t1", "t2"), late, assistant()]
    repaired = plan_repair(messages).apply(messages)
    interrupted = {"type": "tool_result", "tool_use_id": "t2", "content": INTERRUPTED_TEXT, "is_error": True}
    assert repaired == [
        user(),
        tool_use("t1", "t2"),
        {"role": "user", "content": [real]},
        {"role": "user", "content": [interrupted]},
        {"role": "user", "content": [{"type": "text", "text": "and?"}]},
        assistant(),
    ]
    assert analyze(repaired).consistent
    assert_accepted(provider_types, ANTHROPIC, repaired)
    assert late["content"] == [{"type": "text", "text": "and?"}, real]  # not changed in place


def test_anthropic_calls_without_results_get_one_user_message_of_error_results(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    messages = [user(), tool_use("t1", "t2", text="checking")]
    repair = plan_repair(messages)
    block = {"type": "tool_result", "tool_use_id": "t1", "content": INTERRUPTED_TEXT, "is_error": True}
    assert repair.append == ({"role": "user", "content": [block, {**block, "tool_use_id": "t2"}]},)
    assert_accepted(provider_types, ANTHROPIC, repair.apply(messages))


def test_anthropic_partial_results_are_completed_by_a_user_message_the_api_merges_into_the_same_turn(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    messages = [user(), tool_use("t1", "t2"), tool_results("t1")]
    repair = plan_repair(messages)
    assert repair.insert == () and len(repair.append) == 1
    assert_accepted(provider_types, ANTHROPIC, repair.apply(messages))


def test_anthropic_results_go_before_a_text_block_that_closed_their_turn(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    messages = [user(), tool_use("t1", "t2"), tool_results("t1", text="also, hurry")]
    repair = plan_repair(messages)
    assert repair.append == () and [at for at, _ in repair.insert] == [2]
    assert_accepted(provider_types, ANTHROPIC, repair.apply(messages))


@pytest.mark.parametrize("kind", RESPONSES_KINDS)
def test_every_responses_call_kind_gets_an_output_its_type_definition_accepts(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]], kind: str
) -> None:
    messages = [user(), responses_call(kind, "c1")]
    repair = plan_repair(messages)
    (answer,) = repair.append
    assert answer["call_id"] == "c1"
    assert_accepted(provider_types, RESPONSES, repair.apply(messages))


def test_responses_interrupted_outputs_carry_the_text_where_the_item_has_a_text() -> None:
    def answer(kind: str) -> Message:
        return plan_repair([responses_call(kind, "c")]).append[0]

    assert answer("function_call") == {
        "type": "function_call_output",
        "call_id": "c",
        "output": INTERRUPTED_TEXT,
    }
    assert answer("custom_tool_call")["output"] == INTERRUPTED_TEXT
    assert answer("local_shell_call") == {
        "type": "function_call_output",
        "call_id": "c",
        "output": INTERRUPTED_TEXT,
    }
    assert answer("apply_patch_call") == {
        "type": "apply_patch_call_output",
        "call_id": "c",
        "status": "failed",
        "output": INTERRUPTED_TEXT,
    }
    assert answer("shell_call")["output"][0]["stderr"] == INTERRUPTED_TEXT
    assert answer("computer_call")["output"]["image_url"].startswith("data:image/png;base64,")


def test_a_responses_call_made_by_a_program_gets_an_output_naming_the_same_caller(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    call = {**responses_call("function_call", "c"), "caller": {"type": "program", "caller_id": "p1"}}
    (answer,) = plan_repair([call]).append
    assert answer["caller"] == {"type": "program", "caller_id": "p1"}
    assert_accepted(provider_types, RESPONSES, [user(), call, answer])


def test_responses_calls_before_a_later_user_message_are_answered_at_the_end(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    messages = [user(), responses_call("function_call", "a"), user("next"), assistant()]
    repair = plan_repair(messages)
    assert repair.insert == () and [m["call_id"] for m in repair.append] == ["a"]
    assert_accepted(provider_types, RESPONSES, repair.apply(messages))


def test_server_side_tool_search_is_not_a_call_the_client_answers() -> None:
    server = {"type": "tool_search_call", "call_id": "s", "arguments": {}, "execution": "server"}
    assert analyze([user(), server]).calls == ()


def test_the_repair_text_can_be_chosen_and_must_be_text() -> None:
    (answer,) = plan_repair([chat_calls("a")], text="cancelled by operator").append
    assert answer["content"] == "cancelled by operator"
    with pytest.raises(statekeel.InvalidArgument):
        plan_repair([chat_calls("a")], text="")


def test_interrupted_answers_have_each_dialects_shape() -> None:
    def call(dialect: Dialect, kind: str) -> ToolCall:
        return ToolCall("x", dialect, kind, None, 0)

    assert interrupted_answer(call(CHAT, "function")) == {
        "role": "tool",
        "tool_call_id": "x",
        "content": INTERRUPTED_TEXT,
    }
    assert interrupted_answer(call(ANTHROPIC, "tool_use")) == {
        "type": "tool_result",
        "tool_use_id": "x",
        "content": INTERRUPTED_TEXT,
        "is_error": True,
    }
    assert interrupted_answer(call(RESPONSES, "function_call")) == {
        "type": "function_call_output",
        "call_id": "x",
        "output": INTERRUPTED_TEXT,
    }


def test_a_repair_with_an_offset_applies_to_a_session_numbered_list() -> None:
    messages = [chat_calls("a"), user("?")]
    repair = TranscriptIndex(messages, offset=100).repair()
    assert repair.insert[0][0] == 101
    assert [m["role"] for m in repair.apply(messages)] == ["assistant", "tool", "user"]


# --- detection ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "dialect"),
    [
        (chat_calls("a"), CHAT),
        (chat_result("a"), CHAT),
        (responses_call("function_call", "a"), RESPONSES),
        (responses_output("computer_call", "a"), RESPONSES),
        (reasoning(1), RESPONSES),
        ({"type": "message", "role": "user", "content": "hi"}, RESPONSES),
        (tool_use("a"), ANTHROPIC),
        (tool_results("a"), ANTHROPIC),
        (user(), None),
        (assistant(), None),
        ({"role": "user", "content": [{"type": "text", "text": "hi"}]}, None),
    ],
)
def test_each_message_is_told_apart_by_its_own_shape(message: Message, dialect: Dialect | None) -> None:
    assert dialect_of(message) is dialect


# --- bad input: typed errors, nothing changed --------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "message", "error", "call_id"),
    [
        ([], chat_calls(""), statekeel.TranscriptError, ""),
        ([], {"role": "assistant", "tool_calls": [{"type": "function"}]}, statekeel.TranscriptError, None),
        ([], {"role": "assistant", "tool_calls": "a"}, statekeel.TranscriptError, None),
        ([], tool_use(""), statekeel.TranscriptError, ""),
        ([], responses_call("function_call", ""), statekeel.TranscriptError, ""),
        ([chat_calls("a")], {"role": "tool", "content": "x"}, statekeel.TranscriptError, None),
        ([chat_calls("a")], chat_result(""), statekeel.TranscriptError, ""),
        (
            [tool_use("a")],
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5}]},
            statekeel.TranscriptError,
            5,
        ),
        (
            [],
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]},
            statekeel.TranscriptError,
            None,
        ),
        ([chat_calls("a")], chat_result("b"), statekeel.UnknownToolCall, "b"),
        ([tool_use("a")], tool_results("b"), statekeel.UnknownToolCall, "b"),
        (
            [responses_call("function_call", "a")],
            responses_output("function_call", "b"),
            statekeel.UnknownToolCall,
            "b",
        ),
        (
            [chat_calls("a")],
            {"type": "function_call_output", "call_id": "a", "output": "x"},
            statekeel.UnknownToolCall,
            "a",
        ),
        (
            [responses_call("computer_call", "a")],
            responses_output("function_call", "a"),
            statekeel.UnknownToolCall,
            "a",
        ),
        ([chat_calls("a"), chat_result("a")], chat_result("a"), statekeel.ToolCallAlreadyAnswered, "a"),
        ([tool_use("a", "b")], tool_results("a", "a"), statekeel.ToolCallAlreadyAnswered, "a"),
        (
            [responses_call("shell_call", "a"), responses_output("shell_call", "a")],
            responses_output("shell_call", "a"),
            statekeel.ToolCallAlreadyAnswered,
            "a",
        ),
        ([chat_calls("a")], chat_calls("a"), statekeel.TranscriptError, "a"),
        ([], chat_calls("a", "a"), statekeel.TranscriptError, "a"),
        ([chat_calls("a"), user()], chat_result("a"), statekeel.TranscriptError, "a"),
        ([tool_use("a"), tool_results(text="first")], tool_results("a"), statekeel.TranscriptError, "a"),
        (
            [tool_use("a")],
            {
                "role": "user",
                "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "a"}],
            },
            statekeel.TranscriptError,
            "a",
        ),
    ],
)
def test_a_message_that_breaks_the_pairing_is_refused_with_a_typed_error_and_changes_nothing(
    history: list[Message], message: Message, error: type[statekeel.TranscriptError], call_id: Any
) -> None:
    index = TranscriptIndex(history, strict=True)
    before = index.state()
    with pytest.raises(error) as info:
        index.add(message)
    assert type(info.value) is error
    assert isinstance(info.value, statekeel.InvalidArgument)
    assert info.value.call_id == call_id
    assert index.state() == before and len(index) == len(history)


def test_stored_messages_that_break_the_pairing_are_accounted_for_without_raising() -> None:
    messages = [chat_result("ghost"), chat_calls("a"), user(), chat_result("a"), {"role": "tool"}]
    state = analyze(messages)
    assert [r.call_id for r in state.orphans] == ["ghost", "a"]
    assert [c.call_id for c in state.unanswered] == ["a"]
    assert state.malformed == (4,)
    assert not state.consistent
    with pytest.raises(statekeel.UnknownToolCall):
        TranscriptIndex(messages, strict=True)


def test_stored_messages_added_one_by_one_are_accounted_for_like_a_whole_list() -> None:
    messages = [chat_calls("a"), user(), chat_result("a"), {"role": "tool"}]
    index = TranscriptIndex(offset=7)
    for m in messages:
        index.add_stored(m)
    assert index.next_index == 11
    assert index.state() == TranscriptIndex(messages, offset=7).state()
    assert [c.index for c in index.unanswered] == [7]
    assert index.state().malformed == (10,)


def test_a_message_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(statekeel.InvalidArgument):
        TranscriptIndex().add(["role", "user"])


# --- the history window, by example ------------------------------------------------------------------------


def test_history_leaves_out_the_calls_still_waiting_for_their_results() -> None:
    messages = [user(), assistant("thinking"), chat_calls("a", "b"), chat_result("a")]
    assert safe_window(messages, 10) == messages[:2]
    anthropic = [user(), assistant("let me look"), tool_use("t"), tool_results()]
    assert safe_window(anthropic[:3], 10) == [user()]  # the whole open turn, both its messages


def test_history_never_starts_with_a_result_whose_call_is_cut_off() -> None:
    messages = [chat_calls("a", "b"), chat_result("a"), chat_result("b"), assistant("done")]
    assert safe_window(messages, 2) == [assistant("done")]
    anthropic = [tool_use("t"), tool_results("t", text="more"), assistant()]
    assert safe_window(anthropic, 2) == [assistant()]


def test_history_leaves_out_only_a_call_that_never_got_its_result_and_keeps_the_turns_before_it(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    before = [user("1"), assistant("one"), user("2"), assistant("two")]
    messages = [*before, chat_calls("a"), user("3"), assistant("b")]
    assert safe_window(messages, 10) == [*before, user("3"), assistant("b")]
    # The call's message keeps what else it holds: its text, and its calls that were answered.
    said = {**chat_calls("a", "b"), "content": "let me run both"}
    messages = [*before, said, chat_result("b"), user("3")]
    kept = {**chat_calls("b"), "content": "let me run both"}
    assert safe_window(messages, 10) == [*before, kept, chat_result("b"), user("3")]
    assert_accepted(provider_types, CHAT, safe_window(messages, 10), window=True)
    anthropic = [*before, tool_use("t", text="looking"), user("3"), assistant("b")]
    window = safe_window(anthropic, 10)
    assert window == [
        *before,
        {"role": "assistant", "content": [{"type": "text", "text": "looking"}]},
        user("3"),
        assistant("b"),
    ]
    assert_accepted(provider_types, ANTHROPIC, window, window=True)
    items = [*before, reasoning(1), responses_call("function_call", "c"), user("3"), assistant("b")]
    assert safe_window(items, 10) == [*before, user("3"), assistant("b")]  # its reasoning goes with it
    assert messages[4] == said  # the stored messages are not changed


def test_history_leaves_out_a_call_whose_result_is_stored_out_of_place_never_answering_it_twice(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    before = [user("1"), assistant("one")]
    messages = [*before, chat_calls("a"), user("2"), chat_result("a"), assistant("b")]
    window = safe_window(messages, 10)
    assert window == [*before, user("2"), assistant("b")]
    assert_accepted(provider_types, CHAT, window, window=True)
    # Anthropic: a tool_result after a text block of the user turn is out of place.
    out_of_place = {
        "role": "user",
        "content": [{"type": "text", "text": "and?"}, *tool_results("t")["content"]],
    }
    anthropic = [*before, tool_use("t"), out_of_place, assistant("b")]
    window = safe_window(anthropic, 10)
    assert window == [
        *before,
        {"role": "user", "content": [{"type": "text", "text": "and?"}]},
        assistant("b"),
    ]
    assert_accepted(provider_types, ANTHROPIC, window, window=True)


def test_history_never_ends_with_or_starts_right_after_a_reasoning_item() -> None:
    items = [user(), assistant("a"), reasoning(1), responses_call("function_call", "c")]
    assert safe_window(items, 10) == items[:2]
    items = [
        reasoning(1),
        responses_call("function_call", "c"),
        responses_output("function_call", "c"),
        assistant(),
    ]
    assert safe_window(items, 3) == [assistant()]


def test_history_refuses_a_window_size_that_is_not_a_positive_int() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(statekeel.InvalidArgument):
            safe_window([user()], bad)


# --- provider SDK objects ----------------------------------------------------------------------------------


def test_an_openai_responses_output_item_is_stored_as_its_json_and_round_trips(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    item = responses_types.ResponseFunctionToolCall(
        type="function_call", call_id="c1", name="run", arguments='{"x": 1}', id="fc_1", status="completed"
    )
    stored = normalize_item(item)
    assert stored == {
        "type": "function_call",
        "call_id": "c1",
        "name": "run",
        "arguments": '{"x": 1}',
        "id": "fc_1",
        "status": "completed",
    }
    codec = Codec()
    assert codec.decode(codec.encode(stored)) == stored
    assert responses_types.ResponseFunctionToolCall.model_validate(stored) == item
    assert dialect_of(stored) is RESPONSES
    assert type_errors(provider_types, RESPONSES, [stored]) == []


def test_an_item_parsed_from_an_api_response_keeps_exactly_the_fields_the_api_sent() -> None:
    sent = {
        "type": "function_call",
        "call_id": "c1",
        "name": "run",
        "arguments": "{}",
        "id": "fc_1",
        "status": "completed",
    }
    item = responses_types.ResponseFunctionToolCall.model_validate(sent)
    assert normalize_item(item) == sent


def test_an_openai_chat_message_with_tool_calls_is_stored_as_its_json(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    message = chat_types.ChatCompletionMessage(
        role="assistant",
        content=None,
        tool_calls=[
            chat_types.ChatCompletionMessageFunctionToolCall(
                id="call_1", type="function", function={"name": "run", "arguments": "{}"}
            )
        ],
    )
    stored = normalize_item(message)
    assert stored == chat_calls("call_1")
    assert chat_types.ChatCompletionMessage.model_validate(stored) == message
    assert type_errors(provider_types, CHAT, [stored]) == []
    assert [c.call_id for c in analyze([stored]).calls] == ["call_1"]


def test_anthropic_content_blocks_inside_a_message_dict_are_stored_as_their_json(
    provider_types: dict[Dialect, pydantic.TypeAdapter[Any]],
) -> None:
    content = [
        anthropic_types.TextBlock(type="text", text="checking"),
        anthropic_types.ToolUseBlock(type="tool_use", id="toolu_1", name="run", input={"path": "a"}),
    ]
    message = {"role": "assistant", "content": content}
    stored = normalize_item(message)
    assert stored == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "checking"},
            {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {"path": "a"}},
        ],
    }
    assert message["content"] is content  # the caller's dict is not changed
    codec = Codec()
    assert codec.decode(codec.encode(stored)) == stored
    assert [anthropic_types.ToolUseBlock.model_validate(stored["content"][1])] == content[1:]
    assert type_errors(provider_types, ANTHROPIC, [stored]) == []
    assert [c.call_id for c in analyze([stored]).calls] == ["toolu_1"]


def test_a_plain_dict_is_stored_as_it_is() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert normalize_item(message) is message
    item = {"type": "function_call_output", "call_id": "c", "output": "ok"}
    assert normalize_item(item) is item  # Responses items have no role


@pytest.mark.parametrize(
    "item", [None, "hello", ["role", "user"], {}, {"role": ""}, {"type": 3}, {"content": "x"}]
)
def test_an_item_without_a_role_or_type_is_refused(item: Any) -> None:
    with pytest.raises(statekeel.InvalidArgument):
        normalize_item(item)


def test_a_model_whose_dump_fails_is_refused_with_a_serialization_error() -> None:
    class Broken(pydantic.BaseModel):
        role: str = "user"

        def model_dump(self, **kwargs: Any) -> dict[str, Any]:
            raise ValueError("cannot dump")

    with pytest.raises(statekeel.SerializationError) as info:
        normalize_item(Broken())
    assert "cannot dump" in str(info.value)


def test_a_call_id_comes_again_once_its_call_is_answered_and_the_result_answers_the_latest_call() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "add"},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        {"role": "user", "content": "again"},
    ]
    index = TranscriptIndex(items, strict=True)
    index.add({"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"})
    first, second = index.state().calls
    assert (first.index, second.index) == (1, 4)
    assert index.answered(first) and not index.answered(second)
    assert [c.index for c in index.awaiting()] == [4]
    with pytest.raises(statekeel.TranscriptError, match="has no result yet"):
        index.check({"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"})
    index.add({"type": "function_call_output", "call_id": "c1", "output": "3 again"})
    assert index.answered(second) and index.state().orphans == ()
    with pytest.raises(statekeel.ToolCallAlreadyAnswered):
        index.check({"type": "function_call_output", "call_id": "c1", "output": "once more"})
