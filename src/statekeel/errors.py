"""The statekeel error hierarchy.

Every error statekeel raises is a :class:`StatekeelError`. Each carries structured fields (``key``,
``path``, ``current`` …) so callers can react without parsing messages, and each message says what was
wrong and what to do about it.

    try:
        await store.sessions.save(session)
    except statekeel.ConflictError as e:
        # another writer appended first: reload and retry
        print(e.current)
"""

from __future__ import annotations

import asyncio
from typing import Any


class StatekeelError(Exception):
    """Base class of every statekeel error.

    The text is the message followed by the class's ``hint`` (what to do), said once: a raise site whose
    message already says what to do passes its own ``hint`` (``""`` for none). ``message`` is the text
    without the hint, for an error that quotes another as its cause.
    """

    hint: str = ""

    def __init__(self, message: str, **fields: Any) -> None:
        # ``hint=`` is taken from the keywords (not a named parameter) so that callers passing their
        # fields as **mapping type-check whatever the mapping holds.
        hint: str | None = fields.pop("hint", None)
        self.message = message  # without the hint: for a caller that quotes this error in its own
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)
        if hint is not None:
            self.hint = hint
        advice = self.hint
        full = f"{message}. {advice}" if advice and advice.lower() not in message.lower() else message
        super().__init__(full)


class NotFound(StatekeelError):
    """The record does not exist (and the backend answered: never used for a failed read)."""

    hint = "Check the identifier, or create the record first."


class ConflictError(StatekeelError):
    """A conditional write found a different version or head than expected."""

    hint = "Another writer changed it first: reload, re-apply your change and retry."


class LockTimeout(ConflictError):
    """Waiting for a lock or lease held by someone else took longer than the timeout. Nothing changed;
    it is a ``ConflictError`` so that one ``except`` covers "someone else has it"."""

    hint = "Another holder still has it: retry later, or wait longer (a larger timeout)."


class InvalidTransition(StatekeelError):
    """A state machine was asked for a transition it does not allow."""

    hint = "Check the allowed transitions in the documentation of the state kind."


class LeaseLost(StatekeelError):
    """The caller's lease was taken over or expired (a zombie holder)."""

    hint = "Stop working on it: this worker no longer holds it (another may take it over)."


class StepInDoubt(StatekeelError):
    """A non-idempotent step was started but never recorded as finished (a crash in between). Fields:
    ``record``, and ``task_id`` / ``step_key`` for a task's step, ``session_key`` / ``call_id`` for a
    session's tool call."""

    hint = (
        "Check whether its side effect happened, then settle it with tasks.resolve_step() (a task's step) "
        "or sessions.resolve_tool() (a session's tool call); or mark it idempotent if re-running it is safe"
    )


class InvalidArgument(StatekeelError):
    """An argument is malformed (wrong type, out of range). Nothing was written."""

    hint = "Nothing was written; fix the argument and call again."


class StepInTransaction(InvalidArgument):
    """``tasks.step()`` or ``sessions.run_tool()`` was called inside a ``backend.atomic()`` block: its
    *started* record would commit with the block (a rollback would erase it, and the next call run the
    function again), and the block's locks would be held while the function runs. Nothing was written
    and the function did not run."""

    hint = (
        "Nothing was written and the function did not run; call it outside the atomic() block (before "
        "the block, or after it committed)"
    )


class SerializationError(InvalidArgument):
    """A value cannot be encoded by the statekeel codec (or stored bytes cannot be decoded)."""

    hint = (
        "Nothing was written. Use JSON types, or datetime/date/UUID/Decimal/bytes/Enum/dataclasses, "
        "or register a type with statekeel.codec.register_type()"
    )


class PayloadTooLarge(InvalidArgument):
    """An encoded record exceeds ``max_record_bytes``."""

    hint = "Nothing was written. Store large blobs elsewhere and keep a reference, or raise max_record_bytes."


class InvalidKey(InvalidArgument):
    """A key is empty, not a string, contains NUL or exceeds 512 bytes in UTF-8."""

    hint = "Nothing was written. Keys are non-empty str of at most 512 UTF-8 bytes without NUL."


