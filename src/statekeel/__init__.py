"""statekeel: a recoverable state layer for long-running, tool-executing AI agents.

import statekeel

async with statekeel.open_store("sqlite:///agent-state.db") as store:
    session = await store.sessions.get_or_create("user-42")
    session.add_message("user", "run the tests")
    await store.sessions.save(session)
"""

from __future__ import annotations

from .approvals import Approval, ApprovalLog
from .audit import AuditEntry, AuditLog, AuditVerification
from .backends.base import Branch
from .codec.encryption import RotationReport, key_id
from .codec.keyring import create_keyring
from .copy import CopyReport, TableCopy
from .copying import copy_store
from .erasure import ErasureReport
from .errors import (
    AuditKeyRequired,
    AuditTampered,
    BackendUnavailable,
    ConflictError,
    DecryptionError,
    DimensionMismatch,
    EncryptionError,
    ExportCorrupt,
    ExportTooNew,
    InvalidArgument,
    InvalidConfig,
    InvalidEmbedding,
    InvalidImportSource,
    InvalidKey,
    InvalidTransition,
    KeyRingError,
    LeaseLost,
    LockTimeout,
    MigrationError,
    NotFound,
    PayloadTooLarge,
    PlaintextRefused,
    SchemaTooNew,
    SerializationError,
    SessionClosed,
    StatekeelError,
    StepInDoubt,
    StepInTransaction,
    StorageCorrupt,
    SubjectErased,
    SyncCallRefused,
    ToolCallAlreadyAnswered,
    TranscriptError,
    UnknownToolCall,
    UnserializableValue,
    Unsupported,
)
from .export import ExportReport, export_store
from .fallback import ReplayReport
from .files import Drift, FileLedger, FileRecord, checksum_file
from .health import StoreInfo
from .imports import ImportReport, import_store
from .memory import Contradiction, Episode, Memory, MemoryAccess, MemoryEvent, MemoryStore, Relation
from .retention import PurgeReport, Retention
from .schedules import Schedule, ScheduleManager
from .sessions import Rewind, Session, SessionLock, SessionManager
from .store import Store, open_store
from .tasks import Task, TaskManager
from .traces import Span, TraceLog
from .usage import ModelUsage, Usage
from .vectors import ExactSearch, Hit, Lag, SearchEngine, SearchRequest, Vector, VectorIndex
from .workflows import Workflow, WorkflowEngine, WorkflowStep

__version__ = "0.1.0"

__all__ = [
    "Approval",
    "ApprovalLog",
    "AuditEntry",
    "AuditKeyRequired",
    "AuditLog",
    "AuditTampered",
    "AuditVerification",
    "BackendUnavailable",
    "Branch",
    "ConflictError",
    "Contradiction",
    "CopyReport",
    "DecryptionError",
    "DimensionMismatch",
    "Drift",
    "EncryptionError",
    "Episode",
    "ErasureReport",
    "ExactSearch",
    "ExportCorrupt",
    "ExportReport",
    "ExportTooNew",
    "FileLedger",
    "FileRecord",
    "Hit",
    "ImportReport",
    "InvalidArgument",
    "InvalidConfig",
    "InvalidEmbedding",
    "InvalidImportSource",
    "InvalidKey",
    "InvalidTransition",
    "KeyRingError",
    "Lag",
    "LeaseLost",
    "LockTimeout",
    "Memory",
    "MemoryAccess",
    "MemoryEvent",
    "MemoryStore",
    "MigrationError",
    "ModelUsage",
    "NotFound",
    "PayloadTooLarge",
    "PlaintextRefused",
    "PurgeReport",
    "Relation",
    "ReplayReport",
    "Retention",
    "Rewind",
    "RotationReport",
    "Schedule",
    "ScheduleManager",
    "SchemaTooNew",
    "SearchEngine",
    "SearchRequest",
    "SerializationError",
    "Session",
    "SessionClosed",
    "SessionLock",
    "SessionManager",
    "Span",
    "StatekeelError",
    "StepInDoubt",
    "StepInTransaction",
    "StorageCorrupt",
    "Store",
    "StoreInfo",
    "SubjectErased",
    "SyncCallRefused",
    "TableCopy",
    "Task",
    "TaskManager",
    "ToolCallAlreadyAnswered",
    "TraceLog",
    "TranscriptError",
    "UnknownToolCall",
    "UnserializableValue",
    "Unsupported",
    "Usage",
    "Vector",
    "VectorIndex",
    "Workflow",
    "WorkflowEngine",
    "WorkflowStep",
    "checksum_file",
    "copy_store",
    "create_keyring",
    "export_store",
    "import_store",
    "key_id",
    "open_store",
]
