"""Branches of sessions: forks, rewinds and usage. :class:`~statekeel.sessions.SessionManager` inherits
them; see docs/branches.md."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from ..backends.base import Branch, SessionLease, StorageBackend
from ..errors import InvalidArgument, NotFound
from ..usage import ModelUsage, Usage, total_usage
from ..validation import check_int, check_key, check_text
from .session import Rewind, Session, book

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from .tools import ToolCalls


class SessionBranches:
    """Fork, rewind, branches and usage over the manager's backend and cache."""

    backend: StorageBackend
    _cache: MutableMapping[str, Session]
    _tools: ToolCalls

    def _lease_for(self, key: str) -> SessionLease | None:
        raise NotImplementedError

    def discard(self, key: str, session: Session) -> None:
        raise NotImplementedError

    async def load(self, key: str, *, include_archived: bool = False, repair: bool = True) -> Session | None:
        raise NotImplementedError

    async def fork(self, key: str, at_seq: int, *, new_key: str | None = None) -> Session:
        """A new session whose history is ``key``'s messages ``0..at_seq-1`` followed by its own
        (``session.parent == (key, at_seq)``); it starts with ``key``'s stored metadata. Nothing is
        copied: the fork's row points at its parent, whatever the parent's length, and ``load`` reads
        the parent's part and the fork's own messages on one snapshot. ``new_key`` defaults to a fresh
        ``"{key}/fork-<random>"``. ``at_seq`` counts what the store holds (save the parent first):
        ``InvalidArgument`` outside ``0..head``; ``NotFound`` for an unknown parent; ``ConflictError``
        if ``new_key`` exists. See docs/branches.md."""
        check_key(key)
        check_int(at_seq, "at_seq")
        if new_key is None:
            new_key = f"{key}/fork-{uuid.uuid4().hex[:12]}"
        check_key(new_key, "new_key")
        # The calls it inherits still waiting for a result are this process's until it is gone (its
        # heartbeat first: a reader never sees the owner without it).
        if at_seq > 0:
            await self._tools.ensure_heartbeat()
        await self.backend.fork_session(key, at_seq, new_key, calls_owner=self._tools.owner)
        session = await self.load(new_key)
        if session is None:  # deleted by another writer between the fork and this read
            raise NotFound(f"the fork {new_key!r} of {key!r} was deleted as soon as it was made", key=new_key)
        return session

    async def rewind(self, key: str, to_seq: int, *, reason: str) -> Rewind:
        """Take messages ``to_seq`` onwards out of the live transcript: they move to the archive under a
        rewind record (``rewind.compression_id``; ``archived(key, rewind.compression_id)`` reads them),
        and the next message appended takes ``to_seq``'s place. One transaction, with the session's row
        locked and this process's lease (if it holds the session's lock) fenced: a writer that appended
        meanwhile makes it raise ``ConflictError``, and a save of the session loaded before the rewind
        conflicts after it. A fork that read past ``to_seq`` keeps its history (it gets its own copy of
        that part). ``InvalidArgument`` unless ``last_consolidated <= to_seq < head``; ``reason`` is
        required (the rewind record's summary). See docs/branches.md."""
        check_key(key)
        check_int(to_seq, "to_seq")
        check_text(reason, "reason")
        if not reason.strip():
            raise InvalidArgument("reason must say why the session is rewound (it is the rewind record)")
        before = await self.backend.load_session(key)
        if before is None:
            raise NotFound(f"session {key!r} does not exist: nothing to rewind", key=key)
        # Calls the rewind leaves waiting (an output rewound) are this process's until it is gone.
        await self._tools.ensure_heartbeat()
        found, record = await self.backend.rewind_session(
            key,
            to_seq,
            reason=reason,
            compression_id=uuid.uuid4().hex,
            expected_head=before.head_seq,
            lease=self._lease_for(key),
            expected_created_at=before.created_at,
            calls_owner=self._tools.owner,
        )
        cached = self._cache.get(key)
        if cached is not None and not book(cached).rewound(before, record):
            self.discard(key, cached)
        return Rewind(
            found.key, found.compression_id, found.to_seq, found.upto_seq, found.reason, found.created_at
        )

    async def usage(self, key: str) -> Usage:
        """What session ``key``'s history cost: totals and per model (``by_model``) over the messages that
        recorded a usage (``add_message(..., usage=...)``). A fork counts what it shares with its parent
        once; rewound messages are not counted; compressed ones are. ``NotFound`` for an unknown key."""
        check_key(key)
        usages = await self.backend.session_usage(key)
        if usages is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        return total_usage(key, usages)

    async def message_usage(self, key: str) -> dict[int, ModelUsage]:
        """The usage each message of session ``key``'s history recorded, by seq (``turns`` 1 each): the
        messages it inherits as a fork under their seqs, compressed ones too, rewound ones not. Messages
        that recorded none are left out. ``NotFound`` for an unknown key.

            for seq, used in (await store.sessions.message_usage(key)).items():
                print(seq, used.model, used.input_tokens, used.output_tokens, used.cost)
        """
        check_key(key)
        found = await self.backend.message_usages(key)
        if found is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        return {
            seq: ModelUsage(u["model"], u["input_tokens"], u["output_tokens"], u["cost"], 1)
            for seq, u in found
        }

    async def rewinds(self, key: str) -> list[Rewind]:
        """The rewinds of session ``key``, oldest first (``archived(key, r.compression_id)`` reads the
        messages each took out)."""
        check_key(key)
        return [
            Rewind(r.key, r.compression_id, r.to_seq, r.upto_seq, r.reason, r.created_at)
            for r in await self.backend.session_rewinds(key)
        ]

    async def locate(self, key: str, seq: int, *, rewinds: int) -> Rewind | None:
        """Where the message a stored reference ``(key, rewinds, seq)`` names is now: the rewind whose
        record holds it (``archived(key, rewind.compression_id)``), or None when it is still the message
        at ``seq`` of the live transcript (or of its compressed part). ``rewinds`` is the session's rewind
        count the reference was taken under (``session.rewinds``, a fallback file's header, an episode,
        a ``tool_call.resolved`` entry). ``NotFound`` for an unknown session; ``InvalidArgument`` for a
        count the session never had. See docs/branches.md."""
        check_key(key)
        check_int(seq, "seq", minimum=0)
        check_int(rewinds, "rewinds", minimum=0)
        record = await self.backend.load_session(key)
        if record is None:
            raise NotFound(f"session {key!r} does not exist", key=key)
        if rewinds > record.rewinds:
            raise InvalidArgument(
                f"session {key!r} has had {record.rewinds} rewinds, not {rewinds}: the reference was taken "
                "in another session of that key, or its count is wrong",
                key=key,
                rewinds=rewinds,
            )
        if rewinds == record.rewinds:
            return None  # no rewind since: the live transcript's seq (a NATS store has no rewinds)
        # The rewinds since the reference was taken, oldest first: the first that reached seq took it.
        for r in (await self.backend.session_rewinds(key))[rewinds:]:
            if r.to_seq <= seq:
                return Rewind(r.key, r.compression_id, r.to_seq, r.upto_seq, r.reason, r.created_at)
        return None

    async def branches(self, key: str) -> list[Branch]:
        """Every fork made directly from ``key`` (a fork's own forks: ``branches`` of it), by fork point
        then key, each with its ``at_seq``."""
        check_key(key)
        return await self.backend.session_branches(key)


__all__ = ["SessionBranches"]
