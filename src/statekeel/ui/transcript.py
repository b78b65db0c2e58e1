"""A session's messages as a transcript to show: each tool call paired with its result.

Three shapes of tool call are understood, as agents store them:

- OpenAI chat: an assistant message's ``tool_calls`` (``{"id", "function": {"name", "arguments"}}``),
  answered by ``{"role": "tool", "tool_call_id": ...}``;
- OpenAI Responses items: ``{"type": "function_call", "call_id", "name", "arguments"}`` (and the other
  ``*_call`` items) answered by ``{"type": "function_call_output", "call_id", "output"}``;
- Anthropic: ``{"type": "tool_use", "id", "name", "input"}`` content blocks, answered by
  ``{"type": "tool_result", "tool_use_id", "content", "is_error"}`` blocks.

A result is paired with the latest earlier call of its id that has no result yet. A call left without a
result is *dangling*; a result with no call before it is an *orphan*. Messages that compression moved to
the archive are grouped under their summary (:class:`Fold`).

    view = build_transcript(loaded.messages, first_seq=loaded.first_seq, summaries=loaded.summaries)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

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
    """A tool call and, once paired, its result. ``arguments`` is parsed when it is a JSON string."""

    call_id: str | None
    name: str
    arguments: Any
    style: str  # "openai-chat", "openai-responses" or "anthropic"
    seq: int
    result: ToolResult | None = None


@dataclasses.dataclass(slots=True, eq=False)
class ToolResult:
    """A tool result; ``call`` is None for an orphan, ``duplicate`` when its call already had one."""

    call_id: str | None
    content: Any
    is_error: bool
    interrupted: bool
    seq: int
    call: ToolCall | None = None
    duplicate: bool = False


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


class _Pairing:
    """Builds parts message by message, pairing results with the calls before them."""

    def __init__(self) -> None:
        self.open: dict[str, ToolCall] = {}
        self.calls: list[ToolCall] = []
        self.orphans: list[ToolResult] = []

    def call(self, call: ToolCall) -> Part:
        self.calls.append(call)
        if call.call_id is not None:
            self.open[call.call_id] = call  # a later call with the same id takes over its answers
        return Part("call", call=call)

    def result(
        self, call_id: Any, content: Any, seq: int, *, is_error: bool = False, interrupted: bool = False
    ) -> Part:
        cid = call_id if isinstance(call_id, str) else None
        result = ToolResult(cid, _result_text(content), bool(is_error), bool(interrupted), seq)
        call = self.open.get(cid) if cid is not None else None
        if call is None:
            self.orphans.append(result)
        elif call.result is None:
            call.result = result
            result.call = call
        else:
            result.call = call
            result.duplicate = True
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
    pairing = _Pairing()
    entries = [pairing.message(m, first_seq + i) for i, m in enumerate(messages)]
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
    dangling = [c for c in pairing.calls if c.result is None]
    return Transcript(items, len(pairing.calls), dangling, pairing.orphans)


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