class InvalidEmbedding(InvalidArgument):
    """An embedding or a search query is not a usable vector: empty, not numbers, NaN or infinite (also
    once rounded to float32), or all zeros (it has no direction to compare). Nothing was written."""

    hint = "Nothing was written; pass a finite, non-zero list of numbers (or a 1-D numpy array)."


class DimensionMismatch(InvalidEmbedding):
    """An embedding or query has another dimension than its model's (fixed by the model's first vector).
    Fields: ``model``, ``expected``, ``got``."""

    hint = "Nothing was written; embed with the model the index holds, or store it under another model name."


class TranscriptError(InvalidArgument):
    """A message would make the transcript's tool calls and results inconsistent (an empty or reused call
    id, a result in a place the provider refuses). Fields: ``call_id``, ``dialect``, ``index``."""

    hint = "Nothing was written. Each tool call needs one non-empty id and exactly one result after it."


class UnknownToolCall(TranscriptError):
    """A tool result answers a call id that no earlier message of its format made."""


class ToolCallAlreadyAnswered(TranscriptError):
    """A tool result answers a call that already has its result."""


class SchemaTooNew(StatekeelError):
    """The database was migrated by a newer statekeel than this one."""

    hint = "Upgrade statekeel to a version that knows this schema; the database was not modified."


class MigrationError(StatekeelError):
    """A migration failed or an applied migration differs from the shipped file."""

    hint = "The database was left as it was; see the cause above."


class BackendUnavailable(StatekeelError):
    """The storage backend cannot be reached or cannot write right now."""

    hint = "Check that the database is reachable and writable, then retry."


class Unsupported(StatekeelError):
    """The store's backend does not hold this kind of state (or cannot do this), e.g. tasks on a plain
    ``nats://`` store. Fields: ``kind``, ``url``. Raised before anything is written."""

    hint = (
        "Pair the backend with a SQL backend that holds the other kinds (for NATS: "
        "nats://host:4222?rest=sqlite:///state.db), or use a SQL store"
    )


class StorageCorrupt(StatekeelError):
    """The storage is not a statekeel database, or it is damaged."""

    hint = "Restore the database from a backup, or point statekeel at another path."


class ExportCorrupt(StorageCorrupt):
    """An export file is not one, or is damaged, truncated or edited: its header, its counts or the hash
    of its body do not match. ``import_store`` raises it before writing anything."""

    hint = "Nothing was imported; export the store again, or restore the file from a good copy."


class ExportTooNew(SchemaTooNew):
    """An export file was written in a newer format, or from a newer schema, than this statekeel reads."""

    hint = "Nothing was imported; upgrade statekeel to a version that reads it."


class AuditTampered(StatekeelError):
    """The audit hash chain does not verify."""

    hint = "Audit entries were changed or removed outside statekeel; investigate before trusting them."


class AuditKeyRequired(StatekeelError):
    """An audited write on a store whose audit chain carries MACs, by a store opened without the audit
    key: the entry would have no MAC and the chain would stop verifying under the key for good. Refused
    before anything is written. Fields: ``head_seq`` (the keyed entry at the head of the chain)."""

    hint = (
        "Nothing was written; open the store with its audit key (open_store(url, audit_key=...); the "
        "statekeel command: --audit-key-file PATH or $STATEKEEL_AUDIT_KEY_FILE)"
    )


class EncryptionError(StatekeelError):
    """Encryption at rest cannot work as configured: the ``cryptography`` package is missing, or a key is
    unusable. Fields (when known): ``key_id``."""

    hint = "Nothing was written; install statekeel[encryption] and pass 32-byte keys (os.urandom(32))."


class DecryptionError(EncryptionError):
    """A stored value cannot be decrypted: its key id is not among the keys given, the key is wrong, or the
    ciphertext was altered or moved from another record (its identity is authenticated with it). Fields:
    ``kind`` (message, memory, step, approval), ``record`` (the record's identity), ``key_id``."""

    hint = (
        "Open the store with the key whose id is named (keep old keys in encryption_key=[new, old] until "
        "store.rotate_encryption_key() has finished); an authentication failure with the right key means "
        "the stored bytes were changed outside statekeel"
    )


