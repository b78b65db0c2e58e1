"""The records of the storage contract: frozen dataclasses (and the status names) that backends return
and managers consume. :mod:`statekeel.backends.base` re-exports every name here.

Sequence numbers of a session's messages are dense and 0-based: ``head_seq`` is the number of messages
ever appended, and the next message gets ``seq == head_seq``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, NamedTuple

SESSION_STATUSES = ("active", "expired", "archived")
TASK_STATUSES = ("pending", "queued", "running", "suspended", "interrupted", "success", "failed", "cancelled")
STEP_STATUSES = ("started", "succeeded", "failed")
WORKFLOW_STATUSES = ("pending", "running", "success", "failed", "cancelled")
APPROVAL_STATUSES = ("pending", "granted", "denied")
SPAN_STATUSES = ("unset", "ok", "error")


@dataclass(frozen=True, slots=True)
class MigrationInfo:
    """One applied migration as recorded in ``schema_migrations``."""

    version: int
    name: str
    checksum: str
    applied_at: dt.datetime


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's row: everything but its messages."""

    key: str
    status: str
    metadata: dict[str, Any]
    last_consolidated: int
    head_seq: int
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append: its role and its whole payload (the message dict, role included)."""

    role: str
    payload: bytes  # codec-encoded JSON object


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
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[Any] = field(default_factory=list)
    next_cursor: str | None = None


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
class TaskRecord:
    """A task's row. ``lease_owner`` is the worker that last claimed it (None once the task re-entered
    running by a transition, without a claim); ``lease_expires_at`` is set only while it runs under a lease;
    ``lease_epoch`` (the fencing token) grows by one at every claim and every other entry into running."""

    id: str
    workflow_id: str | None
    parent_task_id: str | None
    title: str
    description: str | None
    status: str
    priority: int
    result: Any
    error: Any
    retry_count: int
    max_retries: int
    metadata: dict[str, Any]
    version: int
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    lease_epoch: int
    idempotency_key: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    completed_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to insert; ``metadata`` is codec-encoded JSON."""

    id: str
    title: str
    status: str = "pending"
    description: str | None = None
    priority: int = 5
    max_retries: int = 3
    metadata: bytes = b"{}"
    workflow_id: str | None = None
    parent_task_id: str | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class TaskChange:
    """The new values of a task's mutable fields, written by one conditional update.

    ``result`` and ``error`` are codec-encoded JSON; None keeps the stored value.
    """

    status: str
    retry_count: int
    lease_expires_at: dt.datetime | None
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    result: bytes | None = None
    error: bytes | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One entry of a task's step journal. ``attempt`` counts the runs of ``fn`` that were started."""

    task_id: str
    step_key: str
    status: str
    attempt: int
    result: Any
    error: Any
    started_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class NewWorkflowStep:
    """A step of a workflow to create: its name, the names it depends on, and the task it becomes."""

    name: str
    depends_on: tuple[str, ...]
    task: NewTask


@dataclass(frozen=True, slots=True)
class WorkflowStepRecord:
    name: str
    depends_on: tuple[str, ...]
    task: TaskRecord


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A workflow's row with its steps (in creation order), each with its task as stored now."""

    id: str
    name: str
    status: str
    metadata: dict[str, Any]
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    steps: tuple[WorkflowStepRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An audit row as stored. ``data`` is the canonical JSON text the hash was computed over."""

    seq: int
    kind: str
    actor: str
    subject: str
    data: str
    created_at: dt.datetime
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """An approval: requested, decided once (granted or denied), consumed at most once."""

    id: str
    subject: str
    action: str
    args: Any
    args_hash: str
    status: str
    requested_by: str
    requested_at: dt.datetime
    expires_at: dt.datetime | None
    decided_by: str | None
    decided_at: dt.datetime | None
    reason: str | None
    consumed_by: str | None
    consumed_at: dt.datetime | None
    version: int


@dataclass(frozen=True, slots=True)
class CopyTableInfo:
    """A table ``copy_store`` moves: its primary key, the self-references set in a second pass
    (``links``), whether its rows can never be deleted (``append_only``), and the positions in an
    exported row of its JSON columns (``json_columns``: equal by value, their text differs by backend)."""

    name: str
    key: tuple[str, ...]
    links: tuple[str, ...] = ()
    append_only: bool = False
    json_columns: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RowPage:
    """One page of verbatim rows of a table, in primary-key order; ``last_key`` is the last row's key."""

    rows: list[tuple[Any, ...]]
    last_key: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True)
