"""The heartbeat of one ``SessionManager``: a row that says its process still runs.

A save that leaves tool calls waiting names this manager their owner; a reader treats such calls as its
own to answer only once that owner is gone (its process died on this host, or its heartbeat expired).
The row is committed before any write that names the owner, renewed in the background, and removed by
``close()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
from collections.abc import Callable

from ..backends.base import StorageBackend
from ..errors import StatekeelError
from ..holders import holder_is_dead

log = logging.getLogger("statekeel.sessions")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Heartbeat:
    """The heartbeat row of ``owner`` (a manager's owner id), kept valid for ``lease_seconds()`` at a time
    (asked each time: the manager's ``lease_seconds`` may change while it runs)."""

    def __init__(self, backend: StorageBackend, owner: str, lease_seconds: Callable[[], float]) -> None:
        self.backend = backend
        self.owner = owner
        self._lease_seconds = lease_seconds
        self._until: dt.datetime | None = None  # the row, as last committed
        self._written = False
        self._beater: asyncio.Task[None] | None = None
        # Set by close(): a cancellation alone can be lost (see SessionLock.stop_renewal).
        self._closing = asyncio.Event()

    async def ensure(self) -> None:
        """Make the row valid for a while, before a write names this owner the owner of waiting calls
        (committed first: a reader never sees the owner without its heartbeat)."""
        ttl = dt.timedelta(seconds=self._lease_seconds())
        now = utcnow()
        if self._until is None or self._until - now < ttl / 2:
            until = now + ttl
            await self.backend.put_heartbeat(self.owner, until)
            self._written = True
            # Inside the caller's atomic() block the row commits with it, or not at all: write it again
            # next time rather than trust it.
            self._until = None if self.backend.in_atomic() else until
        if self._beater is None or self._beater.done():
            self._closing = asyncio.Event()
            # A context of its own: the renewals must not join the atomic() block of the task that
            # started them.
            self._beater = asyncio.create_task(
                self._beat(self._closing), name="statekeel-heartbeat", context=contextvars.Context()
            )

    async def _beat(self, closing: asyncio.Event) -> None:
        interval = self._lease_seconds() / 3
        while not closing.is_set():
            await asyncio.sleep(interval)
            if closing.is_set():
                return
            lease_seconds = self._lease_seconds()
            until = utcnow() + dt.timedelta(seconds=lease_seconds)
            try:
                await self.backend.put_heartbeat(self.owner, until)
                if closing.is_set():
                    return  # close() removes the row now
                self._until = until
                interval = lease_seconds / 3
            except StatekeelError as exc:
                interval = max(lease_seconds / 10, 0.05)  # retry sooner: it is ours until it expires
                log.warning("could not renew the heartbeat of %s: %s", self.owner, exc)

    async def alive(self, owner: str | None, *, own_counts: bool = True) -> bool:
        """Whether ``owner`` (a process that left calls waiting) still runs. This owner counts as running
        unless ``own_counts`` is False (``recover()``: then only calls it runs right now do)."""
        if owner is None:
            return False
        if owner == self.owner:
            return own_counts
        if holder_is_dead(owner):
            return False
        until = await self.backend.read_heartbeat(owner)
        return until is not None and until > utcnow()

    async def close(self) -> None:
        """Stop renewing and remove the row: calls this owner left waiting may be answered now."""
        beater, self._beater = self._beater, None
        self._closing.set()  # the beater ends at its next step, also if the cancellation is lost
        if beater is not None:
            beater.cancel()
            await asyncio.gather(beater, return_exceptions=True)
        if self._written:
            self._written = False
            self._until = None
            try:
                await self.backend.delete_heartbeat(self.owner)
            except StatekeelError as exc:
                log.warning("could not remove the heartbeat of %s (it will expire): %s", self.owner, exc)


__all__ = ["Heartbeat", "utcnow"]
