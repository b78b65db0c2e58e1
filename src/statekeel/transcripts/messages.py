"""The shapes of tool calls and results, and the reading of one message in each dialect."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeGuard

from ..errors import (
    TranscriptError,
)

INTERRUPTED_TEXT = "interrupted: the agent stopped before this tool call returned a result"


class Dialect(StrEnum):
    """A provider's transcript format."""

    OPENAI_CHAT = "openai-chat"
    OPENAI_RESPONSES = "openai-responses"
    ANTHROPIC = "anthropic"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call: ``index`` is the number of the message that makes it; ``kind`` is the chat tool call's
    ``type`` (``function``, ``custom``), the Responses item type, or ``tool_use``."""

    call_id: str
    dialect: Dialect
    kind: str
    name: str | None
    index: int
    # A Responses call made by a program (``caller``) gets an output naming the same caller.
    caller: Any = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One tool result: ``index`` is its message's number, ``call_index`` its call's (None: answers none)."""

    call_id: str
    dialect: Dialect
    kind: str
    index: int
    call_index: int | None = None


@dataclass(frozen=True, slots=True)
class TranscriptState:
    """What :func:`analyze` found.

    ``unanswered`` are calls without a result where their provider accepts it; ``pending`` those of them
    that appending results can still answer in place (the last turn's; every Responses call after the last
    user message), starting at message ``pending_from``. ``orphans`` are results that answer no call, or
    answer one a second time or out of place; ``malformed`` the numbers of messages whose tool calls or
    results cannot be read (no id, wrong types).
    """

    calls: tuple[ToolCall, ...]
    results: tuple[ToolResult, ...]
    unanswered: tuple[ToolCall, ...]
    pending: tuple[ToolCall, ...]
    orphans: tuple[ToolResult, ...]
    malformed: tuple[int, ...]
    pending_from: int | None

    @property
    def consistent(self) -> bool:
        """Every call has exactly one well-placed result and every result answers a call."""
        return not self.unanswered and not self.orphans and not self.malformed


