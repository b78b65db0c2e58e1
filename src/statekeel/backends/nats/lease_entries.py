"""The lease entries of sessions: a JetStream KV bucket ``<prefix>_leases``, one entry per session.

An entry holds ``{"owner", "token", "expires_at"}`` and is only ever changed by revision: created only if
absent (expected revision 0), renewed, released or taken over only with the revision the writer read
(``Nats-Expected-Last-Subject-Sequence``, as a KV update is). A holder whose entry changed under it (a
takeover after expiry) fails with its revision and gets ``LeaseLost``. The token (the fencing token) grows
by one with each holder; a session write made under a lease checks the entry first, and the session's own
subject carries the newest token (a *fence* event published by each new holder before its acquisition
returns), so a write decided before a takeover and published after it fails its conditional publish and
is refused on the new state. See leases.py for acquiring, renewing and releasing.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import LeaseLost, StorageCorrupt
from ...validation import check_key
from ..base import SessionLease
from .client import NatsConnection, StreamSpec, checked_subject, encode_token

__all__ = ["LeaseEntries", "leases_spec"]


def leases_spec(prefix: str) -> StreamSpec:
    """The KV bucket ``<prefix>_leases`` (the stream ``KV_<prefix>_leases``), as NATS makes a bucket with
    history 1."""
    return StreamSpec(f"KV_{prefix}_leases", (f"$KV.{prefix}_leases.>",), max_msgs_per_subject=1, kv=True)


class LeaseEntries:
    """Reading and checking the lease entries of the ``<prefix>_leases`` bucket."""

    conn: NatsConnection
    prefix: str

    @property
    def _leases_stream(self) -> str:
        return f"KV_{self.prefix}_leases"

    def _lease_subject(self, key: str) -> str:
        check_key(key, "session key")
        return checked_subject(f"$KV.{self.prefix}_leases.{encode_token(key)}", "session key", key)

    async def _lease_entry(self, key: str) -> tuple[int, dict[str, Any] | None]:
        """The session's lease entry: ``(revision, value)``; ``(revision, None)`` when it was purged and
        ``(0, None)`` when it never existed."""
        last = await self.conn.last(self._leases_stream, self._lease_subject(key))
        if last is None or last.seq is None:
            return 0, None
        if (last.headers or {}).get("KV-Operation") in ("DEL", "PURGE") or not last.data:
            return int(last.seq), None
        try:
            value: dict[str, Any] = orjson.loads(last.data)
            int(value["token"]), int(value["expires_at"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise StorageCorrupt(
                f"the lease entry of session {key!r} (revision {last.seq} of {self._leases_stream}) is "
                "not a statekeel lease"
            ) from None
        return int(last.seq), value

    async def _check_lease(self, key: str, lease: SessionLease) -> None:
        """Refuse a write whose lease is no longer the one in the session's lease entry."""
        _, held = await self._lease_entry(key)
        if held is None or held["owner"] != lease.owner or held["token"] != lease.token:
            current = None if held is None else held["token"]
            raise LeaseLost(
                f"the lease of session {key!r} with token {lease.token} is no longer current "
                f"(current token {current}, held by {None if held is None else held['owner']!r}): "
                "another holder took it over or it was released; the write was refused",
                key=key,
                token=lease.token,
                current=current,
            )
