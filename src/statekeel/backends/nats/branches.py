"""Forks, rewinds and usage totals of sessions: not held by a NATS store.

A fork reads its parent's messages in place and a rewind moves a tail of the transcript aside in the same
transaction that sets the head back; a JetStream subject has neither the cross-session reads nor the
multi-write transaction those need. Every operation raises ``Unsupported`` before anything is written;
a store that needs them keeps its sessions in SQL (``sqlite://``, ``postgresql://``, ``mariadb://``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NoReturn

from ...errors import Unsupported
from ..base import Branch, RewindRecord, SessionLease, SessionRecord


class NatsBranches:
    """The fork, rewind and usage operations of the session contract, refused on NATS."""

    url: Any

    def _no_branches(self, what: str) -> NoReturn:
        raise Unsupported(
            f"a NATS store ({self.url}) does not hold session {what}: keep sessions in a SQL store "
            "(sqlite://, postgresql://, mariadb://) to fork, rewind or total usage",
            kind="sessions",
            url=self.url,
        )

    async def fork_session(
        self,
        key: str,
        at_seq: int,
        new_key: str,
        *,
        metadata: bytes | None = None,
        calls_owner: str | None = None,
    ) -> SessionRecord:
        self._no_branches("forks")

    async def rewind_session(
        self,
        key: str,
        to_seq: int,
        *,
        reason: str,
        compression_id: str,
        expected_head: int,
        lease: SessionLease | None = None,
        expected_created_at: dt.datetime | None = None,
        calls_owner: str | None = None,
    ) -> tuple[RewindRecord, SessionRecord]:
        self._no_branches("rewinds")

    async def session_rewinds(self, key: str) -> list[RewindRecord]:
        self._no_branches("rewinds")

    async def session_usage(self, key: str) -> list[dict[str, Any]] | None:
        self._no_branches("usage")

    async def message_usages(self, key: str) -> list[tuple[int, dict[str, Any]]] | None:
        self._no_branches("usage")

    async def session_branches(self, key: str) -> list[Branch]:
        self._no_branches("forks")
