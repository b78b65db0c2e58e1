"""The storage contract: one ABC per state kind.

A backend is the composition of these ABCs (:class:`StorageBackend`). Every method is a state-semantic
operation that is atomic on its own; ``async with backend.atomic():`` groups several into one transaction.
Managers (``statekeel.sessions`` …) hold the semantics that do not depend on a backend and talk to storage
only through this contract. The records they exchange (frozen dataclasses) live in
:mod:`statekeel.backends.records` and are re-exported here.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractAsyncContextManager
from typing import Any

from statekeel.backends.records import (
    APPROVAL_STATUSES,
    FILE_ACTIONS,
    MEMORY_EVENTS,
    MEMORY_TYPES,
    SESSION_STATUSES,
    SESSION_STEP_STATUSES,
    SPAN_STATUSES,
    STEP_STATUSES,
    TASK_STATUSES,
    WORKFLOW_STATUSES,
    ApprovalRecord,
    ArchivedMessage,
    AuditNote,
    AuditRecord,
    ChannelBlob,
    CheckpointLineage,
    CheckpointRecord,
    CheckpointWrite,
    Contradiction,
    CopyTableInfo,
    Damage,
    DatabaseFiles,
    Drift,
    Episode,
    FileRecord,
    FreeSpace,
    Incident,
    Lag,
    LoadedSession,
    Memory,
    MemoryAccess,
    MemoryEvent,
    MemoryPut,
    MessageRecord,
    MigrationInfo,
    NewCheckpoint,
    NewMessage,
    NewSpan,
    NewTask,
    NewWorkflowStep,
    OpenCalls,
    Page,
    PurgeBatch,
    Relation,
    RowPage,
    SessionLease,
    SessionRecord,
    SessionStepRecord,
    Span,
    StateCounts,
    StepRecord,
    TaskChange,
    TaskRecord,
    TypedBlob,
    Vector,
    VectorModelState,
    VectorRows,
    VectorWrite,
    WorkflowRecord,
    WorkflowStepRecord,
)

__all__ = [
    "APPROVAL_STATUSES",
    "FILE_ACTIONS",
    "MEMORY_EVENTS",
    "MEMORY_TYPES",
    "SESSION_STATUSES",
    "SESSION_STEP_STATUSES",
    "SPAN_STATUSES",
    "STEP_STATUSES",
    "TASK_STATUSES",
    "WORKFLOW_STATUSES",
    "ApprovalBackend",
    "ApprovalRecord",
    "ArchivedMessage",
    "AuditBackend",
    "AuditNote",
    "AuditNotes",
    "AuditRecord",
    "ChannelBlob",
    "CheckpointBackend",
    "CheckpointLineage",
    "CheckpointRecord",
    "CheckpointWrite",
    "Contradiction",
    "CopyBackend",
    "CopyTableInfo",
    "Damage",
    "DatabaseFiles",
    "Drift",
    "Episode",
    "FileBackend",
    "FileRecord",
    "FreeSpace",
    "Incident",
    "IncidentBackend",
    "Lag",
    "LifecycleBackend",
    "LoadedSession",
    "Memory",
    "MemoryAccess",
    "MemoryBackend",
    "MemoryEvent",
    "MemoryPut",
    "MessageRecord",
    "MigrationInfo",
    "NewCheckpoint",
    "NewMessage",
    "NewSpan",
    "NewTask",
    "NewWorkflowStep",
    "OpenCalls",
    "Page",
    "PurgeBatch",
    "Relation",
    "RetentionBackend",
    "RowPage",
    "SessionBackend",
    "SessionLease",
    "SessionRecord",
    "SessionStepRecord",
    "Span",
    "StateCounts",
    "StepRecord",
    "StorageBackend",
    "TaskBackend",
    "TaskChange",
    "TaskRecord",
    "ToolCallBackend",
    "TraceBackend",
    "TypedBlob",
    "Vector",
    "VectorBackend",
    "VectorModelState",
    "VectorRows",
    "VectorWrite",
    "WorkflowBackend",
    "WorkflowRecord",
    "WorkflowStepRecord",
]


class LifecycleBackend(abc.ABC):
    """Opening, closing, transactions and the schema."""

    url: str

    @abc.abstractmethod
    async def initialize(self) -> None:
        """Connect, refuse a database that is not ours or is too new, and apply pending migrations."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish in-flight writes and release connections. Idempotent."""

    @abc.abstractmethod
    def atomic(self) -> AbstractAsyncContextManager[None]:
        """``async with backend.atomic():`` — the enclosed calls commit together or not at all.

        Nested blocks join the outer transaction. Calls made from other tasks are not part of it.
        """

    @abc.abstractmethod
    def in_atomic(self) -> bool:
        """True when the calling task is inside this backend's ``atomic()`` block."""

    @abc.abstractmethod
    def on_block_end(self, callback: Callable[[bool], None]) -> bool:
        """Inside an ``atomic()`` block of the current task: call ``callback(committed)`` once the
        outermost block has ended, ``committed`` being True only when its COMMIT succeeded, and return
        True. Outside one, return False: a write that returned there is committed already.

        Callbacks run in registration order after a commit, in reverse order after a rollback (undo
        first what was done last); they must not block nor raise.
        """

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The highest applied migration version."""

    @abc.abstractmethod
    async def migrations(self) -> list[MigrationInfo]:
        """Applied migrations in order."""

    @abc.abstractmethod
    async def integrity_check(self) -> list[str]:
        """Problems found by the storage engine's own check; empty when healthy."""

    @abc.abstractmethod
    async def pending_migrations(self) -> list[tuple[int, str]]:
        """``(version, name)`` of the migrations this code ships that the database has not applied."""

    @abc.abstractmethod
    async def count_state(self) -> StateCounts:
        """Rows per state kind and status, on one snapshot, from COUNTs over indexed columns."""

    async def scan_damage(self) -> list[Damage]:
        """The tables whose pages are damaged, with the keys of the rows that no longer read (run when the
        integrity check found problems; reads only). Empty where the engine checks its own pages."""
        return []

    async def rebuild_indexes(self, tables: Sequence[str]) -> str | None:
        """Rebuild the indexes of ``tables`` from their rows (a damaged index loses no data). Returns None
        when rebuilt in place; the path of a rebuilt copy of the database when the damaged pages could
        not be replaced in place (a person swaps it in with the agents stopped)."""
        return None

    async def database_files(self) -> DatabaseFiles | None:
        """The sizes of the files the store lives in; None when it has none of its own (in memory, or
        on a database server)."""
        return None


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
        """Delete a session with its messages and archive. False when it did not exist."""

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
    ) -> SessionRecord:
        """Append at ``expected_head`` (and optionally set metadata and status) in one transaction.

        ``open_calls`` is the number of tool calls waiting for a result once the messages are appended,
        and ``calls_owner`` the process that leaves them (None when there are none). A writer that does
        not count them (None) marks the count unknown (-1) when it appends messages, and keeps it as it is
        otherwise.

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


AuditNotes = Callable[[Any], Sequence[AuditNote]]
"""Given what a change returned, the audit entries to append with it, in the same transaction (after
the change's statements: the audit chain's lock is the last one the transaction takes)."""


class TaskBackend(abc.ABC):
    """Tasks (conditional transitions, leases) and their step journal."""

    @abc.abstractmethod
    async def create_task(self, task: NewTask, *, audit: AuditNotes | None = None) -> tuple[TaskRecord, bool]:
        """Insert a task; with an ``idempotency_key`` already used, return that task instead.

        Returns ``(record, created)``. ``NotFound`` if ``workflow_id`` or ``parent_task_id`` is unknown.
        Every task method that writes takes ``audit``: see :data:`AuditNotes`.
        """

    @abc.abstractmethod
    async def get_task(self, task_id: str) -> TaskRecord | None:
        """The task, or None when the backend says it does not exist."""

    @abc.abstractmethod
    async def list_tasks(
        self,
        *,
        workflow_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Tasks oldest first (by ``created_at``, then id), cursor-paginated."""

    @abc.abstractmethod
    async def update_task(
        self,
        task_id: str,
        *,
        expected_status: str,
        expected_version: int,
        change: TaskChange,
        lease_valid_at: dt.datetime | None = None,
        audit: AuditNotes | None = None,
    ) -> TaskRecord | None:
        """Apply ``change`` with one conditional UPDATE (status and version as expected), bumping the
        version. None when the condition did not hold (or the task does not exist).

        With ``lease_valid_at`` (a fenced caller's clock), also None when the task's lease had expired by
        then: checked in the same statement, whether or not :meth:`expire_task_leases` ran."""

    @abc.abstractmethod
    async def claim_task(
        self,
        worker_id: str,
        *,
        lease_expires_at: dt.datetime,
        workflow_id: str | None = None,
        audit: AuditNotes | None = None,
    ) -> TaskRecord | None:
        """Atomically take the queued task with the highest priority (then the oldest), set it running
        under ``worker_id``'s lease and bump ``lease_epoch``. None when nothing is queued."""

    @abc.abstractmethod
    async def heartbeat_task(
        self,
        task_id: str,
        worker_id: str,
        lease_epoch: int,
        *,
        lease_expires_at: dt.datetime,
        now: dt.datetime | None = None,
    ) -> TaskRecord | None:
        """Extend the lease if ``worker_id`` at ``lease_epoch`` still holds the running task and its lease
        has not expired at ``now`` (the caller's clock); else None."""

    @abc.abstractmethod
    async def expire_task_leases(
        self, now: dt.datetime, *, audit: AuditNotes | None = None
    ) -> list[TaskRecord]:
        """Move running tasks whose lease expired before ``now`` to interrupted; return them."""

    @abc.abstractmethod
    async def expired_task_leases(self, now: dt.datetime) -> list[TaskRecord]:
        """Running tasks whose lease expired before ``now`` (what :meth:`expire_task_leases` would move),
        read through the status index; nothing is written."""

    @abc.abstractmethod
    async def begin_step(
        self,
        task_id: str,
        step_key: str,
        *,
        rerun_started: bool,
        lease_epoch: int | None = None,
        now: dt.datetime | None = None,
        audit: AuditNotes | None = None,
    ) -> tuple[StepRecord, bool]:
        """Record that a step starts, in its own transaction. Returns ``(record, run)``.

        With ``lease_epoch``, ``LeaseLost`` unless the task is running at that epoch under a lease that has
        not expired at ``now`` (the caller's clock), checked in the same transaction: a worker whose lease
        was taken over or ran out records nothing.

        New step, or one that failed before: recorded *started*, ``run`` is True. Already succeeded:
        ``run`` is False. Found *started* (never finished): restarted (``attempt + 1``) if
        ``rerun_started``, else returned as is with ``run`` False. ``NotFound`` for an unknown task.
        """

    @abc.abstractmethod
    async def finish_step(
        self,
        task_id: str,
        step_key: str,
        *,
        status: str,
        attempt: int | None,
        result: bytes | None = None,
        error: bytes | None = None,
        audit: AuditNotes | None = None,
    ) -> StepRecord | None:
        """Record the outcome of a *started* step (of that ``attempt``, if given). None when the step is
        no longer started at that attempt (settled or re-run by someone else)."""

    @abc.abstractmethod
    async def get_step(self, task_id: str, step_key: str) -> StepRecord | None: ...

    @abc.abstractmethod
    async def list_steps(self, task_id: str) -> list[StepRecord]:
        """A task's steps in the order they were first started."""

    @abc.abstractmethod
    async def steps_in_doubt(self, now: dt.datetime) -> list[StepRecord]:
        """Steps still *started* whose task is not running under a live lease (their runner is gone)."""