class SubjectErased(DecryptionError):
    """A stored value was sealed under a subject's data key that an erasure destroyed: it is a copy (a
    backup, a restored file) of data the store erased, and can no longer be read by anyone. Fields:
    ``kind``, ``record``, ``key_id`` (the destroyed data key's id)."""

    hint = (
        "The subject was erased (store.erase): its data cannot be read from any copy taken before; "
        "restore nothing of it, or drop the record"
    )


class KeyRingError(EncryptionError):
    """The key ring (the file of per-subject data keys, ``open_store(keyring=...)``) cannot be used as
    configured: it is missing, too open, damaged, or its data keys are wrapped by a store key that is not
    among the keys given. Nothing was written. Fields: ``path``, and ``key_id`` when a store key is named."""

    hint = (
        "Restore the key ring from its own backup (it is not in the database's backups), open the store "
        "with the store key the ring was made with, or create a new ring with statekeel.create_keyring()"
    )


class PlaintextRefused(EncryptionError):
    """A value that should be encrypted was found stored in plaintext while a key is configured: it was
    written without encryption (or planted). Fields: ``kind``, ``record``."""

    hint = (
        "To encrypt a store written without a key, open it with encrypt_existing=True and run "
        "store.rotate_encryption_key()"
    )


# Errors of the framework adapters (``statekeel.integrations``). Each is a statekeel error and also the
# builtin type the framework's own code raises in that case, so callers written for the framework still
# catch it.


class InvalidConfig(InvalidArgument, ValueError):
    """A framework call's configuration or arguments are malformed or miss something statekeel needs (a
    LangGraph config without ``configurable.thread_id``, a ``before`` without a checkpoint id, a negative
    ``limit``). Nothing was written."""

    hint = "Nothing was written; pass the missing field in the config and call again."


class UnserializableValue(SerializationError, TypeError, ValueError):
    """A framework value cannot be serialized (by the framework's serializer or statekeel's codec).
    A ``TypeError`` as the framework's serializer raises, and a ``ValueError`` as bad input."""

    hint = "Nothing was written; store only values the serializer supports (or configure its serde)."


class InvalidImportSource(InvalidArgument, ValueError):
    """What ``statekeel import --from SOURCE PATH`` was given cannot be imported: an unknown source, a
    file that is not a database of that source's shape, or items that source would not hold. Nothing was
    written."""

    hint = "Nothing was written; check --from and the path (the database the framework's own store wrote)"


class SyncCallRefused(StatekeelError, asyncio.InvalidStateError):
    """A synchronous method of an async adapter cannot run here: on the event loop the adapter runs on
    (it would block that loop forever), or while that loop is not running."""

    hint = (
        "Use the async method (await saver.aget_tuple(...), await graph.ainvoke(...)) on the event loop; "
        "call the sync one only from another thread while the loop runs"
    )


class SessionClosed(SyncCallRefused, RuntimeError):
    """A framework session adapter was used after its ``close()``: every operation refuses, as the
    framework's own sessions do once closed (the Agents SDK's ``SQLiteSession`` raises ``RuntimeError``)."""

    hint = "Make a new session object to go on; what the closed one stored is kept"


__all__ = [
    "AuditKeyRequired",
    "AuditTampered",
    "BackendUnavailable",
    "ConflictError",
    "DimensionMismatch",
    "ExportCorrupt",
    "ExportTooNew",
    "InvalidArgument",
    "InvalidConfig",
    "InvalidEmbedding",
    "InvalidImportSource",
    "InvalidKey",
    "InvalidTransition",
    "LeaseLost",
    "LockTimeout",
    "MigrationError",
    "NotFound",
    "PayloadTooLarge",
    "SchemaTooNew",
    "SerializationError",
    "SessionClosed",
    "StatekeelError",
    "StepInDoubt",
    "StepInTransaction",
    "StorageCorrupt",
    "SyncCallRefused",
    "ToolCallAlreadyAnswered",
    "TranscriptError",
    "UnknownToolCall",
    "UnserializableValue",
    "Unsupported",
]
