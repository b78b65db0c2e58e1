"""A transcript shows each tool call with its result, paired as ``statekeel.transcripts`` pairs them in
the three formats agents store; it marks calls left without a result and results that answer no call, and
folds compressed messages under their summary."""

from __future__ import annotations

import json

from statekeel.transcripts import INTERRUPTED_TEXT
from statekeel.ui.transcript import Entry, Fold, build_transcript


def entries(view: object) -> list[Entry]:
    items = view.items  # type: ignore[attr-defined]
    return [e for item in items for e in (item.entries if isinstance(item, Fold) else [item])]


def test_openai_chat_calls_are_paired_with_tool_messages_by_id() -> None:
    view = build_transcript(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}},
                    {"id": "b", "type": "function", "function": {"name": "cat", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "b", "content": "body"},
            {"role": "tool", "tool_call_id": "a", "content": "x y"},
        ]
    )
    calls = [p.call for p in entries(view)[1].parts if p.kind == "call"]
    assert [(c.name, c.arguments, c.result.content, c.result.seq) for c in calls] == [
        ("ls", {"p": "."}, "x y", 3),
        ("cat", "not json", "body", 2),
    ]
    assert view.calls == 2 and view.dangling == [] and view.orphans == []
    ref = entries(view)[2].parts[0]
    assert ref.kind == "result" and ref.result.call is calls[1]


def test_openai_responses_items_are_paired_by_call_id() -> None:
    view = build_transcript(
        [
            {"type": "function_call", "call_id": "fc1", "name": "weather", "arguments": json.dumps({"c": 1})},
            {"type": "function_call_output", "call_id": "fc1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        ]
    )
    first, second, third = entries(view)
    call = first.parts[0].call
    assert (first.role, call.name, call.arguments, call.style) == (
        "function_call",
        "weather",
        {"c": 1},
        "openai-responses",
    )
    assert call.result is second.parts[0].result and call.result.content == "sunny"
    assert (third.role, third.parts[0].kind, third.parts[0].text) == ("assistant", "text", "ok")


def test_anthropic_tool_use_blocks_are_paired_with_tool_result_blocks() -> None:
    view = build_transcript(
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "reading"},
                    {"type": "tool_use", "id": "tu1", "name": "read", "input": {"path": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu1",
                        "content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "and go on"},
                ],
            },
        ]
    )
    call = entries(view)[0].parts[1].call
    assert (call.name, call.arguments, call.style) == ("read", {"path": "a"}, "anthropic")
    assert call.result is not None and call.result.content == "line 1\nline 2" and call.result.is_error
    assert [p.kind for p in entries(view)[1].parts] == ["result", "text"]


def test_a_call_without_a_result_is_dangling_and_a_result_without_a_call_an_orphan() -> None:
    view = build_transcript(
        [
            {"role": "tool", "tool_call_id": "early", "content": "before its call"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "early", "name": "x"}]},
            {"role": "user", "content": "go on"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "last", "name": "y"}]},
        ],
        first_seq=10,
    )
    assert [(c.call_id, c.seq, c.state) for c in view.dangling] == [
        ("early", 11, "dangling"),  # its turn moved on without it
        ("last", 13, "pending"),  # the last turn: its agent may still answer it
    ]
    assert [(r.call_id, r.seq, r.call, r.problem) for r in view.orphans] == [
        ("early", 10, None, "no call with this id comes before it")
    ]


def test_a_second_result_or_one_out_of_place_answers_no_call() -> None:
    view = build_transcript(
        [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c", "content": "first"},
            {"role": "tool", "tool_call_id": "c", "content": "second"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "d", "type": "function"}]},
            {"role": "user", "content": "meanwhile"},
            {"role": "tool", "tool_call_id": "d", "content": "too late"},
        ]
    )
    first = entries(view)[0].parts[0].call
    assert first.state == "answered" and first.result.content == "first"
    assert [(r.content, r.problem) for r in view.orphans] == [
        ("second", "its call already has a result"),
        ("too late", "it is not where its provider takes the result of that call"),
    ]
    assert [c.call_id for c in view.dangling] == ["d"]


def test_results_recovery_wrote_for_interrupted_calls_are_flagged_in_every_format() -> None:
    text = INTERRUPTED_TEXT
    view = build_transcript(
        [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c", "content": text},
            {"type": "function_call", "call_id": "f", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "f", "output": text},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "r", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": text, "is_error": True}],
            },
        ]
    )
    results = [p.call.result for e in entries(view) for p in e.parts if p.kind == "call"]
    assert [(r.interrupted, r.seq) for r in results] == [(True, 1), (True, 3), (True, 5)]
    assert view.dangling == [] and view.orphans == []


def test_unreadable_tool_calls_are_reported_with_their_message() -> None:
    view = build_transcript([{"role": "assistant", "content": None, "tool_calls": "not a list"}], first_seq=3)
    assert view.malformed == [3]


def test_compressed_messages_are_folded_under_their_summary_and_pairing_crosses_the_fold() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "name": "run"}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"},
        {"role": "assistant", "content": "b"},
    ]
    view = build_transcript(messages, summaries=[("z1", 0, 2, "asked and called")])
    fold, after_tool, after_answer = view.items
    assert isinstance(fold, Fold) and (fold.summary, [e.seq for e in fold.entries]) == (
        "asked and called",
        [0, 1],
    )
    assert isinstance(after_tool, Entry) and after_tool.seq == 2 and after_answer.seq == 3
    assert fold.entries[1].parts[0].call.result.content == "done"


def test_a_compression_whose_messages_were_not_loaded_is_an_empty_fold() -> None:
    view = build_transcript([{"role": "user", "content": "late"}], first_seq=4, summaries=[("z", 0, 4, "s")])
    fold, entry = view.items
    assert isinstance(fold, Fold) and fold.entries == [] and entry.seq == 4


def test_unknown_shapes_are_kept_as_values_and_extra_fields_listed() -> None:
    view = build_transcript(
        [
            {"role": "assistant", "content": {"weird": 1}, "name": "bot", "x-trace": "t1"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
            "not a dict",
        ]
    )
    first, second, third = entries(view)
    assert first.parts[0].kind == "json" and first.parts[0].value == {"weird": 1}
    assert first.fields == {"name": "bot", "x-trace": "t1"}
    assert second.role == "reasoning" and second.fields == {
        "summary": [{"type": "summary_text", "text": "hmm"}]
    }
    assert third.parts[0].value == "not a dict"