class StateCounts:
    """How much state a store holds, read on one snapshot by COUNTs over indexed columns.

    ``sessions``, ``tasks`` and ``workflows`` map every status to its count (0 included).
    ``approvals_pending`` counts undecided, unexpired approvals (what ``approvals.pending()`` lists);
    ``audit_entries`` is the audit head's sequence number: entries are numbered from 1 and never deleted.
    """

    sessions: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    workflows: dict[str, int] = field(default_factory=dict)
    approvals_pending: int = 0
    audit_entries: int = 0


@dataclass(frozen=True, slots=True)
class DatabaseFiles:
    """The files an embedded store lives in: the database and its write-ahead log, in bytes."""

    path: str
    database_bytes: int
    wal_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One span of a trace: a tool call, an LLM call, an agent turn … Fields map onto OpenTelemetry.

    ``kind`` and ``status`` are lower-case names (see :mod:`statekeel.traces` for the accepted kinds;
    statuses are OpenTelemetry's ``unset``, ``ok``, ``error``). ``ended_at`` is None while the span is
    open; ``started_at`` defaults to the time the Span is made. Times are timezone-aware; spans read back
    from a store are in UTC, to the microsecond.

        Span(trace_id="t-1", span_id="s-1", name="read_file", kind="tool", started_at=start, ended_at=end)
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    name: str
    kind: str = "internal"
    status: str = "unset"
    attributes: dict[str, Any] = field(default_factory=dict)
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    ended_at: dt.datetime | None = None

    @property
    def duration(self) -> dt.timedelta | None:
        """``ended_at - started_at``, or None while the span is open."""
        return None if self.ended_at is None else self.ended_at - self.started_at


class NewSpan(NamedTuple):
    """A validated span to write: ``attributes`` codec-encoded, times aware UTC.

    A named tuple rather than a frozen dataclass: one is built on every ``traces.record`` call, and a
    tuple costs a fifth of the caller's time a frozen dataclass does."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    status: str
    attributes: bytes
    started_at: dt.datetime
    ended_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class TypedBlob:
    """A value as a framework's serializer wrote it: the serializer's type tag and its bytes.

    statekeel stores these opaquely (LangGraph's ``serde.dumps_typed`` output); ``type == "empty"`` with
    ``data is None`` marks a channel that has a version but no value.
    """

    type: str
    data: bytes | None


@dataclass(frozen=True, slots=True)
class ChannelBlob:
    """One channel's value at one version; stored once per (thread, namespace, channel, version)."""

    channel: str
    version: str
    value: TypedBlob


@dataclass(frozen=True, slots=True)
class NewCheckpoint:
    """A checkpoint to store in one transaction: its row and the channel values new in it.

    ``checkpoint`` is the serialized checkpoint without its channel values; ``channel_versions`` is
    codec-encoded JSON ``{channel: version}`` (the blobs a load joins); ``metadata`` is a codec-encoded JSON
    object (filterable); ``run_id`` is the metadata's run id as text, if any.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: TypedBlob
    metadata: bytes
    channel_versions: bytes
    run_id: str | None
    blobs: tuple[ChannelBlob, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckpointWrite:
    """A pending write of a task, linked to the checkpoint it follows. ``idx`` is its position in the
    task's writes, or a fixed negative slot for special channels (errors, interrupts)."""

    task_id: str
    idx: int
    channel: str
    value: TypedBlob
    task_path: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A stored checkpoint with everything a load returns: the serialized checkpoint, its metadata, the
    values of its channels at its versions (channels without a value omitted) and its pending writes in
    ``(task_path, task_id, idx)`` order."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: TypedBlob
    metadata: dict[str, Any]
    channel_values: dict[str, TypedBlob]
    pending_writes: tuple[CheckpointWrite, ...]
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class CheckpointLineage:
    """One checkpoint of a parent chain, with only the requested channels: their values at this
    checkpoint (channels without a value omitted) and the pending writes to them, in
    ``(task_path, task_id, idx)`` order."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    values: dict[str, TypedBlob]
    writes: tuple[CheckpointWrite, ...]
