"""The window ``Session.history()`` hands out: never a result without its call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..validation import check_int
from .index import TranscriptIndex
from .messages import _M

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
