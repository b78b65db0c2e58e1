"""The storage contract: one ABC per state kind, composed into :class:`StorageBackend`.

Every method is a state-semantic operation that is atomic on its own; ``async with backend.atomic():``
groups several into one transaction. Managers (``statekeel.sessions`` …) hold the semantics that do not
depend on a backend and talk to storage only through this contract. Each kind's ABC lives beside the
records it exchanges (frozen dataclasses) in :mod:`statekeel.backends.contract`; this module re-exports
them all, and is where the rest of statekeel imports a record from.
"""

from __future__ import annotations

import abc

from statekeel.backends.contract.audit import (
    APPROVAL_STATUSES,
    ApprovalBackend,
    ApprovalRecord,
    AuditBackend,
    AuditNote,
    AuditRecord,
)
from statekeel.backends.contract.checkpoints import (
    ChannelBlob,
    CheckpointBackend,
    CheckpointLineage,
    CheckpointRecord,
    CheckpointThread,
    CheckpointWrite,
    NewCheckpoint,
    TypedBlob,
)
from statekeel.backends.contract.encryption import EncryptionBackend, ResealPage
from statekeel.backends.contract.memory import (
    FILE_ACTIONS,
    MEMORY_EVENTS,
    MEMORY_TYPES,
    Contradiction,
    Drift,
    Episode,
    FileBackend,
    FileRecord,
    Memory,
    MemoryAccess,
    MemoryBackend,
    MemoryEvent,
    MemoryPut,
    Relation,
)
from statekeel.backends.contract.schedules import (
    CATCH_UP_POLICIES,
    OVERLAP_POLICIES,
    FiredSchedule,
    NewSchedule,
    ScheduleBackend,
    ScheduleChange,
    ScheduleFire,
    ScheduleRecord,
    ScheduleSlot,
)
from statekeel.backends.contract.sessions import (
    SESSION_STATUSES,
    SESSION_STEP_STATUSES,
    ArchivedMessage,
    Branch,
    LoadedSession,
    MessageRecord,
    NewMessage,
    OpenCalls,
    RewindRecord,
    SessionBackend,
    SessionLease,
    SessionRecord,
    SessionStepRecord,
    ToolCallBackend,
)
from statekeel.backends.contract.store import (
    CopyBackend,
    CopyTableInfo,
    Damage,
    DatabaseFiles,
    ErasureBackend,
    ErasureBatch,
    FreeSpace,
    Incident,
    IncidentBackend,
    LifecycleBackend,
    MigrationInfo,
    Page,
    PurgeBatch,
    RetentionBackend,
    RowPage,
    StateCounts,
    every_item,
)
from statekeel.backends.contract.tasks import (
    STEP_STATUSES,
    TASK_STATUSES,
    WORKFLOW_STATUSES,
    AuditNotes,
    NewTask,
    NewWorkflowStep,
    StepRecord,
    TaskBackend,
    TaskChange,
    TaskRecord,
    WorkflowBackend,
    WorkflowRecord,
    WorkflowStepRecord,
)
from statekeel.backends.contract.traces import SPAN_STATUSES, NewSpan, Span, TraceBackend
from statekeel.backends.contract.vectors import (
    Lag,
    Vector,
    VectorBackend,
    VectorModelState,
    VectorRows,
    VectorWrite,
)

__all__ = [
    "ALL_KINDS",
    "APPROVAL_STATUSES",
    "CATCH_UP_POLICIES",
    "FILE_ACTIONS",
    "KIND_CONTRACTS",
    "MEMORY_EVENTS",
    "MEMORY_TYPES",
    "OVERLAP_POLICIES",
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
    "Branch",
    "ChannelBlob",
    "CheckpointBackend",
    "CheckpointLineage",
    "CheckpointRecord",
    "CheckpointThread",
    "CheckpointWrite",
    "Contradiction",
    "CopyBackend",
    "CopyTableInfo",
    "Damage",
    "DatabaseFiles",
    "Drift",
    "EncryptionBackend",
    "Episode",
    "ErasureBackend",
    "ErasureBatch",
    "FileBackend",
    "FileRecord",
    "FiredSchedule",
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
    "NewSchedule",
    "NewSpan",
    "NewTask",
    "NewWorkflowStep",
    "OpenCalls",
    "Page",
    "PurgeBatch",
    "Relation",
    "ResealPage",
    "RetentionBackend",
    "RewindRecord",
    "RowPage",
    "ScheduleBackend",
    "ScheduleChange",
    "ScheduleFire",
    "ScheduleRecord",
    "ScheduleSlot",
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
    "every_item",
    "kind_methods",
]

KIND_CONTRACTS: dict[str, type] = {
    "lifecycle": LifecycleBackend,
    "incidents": IncidentBackend,
    "sessions": SessionBackend,
    "tool_calls": ToolCallBackend,
    "tasks": TaskBackend,
    "workflows": WorkflowBackend,
    "schedules": ScheduleBackend,
    "audit": AuditBackend,
    "approvals": ApprovalBackend,
    "memory": MemoryBackend,
    "files": FileBackend,
    "traces": TraceBackend,
    "vectors": VectorBackend,
    "retention": RetentionBackend,
    "checkpoints": CheckpointBackend,
    "copy": CopyBackend,
    "encryption": EncryptionBackend,
    "erasure": ErasureBackend,
}
"""Each state kind's name and the contract ABC that holds its operations (``StorageBackend.kinds`` names
the kinds a backend holds)."""

ALL_KINDS = frozenset(KIND_CONTRACTS)


def kind_methods(kind: str) -> tuple[str, ...]:
    """The public operations the contract of ``kind`` defines (its ABC's own methods)."""
    contract = KIND_CONTRACTS[kind]
    return tuple(
        name for name, value in vars(contract).items() if not name.startswith("_") and callable(value)
    )


class StorageBackend(
    LifecycleBackend,
    IncidentBackend,
    SessionBackend,
    ToolCallBackend,
    TaskBackend,
    WorkflowBackend,
    ScheduleBackend,
    AuditBackend,
    ApprovalBackend,
    MemoryBackend,
    FileBackend,
    TraceBackend,
    VectorBackend,
    RetentionBackend,
    CheckpointBackend,
    CopyBackend,
    EncryptionBackend,
    ErasureBackend,
    abc.ABC,
):
    """Everything a store needs from storage. Other state kinds add their ABCs here as they land.

    ``kinds`` names the state kinds the backend holds (:data:`KIND_CONTRACTS`): every kind for the SQL
    backends; an event-log backend holds some, and the operations of the others raise ``Unsupported``.
    ``transactional`` says whether ``atomic()`` groups writes into one transaction.
    """

    kinds: frozenset[str] = ALL_KINDS
    transactional: bool = True

    async def __aenter__(self) -> StorageBackend:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
