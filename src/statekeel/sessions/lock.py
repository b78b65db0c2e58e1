"""Session locks: one holder per session, in this process (an asyncio lock) and across processes and
machines (a lease row in the backend, with a fencing token, renewed in the background)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from ..backends.base import SessionLease, StorageBackend
from ..errors import InvalidArgument, LeaseLost, LockTimeout, StatekeelError
from ..holders import holder_is_dead
from .fallback import background

if TYPE_CHECKING:
    from .manager import SessionManager

log = logging.getLogger("statekeel.sessions")

# Waiting for a lease held elsewhere: poll from 5 ms, doubling up to 250 ms (never past its expiry).
_POLL_FIRST = 0.005
_POLL_MAX = 0.25


async def acquire_lease(
    backend: StorageBackend, key: str, owner: str, ttl: float, deadline: float
) -> SessionLease:
    """The session's lease for ``owner``, waiting for its holder until ``deadline`` (loop time).

    A holder whose process is known to be gone (a crash on this host) is taken over at once rather than
    at its lease's expiry. ``LockTimeout`` (a ``ConflictError``) when the lease is still held at the
    deadline.
    """
    loop = asyncio.get_running_loop()
    delay = _POLL_FIRST
    while True:
        lease = await backend.acquire_session_lease(key, owner, ttl)
        if lease.acquired:
            return lease
        if holder_is_dead(lease.owner):
            taken = await backend.acquire_session_lease(key, owner, ttl, take_over=lease)
            if taken.acquired:
                log.info("session %r: took over the lease of %s, whose process is gone", key, lease.owner)
                return taken
            lease = taken
        left = deadline - loop.time()
        if left <= 0:
            raise LockTimeout(
                f"session {key!r} is held by {lease.owner} (its lease runs until "
                f"{lease.expires_at.isoformat()}); gave up waiting for it at the lock timeout",
                key=key,
                holder=lease.owner,
                expires_at=lease.expires_at,
            )
        until_expiry = (lease.expires_at - dt.datetime.now(dt.UTC)).total_seconds()
        await asyncio.sleep(max(0.001, min(delay, left, until_expiry)))
        delay = min(delay * 2, _POLL_MAX)


class SessionLock:
    """The lock of one session key: one holder at a time, in this process and across processes.

    ``sessions.lock(key)`` returns the same object for a key for as long as anyone holds it or waits for
    it (then it is dropped, so the table never grows without bound). Re-entrant within one task.
    Across processes the holder also holds the session's lease in the backend, renewed in the background;
    saves made while it is held are fenced by the lease's token.
    """

    def __init__(self, manager: SessionManager, key: str, held: dict[str, SessionLock]) -> None:
        self.key = key
        self._manager = manager
        # The manager's table of the locks held, by key: a holder enters itself, and leaves on release.
        self._held = held
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None
        self._depth = 0
        self.lease: SessionLease | None = None
        self.lost = False
        self._renewer: asyncio.Task[None] | None = None
        # Set to stop the renewer: a cancellation alone can be lost (see stop_renewal).
        self._stopping = asyncio.Event()

    @property
    def holder(self) -> asyncio.Task[Any] | None:
        """The task holding the lock (None while no one does)."""
        return self._holder

    @property
    def renewer(self) -> asyncio.Task[None] | None:
        """The background task renewing the held lease (None while the lock is not held)."""
        return self._renewer

    def locked(self) -> bool:
        """Whether some task of this process holds it."""
        return self._lock.locked()

    async def acquire(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout`` seconds, default ``SessionManager.lock_timeout``) for the session.

        Raises ``LockTimeout`` (a ``ConflictError``) when another holder keeps it past the timeout,
        ``BackendUnavailable`` when the backend cannot record the lease.
        """
        task = asyncio.current_task()
        if task is not None and self._holder is task:
            self._depth += 1
            return
        manager = self._manager
        wait = manager.lock_timeout if timeout is None else timeout
        if type(wait) not in (int, float) or not wait >= 0:  # also refuses NaN
            raise InvalidArgument(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            async with asyncio.timeout(wait):
                await self._lock.acquire()
        except TimeoutError:
            raise LockTimeout(
                f"session {self.key!r} is held by another task of this process; gave up waiting for it "
                f"after {wait}s (the lock timeout)",
                key=self.key,
            ) from None
        self._holder = task
        self._depth = 1
        self._held[self.key] = self
        try:
            self.lease = await acquire_lease(
                manager.backend, self.key, manager.owner_id, manager.lease_seconds, deadline
            )
        except BaseException:
            self._unhold()
            raise
        self.lost = False
        self._stopping = asyncio.Event()
        # Renewals run in their own transactions, also when the lock was taken inside an atomic() block.
        self._renewer = background(
            self._renew_loop(self.lease, self._stopping), f"statekeel-lease-{self.key}"
        )

    def _unhold(self) -> None:
        self._holder = None
        self._depth = 0
        if self._held.get(self.key) is self:
            del self._held[self.key]
        self._lock.release()

    async def release(self) -> None:
        """Release the session (the lease first, then the in-process lock)."""
        if not self._lock.locked():
            raise InvalidArgument(f"the lock of session {self.key!r} is not held")
        task = asyncio.current_task()
        if self._holder is not None and task is not self._holder:
            raise InvalidArgument(f"the lock of session {self.key!r} is held by another task")
        self._depth -= 1
        if self._depth > 0:
            return
        renewer = self.stop_renewal()
        self._renewer = None
        try:
            if renewer is not None:
                await asyncio.gather(renewer, return_exceptions=True)
            lease, self.lease = self.lease, None
            if lease is not None and not self.lost:
                try:
                    await self._manager.backend.release_session_lease(lease)
                except StatekeelError as exc:
                    # Not fatal: the lease expires by itself; the next holder waits until then.
                    log.warning(
                        "could not release the lease of session %r (%s); it will expire", self.key, exc
                    )
        finally:
            self._unhold()

    def stop_renewal(self) -> asyncio.Task[None] | None:
        """Tell the background renewal of the held lease to stop (it ends at its next step); the task to
        wait for, None while the lock is not held.

        It is cancelled too, but a cancellation alone can be lost: Python 3.11's ``asyncio.wait_for`` (the
        NATS client's request, some database drivers) returns an answer that arrived with the
        cancellation instead of raising it, and a renewer that only knew of the cancellation renewed on
        forever while ``release()`` or ``close()`` waited for it.
        """
        self._stopping.set()
        renewer = self._renewer
        if renewer is not None:
            renewer.cancel()
        return renewer

    async def _renew_loop(self, lease: SessionLease, stopping: asyncio.Event) -> None:
        manager = self._manager
        ttl = manager.lease_seconds
        interval = ttl / 3
        while not stopping.is_set():
            await asyncio.sleep(interval)
            if stopping.is_set():
                return
            try:
                lease = await manager.backend.renew_session_lease(lease, ttl)
                if stopping.is_set():
                    return  # released meanwhile: release() releases the lease it holds
                self.lease = lease
                interval = ttl / 3
            except LeaseLost as exc:
                self.lost = True
                log.warning("lease of session %r lost while held: %s", self.key, exc)
                return
            except StatekeelError as exc:
                # Retry sooner: the lease is still ours until it expires.
                interval = max(ttl / 10, 0.05)
                log.warning("could not renew the lease of session %r: %s", self.key, exc)

    async def __aenter__(self) -> SessionLock:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"SessionLock(key={self.key!r}, locked={self.locked()})"


__all__ = ["SessionLock", "acquire_lease"]