class WorkflowBackend(abc.ABC):
    """Workflows: DAGs of tasks."""

    @abc.abstractmethod
    async def create_workflow(
        self, workflow_id: str, name: str, metadata: bytes, steps: Sequence[NewWorkflowStep]
    ) -> WorkflowRecord:
        """Insert the workflow (pending), its steps and their tasks in one transaction."""

    @abc.abstractmethod
    async def get_workflow(self, workflow_id: str, *, lock: bool = False) -> WorkflowRecord | None:
        """The workflow with its steps. ``lock`` (inside ``atomic()``) serializes concurrent advancers."""

    @abc.abstractmethod
    async def list_workflows(self, *, status: str | None = None, limit: int = 100) -> list[WorkflowRecord]:
        """Workflows oldest first, with their steps."""

    @abc.abstractmethod
    async def update_workflow(
        self,
        workflow_id: str,
        *,
        expected_status: str,
        expected_version: int,
        status: str,
        started_at: dt.datetime | None,
        completed_at: dt.datetime | None,
    ) -> WorkflowRecord | None:
        """Conditional status change (bumps the version); None when the condition did not hold."""


class AuditBackend(abc.ABC):
    """The append-only, hash-chained audit log."""

    # Set by the store (``open_store(audit_key=...)``): every entry appended gets the MAC of its hash.
    audit_key: bytes | None = None

    @abc.abstractmethod
    async def append_audit(self, kind: str, actor: str, subject: str, data: str) -> AuditRecord:
        """Append an entry after the current head (serialized: the chain never forks). ``data`` is
        canonical JSON text; seq, prev_hash, created_at, hash (and with :attr:`audit_key`, mac) are
        assigned in the transaction."""

    @abc.abstractmethod
    async def latest_approval_entry(self, approval_id: str) -> AuditRecord | None:
        """The newest ``approval.*`` entry whose data names ``approval_id``, or None."""

    @abc.abstractmethod
    async def read_audit(
        self,
        *,
        subject: str | None = None,
        kind: str | None = None,
        since: dt.datetime | None = None,
        after_seq: int = 0,
        limit: int = 100,
    ) -> list[AuditRecord]:
        """Entries in seq order with ``seq > after_seq`` matching the filters."""


