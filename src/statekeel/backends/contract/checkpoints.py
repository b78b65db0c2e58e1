"""Framework checkpoints (LangGraph): channel blobs stored once per version, pending writes, lineage."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChannelBlob",
    "CheckpointBackend",
    "CheckpointLineage",
    "CheckpointRecord",
    "CheckpointThread",
    "CheckpointWrite",
    "NewCheckpoint",
    "TypedBlob",
]


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
class CheckpointThread:
    """A thread as a listing shows it: how many checkpoints it holds in how many namespaces, and its newest
    checkpoint's id and time."""

    thread_id: str
    checkpoints: int
    namespaces: int
    latest_checkpoint_id: str
    latest_at: dt.datetime


@dataclass(frozen=True, slots=True)
class CheckpointLineage:
    """One checkpoint of a parent chain, with only the requested channels: their values at this
    checkpoint (channels without a value omitted) and the pending writes to them, in
    ``(task_path, task_id, idx)`` order."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    values: dict[str, TypedBlob]
    writes: tuple[CheckpointWrite, ...]


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
    async def list_checkpoint_threads(self, *, limit: int = 100) -> list[CheckpointThread]:
        """The threads with a checkpoint, the most recently checkpointed first (then by thread id), at
        most ``limit``, read on one snapshot."""

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
