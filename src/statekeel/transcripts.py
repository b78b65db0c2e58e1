"""Tool calls and their results in a transcript, in each provider's own format.

A transcript is the list of messages (or items) an agent sends to its model. Three formats ("dialects")
are understood, told apart message by message:

- **OpenAI chat** (``Dialect.OPENAI_CHAT``): an assistant message's ``tool_calls`` (each with an ``id``),
  answered by ``{"role": "tool", "tool_call_id": id, "content": ...}`` messages. The API wants the answers
  right after the assistant message that made the calls: only tool messages may come between it and the
  last of them.
- **OpenAI Responses** (``Dialect.OPENAI_RESPONSES``): items without a role. ``function_call``,
  ``custom_tool_call``, ``computer_call``, ``local_shell_call``, ``shell_call``, ``apply_patch_call`` and a
  ``tool_search_call`` executed by the client carry a ``call_id``, answered by the matching ``*_output``
  item with the same ``call_id`` anywhere after it (a ``local_shell_call`` also by a
  ``function_call_output``, which is how the reference client answers it).
- **Anthropic messages** (``Dialect.ANTHROPIC``): ``tool_use`` blocks (``id``) in an assistant message's
  ``content``, answered by ``tool_result`` blocks (``tool_use_id``) in the *next user turn* — consecutive
  messages of one role form one turn — and before any other block of that turn.

A transcript is **consistent** when every call has exactly one result, placed where its provider accepts
it, and every result answers a call. After a crash between "the model asked for a tool" and "its result was
appended" a call has no result, and every later request to the provider fails. :func:`plan_repair` answers
each such call with an explicit *interrupted* result in its own dialect's shape
(:func:`interrupted_answer`):

- chat: a ``tool`` message, appended after the calls' assistant message and the tool messages that follow
  it;
- Responses: a ``*_output`` item with ``call_id``, appended at the end (the API pairs by ``call_id``);
- Anthropic: one user message of ``tool_result`` blocks with ``is_error: true``, appended when the calls'
  turn is the last one (the API merges it into the user turn that already holds some of their results).

A call whose turn was already followed by other messages (a user message added after a crash without a
repair) cannot be answered by appending: the repair then *inserts* its result where the provider looks for
it (``Repair.insert``), which a stored, append-only history can only apply to the view it hands out.
The interrupted results carry no field of statekeel's own: providers refuse unknown fields.

:func:`safe_window` is the rule of ``Session.history(max_messages)``: a contiguous run of at most
``max_messages`` messages that never starts with a result whose call is outside it and never holds a call
without its result — calls still awaiting theirs (the last turn's) are left out until they have one.

    from statekeel.transcripts import plan_repair

    repair = plan_repair(messages)
    messages.extend(repair.append)      # every call now has exactly one result
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeGuard, TypeVar

from .errors import (
    InvalidArgument,
    SerializationError,
    ToolCallAlreadyAnswered,
    TranscriptError,
    UnknownToolCall,
)
from .validation import check_int, check_text

_M = TypeVar("_M", bound=Mapping[str, Any])

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

    def __bool__(self) -> bool:
        return bool(self.calls)

    def apply(self, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The repaired transcript: ``messages`` with the inserted and appended results (a new list)."""
        if not self.insert:
            return [*messages, *self.append]
        out: list[Mapping[str, Any]] = []
        pending = iter(self.insert)
        nxt = next(pending, None)
        for i, message in enumerate(messages):
            while nxt is not None and nxt[0] - self.offset == i:
                out.append(nxt[1])
                nxt = next(pending, None)
            out.append(message)
        while nxt is not None:  # positions at the end of the list
            out.append(nxt[1])
            nxt = next(pending, None)
        out.extend(self.append)
        return out


# --- the Responses item types that are tool calls a client answers ---------------------------------------