@dataclass(frozen=True, slots=True)
class Repair:
    """The results that answer every unanswered call of a transcript (see :func:`plan_repair`).

    ``append`` goes at the end, in order. ``insert`` holds ``(n, message)`` pairs for calls whose turn
    was followed by other messages: each goes right before message number ``n``. ``offset`` is the number
    of the first message of the list the repair was planned for.
    """

    calls: tuple[ToolCall, ...]
    append: tuple[dict[str, Any], ...]
    insert: tuple[tuple[int, dict[str, Any]], ...] = ()
    offset: int = 0
    # (n, m, call_id): the real result of ``call_id``, stored out of place in message ``n``, goes right
    # before message ``m`` (where its provider wants it) and leaves message ``n``.
    moved: tuple[tuple[int, int, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.calls)

    def apply(self, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The repaired transcript: ``messages`` with the inserted and appended results, and the results
        stored out of place moved where their provider wants them (a new list; ``messages`` and the
        messages in it are not changed). Every call then has exactly one result."""
        if not self.insert and not self.moved:
            return [*messages, *self.append]
        before: dict[int, list[Mapping[str, Any]]] = {}
        taken: dict[int, set[str]] = {}
        for n, m, call_id in self.moved:
            result = _result_of(messages[n - self.offset], call_id)
            before.setdefault(m - self.offset, []).append(result)
            taken.setdefault(n - self.offset, set()).add(call_id)
        for at, answer in self.insert:
            before.setdefault(at - self.offset, []).append(answer)
        out: list[Mapping[str, Any]] = []
        for i, stored in enumerate(messages):
            out.extend(before.pop(i, ()))
            kept = _without_results(stored, taken[i]) if i in taken else stored
            if kept is not None:
                out.append(kept)
        for at in sorted(before):  # positions at the end of the list
            out.extend(before[at])
        out.extend(self.append)
        return out


def _result_of(message: Mapping[str, Any], call_id: str) -> Mapping[str, Any]:
    """The message that holds only ``message``'s result of ``call_id``: a chat tool message is one already;
    an Anthropic ``tool_result`` block goes in a user message of its own."""
    content = message.get("content")
    if message.get("role") == "user" and type(content) is list:
        blocks = [
            b
            for b in content
            if type(b) is dict and b.get("type") == "tool_result" and b.get("tool_use_id") == call_id
        ]
        return {"role": "user", "content": blocks[:1]}
    return message


def _without_results(message: Mapping[str, Any], call_ids: set[str]) -> Mapping[str, Any] | None:
    """``message`` without its results of ``call_ids`` (a copy), or None when nothing else is left."""
    content = message.get("content")
    if message.get("role") == "user" and type(content) is list:
        kept = [
            b
            for b in content
            if not (type(b) is dict and b.get("type") == "tool_result" and b.get("tool_use_id") in call_ids)
        ]
        return {**message, "content": kept} if kept else None
    return None  # a chat tool message is its one result


# --- the Responses item types that are tool calls a client answers ---------------------------------------

# call item type -> the output item type an interrupted answer uses
RESPONSES_ANSWER = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "function_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
}
# output item type -> the call item types it answers
RESPONSES_ANSWERS = {
    "function_call_output": frozenset({"function_call", "local_shell_call"}),
    "custom_tool_call_output": frozenset({"custom_tool_call"}),
    "computer_call_output": frozenset({"computer_call"}),
    "local_shell_call_output": frozenset({"local_shell_call"}),
    "shell_call_output": frozenset({"shell_call"}),
    "apply_patch_call_output": frozenset({"apply_patch_call"}),
    "tool_search_output": frozenset({"tool_search_call"}),
}
# Tool search runs on the server unless the item says otherwise; only a client's search needs an answer.
_CLIENT_ONLY = frozenset({"tool_search_call", "tool_search_output"})


def _blank_png_data_url() -> str:
    """A 1x1 white PNG: the only answer a computer call's output can hold is a screenshot."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)  # 1x1, 8-bit greyscale
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff"))  # filter byte, one white pixel
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


BLANK_SCREENSHOT = _blank_png_data_url()


# --- reading one message ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Parsed:
    """What one message holds for pairing: its role, tool calls and results, and whether it is readable."""

    index: int
    strict: bool  # raise on what cannot be read (a message being added), or mark it (a stored one)
    role: str | None
    calls: list[ToolCall]
    # (result, leading): an Anthropic tool_result block counts only before every other block of its message
    results: list[tuple[ToolResult, bool]]
    user_start: bool  # a user message that starts a turn (holds no tool results)
    only_results: bool  # an Anthropic user message whose content is tool_result blocks only
    malformed: bool = False


def fail(parsed: Parsed, message: str, **fields: Any) -> None:
    """Raise ``TranscriptError`` for a message being added (strict); mark a stored one malformed."""
    if parsed.strict:
        raise TranscriptError(message, **fields)
    parsed.malformed = True


def valid_id(value: Any) -> TypeGuard[str]:
    """Whether ``value`` can be a tool call id: a non-empty str."""
    return type(value) is str and value != ""


def _checked_id(p: Parsed, value: Any, dialect: Dialect, what: str, wanted: str) -> str | None:
    """``value`` if it is a usable call id; otherwise the error (strict) or a malformed mark."""
    if valid_id(value):
        return value
    what = what.format(where=f"messages[{p.index}]")  # built only here: this runs for every message
    fail(p, f"{what} is {value!r}; it must be {wanted}", call_id=value, dialect=dialect.value, index=p.index)
    return None


def parse_message(message: Mapping[str, Any], i: int, strict: bool) -> Parsed:
    """What message ``i`` holds for pairing, in any dialect (see :class:`Parsed`)."""
    role = message.get("role")
    role = role if type(role) is str else None
    kind = message.get("type")
    kind = kind if type(kind) is str else None
    p = Parsed(i, strict, role=role, calls=[], results=[], user_start=False, only_results=False)
    client_side = message.get("execution") == "client"

    if kind in RESPONSES_ANSWER and (kind not in _CLIENT_ONLY or client_side):
        call_id = _checked_id(
            p,
            message.get("call_id"),
            Dialect.OPENAI_RESPONSES,
            f"{{where}} is a {kind} item whose call_id",
            "a non-empty str",
        )
        if call_id is not None:
            name = message.get("name")
            name = name if type(name) is str else None
            caller = message.get("caller")
            p.calls.append(ToolCall(call_id, Dialect.OPENAI_RESPONSES, kind, name, i, caller=caller))
        return p
    if kind in RESPONSES_ANSWERS and (kind not in _CLIENT_ONLY or client_side):
        call_id = message.get("call_id")
        if call_id is None and kind == "local_shell_call_output":
            call_id = message.get("id")  # the type definitions name the call's id ``id`` here
        call_id = _checked_id(
            p,
            call_id,
            Dialect.OPENAI_RESPONSES,
            f"{{where}} is a {kind} item whose call_id",
            "the non-empty call_id of the call it answers",
        )
        if call_id is not None:
            p.results.append((ToolResult(call_id, Dialect.OPENAI_RESPONSES, kind, i), True))
        return p

    if role == "tool":
        call_id = _checked_id(
            p,
            message.get("tool_call_id"),
            Dialect.OPENAI_CHAT,
            "{where} is a tool message whose tool_call_id",
            "the non-empty id of the assistant tool call it answers",
        )
        if call_id is not None:
            p.results.append((ToolResult(call_id, Dialect.OPENAI_CHAT, "tool", i), True))
        return p

    tool_calls = message.get("tool_calls")
    if role == "assistant" and tool_calls is not None:
        _parse_chat_calls(tool_calls, p)

    content = message.get("content")
    if role in ("assistant", "user") and type(content) is list:
        _parse_blocks(content, p)
    p.user_start = role == "user" and not p.results and kind in (None, "message")
    return p


def _parse_chat_calls(tool_calls: Any, p: Parsed) -> None:
    i = p.index
    if type(tool_calls) is not list:
        fail(
            p,
            f"messages[{i}].tool_calls must be a list of tool calls, got {type(tool_calls).__name__}",
            call_id=None,
            dialect=Dialect.OPENAI_CHAT.value,
            index=i,
        )
        return
    for n, entry in enumerate(tool_calls):
        call_id = _checked_id(
            p,
            entry.get("id") if type(entry) is dict else None,
            Dialect.OPENAI_CHAT,
            f"{{where}}.tool_calls[{n}].id",
            "a non-empty str",
        )
        if call_id is None:
            continue
        kind = entry.get("type")
        kind = kind if type(kind) is str else "function"
        detail = entry.get(kind)
        name = detail.get("name") if type(detail) is dict else None
        p.calls.append(ToolCall(call_id, Dialect.OPENAI_CHAT, kind, name if type(name) is str else None, i))


def _parse_blocks(content: list[Any], p: Parsed) -> None:
    i = p.index
    leading = True
    only_results = bool(content)
    chat_calls = bool(p.calls)
    for n, block in enumerate(content):
        kind = block.get("type") if type(block) is dict else None
        if kind == "tool_use" and p.role == "assistant":
            call_id = _checked_id(
                p, block.get("id"), Dialect.ANTHROPIC, f"{{where}}.content[{n}].id", "a non-empty str"
            )
            if call_id is not None:
                name = block.get("name")
                name = name if type(name) is str else None
                p.calls.append(ToolCall(call_id, Dialect.ANTHROPIC, "tool_use", name, i))
            only_results = False
        elif kind == "tool_result" and p.role == "user":
            call_id = _checked_id(
                p,
                block.get("tool_use_id"),
                Dialect.ANTHROPIC,
                f"{{where}}.content[{n}].tool_use_id",
                "the non-empty id of the tool_use block it answers",
            )
            if call_id is not None:
                p.results.append((ToolResult(call_id, Dialect.ANTHROPIC, "tool_result", i), leading))
        elif kind in ("tool_use", "tool_result"):
            fail(
                p,
                f"messages[{i}].content[{n}] is a {kind} block in a {p.role} message; tool_use blocks "
                "belong to assistant messages and tool_result blocks to user messages",
                call_id=None,
                dialect=Dialect.ANTHROPIC.value,
                index=i,
            )
            leading = only_results = False
        else:
            leading = only_results = False
    p.only_results = only_results and p.role == "user"
    if chat_calls and any(c.dialect is Dialect.ANTHROPIC for c in p.calls):
        fail(
            p,
            f"messages[{i}] holds both chat tool_calls and Anthropic tool_use blocks; use one format "
            "per message",
            call_id=None,
            dialect=None,
            index=i,
        )


def dialect_of(message: Mapping[str, Any]) -> Dialect | None:
    """The dialect a message is written in, or None for a plain ``role``/``content`` message that every
    dialect accepts (a user question, an assistant answer without tool calls)."""
    p = parse_message(message, 0, strict=False)
    for call in p.calls:
        return call.dialect
    for result, _ in p.results:
        return result.dialect
    kind = message.get("type")
    return Dialect.OPENAI_RESPONSES if type(kind) is str and kind else None
