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
SESSION_STEP_STATUSES = ("started", "succeeded", "failed", "interrupted")
WORKFLOW_STATUSES = ("pending", "running", "success", "failed", "cancelled")
APPROVAL_STATUSES = ("pending", "granted", "denied")
MEMORY_TYPES = ("user", "environment", "semantic", "episodic", "procedural")
MEMORY_EVENTS = ("ADD", "UPDATE", "DELETE", "SUPERSEDE")
FILE_ACTIONS = ("created", "modified", "deleted")
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
    """A session's row: everything but its messages.

    ``open_calls`` counts the tool calls of the live transcript that still wait for a result (-1: not
    known, for messages appended by a writer that does not read transcripts); ``calls_owner`` is the
    process (a lease owner id) that saved the session while they were waiting.
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


AuditNote = tuple[str, str, str, str]
"""An audit entry to append with a change, in the change's transaction: (kind, actor, subject, data as
canonical JSON text)."""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An audit row as stored. ``data`` is the canonical JSON text the hash was computed over; ``mac`` is
    the HMAC of ``hash`` under the store's audit key (None when appended without a key)."""

    seq: int
    kind: str
    actor: str
    subject: str
    data: str
    created_at: dt.datetime
    prev_hash: str
    hash: str
    mac: str | None = None


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
class Memory:
    """A memory as stored. ``version`` starts at 1 and grows by one at every change (update, forget,
    supersede), and ``updated_at`` moves with it; ``deleted_at`` is set when it was forgotten."""

    id: str
    type: str
    scope: str
    key: str | None
    content: Any
    data: Any
    confidence: float
    source: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    expires_at: dt.datetime | None
    superseded_by: str | None
    deleted_at: dt.datetime | None
    version: int

    @property
    def forgotten(self) -> bool:
        return self.deleted_at is not None

    @property
    def superseded(self) -> bool:
        return self.superseded_by is not None

    def expired(self, now: dt.datetime | None = None) -> bool:
        """True once ``expires_at`` has passed (at ``now``, default the current time)."""
        when = dt.datetime.now(dt.UTC) if now is None else now
        return self.expires_at is not None and self.expires_at <= when


@dataclass(frozen=True, slots=True)
class MemoryPut:
    """A memory to write: ``content`` and ``data`` codec-encoded, ``id`` used only if it is added."""

    id: str
    type: str
    scope: str
    key: str | None
    content: bytes
    data: bytes | None
    confidence: float
    source: str | None
    expires_at: dt.datetime | None
    actor: str | None
    reason: str | None
    at: dt.datetime


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """One change of a memory. ``old`` and ``new`` are its content before and after (None before an
    ADD and after a DELETE); ``before`` and ``after`` hold every field that can change (content, data,
    confidence, source, expires_at, superseded_by, deleted_at). ``version`` is the memory's version
    after the change: a memory's events have versions 1, 2, 3 … without gaps."""

    memory_id: str
    version: int
    event: str
    old: Any
    new: Any
    actor: str | None
    reason: str | None
    at: dt.datetime
    before: dict[str, Any] | None
    after: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Episode:
    """What happened in a session, summarised: messages ``first_seq`` (inclusive) to ``upto_seq``."""

    id: str
    session_key: str
    summary: str
    first_seq: int | None
    upto_seq: int | None
    entities: tuple[str, ...]
    importance: float
    created_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Relation:
    """An edge of the memory graph, true from ``valid_from`` until ``valid_to`` (excluded; None: still
    true). ``source_memory_id`` is the memory it was derived from, if any."""

    id: str
    subject: str
    relation: str
    object: str
    weight: float
    valid_from: dt.datetime
    valid_to: dt.datetime | None
    source_memory_id: str | None
    created_at: dt.datetime

    @property
    def obj(self) -> str:
        """The object, under the name ``relate`` takes it by."""
        return self.object

    def valid_at(self, when: dt.datetime) -> bool:
        return self.valid_from <= when and (self.valid_to is None or when < self.valid_to)


@dataclass(frozen=True, slots=True)
class Contradiction:
    """Two memories that disagree; open until resolved (once) with a resolution text."""

    id: str
    memory_a: str
    memory_b: str
    description: str
    resolution: str | None
    created_at: dt.datetime
    resolved_at: dt.datetime | None

    @property
    def resolved(self) -> bool:
        return self.resolved_at is not None


