"""The window ``Session.history()`` hands out: never a result without its call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..validation import check_int
from .index import TranscriptIndex
from .messages import Dialect

_M = TypeVar("_M", bound=Mapping[str, Any])

# --- the window history() hands out ----------------------------------------------------------------------


def _is_reasoning(message: Mapping[str, Any]) -> bool:
    return message.get("type") == "reasoning" and "role" not in message


def safe_window(messages: Sequence[_M], max_messages: int) -> list[_M]:
    """The last messages (at most ``max_messages``, in order) that a provider accepts as they are.

    - It ends before the calls still awaiting their results (the last turn's, or a Responses call after
      the last user message), and never with a Responses ``reasoning`` item (it goes with the item after it).
    - A call that never got its result where its provider wants it (its turn was followed by other
      messages, say after a crash) is left out of its message, and so is a result of it stored out of
      place: the message keeps its other content and calls (a message left empty, and a ``reasoning`` item
      right before a call item left out, go too). The turns before it stay.
    - It starts at the first user message (one that holds no tool results) from which the rest is
      consistent; without one, at the first message from which it is — never with a result whose call is
      cut off, nor right after a ``reasoning`` item.
    - Results that answer no call (or one a second time) and unreadable tool messages are never inside:
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
    # Calls without their result (their turn was followed by others): left out of their messages, with
    # the first result of each that is stored out of place.
    dropped: dict[tuple[Dialect, str], int] = {}
    drop_calls: dict[int, set[str]] = {}
    for c in state.unanswered:
        if c.index < end:
            dropped[(c.dialect, c.call_id)] = c.index
            drop_calls.setdefault(c.index, set()).add(c.call_id)
    drop_results: dict[int, set[str]] = {}
    for r in state.orphans:
        made = dropped.get((r.dialect, r.call_id))
        if made is not None and made < r.index < end and r.call_id not in drop_results.get(-1 - made, ()):
            drop_results.setdefault(r.index, set()).add(r.call_id)
            drop_results.setdefault(-1 - made, set()).add(r.call_id)  # this call's result is taken
        else:
            bad.add(r.index)
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

    def cut(start: int) -> list[_M]:
        if not drop_calls and not drop_results:
            return window[start:end]
        out: list[_M] = []
        for i in range(start, end):
            m = window[i]
            if i in drop_calls or i in drop_results:
                kept = _without(m, drop_calls.get(i, set()), drop_results.get(i, set()))
                if kept is None:
                    while out and _is_reasoning(out[-1]):
                        out.pop()  # a reasoning item goes with the item after it
                    continue
                m = kept
            out.append(m)
        return out

    s = first_valid(0)
    j = s
    while (u := user_start_from(j)) is not None:
        v = first_valid(u)
        if v == u:
            return cut(u)
        j = v
    while s < end and lo + s > 0 and _is_reasoning(messages[lo + s - 1]):
        s = first_valid(s + 1)
    return cut(s)


def _without(message: _M, calls: set[str], results: set[str]) -> _M | None:
    """``message`` without the tool calls ``calls`` and the tool results ``results`` (a copy; the stored
    message is not changed), or None when nothing else is left of it."""
    if "role" not in message:  # a Responses item is one call or one result
        return None
    if message.get("role") == "tool":  # a chat tool message is one result
        return None
    out = dict(message)
    if calls and "tool_calls" in message:
        remaining = [c for c in message["tool_calls"] if not (type(c) is dict and c.get("id") in calls)]
        if remaining:
            out["tool_calls"] = remaining
        else:
            del out["tool_calls"]
            if out.get("content") in (None, "", []):
                return None
            return out  # type: ignore[return-value]
    content = message.get("content")
    if type(content) is list:
        kept = [
            b
            for b in content
            if not (
                type(b) is dict
                and (
                    (b.get("type") == "tool_use" and b.get("id") in calls)
                    or (b.get("type") == "tool_result" and b.get("tool_use_id") in results)
                )
            )
        ]
        if not kept:
            return None
        out["content"] = kept
    return out  # type: ignore[return-value]


def _has_results(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return type(content) is list and any(type(b) is dict and b.get("type") == "tool_result" for b in content)
