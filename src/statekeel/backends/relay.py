"""The audit outbox of a store paired with NATS, and the relay that moves it onto the chain there.

A paired store (``nats://…?rest=SQL-URL``) keeps its audit chain on NATS, while the changes of the SQL
kinds (task transitions, approvals) must commit together with their audit entries. So such an entry is
written to the SQL store's ``audit_outbox`` in the change's own transaction, and relayed afterwards, in
id order, to the chain on NATS — chained after the stream's head like any append, published with the
expected last sequence and a ``Nats-Msg-Id`` derived from the entry itself — and then deleted.

What landed is decided from the chain, never assumed: before each publish the relay records (and
commits) the sequence the entry is sent to land at; an entry's message carries its relay tag. A relay
killed between its publish and the deletion leaves the entry with its attempts: the next relay (any
process's) reads the message at each attempted sequence, finds its tag there and deletes the entry
without publishing it again. A publish whose answer was lost and that is sent again is kept once by the
stream's duplicate detection (the message id is the same).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Protocol

import orjson

__all__ = ["AuditRelay", "Chain", "Outbox", "OutboxEntry"]


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """An audit entry written with its change, waiting to be relayed to the chain."""

    id: int
    kind: str
    actor: str
    subject: str
    data: str
    created_at: dt.datetime

    @property
    def tag(self) -> str:
        """The name its message on the chain carries: derived from the entry, so it is the same for every
        relay of it (from any process) and differs between two stores' entries of the same id."""
        fields = [self.id, self.kind, self.actor, self.subject, self.data, self.created_at.isoformat()]
        return "relay-" + hashlib.sha256(orjson.dumps(fields)).hexdigest()[:40]


class Outbox(Protocol):
    """The SQL store's side: the waiting entries and the relay's attempts, each call its own transaction."""

    async def outbox_pending(self, after_id: int, limit: int) -> list[OutboxEntry]: ...

    async def outbox_attempt(self, outbox_id: int, seq: int) -> None: ...

    async def outbox_attempts(self, entry: OutboxEntry) -> list[int] | None:
        """The sequences earlier relays of ``entry`` attempted; None once it is no longer waiting (another
        relay put it on the chain and deleted it)."""

    async def outbox_relayed(self, entry: OutboxEntry) -> None:
        """Delete ``entry`` (if it is still the one of its id) and its attempts."""

    async def outbox_lag(self) -> tuple[int, dt.datetime | None]: ...


class Chain(Protocol):
    """The NATS side: the chain's head, the relay tag of an entry, a conditional publish."""

    async def chain_head(self) -> tuple[int, str]:
        """The head's seq and hash (0 and the genesis hash on an empty chain)."""

    async def chain_tag(self, seq: int) -> str | None:
        """The relay tag of the entry at ``seq``; None when there is none, or it carries no tag."""

    async def chain_publish(self, seq: int, prev_hash: str, entry: OutboxEntry) -> int | None:
        """Publish ``entry`` as entry ``seq`` after ``prev_hash`` if ``seq - 1`` is still the head; the
        stream sequence it is stored at (an earlier copy's, when the stream found it a duplicate), or None
        when another entry was appended first."""


class AuditRelay:
    """Relays an :class:`Outbox` onto a :class:`Chain`; one relay at a time per process (the chain and
    the attempts keep relays of several processes apart)."""

    def __init__(self, outbox: Outbox, chain: Chain) -> None:
        self.outbox = outbox
        self.chain = chain
        self._lock = asyncio.Lock()

    async def run(self, *, page: int = 100) -> int:
        """Relay every waiting entry, oldest id first; the number relayed (by this call or found relayed)."""
        async with self._lock:
            relayed = 0
            while True:
                after = 0
                batch = await self.outbox.outbox_pending(after, page)
                if not batch:
                    return relayed
                for entry in batch:
                    await self._relay(entry)
                    relayed += 1

    async def _relay(self, entry: OutboxEntry) -> None:
        tag = entry.tag
        while True:
            attempts = await self.outbox.outbox_attempts(entry)
            if attempts is None:
                return  # another relay put it on the chain meanwhile, and deleted it
            for seq in attempts:
                if await self.chain.chain_tag(seq) == tag:
                    await self.outbox.outbox_relayed(entry)  # landed before (its mark was lost)
                    return
            head_seq, head_hash = await self.chain.chain_head()
            seq = head_seq + 1
            await self.outbox.outbox_attempt(entry.id, seq)  # committed before the publish it names
            if await self.chain.chain_publish(seq, head_hash, entry) is not None:
                await self.outbox.outbox_relayed(entry)
                return
            # Another entry was appended first (or another relay published this one): look again.