@dataclass(frozen=True, slots=True)
class MemoryAccess:
    """One read of a memory, from the access log (``id`` identifies the entry)."""

    id: str
    memory_id: str
    at: dt.datetime
    context_query: str | None


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One recorded change of a file. ``path`` is relative and POSIX-normalised; ``seq`` counts the
    records of that path from 1; ``checksum`` is the SHA-256 hex of the content (None for a deletion)."""

    path: str
    seq: int
    checksum: str | None
    size: int | None
    action: str
    task_id: str | None
    session_key: str | None
    recorded_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Drift:
    """A file whose state on disk no longer matches its last record: ``kind`` is "changed" (other
    content, not a regular file, or present although recorded as deleted), "missing" or "unreadable".
    ``checksum`` and ``size`` are those of the file on disk now, when it could be read."""

    path: str
    kind: str
    record: FileRecord
    checksum: str | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class StateCounts:
    """How much state a store holds, read on one snapshot by COUNTs over indexed columns.

    ``sessions``, ``tasks`` and ``workflows`` map every status to its count (0 included).
    ``approvals_pending`` counts undecided, unexpired approvals (what ``approvals.pending()`` lists);
    ``audit_entries`` is the audit head's sequence number: entries are numbered from 1 and never deleted.
    ``memories`` counts live memories (neither forgotten nor superseded), ``contradictions_open`` the
    unresolved contradictions, ``file_changes`` the records of the file ledger.
    """

    sessions: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    workflows: dict[str, int] = field(default_factory=dict)
    approvals_pending: int = 0
    audit_entries: int = 0
    memories: int = 0  # live: neither forgotten nor superseded
    contradictions_open: int = 0
    file_changes: int = 0


@dataclass(frozen=True, slots=True)
class DatabaseFiles:
    """The files an embedded store lives in: the database and its write-ahead log, in bytes."""

    path: str
    database_bytes: int
    wal_bytes: int


@dataclass(frozen=True, slots=True)
class Incident:
    """Damage statekeel found in its own storage, kept until someone acknowledges it.

    ``kind`` is e.g. ``"wal_lost"`` (a SQLite WAL file was deleted before its commits reached the database
    file: acknowledged writes are gone); ``detail`` says what was found and what to do.
    """

    id: int
    kind: str
    detected_at: dt.datetime
    detail: dict[str, Any]
    acknowledged_at: dt.datetime | None = None
    acknowledged_by: str | None = None


@dataclass(frozen=True, slots=True)
class Damage:
    """What a damaged table still holds (SQLite: pages the integrity check found damaged).

    ``index_only``: every row reads, only an index is damaged (rebuilding it loses nothing). Otherwise
    ``unreadable`` lists the primary keys of rows that cannot be read (a message as ``(session_key, seq)``,
    a task as ``(id,)``; a group whose rows cannot be told apart as its first key column alone), and
    ``complete`` is False when some unreadable rows could not be named. ``readable`` counts the rows that
    still read; ``detail`` is what the integrity check said.
    """

    table: str
    index_only: bool
    unreadable: tuple[tuple[Any, ...], ...]
    readable: int
    complete: bool
    detail: str


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


@dataclass(frozen=True, slots=True)
class Vector:
    """A stored embedding. ``embedding`` holds its float32 values (as Python floats); ``source_version``
    is the version of the source it was computed from (None: not said)."""

    vec_id: str
    model: str
    source_id: str
    source_version: int | None
    embedding: tuple[float, ...]
    metadata: dict[str, Any]
    updated_at: dt.datetime

    @property
    def dim(self) -> int:
        return len(self.embedding)


@dataclass(frozen=True, slots=True)
class VectorWrite:
    """A validated embedding to store: ``embedding`` is ``dim`` little-endian float32 values.

    ``vec_id=None`` (a rebuild) replaces every vector of the source in ``model`` by this one, keeping the
    first one's id and metadata. ``metadata`` is codec-encoded JSON; None keeps what is stored (``{}`` for a
    new vector)."""

    vec_id: str | None
    model: str
    source_id: str
    source_version: int | None
    embedding: bytes
    dim: int
    metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class VectorModelState:
    """An embedding model of the index: its dimension and its change counters (``generation`` grows at
    every change of its vectors, ``removals`` at every deletion)."""

    model: str
    dim: int
    generation: int
    removals: int


@dataclass(frozen=True, slots=True)
class VectorRows:
    """Vectors of one model read on one snapshot with the model's state: all of them (``full``), or those
    written after a given generation. Each row is ``(vec_id, source_id, embedding, metadata, generation)``."""

    state: VectorModelState | None
    full: bool
    rows: list[tuple[str, str, bytes, dict[str, Any], int]]


@dataclass(frozen=True, slots=True)
class Lag:
    """A source whose vectors are behind it: ``kind`` is "memory" (a memory's id) or "external" (announced
    with ``source_changed``); ``version`` is the source's version, ``indexed_version`` the newest version
    among its vectors (None: no vector says one). ``changed_at`` orders the listing."""

    source_id: str
    kind: str
    version: int
    indexed_version: int | None
    changed_at: dt.datetime


@dataclass(frozen=True, slots=True)
class PurgeBatch:
    """What one purge transaction deleted (or, in a dry run, would delete), by kind; ``after`` is where the
    next batch starts (None when this one was the last); ``seconds`` is how long it held the transaction;
    ``purged`` names the rows of the batch's kind it deleted that later batches must know of."""

    counts: dict[str, int]
    after: tuple[Any, ...] | None
    seconds: float
    purged: tuple[str, ...] = ()
    parents: tuple[str, ...] = ()  # tasks: the parents of those purged, which may be free to go now


@dataclass(frozen=True, slots=True)
class FreeSpace:
    """Unused space inside an embedded database file: free pages and their size, and whether the file
    gives them back by itself after a purge (``incremental``: SQLite's ``auto_vacuum=INCREMENTAL``)."""

    free_pages: int
    page_size: int
    incremental: bool

    @property
    def free_bytes(self) -> int:
        return self.free_pages * self.page_size
