"""The records of the storage contract: frozen dataclasses (and the status names) that backends return
and managers consume. Each lives beside its kind's ABC in :mod:`statekeel.backends.contract`; this module
(and :mod:`statekeel.backends.base`) re-exports them.

Sequence numbers of a session's messages are dense and 0-based: ``head_seq`` is the number of messages
ever appended, and the next message gets ``seq == head_seq``.
"""

from __future__ import annotations

from statekeel.backends.contract.audit import APPROVAL_STATUSES, ApprovalRecord, AuditNote, AuditRecord
from statekeel.backends.contract.checkpoints import (
    ChannelBlob,
    CheckpointLineage,
    CheckpointRecord,
    CheckpointWrite,
    NewCheckpoint,
    TypedBlob,
)
from statekeel.backends.contract.encryption import ResealPage
from statekeel.backends.contract.memory import (
    FILE_ACTIONS,
    MEMORY_EVENTS,
    MEMORY_TYPES,
    Contradiction,
    Drift,
    Episode,
    FileRecord,
    Memory,
    MemoryAccess,
    MemoryEvent,
    MemoryPut,
    Relation,
)
from statekeel.backends.contract.sessions import (
    SESSION_STATUSES,
    SESSION_STEP_STATUSES,
    ArchivedMessage,
    LoadedSession,
    MessageRecord,
    NewMessage,
    OpenCalls,
    SessionLease,
    SessionRecord,
    SessionStepRecord,
)
from statekeel.backends.contract.store import (
    CopyTableInfo,
    Damage,
    DatabaseFiles,
    FreeSpace,
    Incident,
    MigrationInfo,
    Page,
    PurgeBatch,
    RowPage,
    StateCounts,
    every_item,
)
from statekeel.backends.contract.tasks import (
    STEP_STATUSES,
    TASK_STATUSES,
    WORKFLOW_STATUSES,
    NewTask,
    NewWorkflowStep,
    StepRecord,
    TaskChange,
    TaskRecord,
    WorkflowRecord,
    WorkflowStepRecord,
)
from statekeel.backends.contract.traces import SPAN_STATUSES, NewSpan, Span
from statekeel.backends.contract.vectors import Lag, Vector, VectorModelState, VectorRows, VectorWrite

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
    "ApprovalRecord",
    "ArchivedMessage",
    "AuditNote",
    "AuditRecord",
    "ChannelBlob",
    "CheckpointLineage",
    "CheckpointRecord",
    "CheckpointWrite",
    "Contradiction",
    "CopyTableInfo",
    "Damage",
    "DatabaseFiles",
    "Drift",
    "Episode",
    "FileRecord",
    "FreeSpace",
    "Incident",
    "Lag",
    "LoadedSession",
    "Memory",
    "MemoryAccess",
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
    "RowPage",
    "SessionLease",
    "SessionRecord",
    "SessionStepRecord",
    "Span",
    "StateCounts",
    "StepRecord",
    "TaskChange",
    "TaskRecord",
    "TypedBlob",
    "Vector",
    "VectorModelState",
    "VectorRows",
    "VectorWrite",
    "WorkflowRecord",
    "WorkflowStepRecord",
    "every_item",
]