class ApprovalBackend(abc.ABC):
    """Approvals bound to exact arguments; decided once, consumed once."""

    @abc.abstractmethod
    async def create_approval(
        self,
        approval_id: str,
        *,
        subject: str,
        action: str,
        args: bytes,
        args_hash: str,
        requested_by: str,
        expires_at: dt.datetime | None,
    ) -> ApprovalRecord: ...

    @abc.abstractmethod
    async def get_approval(self, approval_id: str) -> ApprovalRecord | None: ...

    @abc.abstractmethod
    async def decide_approval(
        self, approval_id: str, *, granted: bool, decided_by: str, reason: str | None, now: dt.datetime
    ) -> ApprovalRecord | None:
        """Decide a pending, unexpired approval. None when it is not (already decided, expired, unknown)."""

    @abc.abstractmethod
    async def find_approval(
        self, subject: str, action: str, args_hash: str, now: dt.datetime
    ) -> ApprovalRecord | None:
        """The oldest granted, unexpired, unconsumed approval with exactly this binding."""

    @abc.abstractmethod
    async def consume_approval(self, approval_id: str, by: str, now: dt.datetime) -> ApprovalRecord | None:
        """Mark a granted, unexpired, unconsumed approval consumed. None when it is not."""

    @abc.abstractmethod
    async def pending_approvals(self, now: dt.datetime, limit: int = 100) -> list[ApprovalRecord]:
        """Undecided, unexpired approvals, oldest first."""

    @abc.abstractmethod
    async def list_approvals(self, *, after_id: str = "", limit: int = 1000) -> list[ApprovalRecord]:
        """Every approval with an id after ``after_id``, in id order (bytewise), for verification."""


