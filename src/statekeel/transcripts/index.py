"""The transcript as a whole: which calls have their results, and the repair of those that do not."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import (
    InvalidArgument,
    ToolCallAlreadyAnswered,
    TranscriptError,
    UnknownToolCall,
)
from ..validation import check_int, check_text
from .messages import (
    BLANK_SCREENSHOT,
    INTERRUPTED_TEXT,
    RESPONSES_ANSWER,
    RESPONSES_ANSWERS,
    Dialect,
    Parsed,
    Repair,
    ToolCall,
    ToolResult,
    TranscriptState,
    fail,
    parse_message,
)

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

    parsed: Parsed
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
        self._calls: dict[_Key, ToolCall] = {}  # the latest call of each id
        self._all_calls: list[ToolCall] = []
        # The calls that have their result, by id and the index of the message that made them.
        self._answered_at: set[tuple[Dialect, str, int]] = set()
        self._answered: dict[_Key, ToolResult] = {}
        self._unanswered: dict[_Key, ToolCall] = {}
        self._abandoned_at: dict[_Key, int] = {}
        # The first result stored out of place after each unanswered call (by the message number).
        self._late: dict[_Key, int] = {}
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
        p = parse_message(message, i, strict)
        if not p.calls and not p.results and not p.malformed:
            return self._plain_step(p, i)
        new_calls: list[ToolCall] = []
        fresh: set[_Key] = set()
        for call in p.calls:
            key = (call.dialect, call.call_id)
            # An id may come again once its earlier call has its result (some providers reuse ids from
            # one turn to the next): the new call is then the one a result with that id answers.
            if key in self._unanswered or key in fresh:
                fail(
                    p,
                    f"messages[{i}] makes tool call {call.call_id!r}, the id of an earlier call of this "
                    "transcript that has no result yet; each waiting call needs its own id",
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
            if key in self._answered or key in answered_here or self._late_key(key):
                where = self._answered[key].index if key in self._answered else self._late.get(key, i)
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
                if made.kind not in RESPONSES_ANSWERS[result.kind]:
                    error = UnknownToolCall(
                        f"messages[{i}] is a {result.kind} for call {result.call_id!r}, but that call is a "
                        f"{made.kind}; answer it with a {RESPONSES_ANSWER[made.kind]} item",
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

    def _plain_step(self, p: Parsed, i: int) -> _Step:
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
            self._all_calls.append(call)
            self._answered.pop(key, None)  # a reused id: the new call waits for its own result
            self._abandoned_at.pop(key, None)
            self._late.pop(key, None)
            self._unanswered[key] = call
        for result in step.answers:
            key = (result.dialect, result.call_id)
            self._answered[key] = result
            if result.call_index is not None:
                self._answered_at.add((result.dialect, result.call_id, result.call_index))
            self._unanswered.pop(key, None)
            self._abandoned_at.pop(key, None)
            self._results.append(result)
        for result in step.orphans:
            self._orphans.append(result)
            self._results.append(result)
            key = (result.dialect, result.call_id)
            if key in self._unanswered and self._unanswered[key].index < result.index:
                self._late.setdefault(key, result.index)
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
            calls=tuple(self._all_calls),
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

    def _late_key(self, key: _Key) -> bool:
        # A chat or Anthropic call of a turn that other messages followed, with a result stored after them.
        return key in self._late and key in self._abandoned_at and key[0] is not Dialect.OPENAI_RESPONSES

    def answered_late(self, call: ToolCall) -> bool:
        """Whether ``call``, of a turn that other messages followed, has a result stored after them (out
        of place): ``safe_window`` leaves both out, :meth:`repair` moves the result where the provider
        wants it. A second result for it is refused (``ToolCallAlreadyAnswered``)."""
        key = (call.dialect, call.call_id)
        return self._unanswered.get(key) is call and self._late_key(key)

    def outstanding(self) -> tuple[ToolCall, ...]:
        """The calls no stored result answers yet, even out of place, oldest first: :meth:`awaiting`, and
        the calls of a chat or Anthropic turn that other messages followed (a user message appended after a
        crash) until a result for them is stored. A session row counts these as waiting (``open_calls``)."""
        return tuple(c for k, c in self._unanswered.items() if not self._late_key(k))

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
        return (call.dialect, call.call_id, call.index) in self._answered_at

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
        # A call whose real result was stored out of place (after other messages) gets that result moved
        # where its provider wants it, never an interrupted answer beside it.
        moved: list[tuple[int, int, str]] = []
        for call in calls:
            answer = interrupted_answer(call, text)
            at = self._abandoned_at.get((call.dialect, call.call_id))
            if self._late_key((call.dialect, call.call_id)):
                assert at is not None
                moved.append((self._late[(call.dialect, call.call_id)], at, call.call_id))
                continue
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
        return Repair(
            calls=calls, append=tuple(append), insert=insert, offset=self._offset, moved=tuple(moved)
        )


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
    kind = RESPONSES_ANSWER[call.kind]
    item: dict[str, Any] = {"type": kind, "call_id": call.call_id}
    if kind == "computer_call_output":
        item["output"] = {"type": "computer_screenshot", "image_url": BLANK_SCREENSHOT}
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
    kind = RESPONSES_ANSWER[call.kind]
    item: dict[str, Any] = {"type": kind, "call_id": call.call_id, "output": output}
    if call.caller is not None and kind != "computer_call_output" and call.kind != "local_shell_call":
        item["caller"] = call.caller
    return item
