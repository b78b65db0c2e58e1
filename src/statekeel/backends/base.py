"""The storage contract: one ABC per state kind, composed into :class:`StorageBackend`.

Every method is a state-semantic operation that is atomic on its own; ``async with backend.atomic():``
groups several into one transaction. Managers (``statekeel.sessions`` …) hold the semantics that do not
depend on a backend and talk to storage only through this contract. Each kind's ABC lives beside the
records it exchanges (frozen dataclasses) in :mod:`statekeel.backends.contract`; this module re-exports
them all.
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
    "ResealPage",
    "RetentionBackend",
    "RewindRecord",
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
    "every_item",
]


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
    EncryptionBackend,
    abc.ABC,
):
    """Everything a store needs from storage. Other state kinds add their ABCs here as they land."""

    async def __aenter__(self) -> StorageBackend:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