class MemoryBackend(abc.ABC):
    """Memories with their history, episodes, the temporal graph, contradictions and the access log."""

    @abc.abstractmethod
    async def put_memory(self, put: MemoryPut) -> tuple[Memory, str | None]:
        """Add a memory, or update the live one with the same (type, scope, key) in place, with its
        history event in the same transaction. Returns the memory and the event written ("ADD",
        "UPDATE"), or None when the stored memory already held exactly these values."""

    @abc.abstractmethod
    async def get_memory(self, memory_id: str) -> Memory | None:
        """The memory whatever its state (forgotten, superseded, expired), or None if unknown."""

    @abc.abstractmethod
    async def query_memories(
        self,
        *,
        type: str | None = None,
        scope: str | None = None,
        key: str | None = None,
        min_confidence: float | None = None,
        include_forgotten: bool = False,
        include_superseded: bool = False,
        live_at: dt.datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Memories newest first (by ``updated_at``, then id), cursor-paginated; with ``live_at``,
        those expired by then are left out."""

    @abc.abstractmethod
    async def changed_memories(
        self, *, since: dt.datetime | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        """Every memory (forgotten and superseded too) changed at or after ``since``, oldest change
        first (by ``updated_at``, then id), cursor-paginated."""

    @abc.abstractmethod
    async def forget_memory(
        self, memory_id: str, *, actor: str | None, reason: str | None, at: dt.datetime
    ) -> Memory:
        """Set ``deleted_at`` with a DELETE event. Already forgotten: returned as is, nothing written.
        ``NotFound`` for an unknown id."""

    @abc.abstractmethod
    async def supersede_memory(
        self, old_id: str, new_id: str, *, actor: str | None, reason: str | None, at: dt.datetime
    ) -> Memory:
        """Mark ``old_id`` superseded by ``new_id`` with a SUPERSEDE event; returns the old memory.
        ``NotFound`` for an unknown id, ``InvalidTransition`` unless both are live (superseding again
        by the same memory changes nothing)."""

    @abc.abstractmethod
    async def memory_history(self, memory_id: str) -> list[MemoryEvent]:
        """The memory's events in order. ``NotFound`` for an unknown id."""

    @abc.abstractmethod
    async def add_episode(self, episode: Episode) -> Episode: ...

    @abc.abstractmethod
    async def list_episodes(self, *, session_key: str | None = None, limit: int = 100) -> list[Episode]:
        """Episodes newest first (of one session, or all)."""

    @abc.abstractmethod
    async def add_relation(self, relation: Relation) -> Relation:
        """Insert an edge; ``NotFound`` if its ``source_memory_id`` is unknown."""

    @abc.abstractmethod
    async def end_relation(self, relation_id: str, at: dt.datetime) -> Relation:
        """Set ``valid_to = at``. ``NotFound`` for an unknown id, ``InvalidTransition`` if it already
        ended, ``InvalidArgument`` if ``at`` is before ``valid_from``."""

    @abc.abstractmethod
    async def relations_at(self, entity: str, *, relation: str | None, at: dt.datetime) -> list[Relation]:
        """Edges with ``entity`` as subject or object that were true at ``at``, oldest first."""

    @abc.abstractmethod
    async def add_contradiction(self, contradiction: Contradiction) -> Contradiction:
        """Insert an open contradiction; ``NotFound`` if either memory is unknown."""

    @abc.abstractmethod
    async def resolve_contradiction(
        self, contradiction_id: str, resolution: str, at: dt.datetime
    ) -> Contradiction:
        """Resolve an open contradiction. ``NotFound`` for an unknown id, ``ConflictError`` if it was
        resolved already."""

    @abc.abstractmethod
    async def open_contradictions(self, *, limit: int = 1000) -> list[Contradiction]:
        """Unresolved contradictions, oldest first."""

    @abc.abstractmethod
    async def record_accesses(self, accesses: Sequence[MemoryAccess]) -> int:
        """Append entries to the access log in one transaction; returns how many."""

    @abc.abstractmethod
    async def list_accesses(self, memory_id: str, *, limit: int = 100) -> list[MemoryAccess]:
        """A memory's accesses, newest first."""


class FileBackend(abc.ABC):
    """The file ledger: every recorded change of every file, append-only."""

    @abc.abstractmethod
    async def record_file(
        self,
        path: str,
        *,
        checksum: str | None,
        size: int | None,
        action: str,
        task_id: str | None,
        session_key: str | None,
        at: dt.datetime,
    ) -> FileRecord:
        """Append the next record of ``path`` (``seq`` one more than its last; ``recorded_at`` never
        before the last one's)."""

    @abc.abstractmethod
    async def list_files(
        self,
        *,
        task_id: str | None = None,
        session_key: str | None = None,
        path: str | None = None,
        limit: int | None = None,
    ) -> list[FileRecord]:
        """Records matching every given filter, in the order they were recorded."""

    @abc.abstractmethod
    async def last_file_records(
        self,
        *,
        after_path: str = "",
        limit: int = 1000,
        task_id: str | None = None,
        session_key: str | None = None,
    ) -> list[FileRecord]:
        """The last record of each path after ``after_path`` (in path order), for paths with a record of
        ``task_id`` / ``session_key`` when given."""


class TraceBackend(abc.ABC):
    """Spans (the buffered tier): written in batches, read by trace and by start time."""

    @abc.abstractmethod
    async def write_spans(self, spans: Sequence[NewSpan], *, dropped: int = 0) -> None:
        """Upsert ``spans`` by ``(trace_id, span_id)`` in order (a later span replaces an earlier one with
        the same ids) and add ``dropped`` to the store's count of spans lost to buffer overflow, in one
        transaction."""

    @abc.abstractmethod
    async def read_trace(self, trace_id: str) -> list[Span]:
        """A trace's spans in start order (then by ``span_id``); empty when there are none."""

    @abc.abstractmethod
    async def query_spans(
        self,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        name: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Spans with ``since <= started_at < until``, newest first (by ``started_at``, then trace and
        span id, descending), cursor-paginated."""

    @abc.abstractmethod
    async def spans_dropped(self) -> int:
        """The total ``dropped`` recorded by :meth:`write_spans` over the life of the store."""


class VectorBackend(abc.ABC):
    """Embeddings (the derived tier) and the sources they follow."""

    @abc.abstractmethod
    async def upsert_vectors(self, writes: Sequence[VectorWrite], *, at: dt.datetime) -> list[str]:
        """Store the vectors in one transaction; returns their ids. The first vector of a model fixes its
        dimension: ``DimensionMismatch`` for another one, ``InvalidArgument`` for an id stored under another
        model (nothing written either way). Each source's ``indexed_version`` follows its vectors."""

    @abc.abstractmethod
    async def delete_vector(self, vec_id: str) -> bool:
        """Delete one vector; False when there was none."""

    @abc.abstractmethod
    async def vectors_by_source(self, source_id: str) -> list[Vector]:
        """The source's vectors, by model then id."""

    @abc.abstractmethod
    async def vector_models(self) -> list[VectorModelState]:
        """Every model of the index, by name."""

    @abc.abstractmethod
    async def vector_model(self, model: str) -> VectorModelState | None: ...

    @abc.abstractmethod
    async def load_vectors(self, model: str, *, since: tuple[int, int] | None = None) -> VectorRows:
        """The model's state and its vectors: all of them, or — given ``since``, the ``(generation,
        removals)`` a cache holds — those written after that generation, unless a vector was deleted since
        (``removals`` moved on), when all of them are read (``full``)."""

    @abc.abstractmethod
    async def source_changed(self, source_id: str, version: int, *, at: dt.datetime) -> None:
        """Record that a source is at ``version`` (an older version than the one recorded is ignored; a
        source marked gone comes back)."""

    @abc.abstractmethod
    async def sources_gone(self, source_ids: Sequence[str], *, at: dt.datetime) -> int:
        """Mark sources gone (their vectors are purged later); returns how many were not gone yet."""

    @abc.abstractmethod
    async def sync_vector_sources(
        self, *, overlap: dt.timedelta, start: tuple[dt.datetime, str] | None, limit: int
    ) -> tuple[int, tuple[dt.datetime, str] | None]:
        """Read up to ``limit`` memory changes after ``start`` (None: from the stored cursor less
        ``overlap``) into the sources table, in one transaction, and move the cursor. Returns the number of
        changes read and the key of the last one."""

    @abc.abstractmethod
    async def lagging_sources(self, *, limit: int, after: tuple[dt.datetime, str] | None = None) -> list[Lag]:
        """Sources (not gone) whose vectors are missing or older, by ``changed_at`` then id, after
        ``after``."""

    @abc.abstractmethod
    async def count_lagging(self) -> int: ...


class RetentionBackend(abc.ABC):
    """Deleting what retention allows, one short transaction per batch, never a protected row.

    Each method handles one batch: up to ``limit`` candidates in key order after ``after``; with
    ``dry_run`` nothing is deleted and the counts are what a real batch would delete.
    """

    @abc.abstractmethod
    async def purge_traces(self, before: dt.datetime, *, limit: int, dry_run: bool) -> PurgeBatch:
        """Spans started before ``before`` (a dry run counts them all at once)."""

    @abc.abstractmethod
    async def purge_sessions(
        self, before: dt.datetime, *, limit: int, after: tuple[Any, ...] | None, dry_run: bool
    ) -> PurgeBatch:
        """Archived sessions last updated before ``before``, with their messages and archive, and the file
        ledger records only they made (each path's last record is kept)."""

    @abc.abstractmethod
    async def purge_workflows(
        self, before: dt.datetime, *, limit: int, after: tuple[Any, ...] | None, dry_run: bool
    ) -> PurgeBatch:
        """Finished workflows completed before ``before`` whose tasks are all finished and have no child
        task outside the workflow, with their tasks and steps. ``purged``: the tasks' ids."""

    @abc.abstractmethod
    async def purge_tasks(
        self,
        before: dt.datetime,
        *,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
        doomed: AbstractSet[str] = frozenset(),
        ids: Sequence[str] | None = None,
    ) -> PurgeBatch:
        """Finished tasks outside workflows completed before ``before`` whose child tasks are all gone (or
        in ``doomed``: purged earlier in this purge), with their steps and their file ledger records (each
        path's last record is kept). With ``ids``, only those tasks (parents freed by a batch).
        ``purged``: their ids; ``parents``: the parents of those, which may be free to go now."""

    @abc.abstractmethod
    async def purge_memories(
        self,
        forgotten_before: dt.datetime | None,
        expired_before: dt.datetime | None,
        *,
        expired: bool,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
    ) -> PurgeBatch:
        """Memories forgotten before ``forgotten_before`` (or, with ``expired``, expired before
        ``expired_before`` and not already among the former) that no open contradiction names, with their
        history, access log entries and vectors. ``purged``: their ids."""

    @abc.abstractmethod
    async def purge_vector_sources(
        self,
        before: dt.datetime,
        *,
        limit: int,
        after: tuple[Any, ...] | None,
        dry_run: bool,
        doomed: AbstractSet[str] = frozenset(),
    ) -> PurgeBatch:
        """Sources marked gone before ``before``, with their vectors (those in ``doomed`` were counted
        already)."""

    def batch_pause(self, held: float) -> float:
        """Seconds to leave the write lock free after a batch that held it ``held`` seconds, so that other
        processes' writers get it (0 where writers do not share one lock)."""
        return 0.0

    async def free_space(self) -> FreeSpace | None:
        """Free pages inside the database file; None when the store has no file of its own."""
        return None

    async def reclaim_space(self, max_pages: int) -> int:
        """Give up to ``max_pages`` free pages back to the file system in one short transaction (only where
        the file allows it: ``FreeSpace.incremental``); returns how many."""
        return 0

    async def shrink_log(self) -> None:
        """Give back the space of a write-ahead log that a large purge grew (SQLite: a TRUNCATE
        checkpoint, best effort); nothing where there is none."""
        return None

    async def vacuum(self) -> FreeSpace | None:
        """Rewrite the database file without its free pages (SQLite ``VACUUM``; it holds the write lock
        throughout) and let later purges give space back by themselves. None where there is no file."""
        return None


class CopyBackend(abc.ABC):
    """Verbatim table access for ``statekeel.copy_store``: moving a whole store to another backend.

    Not for applications: rows bypass every state rule. Rows are portable between backends (aware UTC
    datetimes, JSON columns as JSON text) and pages follow the primary key in byte order on every
    backend, so a destination filled page by page holds a prefix of its source.
    """

    @abc.abstractmethod
    async def copy_tables(self) -> list[CopyTableInfo]:
        """The copyable tables that exist in this store, parents before children."""

    @abc.abstractmethod
    async def count_rows(self, table: str) -> int: ...

    @abc.abstractmethod
    async def export_rows(
        self, table: str, *, after: Sequence[Any] | None = None, limit: int = 1000
    ) -> RowPage:
        """Up to ``limit`` rows whose key is after ``after`` (from the start when None), in key order."""

    @abc.abstractmethod
    async def last_key(self, table: str) -> tuple[Any, ...] | None:
        """The greatest primary key of ``table``, or None when it is empty."""

    @abc.abstractmethod
    async def import_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> int:
        """Insert rows as exported, verbatim, in one transaction; returns how many. The table's ``links``
        columns are left empty: they may point at rows not copied yet (see :meth:`link_rows`)."""

    @abc.abstractmethod
    async def link_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> int:
        """Second pass over rows as exported: set their ``links`` columns; returns how many rows."""

    @abc.abstractmethod
    async def clear_rows(self, table: str) -> int:
        """Delete every row of ``table`` (children cascade); returns how many."""

    async def store_identity(self) -> str | None:
        """A name of the physical database, equal for two stores open on the same one whatever their
        URLs; None when there is none (an in-memory store). ``copy_store`` refuses to copy onto itself."""
        return None


class CheckpointBackend(abc.ABC):
    """Graph checkpoints (LangGraph's shape): checkpoints per (thread, namespace), channel values stored
    once per channel version, and the pending writes of the tasks that ran after a checkpoint."""

    @abc.abstractmethod
    async def put_checkpoint(self, checkpoint: NewCheckpoint) -> None:
        """Store the checkpoint and its new channel blobs in one transaction.

        Storing the same checkpoint id again replaces its body and metadata (a framework saves its last
        checkpoint again on exit); a blob already stored at that channel version is kept. The parent id is
        stored as given, as LangGraph's savers do (a run started from an id that names no checkpoint).
        """

    @abc.abstractmethod
    async def put_checkpoint_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool = False,
    ) -> None:
        """Store pending writes in one transaction. A write whose (task_id, idx) is already stored for
        the checkpoint is kept, unless ``replace`` (special channels: the latest write wins)."""

    @abc.abstractmethod
    async def get_checkpoint(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None
    ) -> CheckpointRecord | None:
        """The checkpoint (the newest of the thread and namespace when ``checkpoint_id`` is None), read
        on one snapshot; None when there is none."""

    @abc.abstractmethod
    async def list_checkpoints(
        self,
        *,
        thread_id: str | None = None,
        checkpoint_ns: str | None = None,
        checkpoint_id: str | None = None,
        metadata_filter: bytes | None = None,
        after: tuple[str, str, str] | None = None,
        limit: int = 100,
    ) -> list[CheckpointRecord]:
        """Checkpoints newest first (checkpoint id descending, then thread and namespace), at most
        ``limit``, each read whole. ``thread_id`` / ``checkpoint_ns`` / ``checkpoint_id`` narrow the
        listing when given. ``metadata_filter`` (codec-encoded JSON object) keeps checkpoints whose
        metadata has each key equal to its value (a null value also matches a missing key). ``after``
        is ``(checkpoint_id, thread_id, checkpoint_ns)``: only checkpoints strictly after it in this
        order (``(before_id, "", "")`` lists those with an id below ``before_id``)."""

    @abc.abstractmethod
    async def checkpoint_lineage(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        channels: Sequence[str],
        *,
        limit: int = 100,
    ) -> list[CheckpointLineage]:
        """The checkpoint (the newest of the thread and namespace when ``checkpoint_id`` is None) and
        its ancestors by parent id, nearest first, at most ``limit`` in all, read on one snapshot; each
        with the values and pending writes of ``channels`` only. Empty when the checkpoint is not stored;
        the chain ends at a parent id that names no stored checkpoint."""

    @abc.abstractmethod
    async def delete_checkpoint_thread(self, thread_id: str) -> int:
        """Delete a thread's checkpoints, blobs and writes in every namespace; returns checkpoints deleted."""

    @abc.abstractmethod
    async def delete_checkpoint_runs(self, run_ids: Sequence[str]) -> int:
        """Delete the checkpoints whose metadata ``run_id`` is one of ``run_ids``, with their writes and
        the blobs no remaining checkpoint uses; returns checkpoints deleted."""

    @abc.abstractmethod
    async def copy_checkpoint_thread(self, source_thread_id: str, target_thread_id: str) -> int:
        """Copy every checkpoint, blob and write of a thread to another thread id in one transaction
        (rows the target already holds are kept); returns checkpoints copied."""

    @abc.abstractmethod
    async def prune_checkpoints(self, thread_ids: Sequence[str], *, keep_latest: bool) -> int:
        """Delete the threads' checkpoints — all of them, or all but the newest of each namespace — with
        their writes and the blobs no remaining checkpoint uses; returns checkpoints deleted."""


class IncidentBackend(abc.ABC):
    """Damage statekeel found in its own storage (see :class:`Incident`)."""

    @abc.abstractmethod
    async def record_incident(self, kind: str, detail: bytes) -> Incident:
        """Record an incident (``detail``: codec-encoded JSON object)."""

    @abc.abstractmethod
    async def list_incidents(self, *, include_acknowledged: bool = False) -> list[Incident]:
        """Incidents oldest first: those not acknowledged yet, or all of them."""

    @abc.abstractmethod
    async def acknowledge_incident(self, incident_id: int, by: str) -> Incident | None:
        """Mark an incident acknowledged by ``by``; None when there is no such unacknowledged incident."""


class StorageBackend(
    LifecycleBackend,
    IncidentBackend,
    SessionBackend,
    ToolCallBackend,
    TaskBackend,
    WorkflowBackend,
    AuditBackend,
    ApprovalBackend,
    MemoryBackend,
    FileBackend,
    TraceBackend,
    VectorBackend,
    RetentionBackend,
    CheckpointBackend,
    CopyBackend,
    abc.ABC,
):
    """Everything a store needs from storage. Other state kinds add their ABCs here as they land."""

    async def __aenter__(self) -> StorageBackend:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
