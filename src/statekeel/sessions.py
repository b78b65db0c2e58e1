"""Sessions: what an agent said and heard, append-only, resumable after a crash.

async with statekeel.open_store("sqlite:///agent.db") as store:
    session = await store.sessions.get_or_create("user-42")
    session.add_message("user", "hello")
    await store.sessions.save(session)      # writes only the new message
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .backends.base import NewMessage, SessionRecord, StorageBackend
from .codec import Codec
from .errors import InvalidArgument
from .validation import check_key, check_str


class Session:
    """A session in memory: its live messages plus what the store knows of it.

    ``messages`` holds the unconsolidated messages (``seq`` from ``last_consolidated``); append with
    :meth:`add_message` and persist with ``SessionManager.save``.
    """

    __slots__ = (
        "_codec",
        "_head",
        "_metadata_raw",
        "_owner",
        "created_at",
        "key",
        "last_consolidated",
        "messages",
        "metadata",
        "status",
        "updated_at",
    )

    def __init__(self, key: str, *, owner: object, codec: Codec, record: SessionRecord | None = None) -> None:
        self.key = key
        self._owner = owner
        self._codec = codec
        self.messages: list[dict[str, Any]] = []
        now = dt.datetime.now(dt.UTC)
        if record is None:
            self.metadata: dict[str, Any] = {}
            self.status = "active"
            self.last_consolidated = 0
            self.created_at = self.updated_at = now
            self._head = 0
            self._metadata_raw: bytes | None = None  # never saved
        else:
            self.metadata = record.metadata
            self.status = record.status
            self.last_consolidated = record.last_consolidated
            self.created_at = record.created_at
            self.updated_at = record.updated_at
            self._head = record.head_seq
            self._metadata_raw = codec.encode(record.metadata, where="metadata")

    @property
    def head_seq(self) -> int:
        """The sequence number the next message will get once saved."""
        return self.last_consolidated + len(self.messages)

    @property
    def saved_head(self) -> int:
        """The head sequence the store held when this session was last loaded or saved."""
        return self._head

    def add_message(self, role: str, content: Any, **fields: Any) -> dict[str, Any]:
        """Append a message in memory; raises a typed error (and adds nothing) if it cannot be stored."""
        check_str(role, "role")
        message: dict[str, Any] = {"role": role, "content": content, **fields}
        self._codec.encode(message, where=f"messages[{self.head_seq}]")
        self.messages.append(message)
        return message

    def unsaved(self) -> list[dict[str, Any]]:
        """Messages added since the last load or save."""
        return self.messages[self._head - self.last_consolidated :]

    def __repr__(self) -> str:
        return f"Session(key={self.key!r}, messages={len(self.messages)}, status={self.status!r})"


class SessionManager:
    """Loads and saves sessions through a backend. See DESIGN.md, Sessions."""

    def __init__(self, backend: StorageBackend, codec: Codec) -> None:
        self.backend = backend
        self.codec = codec

    def _new(self, key: str, record: SessionRecord | None) -> Session:
        return Session(key, owner=self, codec=self.codec, record=record)

    async def load(self, key: str) -> Session | None:
        """The stored session, or None if it does not exist. A failed read raises; it never looks empty."""
        check_key(key)
        found = await self.backend.load_session_with_messages(key)
        if found is None:
            return None
        record, rows = found
        session = self._new(key, record)
        session.messages = [r.payload for r in rows]
        return session

    async def get_or_create(self, key: str) -> Session:
        """Load the session, or start a new one in memory (created in the store by the first save)."""
        session = await self.load(key)
        return session if session is not None else self._new(key, None)

    async def save(self, session: Session) -> None:
        """Write the new messages and changed metadata in one transaction, conditional on the head
        sequence the session was loaded at (``ConflictError`` if another writer appended first)."""
        if not isinstance(session, Session) or session._owner is not self:
            raise InvalidArgument(
                "this Session was not loaded from this store; load it from this store first"
            )
        new = session.unsaved()
        encode = self.codec.encode
        base = session._head
        batch = [NewMessage(m["role"], encode(m, where=f"messages[{base + i}]")) for i, m in enumerate(new)]
        for m in new:
            check_str(m.get("role"), "role")
        meta_raw = encode(session.metadata, where="metadata")
        changed_meta = meta_raw if meta_raw != session._metadata_raw else None
        if not batch and changed_meta is None and session._metadata_raw is not None:
            return
        record = await self.backend.append_messages(
            session.key, base, batch, metadata=changed_meta, create=session._metadata_raw is None
        )
        session._head = record.head_seq
        session._metadata_raw = meta_raw
        session.updated_at = record.updated_at
        session.created_at = record.created_at
