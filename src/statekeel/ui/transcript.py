"""A session's messages as a transcript to show: each tool call with its result under it.

Which result answers which call is decided by :mod:`statekeel.transcripts` (the rules the providers
apply: OpenAI chat ``tool_calls`` answered by ``tool`` messages right after them, OpenAI Responses
``*_call`` items answered by their ``*_output`` by ``call_id``, Anthropic ``tool_use`` blocks answered by
``tool_result`` blocks leading the next user turn). This module only extracts what to show: names,
arguments, contents, error flags. A call left without a result is *dangling* (*pending* when it is in
the last turn, where the agent may still answer it); a result that answers no call, answers one a second
time or comes where its provider does not accept it is an *orphan*. Messages that compression moved to
the archive are grouped under their summary (:class:`Fold`).

    view = build_transcript(loaded.messages, first_seq=loaded.first_seq, summaries=loaded.summaries)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from ..transcripts import INTERRUPTED_TEXT, TranscriptIndex, TranscriptState

# Top-level fields the parts of a message show; any other field is listed under "other fields".
_SHOWN = frozenset({"role", "content", "tool_calls", "tool_call_id", "type", "id", "statekeel_interrupted"})
_SHOWN_BY_ITEMS = _SHOWN | {"call_id", "name", "arguments", "input", "action", "output", "status"}
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text", "refusal"})
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking", "reasoning"})


@dataclasses.dataclass(slots=True)
class Part:
    """One thing a message shows, in order.

    ``kind`` is ``text`` (``text``), ``thinking`` (``text``), ``json`` (``value``), ``call`` (``call``)
    or ``result`` (``result``: shown in full only when it is an orphan; else a link to its call).
    """

    kind: str
    text: str = ""
    value: Any = None
    label: str = ""
    call: ToolCall | None = None
    result: ToolResult | None = None


@dataclasses.dataclass(slots=True, eq=False)
class ToolCall:
    """A tool call and, once paired, its result. ``arguments`` is parsed when it is a JSON string.
    ``state`` is ``answered``, ``pending`` (no result yet, in the last turn), ``dangling`` (its turn moved
    on without a result) or ``untracked`` (a call the provider runs itself, such as a web search)."""

    call_id: str | None
    name: str
    arguments: Any
    style: str  # "openai-chat", "openai-responses" or "anthropic"
    seq: int
    result: ToolResult | None = None
    state: str = "untracked"


@dataclasses.dataclass(slots=True, eq=False)
class ToolResult:
    """A tool result; ``call`` is None for an orphan, whose ``problem`` says why it answers nothing."""

    call_id: str | None
    content: Any
    is_error: bool
    interrupted: bool
    seq: int
    call: ToolCall | None = None
    problem: str | None = None


@dataclasses.dataclass(slots=True)
class Entry:
    """One stored message: its sequence number, who it is from, its parts and its other fields."""

    seq: int
    role: str
    parts: list[Part]
    fields: dict[str, Any]


@dataclasses.dataclass(slots=True)
class Fold:
    """Messages ``[first_seq, upto_seq)`` that one compression replaced by ``summary``."""

    compression_id: str
    first_seq: int
    upto_seq: int
    summary: str
    entries: list[Entry]


@dataclasses.dataclass(slots=True)
class Transcript:
    """What the transcript page shows: entries and folds in sequence order, and counts."""

    items: list[Entry | Fold]
    calls: int
    dangling: list[ToolCall]
    orphans: list[ToolResult]
    malformed: list[int]  # seqs of messages whose tool calls or results cannot be read


def _parse_arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw  # not JSON: shown as the text it is
    return raw


def _chat_call(raw: Any, seq: int) -> ToolCall:
    call = raw if isinstance(raw, dict) else {}
    function = call.get("function")
    if isinstance(function, dict):
        name, arguments = function.get("name"), function.get("arguments")
    else:
        name, arguments = call.get("name"), call.get("arguments", call.get("input"))
    call_id = call.get("id")
    return ToolCall(
        call_id=call_id if isinstance(call_id, str) else None,
        name=name if isinstance(name, str) else "(unnamed)",
        arguments=_parse_arguments(arguments),
        style="openai-chat",
        seq=seq,
    )


def _result_text(content: Any) -> Any:
    """A result's content: text blocks joined into one text, anything else as it is."""
    if (
        isinstance(content, list)
        and content
        and all(
            isinstance(b, dict) and b.get("type") in _TEXT_BLOCKS and isinstance(b.get("text"), str)
            for b in content
        )
    ):
        return "\n".join(b["text"] for b in content)
    return content


