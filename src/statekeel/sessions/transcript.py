"""The tool calls of one session's transcript, kept in step with ``session.messages``.

A :class:`SessionTranscript` belongs to one :class:`~statekeel.sessions.Session`: it holds the
:class:`~statekeel.transcripts.TranscriptIndex` of the session's live messages (built on first use, then
updated one message at a time) and what the store said of the session's waiting calls when it was last
loaded or saved (their count and the process that left them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..backends.base import SessionRecord
from ..transcripts import TranscriptIndex


class SessionTranscript:
    """The transcript index of one session, and the stored facts about its waiting calls."""

    __slots__ = ("_index", "_of", "calls_owner", "stored_open")

    def __init__(self, record: SessionRecord | None) -> None:
        self._index: TranscriptIndex | None = None
        self._of: list[dict[str, Any]] | None = None  # the message list the index was built over
        self.stored_open = 0
        self.calls_owner: str | None = None
        self.stored(record)

    def stored(self, record: SessionRecord | None) -> None:
        """The store's row of the session, as just loaded or written."""
        if record is not None:
            self.stored_open = record.open_calls
            self.calls_owner = record.calls_owner

    def index(self, messages: list[dict[str, Any]], first: int) -> TranscriptIndex:
        """The index of ``messages`` (numbered from ``first``), brought up to date with the list: rebuilt
        when the list was replaced or cut, extended with messages appended to it directly."""
        idx = self._index
        if (
            idx is None
            or self._of is not messages
            or idx.next_index - len(idx) != first
            or len(idx) > len(messages)
        ):
            idx = TranscriptIndex(map(_readable, messages), offset=first)
            self._index, self._of = idx, messages
        elif len(idx) < len(messages):
            for message in messages[len(idx) :]:
                idx.add_stored(_readable(message))
        return idx

    def forget(self) -> None:
        """Drop the index (messages were taken back out of the list)."""
        self._index = self._of = None

    def open_calls(self, messages: list[dict[str, Any]], first: int) -> int:
        """How many calls of ``messages`` no stored result answers yet (``TranscriptIndex.outstanding``)."""
        return len(self.index(messages, first).outstanding())


def _readable(message: Any) -> Mapping[str, Any]:
    # Something that is not a message, put in the list by hand, holds no tool call (saving refuses it).
    return message if isinstance(message, Mapping) else {}


def take_back(
    messages: list[dict[str, Any]], added: Sequence[dict[str, Any]], tools: SessionTranscript
) -> None:
    """Remove ``added`` (the last messages of the list) after the write that was to store them failed."""
    if (
        added
        and len(messages) >= len(added)
        and all(a is b for a, b in zip(messages[-len(added) :], added, strict=True))
    ):
        del messages[-len(added) :]
        tools.forget()


__all__ = ["SessionTranscript", "take_back"]
