"""Sessions, their messages, the message archive, leases and the tool-call journal."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from statekeel.backends.contract.store import Page

__all__ = [
    "SESSION_STATUSES",
    "SESSION_STEP_STATUSES",
    "ArchivedMessage",
    "Branch",
    "LoadedSession",
    "MessageRecord",
    "NewMessage",
    "OpenCalls",
    "RewindRecord",
    "SessionBackend",
    "SessionLease",
    "SessionRecord",
    "SessionStepRecord",
    "ToolCallBackend",
]


SESSION_STATUSES = ("active", "expired", "archived")


SESSION_STEP_STATUSES = ("started", "succeeded", "failed", "interrupted")


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's row: everything but its messages.

    ``open_calls`` counts the tool calls of the live transcript that still wait for a result (-1: not
    known, for messages appended by a writer that does not read transcripts); ``calls_owner`` is the
    process (a lease owner id) that saved the session while they were waiting. ``write_id`` is the id the
    last append was given (``append_messages(write_id=...)``; None when it gave none).

    ``parent_key`` and ``parent_seq`` are set on a fork: its history is ``parent_key``'s messages
    ``0..parent_seq-1`` followed by its own (stored from ``parent_seq`` on). Both None otherwise.
    """

    key: str
    status: str
    metadata: dict[str, Any]
    last_consolidated: int
    head_seq: int
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime
    open_calls: int = 0
    calls_owner: str | None = None
    write_id: str | None = None
    parent_key: str | None = None
    parent_seq: int | None = None
    rewinds: int = 0


@dataclass(frozen=True, slots=True)
class Branch:
    """One fork made directly from a session: its key, the seq it forked at, its head and creation."""

    key: str
    at_seq: int
    head_seq: int
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class RewindRecord:
    """A rewind: messages ``to_seq..upto_seq-1`` left the live transcript for the archive under
    ``compression_id`` (its rewind record, ``reason`` its summary)."""

    key: str
    compression_id: str
    to_seq: int
    upto_seq: int
    reason: str
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append: its role and its whole payload (the message dict, role included)."""

    role: str
    payload: bytes  # codec-encoded JSON object
    usage: bytes | None = None  # codec-encoded usage of the turn (see statekeel.usage), None: none


@dataclass(frozen=True, slots=True)
class LoadedSession:
    """What a session load needs, read on one snapshot: the row, the message payloads in sequence order
    (seq ``first_seq`` onwards, dense), and ``(compression_id, first_seq, upto_seq, summary)`` per
    compression."""

    record: SessionRecord
    messages: list[dict[str, Any]]
    first_seq: int
    summaries: list[tuple[str, int, int, str]]


@dataclass(frozen=True, slots=True)
class MessageRecord:
    session_key: str
    seq: int
    role: str
    payload: dict[str, Any]
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A message that compression moved out of the live history, with the summary that replaced it."""

    session_key: str
    compression_id: str
    seq: int
    payload: dict[str, Any]
    summary: str
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class SessionLease:
    """The cross-process lock of one session: who holds it, until when, and its fencing token.

    ``token`` grows by one at every acquisition; a write fenced with an older token is refused with
    ``LeaseLost``. ``acquired`` says whether the call that returned it took the lease.
    """

    key: str
    owner: str | None
    token: int
    expires_at: dt.datetime
    acquired: bool = False


@dataclass(frozen=True, slots=True)
class SessionStepRecord:
    """One tool call of a session run through ``sessions.run_tool``: *started* before its function runs,
    then *succeeded* (its result message is at ``result_seq``), *failed* (the function raised; ``error``)
    or *interrupted* (settled with an interrupted answer). ``owner`` is the process that started it;
    ``attempt`` counts the runs that were started."""

    session_key: str
    call_id: str
    status: str
    attempt: int
    owner: str
    result_seq: int | None
    error: Any
    started_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class OpenCalls:
    """A session whose transcript has tool calls waiting for a result (``open_calls`` -1: not counted
    yet), and the process that left them."""

    key: str
    status: str
    head_seq: int
    created_at: dt.datetime
    open_calls: int
    calls_owner: str | None


