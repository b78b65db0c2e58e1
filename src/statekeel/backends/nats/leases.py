"""Session leases on NATS: taking, renewing and releasing a session's entry of the ``<prefix>_leases`` KV
bucket (see lease_entries.py), each a conditional write on the revision read."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson

import nats.js.errors

from ...errors import LeaseLost, StorageCorrupt
from ..base import SessionLease
from .client import WRONG_LAST_SEQUENCE, from_micros
from .sessions import NatsSessions, SessionState, now_us

__all__ = ["NatsLeases"]


class NatsLeases(NatsSessions):
    """The lease operations of the session contract, on the lease entries."""

    def _lease_record(self, key: str, held: dict[str, Any], acquired: bool) -> SessionLease:
        return SessionLease(key, held["owner"], held["token"], from_micros(held["expires_at"]), acquired)

    async def _put_lease(self, key: str, revision: int, value: dict[str, Any]) -> bool:
        """Write the entry if it is still at ``revision`` (0: only if absent); False when it changed."""
        wid = f"l-{uuid.uuid4().hex}"
        try:
            await self.conn.publish(
                self._lease_subject(key),
                orjson.dumps(value),
                stream=self._leases_stream,
                headers={"Nats-Expected-Last-Subject-Sequence": str(revision), "Nats-Msg-Id": wid},
                what=f"the lease of session {key!r}",
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return False
            raise StorageCorrupt(f"the NATS stream {self._leases_stream} refused: {exc.description}") from exc
        return True

    async def _fence_session(self, key: str, token: int) -> None:
        """Record ``token`` on the session's subject: a write decided under an older token and not yet
        published now fails its conditional publish, and is refused on the new state (``_fence``)."""

        def decide(s: SessionState) -> tuple[dict[str, Any] | None, Callable[[SessionState], None]]:
            return (None if s.fence >= token else {"fence": token}), lambda n: None

        # Never part of the caller's atomic() block: the lease is taken now, whatever the block does.
        await self._change(key, decide, own=True)

    async def acquire_session_lease(
        self, key: str, owner: str, ttl_seconds: float, *, take_over: SessionLease | None = None
    ) -> SessionLease:
        while True:
            revision, held = await self._lease_entry(key)
            now = now_us()
            current = held or {"owner": None, "token": 0, "expires_at": 0}
            if take_over is not None:
                free = current["owner"] == take_over.owner and current["token"] == take_over.token
            else:
                free = current["owner"] is None or current["expires_at"] <= now or current["owner"] == owner
            if not free:
                return self._lease_record(key, current, False)
            token = current["token"] + 1
            if held is None:
                # A first or purged entry (erasure): above any fence the session's subject still has.
                token = max(token, (await self.read_state(key)).fence + 1)
            taken = {"owner": owner, "token": token, "expires_at": now + int(ttl_seconds * 1e6)}
            if not await self._put_lease(key, revision, taken):
                continue  # another process changed the entry since it was read: decide again
            await self._fence_session(key, token)
            return self._lease_record(key, taken, True)

    async def renew_session_lease(self, lease: SessionLease, ttl_seconds: float) -> SessionLease:
        key = lease.key
        while True:
            revision, held = await self._lease_entry(key)
            if held is None or held["owner"] != lease.owner or held["token"] != lease.token:
                raise LeaseLost(
                    f"the lease of session {key!r} (token {lease.token}) was taken over by "
                    f"{None if held is None else held['owner']!r}",
                    key=key,
                    token=lease.token,
                    current=None if held is None else held["token"],
                )
            renewed = {**held, "expires_at": now_us() + int(ttl_seconds * 1e6)}
            if await self._put_lease(key, revision, renewed):
                return self._lease_record(key, renewed, True)

    async def release_session_lease(self, lease: SessionLease) -> bool:
        while True:
            revision, held = await self._lease_entry(lease.key)
            if held is None or held["owner"] != lease.owner or held["token"] != lease.token:
                return False
            released = {"owner": None, "token": held["token"], "expires_at": 0}
            if await self._put_lease(lease.key, revision, released):
                return True

    async def read_session_lease(self, key: str) -> SessionLease | None:
        _, held = await self._lease_entry(key)
        return None if held is None else self._lease_record(key, held, False)