# call item type -> the output item type an interrupted answer uses
_RESPONSES_ANSWER = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "function_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
}
# output item type -> the call item types it answers
_RESPONSES_ANSWERS = {
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


_BLANK_SCREENSHOT = _blank_png_data_url()


# --- reading one message ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Parsed:
    index: int
    strict: bool  # raise on what cannot be read (a message being added), or mark it (a stored one)
    role: str | None
    calls: list[ToolCall]
    # (result, leading): an Anthropic tool_result block counts only before every other block of its message
    results: list[tuple[ToolResult, bool]]
    user_start: bool  # a user message that starts a turn (holds no tool results)
    only_results: bool  # an Anthropic user message whose content is tool_result blocks only
    malformed: bool = False


def _fail(parsed: _Parsed, message: str, **fields: Any) -> None:
    if parsed.strict:
        raise TranscriptError(message, **fields)
    parsed.malformed = True


def _valid_id(value: Any) -> TypeGuard[str]:
    return type(value) is str and value != ""


def _checked_id(p: _Parsed, value: Any, dialect: Dialect, what: str, wanted: str) -> str | None:
    """``value`` if it is a usable call id; otherwise the error (strict) or a malformed mark."""
    if _valid_id(value):
        return value
    what = what.format(where=f"messages[{p.index}]")  # built only here: this runs for every message
    _fail(p, f"{what} is {value!r}; it must be {wanted}", call_id=value, dialect=dialect.value, index=p.index)
    return None


def _parse(message: Mapping[str, Any], i: int, strict: bool) -> _Parsed:
    role = message.get("role")
    role = role if type(role) is str else None
    kind = message.get("type")
    kind = kind if type(kind) is str else None
    p = _Parsed(i, strict, role=role, calls=[], results=[], user_start=False, only_results=False)
    client_side = message.get("execution") == "client"

    if kind in _RESPONSES_ANSWER and (kind not in _CLIENT_ONLY or client_side):
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
    if kind in _RESPONSES_ANSWERS and (kind not in _CLIENT_ONLY or client_side):
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


def _parse_chat_calls(tool_calls: Any, p: _Parsed) -> None:
    i = p.index
    if type(tool_calls) is not list:
        _fail(
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


def _parse_blocks(content: list[Any], p: _Parsed) -> None:
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
            _fail(
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
        _fail(
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
    p = _parse(message, 0, strict=False)
    for call in p.calls:
        return call.dialect
    for result, _ in p.results:
        return result.dialect
    kind = message.get("type")
    return Dialect.OPENAI_RESPONSES if type(kind) is str and kind else None


# --- the transcript as a whole ---------------------------------------------------------------------------

_Key = tuple[Dialect, str]
# Shared by the steps of messages without tool calls or results: never changed.
_NO_CALLS: list[ToolCall] = []
_NO_RESULTS: list[ToolResult] = []
# Where an Anthropic transcript stands: outside a tool turn, in an assistant turn, in the user turn after
# it while only tool results have come, or past the point where a result may still come.
_NONE, _ASSISTANT, _RESULTS = 0, 1, 2


def _keys(calls: list[ToolCall], dialect: Dialect) -> list[_Key]:
    return [(c.dialect, c.call_id) for c in calls if c.dialect is dialect]


@dataclass(slots=True)
class _Step:
    """What one message changes, computed before anything changes (so a refused message changes nothing)."""

    parsed: _Parsed
    index: int
    new_calls: list[ToolCall]
    answers: list[ToolResult]
    orphans: list[ToolResult]
    abandoned: list[_Key]
    chat_open: list[_Key] | None
    chat_from: int
    anth_state: int
    anth_open: list[_Key]
    anth_from: int


class TranscriptIndex:
    """The tool calls and results of a transcript, kept up to date one message at a time.

    Built from stored messages it accepts anything and records what is wrong (``state()``); :meth:`check`
    and :meth:`add` refuse a message that would make the transcript inconsistent, with a typed error and
    without changing the index. Messages are numbered from ``offset`` (a session's sequence numbers).

        index = TranscriptIndex(session.messages)
        index.check(message)   # UnknownToolCall, ToolCallAlreadyAnswered, TranscriptError
    """

    def __init__(
        self, messages: Iterable[Mapping[str, Any]] = (), *, offset: int = 0, strict: bool = False
    ) -> None:
        check_int(offset, "offset")
        self._offset = offset
        self._count = 0
        self._calls: dict[_Key, ToolCall] = {}
        self._answered: dict[_Key, ToolResult] = {}
        self._unanswered: dict[_Key, ToolCall] = {}
        self._abandoned_at: dict[_Key, int] = {}
        self._results: list[ToolResult] = []
        self._orphans: list[ToolResult] = []
        self._malformed: list[int] = []
        self._chat_open: list[_Key] | None = None
        self._chat_from = 0
        self._anth_state = _NONE
        self._anth_open: list[_Key] = []
        self._anth_from = 0
        self._last_user_start = -1
        for message in messages:
            self._commit(self._step(message, strict))

    def __len__(self) -> int:
        return self._count

    @property
    def next_index(self) -> int:
        """The number the next added message gets."""
        return self._offset + self._count

    def check(self, message: Mapping[str, Any]) -> None:
        """Raise the typed error adding ``message`` would be (nothing changes either way)."""
        self._step(message, strict=True)

    def add(self, message: Mapping[str, Any]) -> None:
        """Check ``message`` and account for it."""
        self._commit(self._step(message, strict=True))

    def add_stored(self, message: Mapping[str, Any]) -> None:
        """Account for a message that is already stored, whatever it holds (problems go to ``state()``)."""
        self._commit(self._step(message, strict=False))

    def _step(self, message: Mapping[str, Any], strict: bool) -> _Step:
        if type(message) is not dict and not isinstance(message, Mapping):
            raise InvalidArgument(
                f"messages[{self.next_index}] must be a dict, got {type(message).__name__}; "
                "use normalize_item() for pydantic models"
            )
        i = self.next_index
        p = _parse(message, i, strict)
        if not p.calls and not p.results and not p.malformed:
            return self._plain_step(p, i)
        new_calls: list[ToolCall] = []
        fresh: set[_Key] = set()
        for call in p.calls:
            key = (call.dialect, call.call_id)
            if key in self._calls or key in fresh:
                _fail(
                    p,
                    f"messages[{i}] makes tool call {call.call_id!r}, an id an earlier call of this "
                    "transcript already has; each call needs its own id",
                    call_id=call.call_id,
                    dialect=call.dialect.value,
                    index=i,
                )
                continue
            fresh.add(key)
            new_calls.append(call)

        answers: list[ToolResult] = []
        orphans: list[ToolResult] = []
        answered_here: set[_Key] = set()
        anth_may_answer = p.role == "user" and self._anth_state in (_ASSISTANT, _RESULTS)
        for result, leading in p.results:
            key = (result.dialect, result.call_id)
            made = self._calls.get(key)
            error: TranscriptError | None = None
            fields = {"call_id": result.call_id, "dialect": result.dialect.value, "index": i}
            if key in self._answered or key in answered_here:
                where = self._answered[key].index if key in self._answered else i
                error = ToolCallAlreadyAnswered(
                    f"messages[{i}] answers tool call {result.call_id!r}, which messages[{where}] already "
                    "answered; a call gets exactly one result",
                    **fields,
                )
            elif made is None:
                error = UnknownToolCall(
                    f"messages[{i}] answers tool call {result.call_id!r}, but no earlier "
                    f"{result.dialect.value} message makes a call with that id; answer the ids the "
                    "model's calls carry",
                    **fields,
                )
            elif result.dialect is Dialect.OPENAI_RESPONSES:
                if made.kind not in _RESPONSES_ANSWERS[result.kind]:
                    error = UnknownToolCall(
                        f"messages[{i}] is a {result.kind} for call {result.call_id!r}, but that call is a "
                        f"{made.kind}; answer it with a {_RESPONSES_ANSWER[made.kind]} item",
                        **fields,
                    )
            elif result.dialect is Dialect.OPENAI_CHAT:
                if self._chat_open is None or key not in self._chat_open:
                    error = TranscriptError(
                        f"messages[{i}] answers tool call {result.call_id!r} of messages[{made.index}], but "
                        "other messages came in between; OpenAI chat takes tool results only right after "
                        "the assistant message that made the calls",
                        **fields,
                    )
            elif not (anth_may_answer and leading and key in self._anth_open):
                error = TranscriptError(
                    f"messages[{i}] answers tool_use {result.call_id!r} of messages[{made.index}] out of "
                    "place; Anthropic takes tool_result blocks only in the user turn right after the "
                    "assistant turn that made the calls, before any other block",
                    **fields,
                )
            if error is not None:
                if strict:
                    raise error
                orphans.append(result)
                continue
            assert made is not None  # every branch above that leaves ``error`` None found the call
            answered_here.add(key)
            answers.append(ToolResult(result.call_id, result.dialect, result.kind, i, made.index))

        abandoned: list[_Key] = []
        # OpenAI chat: only tool messages may follow the assistant message with the calls.
        chat_open = self._chat_open
        chat_from = self._chat_from
        chat_calls: list[_Key] = [
            (c.dialect, c.call_id) for c in new_calls if c.dialect is Dialect.OPENAI_CHAT
        ]
        if p.role == "tool":
            if chat_open is not None:
                chat_open = [k for k in chat_open if k not in answered_here]
        else:
            if chat_open:
                abandoned.extend(chat_open)
            chat_open, chat_from = (chat_calls, i) if chat_calls else (None, chat_from)

        # Anthropic: turns are runs of one role; results go first in the user turn after the calls.
        anth_state, anth_open, anth_from = self._anth_state, self._anth_open, self._anth_from
        anth_calls = _keys(new_calls, Dialect.ANTHROPIC)
        if p.role == "assistant":
            if anth_state == _ASSISTANT:
                anth_open = anth_open + anth_calls
            else:
                abandoned.extend(anth_open)
                anth_state, anth_open, anth_from = _ASSISTANT, anth_calls, i
        elif p.role == "user" and anth_state in (_ASSISTANT, _RESULTS):
            anth_open = [k for k in anth_open if k not in answered_here]
            if p.only_results:
                anth_state = _RESULTS
            else:
                abandoned.extend(anth_open)
                anth_state, anth_open = _NONE, []
        elif p.role != "user":
            abandoned.extend(anth_open)
            anth_state, anth_open = _NONE, []

        return _Step(
            p,
            i,
            new_calls,
            answers,
            orphans,
            abandoned,
            chat_open,
            chat_from,
            anth_state,
            anth_open,
            anth_from,
        )

    def _plain_step(self, p: _Parsed, i: int) -> _Step:
        """What a message without tool calls or results changes: the general rules of :meth:`_step`
        with nothing to add or answer (most messages; this is their fast path)."""
        abandoned: list[_Key] = []
        if self._chat_open:  # only tool messages may follow a chat message's calls
            abandoned.extend(self._chat_open)
        anth_state, anth_open, anth_from = self._anth_state, self._anth_open, self._anth_from
        if p.role == "assistant":
            if anth_state != _ASSISTANT:
                abandoned.extend(anth_open)
                anth_state, anth_open, anth_from = _ASSISTANT, [], i
        elif p.role != "user" or anth_state in (_ASSISTANT, _RESULTS):
            # A user message without results closes the turn after the calls; any other role too.
            abandoned.extend(anth_open)
            anth_state, anth_open = _NONE, []
        return _Step(
            p,
            i,
            _NO_CALLS,
            _NO_RESULTS,
            _NO_RESULTS,
            abandoned,
            None,
            self._chat_from,
            anth_state,
            anth_open,
            anth_from,
        )

    def _commit(self, step: _Step) -> None:
        self._count += 1
        for call in step.new_calls:
            key = (call.dialect, call.call_id)
            self._calls[key] = call
            self._unanswered[key] = call
        for result in step.answers:
            key = (result.dialect, result.call_id)
            self._answered[key] = result
            self._unanswered.pop(key, None)
            self._abandoned_at.pop(key, None)
            self._results.append(result)
        for result in step.orphans:
            self._orphans.append(result)
            self._results.append(result)
        if step.parsed.malformed:
            self._malformed.append(step.index)
        for key in step.abandoned:
            if key in self._unanswered:
                self._abandoned_at[key] = step.index
        self._chat_open, self._chat_from = step.chat_open, step.chat_from
        self._anth_state, self._anth_open, self._anth_from = step.anth_state, step.anth_open, step.anth_from
        if step.parsed.user_start:
            self._last_user_start = step.index

    def _pending(self) -> tuple[list[ToolCall], int | None]:
        pending: list[ToolCall] = []
        starts: list[int] = []
        if self._chat_open:
            pending.extend(self._unanswered[k] for k in self._chat_open)
            starts.append(self._chat_from)
        if self._anth_open:
            pending.extend(self._unanswered[k] for k in self._anth_open)
            starts.append(self._anth_from)
        responses = [
            c
            for c in self._unanswered.values()
            if c.dialect is Dialect.OPENAI_RESPONSES and c.index > self._last_user_start
        ]
        if responses:
            pending.extend(responses)
            starts.append(responses[0].index)
        pending.sort(key=lambda c: c.index)
        return pending, min(starts, default=None)

    def state(self) -> TranscriptState:
        """A snapshot of the calls, results and problems found so far."""
        pending, pending_from = self._pending()
        return TranscriptState(
            calls=tuple(self._calls.values()),
            results=tuple(self._results),
            unanswered=tuple(self._unanswered.values()),
            pending=tuple(pending),
            orphans=tuple(self._orphans),
            malformed=tuple(self._malformed),
            pending_from=pending_from,
        )

    @property
    def unanswered(self) -> tuple[ToolCall, ...]:
        """The calls without a result, oldest first."""
        return tuple(self._unanswered.values())

    def awaiting(self) -> tuple[ToolCall, ...]:
        """The calls without a result that appending one still answers, oldest first: every unanswered
        call but those of a chat or Anthropic turn that other messages followed."""
        return tuple(
            c
            for k, c in self._unanswered.items()
            if c.dialect is Dialect.OPENAI_RESPONSES or k not in self._abandoned_at
        )

    def call(self, call_id: str) -> ToolCall | None:
        """The call with this id (when two formats used it, the one still without a result)."""
        found = None
        for dialect in Dialect:
            key = (dialect, call_id)
            if key in self._unanswered:
                return self._unanswered[key]
            found = found or self._calls.get(key)
        return found

    def answered(self, call: ToolCall) -> bool:
        """Whether ``call`` has its result."""
        return (call.dialect, call.call_id) in self._answered

    def repair(self, text: str = INTERRUPTED_TEXT, *, only: Iterable[str] | None = None) -> Repair:
        """The interrupted results that answer every unanswered call (see :func:`plan_repair`), or only
        those whose ids are in ``only``."""
        check_text(text, "text")
        calls = tuple(self._unanswered.values())
        if only is not None:
            wanted = set(only)
            calls = tuple(c for c in calls if c.call_id in wanted)
        append: list[dict[str, Any]] = []
        anthropic_append: dict[str, Any] | None = None
        inserts: dict[int, list[dict[str, Any]]] = {}
        anthropic_inserts: dict[int, dict[str, Any]] = {}
        for call in calls:
            answer = interrupted_answer(call, text)
            at = self._abandoned_at.get((call.dialect, call.call_id))
            if call.dialect is Dialect.OPENAI_RESPONSES or at is None:
                if call.dialect is not Dialect.ANTHROPIC:
                    append.append(answer)
                elif anthropic_append is None:
                    anthropic_append = {"role": "user", "content": [answer]}
                    append.append(anthropic_append)
                else:
                    anthropic_append["content"].append(answer)
            elif call.dialect is Dialect.ANTHROPIC:
                if at in anthropic_inserts:
                    anthropic_inserts[at]["content"].append(answer)
                else:
                    anthropic_inserts[at] = {"role": "user", "content": [answer]}
                    inserts.setdefault(at, []).append(anthropic_inserts[at])
            else:
                inserts.setdefault(at, []).append(answer)
        insert = tuple((at, message) for at in sorted(inserts) for message in inserts[at])
        return Repair(calls=calls, append=tuple(append), insert=insert, offset=self._offset)


def analyze(messages: Iterable[Mapping[str, Any]]) -> TranscriptState:
    """The tool calls, results, unanswered calls and problems of a transcript (it is not changed)."""
    return TranscriptIndex(messages).state()


def plan_repair(messages: Iterable[Mapping[str, Any]], text: str = INTERRUPTED_TEXT) -> Repair:
    """What makes every tool call of ``messages`` have exactly one result: an explicit interrupted answer,
    in its call's dialect, for each call without one. ``Repair.apply(messages)`` is the repaired transcript;
    when ``Repair.insert`` is empty, appending ``Repair.append`` is enough. A repaired transcript plans an
    empty repair. Results that answer no call are not removed (``analyze().orphans``)."""
    return TranscriptIndex(messages).repair(text)


def interrupted_answer(call: ToolCall, text: str = INTERRUPTED_TEXT) -> dict[str, Any]:
    """The result that tells the model ``call`` was interrupted, in the call's own dialect: a chat
    ``tool`` message, a Responses output item, or an Anthropic ``tool_result`` block (``is_error``; it goes
    in a user message's content)."""
    check_text(text, "text")
    if call.dialect is Dialect.OPENAI_CHAT:
        return {"role": "tool", "tool_call_id": call.call_id, "content": text}
    if call.dialect is Dialect.ANTHROPIC:
        return {"type": "tool_result", "tool_use_id": call.call_id, "content": text, "is_error": True}
    kind = _RESPONSES_ANSWER[call.kind]
    item: dict[str, Any] = {"type": kind, "call_id": call.call_id}
    if kind == "computer_call_output":
        item["output"] = {"type": "computer_screenshot", "image_url": _BLANK_SCREENSHOT}
    elif kind == "shell_call_output":
        item["output"] = [{"stdout": "", "stderr": text, "outcome": {"type": "exit", "exit_code": 1}}]
        item["status"] = "incomplete"
    elif kind == "apply_patch_call_output":
        item["status"] = "failed"
        item["output"] = text
    elif kind == "tool_search_output":
        item.update(execution="client", tools=[], status="incomplete")
    else:
        item["output"] = text
    if call.caller is not None and kind != "computer_call_output" and call.kind != "local_shell_call":
        item["caller"] = call.caller
    return item


def tool_result(call: ToolCall, output: Any) -> dict[str, Any]:
    """The message that answers ``call`` with ``output``, in the call's own dialect: a chat ``tool``
    message, a Responses ``*_output`` item, or an Anthropic user message holding one ``tool_result`` block.

    ``output`` is the result's content: a str, or a list of content parts as the provider takes them.

        tool_result(call, "3 passed")  # {"role": "tool", "tool_call_id": ..., "content": "3 passed"}
    """
    if call.dialect is Dialect.OPENAI_CHAT:
        return {"role": "tool", "tool_call_id": call.call_id, "content": output}
    if call.dialect is Dialect.ANTHROPIC:
        block = {"type": "tool_result", "tool_use_id": call.call_id, "content": output}
        return {"role": "user", "content": [block]}
    kind = _RESPONSES_ANSWER[call.kind]
    item: dict[str, Any] = {"type": kind, "call_id": call.call_id, "output": output}
    if call.caller is not None and kind != "computer_call_output" and call.kind != "local_shell_call":
        item["caller"] = call.caller
    return item


# --- the window history() hands out ----------------------------------------------------------------------


def _is_reasoning(message: Mapping[str, Any]) -> bool:
    return message.get("type") == "reasoning" and "role" not in message


def safe_window(messages: Sequence[_M], max_messages: int) -> list[_M]:
    """The last messages (at most ``max_messages``, in order, contiguous) that a provider accepts as they are.

    - It ends before the calls still awaiting their results (the last turn's, or a Responses call after
      the last user message), and never with a Responses ``reasoning`` item (it goes with the item after it).
    - It starts at the first user message (one that holds no tool results) from which the rest is
      consistent; without one, at the first message from which it is — never with a result whose call is
      cut off, nor right after a ``reasoning`` item.
    - Calls without a result, results that answer no call, and unreadable tool messages are never inside:
      it starts after the last of them.
    """
    check_int(max_messages, "max_messages", minimum=1)
    lo = max(0, len(messages) - max_messages)
    window = list(messages[lo:])
    state = TranscriptIndex(window).state()
    end = len(window) if state.pending_from is None else state.pending_from
    while end > 0 and _is_reasoning(window[end - 1]):
        end -= 1

    bad = set(state.malformed)
    bad.update(r.index for r in state.orphans)
    bad.update(c.index for c in state.unanswered if c.index < end)
    needs: dict[int, int] = {}  # message number -> the earliest call it answers
    for r in state.results:
        if r.call_index is None:
            continue
        if r.index >= end:
            bad.add(r.call_index)  # the answer is cut off: the call cannot be in the window either
        else:
            needs[r.index] = min(needs.get(r.index, r.call_index), r.call_index)

    def first_valid(start: int) -> int:
        s = start
        for i in range(start, end):
            if i in bad or needs.get(i, s) < s:
                s = i + 1
        return s

    def user_start_from(start: int) -> int | None:
        for j in range(start, end):
            m = window[j]
            if m.get("role") == "user" and m.get("type") in (None, "message") and not _has_results(m):
                return j
        return None

    s = first_valid(0)
    j = s
    while (u := user_start_from(j)) is not None:
        v = first_valid(u)
        if v == u:
            return window[u:end]
        j = v
    while s < end and lo + s > 0 and _is_reasoning(messages[lo + s - 1]):
        s = first_valid(s + 1)
    return window[s:end]


def _has_results(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return type(content) is list and any(type(b) is dict and b.get("type") == "tool_result" for b in content)


# --- items from provider SDKs ----------------------------------------------------------------------------

_MAX_NESTING = 64


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _dump(value: Any, depth: int) -> Any:
    if type(value) in _LEAVES:  # most of a message: nothing to look up
        return value
    dump = getattr(value, "model_dump", None)
    if dump is not None and callable(dump) and not isinstance(value, type):
        try:
            # As the SDKs' own to_dict(): the fields the API sent or the caller set, by their API names.
            return dump(mode="json", by_alias=True, exclude_unset=True)
        except Exception as exc:
            raise SerializationError(
                f"{type(value).__name__}.model_dump(mode='json') failed: {exc}", type=type(value).__name__
            ) from exc
    if depth >= _MAX_NESTING:
        return value  # the codec refuses what is nested too deep, with its path
    if type(value) is dict:
        out: dict[Any, Any] | None = None
        for k, v in value.items():
            new = _dump(v, depth + 1)
            if new is not v:
                out = dict(value) if out is None else out
                out[k] = new
        return value if out is None else out
    if type(value) is list:
        items: list[Any] | None = None
        for n, v in enumerate(value):
            new = _dump(v, depth + 1)
            if new is not v:
                items = list(value) if items is None else items
                items[n] = new
        return value if items is None else items
    return value


def role_of(message: Any) -> str | None:
    """What a stored message's role is: its non-empty str ``role``, or for an item without one (OpenAI
    Responses) its non-empty str ``type``; None for anything else, which is not a message."""
    if type(message) is not dict:
        return None
    role = message.get("role")
    if _valid_id(role):
        return role
    kind = message.get("type")
    return kind if role is None and _valid_id(kind) else None


def normalize_item(item: Any) -> dict[str, Any]:
    """A message or provider item as the plain dict statekeel stores.

    Pydantic models (anything with ``model_dump(mode="json")``: the OpenAI and Anthropic SDKs' messages,
    output items and content blocks), also nested in a dict's values or a list, become their JSON dump — the
    fields the API sent or the caller set — so that validating the stored dict gives back an equal model.
    A dict is returned as it is unless it holds such models. The result must have a non-empty str ``role``
    (chat and Anthropic messages) or ``type`` (Responses items, which have no role).

        item = normalize_item(response.output[0])   # {"type": "function_call", "call_id": ..., ...}
    """
    value = _dump(item, 0)
    if type(value) is not dict:
        raise InvalidArgument(
            f"a message must be a dict or a pydantic model, got {type(item).__name__}",
            type=type(item).__name__,
        )
    role, kind = value.get("role"), value.get("type")
    if not _valid_id(role) and not _valid_id(kind):
        raise InvalidArgument(
            "a message needs a non-empty str 'role' (chat and Anthropic messages) or 'type' (Responses "
            f"items); got role={role!r}, type={kind!r}"
        )
    return value


__all__ = [
    "INTERRUPTED_TEXT",
    "Dialect",
    "Repair",
    "ToolCall",
    "ToolResult",
    "TranscriptIndex",
    "TranscriptState",
    "analyze",
    "dialect_of",
    "interrupted_answer",
    "normalize_item",
    "plan_repair",
    "role_of",
    "safe_window",
    "tool_result",
]