class _Parts:
    """Builds the parts of each message and collects its calls and results by (seq, call id)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[int, str], ToolCall] = {}
        self.results: dict[tuple[int, str], ToolResult] = {}

    def call(self, call: ToolCall) -> Part:
        if call.call_id is not None:
            self.calls.setdefault((call.seq, call.call_id), call)
        return Part("call", call=call)

    def result(
        self, call_id: Any, content: Any, seq: int, *, is_error: bool = False, interrupted: bool = False
    ) -> Part:
        cid = call_id if isinstance(call_id, str) else None
        text = _result_text(content)
        # recover() answers a call its agent never answered with this text, in the call's own format.
        interrupted = interrupted or text == INTERRUPTED_TEXT
        result = ToolResult(cid, text, bool(is_error), interrupted, seq)
        if cid is not None:
            self.results.setdefault((seq, cid), result)
        return Part("result", result=result)

    def block(self, block: Any, seq: int, interrupted: bool) -> Part:
        if not isinstance(block, dict):
            return Part("text", text=block) if isinstance(block, str) else Part("json", value=block)
        kind = block.get("type")
        if kind in _TEXT_BLOCKS and isinstance(block.get("text"), str):
            return Part("text", text=block["text"], label="" if kind == "text" else str(kind))
        if kind in _THINKING_BLOCKS:
            text = block.get("thinking", block.get("text"))
            if isinstance(text, str):
                return Part("thinking", text=text)
            return Part("json", value=block, label=str(kind))
        if kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            call_id, name = block.get("id"), block.get("name")
            return self.call(
                ToolCall(
                    call_id=call_id if isinstance(call_id, str) else None,
                    name=name if isinstance(name, str) else "(unnamed)",
                    arguments=block.get("input"),
                    style="anthropic",
                    seq=seq,
                )
            )
        if "tool_use_id" in block:
            return self.result(
                block["tool_use_id"],
                block.get("content"),
                seq,
                is_error=block.get("is_error") is True,
                interrupted=interrupted or block.get("statekeel_interrupted") is True,
            )
        return Part("json", value=block, label=str(kind) if isinstance(kind, str) else "")

    def content(self, content: Any, seq: int, interrupted: bool) -> list[Part]:
        if content is None:
            return []
        if isinstance(content, str):
            return [Part("text", text=content)]
        if isinstance(content, list):
            return [self.block(b, seq, interrupted) for b in content]
        return [Part("json", value=content)]

    def message(self, message: Any, seq: int) -> Entry:
        if not isinstance(message, dict):
            return Entry(seq, "?", [Part("json", value=message)], {})
        role = message.get("role")
        kind = message.get("type")
        interrupted = message.get("statekeel_interrupted") is True
        parts: list[Part]
        shown = _SHOWN_BY_ITEMS
        if role == "tool":
            parts = [
                self.result(message.get("tool_call_id"), message.get("content"), seq, interrupted=interrupted)
            ]
        elif isinstance(kind, str) and kind.endswith("_call_output"):
            output = message.get("output")
            parts = [self.result(message.get("call_id"), output, seq, interrupted=interrupted)]
        elif isinstance(kind, str) and kind.endswith("_call") and "call_id" in message:
            name = message.get("name")
            arguments = message.get("arguments", message.get("input", message.get("action")))
            call = ToolCall(
                call_id=message["call_id"] if isinstance(message["call_id"], str) else None,
                name=name if isinstance(name, str) else kind,
                arguments=_parse_arguments(arguments),
                style="openai-responses",
                seq=seq,
            )
            parts = [self.call(call)]
        else:
            shown = _SHOWN
            parts = self.content(message.get("content"), seq, interrupted)
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                parts.extend(self.call(_chat_call(c, seq)) for c in calls)
            elif calls is not None:
                parts.append(Part("json", value=calls, label="tool_calls"))
        fields = {k: v for k, v in message.items() if k not in shown}
        if not isinstance(role, str) or not role:
            role = kind if isinstance(kind, str) and kind else "item"
        return Entry(seq, role, parts, fields)


def build_transcript(
    messages: Sequence[Any],
    *,
    first_seq: int = 0,
    summaries: Sequence[tuple[str, int, int, str]] = (),
) -> Transcript:
    """The transcript of ``messages`` (seq ``first_seq`` onwards), pairing calls and results.

    ``summaries`` are ``(compression_id, first_seq, upto_seq, summary)``: the messages of each range are
    put in a :class:`Fold`; a compression whose messages are not among ``messages`` (loaded without the
    archive) is shown as an empty fold with its summary.
    """
    parts = _Parts()
    entries = [parts.message(m, first_seq + i) for i, m in enumerate(messages)]
    index = TranscriptIndex(offset=first_seq)
    for m in messages:
        index.add_stored(m if isinstance(m, dict) else {})
    state = index.state()
    _link(state, parts)
    dangling = [call for c in state.unanswered if (call := parts.calls.get((c.index, c.call_id))) is not None]
    orphans = [r for o in state.orphans if (r := parts.results.get((o.index, o.call_id))) is not None]
    items: list[Entry | Fold] = []
    i = 0
    for compression_id, start, upto, summary in sorted(summaries, key=lambda s: s[1]):
        while i < len(entries) and entries[i].seq < start:
            items.append(entries[i])
            i += 1
        folded: list[Entry] = []
        while i < len(entries) and entries[i].seq < upto:
            folded.append(entries[i])
            i += 1
        items.append(Fold(compression_id, start, upto, summary, folded))
    items.extend(entries[i:])
    return Transcript(items, len(state.calls), dangling, orphans, list(state.malformed))


def _link(state: TranscriptState, parts: _Parts) -> None:
    """Pair the shown calls and results as :mod:`statekeel.transcripts` paired them."""
    for result in state.results:
        shown = parts.results.get((result.index, result.call_id))
        if shown is None or result.call_index is None:
            continue
        call = parts.calls.get((result.call_index, result.call_id))
        if call is not None:
            call.result, shown.call = shown, call
            call.state = "answered"
    pending = {(c.index, c.call_id) for c in state.pending}
    for c in state.unanswered:
        call = parts.calls.get((c.index, c.call_id))
        if call is not None:
            call.state = "pending" if (c.index, c.call_id) in pending else "dangling"
    made = {(c.dialect, c.call_id): c for c in state.calls}
    answered = {(r.dialect, r.call_id) for r in state.results if r.call_index is not None}
    for o in state.orphans:
        shown = parts.results.get((o.index, o.call_id))
        if shown is None:
            continue
        key = (o.dialect, o.call_id)
        if key not in made or made[key].index > o.index:
            shown.problem = "no call with this id comes before it"
        elif key in answered:
            shown.problem = "its call already has a result"
        else:
            shown.problem = "it is not where its provider takes the result of that call"


def _default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return str(value)


def pretty(value: Any) -> str:
    """``value`` as indented JSON text (types beyond JSON as their ISO or ``str`` form)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=_default)


def compact(value: Any, limit: int = 120) -> str:
    """``value`` as one line of JSON, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=_default, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "Entry",
    "Fold",
    "Part",
    "ToolCall",
    "ToolResult",
    "Transcript",
    "build_transcript",
    "compact",
    "pretty",
]
