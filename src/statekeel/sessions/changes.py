"""What a save of a session would write: its new messages checked and encoded, and the fields that changed.

Built by the session (``book(session).changes()``) before anything is written, and handed to
:mod:`statekeel.sessions.writes`, which writes it to the backend or to the session's fallback file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.base import NewMessage
from ..codec import Codec
from ..errors import InvalidArgument
from ..transcripts import role_of


def check_message(message: Any, seq: int) -> str:
    """Refuse what ``add_message`` / ``add_item`` would not have produced: a non-dict, or one without a
    non-empty ``role`` or (a Responses item) ``type``. Returns what the ``role`` column stores."""
    if type(message) is not dict:
        raise InvalidArgument(
            f"messages[{seq}] must be a dict, got {type(message).__name__}; use session.add_message()",
            seq=seq,
        )
    role = role_of(message)  # a Responses item has no role: its type stands in for it
    if role is None:
        raise InvalidArgument(
            f"messages[{seq}] role must be a non-empty str (or, for an item without a role, its type), "
            f"got role={message.get('role')!r}",
            seq=seq,
        )
    return role


def message_batch(codec: Codec, base: int, messages: Sequence[dict[str, Any]]) -> list[NewMessage]:
    """The messages that follow head ``base``, checked and encoded for ``append_messages``."""
    batch = []
    for i, message in enumerate(messages):
        role = check_message(message, base + i)
        batch.append(NewMessage(role, codec.encode(message, where=f"messages[{base + i}]")))
    return batch


@dataclass(frozen=True, slots=True)
class Changes:
    """What saving a session would write: checked and encoded, before anything is written."""

    base: int  # the backend head the new messages follow
    messages: list[dict[str, Any]]
    batch: list[NewMessage]
    metadata_raw: bytes  # the session's metadata, encoded
    metadata: bytes | None  # the same when it differs from the stored metadata, else None
    status: str | None  # the status when it differs from the stored one, else None
    create: bool  # the session is not in the backend yet
    expected_version: int | None  # what a metadata or status change is conditional on
    expected_rewinds: int | None = None  # the rewinds the session was loaded after (None: not stored yet)

    @property
    def empty(self) -> bool:
        return not self.batch and self.metadata is None and self.status is None and not self.create


__all__ = ["Changes", "check_message", "message_batch"]