class SessionBackend(abc.ABC):
    """Sessions, their append-only messages and the message archive."""

    @abc.abstractmethod
    async def create_session(
        self, key: str, *, metadata: bytes | None = None, if_missing: bool = False
    ) -> SessionRecord:
        """Create an empty active session. ``ConflictError`` if it exists, unless ``if_missing``."""

    @abc.abstractmethod
    async def load_session(self, key: str) -> SessionRecord | None:
        """The session's row, or None when the backend says it does not exist (errors always raise)."""

    @abc.abstractmethod
    async def load_session_payloads(
        self, key: str, *, include_archived: bool = False
    ) -> LoadedSession | None:
        """The fast load: row, payloads and summaries in one snapshot (None when the session does not
        exist). Raises ``StorageCorrupt`` if a sequence number in the range is missing."""

    @abc.abstractmethod
    async def load_session_with_messages(
        self, key: str, *, include_archived: bool = False
    ) -> tuple[SessionRecord, list[MessageRecord]] | None:
        """The session's row and its live messages (from ``last_consolidated``), read on one snapshot.

        With ``include_archived`` the messages start at seq 0: archived ones first, then the live ones.
        """

    @abc.abstractmethod
    async def list_sessions(
        self, *, status: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        """Sessions newest first (by ``updated_at``, then key), cursor-paginated."""

    @abc.abstractmethod
    async def update_session(
        self,
        key: str,
        *,
        expected_version: int | None = None,
        metadata: bytes | None = None,
        status: str | None = None,
        lease: SessionLease | None = None,
    ) -> SessionRecord:
        """Change metadata and/or status, conditional on ``expected_version`` (``ConflictError``).

        With ``lease``, refused with ``LeaseLost`` unless it is still the session's current lease (checked
        in the same transaction; the same holds for every write below that takes ``lease``).
        """

    @abc.abstractmethod
    async def delete_session(self, key: str, *, lease: SessionLease | None = None) -> bool:
        """Delete a session with its messages and archive. False when it did not exist.

        Its forks stay whole: in the same transaction, the part of its history each fork reads is copied
        into that fork, which then reads the rest from the deleted session's own parent (if any)."""

    @abc.abstractmethod
    async def fork_session(
        self,
        key: str,
        at_seq: int,
        new_key: str,
        *,
        metadata: bytes | None = None,
        calls_owner: str | None = None,
    ) -> SessionRecord:
        """Create ``new_key`` as a fork of ``key`` at ``at_seq`` (``0 <= at_seq <= key``'s head): a row
        only, whatever the parent's length. Its count of waiting tool calls starts unknown (-1, when it
        inherits any message) with ``calls_owner`` (the process making it) as their owner. ``NotFound``
        for an unknown parent, ``ConflictError`` if ``new_key`` exists, ``InvalidArgument`` for a seq out
        of range."""

    @abc.abstractmethod
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
        """Move the live messages ``[to_seq, head)`` to the archive under a rewind record and set the
        head back to ``to_seq``, in one transaction with the row locked and the lease fenced. A fork that
        read past ``to_seq`` first gets its own copy of that part. ``ConflictError`` when the head is not
        ``expected_head`` (another writer appended) or the row is another incarnation;
        ``InvalidArgument`` unless ``last_consolidated <= to_seq < head``. A save made before the rewind
        (``append_messages(expected_rewinds=...)``) conflicts afterwards even at the same head. The count of
        waiting tool calls becomes unknown (-1), owned by ``calls_owner`` (the process rewinding)."""

    @abc.abstractmethod
    async def session_rewinds(self, key: str) -> list[RewindRecord]:
        """The session's rewind records, oldest first."""

    @abc.abstractmethod
    async def session_usage(self, key: str) -> list[dict[str, Any]] | None:
        """The usages recorded with the messages of ``key``'s history (a fork's inherited part once,
        rewound messages not at all), or None when the session does not exist."""

    @abc.abstractmethod
    async def message_usages(self, key: str) -> list[tuple[int, dict[str, Any]]] | None:
        """``(seq, usage)`` for each message of ``key``'s history that recorded a usage, in seq order (a
        fork's inherited part under its own seqs, rewound messages not at all), or None when the session
        does not exist."""

    @abc.abstractmethod
    async def session_branches(self, key: str) -> list[Branch]:
        """The forks made directly from ``key``, by fork point then key."""

    @abc.abstractmethod
    async def append_messages(
        self,
        key: str,
        expected_head: int,
        messages: Sequence[NewMessage],
        *,
        metadata: bytes | None = None,
        create: bool = False,
        status: str | None = None,
        lease: SessionLease | None = None,
        expected_created_at: dt.datetime | None = None,
        expected_version: int | None = None,
        open_calls: int | None = None,
        calls_owner: str | None = None,
        write_id: str | None = None,
        expected_rewinds: int | None = None,
    ) -> SessionRecord:
        """Append at ``expected_head`` (and optionally set metadata and status) in one transaction.

        ``open_calls`` is the number of tool calls waiting for a result once the messages are appended,
        and ``calls_owner`` the process that leaves them (None when there are none). A writer that does
        not count them (None) marks the count unknown (-1) when it appends messages, and keeps it as it is
        otherwise.

        ``write_id`` is stored in the row (``SessionRecord.write_id``; None when not given), so that a
        writer that never heard the outcome of its append (cancelled, or the COMMIT's answer lost) can tell
        its own write from another writer's.

        ``ConflictError`` with ``current`` = the actual head when another writer appended first, when
        ``expected_created_at`` is given and the session was deleted and created again since, or when
        ``expected_version`` is given and the session's version differs (another writer changed it);
        ``NotFound`` when the session does not exist and ``create`` is false.
        """

    @abc.abstractmethod
    async def read_messages(self, key: str, *, start: int = 0, end: int | None = None) -> list[MessageRecord]:
        """Live (not archived) messages with ``start <= seq < end``, in sequence order."""

    @abc.abstractmethod
    async def tail_messages(self, key: str, n: int) -> list[MessageRecord]:
        """The last ``n`` live messages, in sequence order."""

    @abc.abstractmethod
    async def archive_messages(
        self,
        key: str,
        *,
        compression_id: str,
        upto_seq: int,
        summary: str,
        expected_consolidated: int,
        lease: SessionLease | None = None,
        expected_created_at: dt.datetime | None = None,
    ) -> SessionRecord:
        """Move live messages ``[last_consolidated, upto_seq)`` into the archive under ``compression_id``
        and set ``last_consolidated = upto_seq``, in one transaction, with the session's row locked
        (``ConflictError`` if ``last_consolidated`` is not ``expected_consolidated``, or if
        ``expected_created_at`` is given and the session was deleted and created again since)."""

    @abc.abstractmethod
    async def read_archive(self, key: str, *, compression_id: str | None = None) -> list[ArchivedMessage]:
        """Archived messages in sequence order (all compressions, or one)."""

    @abc.abstractmethod
    async def read_summaries(self, key: str) -> list[tuple[str, int, int, str]]:
        """``(compression_id, first_seq, last_seq, summary)`` per compression, in order."""

    @abc.abstractmethod
    async def transition_idle_sessions(
        self, from_status: str, to_status: str, idle_before: dt.datetime
    ) -> int:
        """Move every session in ``from_status`` last updated before ``idle_before`` to ``to_status``
        (``updated_at`` is kept: a status change is not activity). Returns how many moved."""

    @abc.abstractmethod
    async def acquire_session_lease(
        self, key: str, owner: str, ttl_seconds: float, *, take_over: SessionLease | None = None
    ) -> SessionLease:
        """Take the session's lease if it is free, expired or already ``owner``'s, bumping its token.

        With ``take_over``, also take it while it is still exactly that lease (same owner and token): for a
        holder known to be dead. Returns the lease with ``acquired=True``, or the current holder's lease
        with ``acquired=False``.
        """

    @abc.abstractmethod
    async def renew_session_lease(self, lease: SessionLease, ttl_seconds: float) -> SessionLease:
        """Extend a held lease; ``LeaseLost`` if another owner took it over (a newer token)."""

    @abc.abstractmethod
    async def release_session_lease(self, lease: SessionLease) -> bool:
        """Free a held lease (its token stays). False if it was no longer this lease."""

    @abc.abstractmethod
    async def read_session_lease(self, key: str) -> SessionLease | None:
        """The session's lease row, or None if it was never taken."""


class ToolCallBackend(abc.ABC):
    """Sessions' tool calls: the journal of the calls run through ``sessions.run_tool`` (one row per
    session and call id, deleted with its session), the sessions whose transcript has calls waiting for a
    result, and the heartbeats of the processes that leave calls waiting."""

    @abc.abstractmethod
    async def set_open_calls(
        self,
        key: str,
        *,
        expected_head: int,
        expected_created_at: dt.datetime,
        open_calls: int,
        calls_owner: str | None,
        lease: SessionLease | None = None,
    ) -> bool:
        """Set the session's count of waiting calls and their owner if the session is still at
        ``expected_head`` (and that incarnation); False otherwise. Neither the version nor ``updated_at``
        changes: the count follows from the messages. ``lease`` fences it as in ``append_messages``."""

    @abc.abstractmethod
    async def set_open_calls_many(self, counts: Sequence[OpenCalls]) -> int:
        """:meth:`set_open_calls` for many sessions in one transaction (each conditional on its
        ``head_seq`` and ``created_at``); returns how many were set."""

    @abc.abstractmethod
    async def read_session_tails(self, keys: Sequence[str], n: int) -> dict[str, list[dict[str, Any]]]:
        """The payloads of the last ``n`` live messages of each session, in sequence order, on one
        snapshot (sessions without live messages are left out)."""

    @abc.abstractmethod
    async def sessions_with_open_calls(
        self, *, after: str | None = None, limit: int = 500
    ) -> list[OpenCalls]:
        """Sessions whose count of waiting calls is not 0 (unknown included), by key after ``after``; read
        through an index of those sessions only."""

    @abc.abstractmethod
    async def get_session_step(self, key: str, call_id: str) -> SessionStepRecord | None: ...

    @abc.abstractmethod
    async def session_steps(self, key: str, *, status: str | None = None) -> list[SessionStepRecord]:
        """The session's tool steps (in the given status), by call id."""

    @abc.abstractmethod
    async def start_session_step(
        self, key: str, call_id: str, *, owner: str, expected_attempt: int | None
    ) -> SessionStepRecord | None:
        """Record that the call's function starts: a new row at attempt 1 (``expected_attempt`` None), or
        the row found at ``expected_attempt`` restarted at the next attempt. None when the row is not as
        expected (someone else started or settled it first). ``NotFound`` for an unknown session."""

    @abc.abstractmethod
    async def finish_session_step(
        self,
        key: str,
        call_id: str,
        *,
        status: str,
        attempt: int,
        result_seq: int | None = None,
        error: bytes | None = None,
    ) -> SessionStepRecord | None:
        """Settle a *started* step of that ``attempt``; None when it is no longer that."""

    @abc.abstractmethod
    async def settle_session_step(
        self, key: str, call_id: str, *, status: str, owner: str, result_seq: int | None
    ) -> SessionStepRecord:
        """Record the call as settled by its caller (a result or an interrupted answer appended at
        ``result_seq``), whatever its row said before, creating the row if there was none."""

    @abc.abstractmethod
    async def put_heartbeat(self, owner: str, expires_at: dt.datetime) -> None:
        """Record that ``owner`` runs until ``expires_at`` (renewed while it does)."""

    @abc.abstractmethod
    async def delete_heartbeat(self, owner: str) -> bool:
        """Remove ``owner``'s heartbeat (its store closed): its waiting calls may be answered at once."""

    @abc.abstractmethod
    async def read_heartbeat(self, owner: str) -> dt.datetime | None:
        """Until when ``owner`` said it runs; None when it has no heartbeat."""

    @abc.abstractmethod
    async def purge_heartbeats(self, expired_before: dt.datetime) -> int:
        """Remove heartbeats that expired before ``expired_before``; returns how many."""
