"""LangGraph checkpoints in a statekeel store: :class:`StatekeelSaver`, a ``BaseCheckpointSaver``.

One line to adopt it, on any statekeel URL (SQLite file, ``memory://``, PostgreSQL)::

    from statekeel.integrations.langgraph import StatekeelSaver

    async with StatekeelSaver.from_url("sqlite:///agent.db") as saver:
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke({"messages": [...]}, {"configurable": {"thread_id": "user-42"}})

or, on a store the application already opened, ``StatekeelSaver(store)``.

Storage: a checkpoint row holds the checkpoint without its channel values; each channel's value is stored
once per channel version (the shape of LangGraph's PostgreSQL saver), so a step that changes one channel
stores that channel only and a long thread grows with what changed. Values are serialized with the saver's
``serde`` (LangGraph's ``JsonPlusSerializer`` by default) into bytes columns; metadata is JSON, filterable
by ``alist(filter=...)``. Each ``aput`` is one transaction, and it returns only once committed.

Bad input raises before anything is written: a config without ``thread_id`` raises
:class:`~statekeel.errors.InvalidConfig` (a ``ValueError``), a value the serializer refuses
:class:`~statekeel.errors.UnserializableValue` (a ``TypeError``, as the serializer raises, and a
``ValueError``). An unknown checkpoint id is what LangGraph expects of every saver: ``aget_tuple`` returns
None and ``alist`` yields nothing.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import orjson

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        PendingWrite,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # an optional extra
    raise ImportError(
        f"statekeel.integrations.langgraph needs LangGraph: pip install 'statekeel[langgraph]' ({exc})"
    ) from exc

from ..backends.base import (
    ChannelBlob,
    CheckpointRecord,
    CheckpointWrite,
    NewCheckpoint,
    TypedBlob,
)
from ..errors import (
    InvalidArgument,
    InvalidConfig,
    PayloadTooLarge,
    SerializationError,
    SyncCallRefused,
    UnserializableValue,
)
from ..store import Store, open_store
from ._bridge import LoopThread, blocking

T = TypeVar("T")

# Rows per page when alist reads a long history; each page is one read.
_PAGE = 100
# Upper bounds (UTF-8 bytes) of the identifiers that make up primary keys: PostgreSQL's B-tree refuses index
# entries above ~2.7 kB, and a key this long is a caller's mistake anyway.
_MAX_ID_BYTES = 512
_MAX_NS_BYTES = 1024


def _text(
    value: Any, what: str, *, limit: int = _MAX_ID_BYTES, allow_empty: bool = False, coerce: bool = False
) -> str:
    """``value`` as identifier text every backend stores, or ``InvalidConfig`` saying what was wrong.

    With ``coerce`` an int or UUID becomes its text, as LangGraph itself does with a thread or run id.
    """
    if coerce and isinstance(value, int | uuid.UUID) and not isinstance(value, bool):
        value = str(value)
    if type(value) is not str:
        raise InvalidConfig(f"{what} must be a str, got {type(value).__name__} {value!r}", value=value)
    if not value and not allow_empty:
        raise InvalidConfig(f"{what} is empty", value=value)
    if "\x00" in value:
        raise InvalidConfig(f"{what} {value[:40]!r} contains NUL, which PostgreSQL cannot store")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidConfig(f"{what} {value[:40]!r} is not valid Unicode (lone surrogate)") from None
    if size > limit:
        raise InvalidConfig(f"{what} is {size} bytes in UTF-8, over the limit of {limit}", value=value[:40])
    return value


def _configurable(config: Any, what: str = "config") -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        raise InvalidConfig(
            f"{what} must be a dict like {{'configurable': {{'thread_id': ...}}}}, got "
            f"{type(config).__name__}"
        )
    conf = config.get("configurable")
    if not isinstance(conf, Mapping):
        raise InvalidConfig(
            f"{what} has no 'configurable' dict; pass {{'configurable': {{'thread_id': ...}}}}"
        )
    return conf


def _thread(conf: Mapping[str, Any], what: str = "config") -> tuple[str, str]:
    """``(thread_id, checkpoint_ns)`` of a config; the namespace defaults to the root ``""``."""
    if conf.get("thread_id") in (None, ""):
        raise InvalidConfig(
            f"{what} has no configurable.thread_id: a checkpointer stores state per thread; pass "
            "{'configurable': {'thread_id': 'user-42'}}"
        )
    thread_id = _text(conf["thread_id"], "thread_id", coerce=True)
    ns = conf.get("checkpoint_ns")
    return thread_id, "" if ns is None else _text(ns, "checkpoint_ns", limit=_MAX_NS_BYTES, allow_empty=True)


def _checkpoint_id(conf: Mapping[str, Any]) -> str | None:
    value = conf.get("checkpoint_id")
    return None if value in (None, "") else _text(value, "checkpoint_id")


def _version(value: Any, channel: str) -> str:
    """A channel version as the text that keys its blob (versions are str, int or float)."""
    if isinstance(value, str):
        return _text(value, f"version of channel {channel!r}")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise InvalidConfig(f"version of channel {channel!r} must be a str, int or float, got {value!r}")


def _loop_now() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class StatekeelSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer on a statekeel store (SQLite, ``memory://`` or PostgreSQL).

    ``StatekeelSaver(store)`` uses an open :class:`~statekeel.Store` (the application closes it);
    ``StatekeelSaver.from_url(url)`` / ``from_conn_string(url)`` opens one and closes it with the saver::

        async with StatekeelSaver.from_url("postgresql://agent@db:5432/agents") as saver:
            graph = builder.compile(checkpointer=saver)

    or, for a sync graph (``graph.invoke``, ``get_state``), as LangGraph's ``SqliteSaver`` is used::

        with StatekeelSaver.from_url("sqlite:///agent.db") as saver:
            graph = builder.compile(checkpointer=saver)
            graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "user-42"}})

    The async methods are the interface. The sync ones (``get_tuple``, ``list``, ``put`` …) exist for
    LangGraph's sync API and run on the saver's event loop: call them from another thread while that loop
    runs; on the loop itself they raise :class:`~statekeel.errors.SyncCallRefused`, as LangGraph's own
    async savers do.
    """

    store: Store

    def __init__(self, store: Store, *, serde: SerializerProtocol | None = None) -> None:
        if not isinstance(store, Store):
            raise InvalidArgument(
                f"StatekeelSaver needs an open statekeel Store, got {type(store).__name__}; use "
                "StatekeelSaver.from_url('sqlite:///agent.db') to open one"
            )
        super().__init__(serde=serde)
        self.store = store
        self.loop: asyncio.AbstractEventLoop | None = _loop_now()
        self._owns_store = False
        self._thread: LoopThread | None = None  # the store's own loop, for a saver opened with `with`

    @classmethod
    def from_url(
        cls, url: str, *, serde: SerializerProtocol | None = None, **store_options: Any
    ) -> _SaverOpener:
        """Open the store at ``url`` (``open_store`` options as keywords) and a saver on it.

        ``async with StatekeelSaver.from_url(url) as saver:`` closes the store at the end of the block;
        ``saver = await StatekeelSaver.from_url(url)`` leaves that to ``await saver.aclose()``.
        """
        return _SaverOpener(cls, url, serde, store_options)

    @classmethod
    def from_conn_string(
        cls, conn_string: str, *, serde: SerializerProtocol | None = None, **store_options: Any
    ) -> _SaverOpener:
        """The name LangGraph's savers use for :meth:`from_url`: ``async with
        StatekeelSaver.from_conn_string("sqlite:///agent.db") as saver:``."""
        return _SaverOpener(cls, conn_string, serde, store_options)

    async def aclose(self) -> None:
        """Close the store if this saver opened it (``from_url``); a store passed in is left open."""
        if self._owns_store:
            await self.store.close()

    def close(self) -> None:
        """Close, from sync code, a saver opened with ``with StatekeelSaver.from_url(url) as saver:`` (the
        block does it): its store, then the thread its event loop runs on."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            blocking(self.aclose(), thread.loop, "StatekeelSaver.close")
        finally:
            thread.stop()

    # --- serialization -------------------------------------------------------------------------------

    def _dump(self, value: Any, where: str) -> TypedBlob:
        try:
            kind, data = self.serde.dumps_typed(value)
        except Exception as exc:  # the serializer's own error (TypeError, ValueError …) names the type
            raise UnserializableValue(
                f"cannot serialize {where} with {type(self.serde).__name__}: {exc}", path=where
            ) from exc
        limit = self.store.codec.max_record_bytes
        if len(data) > limit:
            raise PayloadTooLarge(
                f"{where} is {len(data)} bytes serialized, over the store's max_record_bytes of {limit}",
                size=len(data),
                limit=limit,
                path=where,
            )
        return TypedBlob(kind, data)

    def _json(self, value: Any, where: str) -> bytes:
        # Sorted keys: metadata and filters compare equal as text on SQLite when they are equal as values.
        try:
            raw = orjson.dumps(self.store.codec.to_json(value, where=where), option=orjson.OPT_SORT_KEYS)
        except SerializationError as exc:
            raise UnserializableValue(str(exc), path=where) from None
        limit = self.store.codec.max_record_bytes
        if len(raw) > limit:
            raise PayloadTooLarge(
                f"{where} is {len(raw)} bytes encoded, over the limit of {limit}", size=len(raw), limit=limit
            )
        return raw

    def _load(self, blob: TypedBlob) -> Any:
        return self.serde.loads_typed((blob.type, b"" if blob.data is None else blob.data))

    def _tuple(self, rec: CheckpointRecord) -> CheckpointTuple:
        checkpoint: Checkpoint = self._load(rec.checkpoint)
        checkpoint["channel_values"] = {ch: self._load(b) for ch, b in rec.channel_values.items()}
        parent: RunnableConfig | None = None
        if rec.parent_checkpoint_id is not None:
            parent = {
                "configurable": {
                    "thread_id": rec.thread_id,
                    "checkpoint_ns": rec.checkpoint_ns,
                    "checkpoint_id": rec.parent_checkpoint_id,
                }
            }
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": rec.thread_id,
                    "checkpoint_ns": rec.checkpoint_ns,
                    "checkpoint_id": rec.checkpoint_id,
                }
            },
            checkpoint=checkpoint,
            metadata=rec.metadata,  # type: ignore[arg-type]
            parent_config=parent,
            pending_writes=[(w.task_id, w.channel, self._load(w.value)) for w in rec.pending_writes],
        )

    def _bind(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    # --- async interface -----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (its ``checkpoint_id``, else the newest of the thread and
        namespace) with its pending writes; None when there is none."""
        self._bind()
        conf = _configurable(config)
        thread_id, ns = _thread(conf)
        rec = await self.store.backend.get_checkpoint(thread_id, ns, _checkpoint_id(conf))
        return None if rec is None else self._tuple(rec)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first: of the config's thread (and namespace, and checkpoint id, when it
        names them), or of every thread when ``config`` is None. ``filter`` keeps those whose metadata has
        each key equal to its value; ``before`` those older than its checkpoint; ``limit`` caps the count.
        """
        self._bind()
        thread_id = ns = checkpoint_id = None
        if config is not None:
            conf = _configurable(config)
            thread_id, ns = _thread(conf)
            if conf.get("checkpoint_ns") is None:
                ns = None  # no namespace given: every namespace of the thread
            checkpoint_id = _checkpoint_id(conf)
        after: tuple[str, str, str] | None = None
        if before is not None:
            before_id = _checkpoint_id(_configurable(before, "before"))
            if before_id is None:
                raise InvalidConfig(
                    "before has no configurable.checkpoint_id; pass the config of a checkpoint"
                )
            after = (before_id, "", "")  # sorts after every (before_id, thread, namespace)
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidConfig(f"limit must be None or an int >= 0, got {limit!r}", value=limit)
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidConfig(f"filter must be a dict of metadata values, got {type(filter).__name__}")
        metadata_filter = self._json(dict(filter), "filter") if filter else None
        remaining = limit
        while remaining is None or remaining > 0:
            page = _PAGE if remaining is None else min(remaining, _PAGE)
            records = await self.store.backend.list_checkpoints(
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                metadata_filter=metadata_filter,
                after=after,
                limit=page,
            )
            for rec in records:
                yield self._tuple(rec)
            if len(records) < page:
                return
            last = records[-1]
            after = (last.checkpoint_id, last.thread_id, last.checkpoint_ns)
            if remaining is not None:
                remaining -= len(records)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the values of the channels in ``new_versions``, in one transaction.

        Returns the config of the stored checkpoint. The config's ``checkpoint_id``, if any, is recorded
        as its parent.
        """
        self._bind()
        conf = _configurable(config)
        thread_id, ns = _thread(conf)
        parent = _checkpoint_id(conf)
        if not isinstance(checkpoint, Mapping) or "id" not in checkpoint:
            raise InvalidConfig(
                f"checkpoint must be a LangGraph Checkpoint dict with an id, got {checkpoint!r}"
            )
        checkpoint_id = _text(checkpoint["id"], "checkpoint id")
        values = checkpoint.get("channel_values") or {}
        # Everything is serialized before the write: a value the serializer refuses changes nothing.
        blobs = tuple(
            ChannelBlob(
                channel,
                _version(version, channel),
                self._dump(values[channel], f"channel {channel!r}")
                if channel in values
                else TypedBlob("empty", None),
            )
            for channel, version in new_versions.items()
        )
        body = self._dump({k: v for k, v in checkpoint.items() if k != "channel_values"}, "checkpoint")
        versions = {
            _text(ch, "channel name"): _version(v, ch)
            for ch, v in checkpoint.get("channel_versions", {}).items()
        }
        meta = get_serializable_checkpoint_metadata(config, metadata)
        run_id = meta.get("run_id")
        await self.store.backend.put_checkpoint(
            NewCheckpoint(
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                parent_checkpoint_id=parent,
                checkpoint=body,
                metadata=self._json(meta, "metadata"),
                channel_versions=orjson.dumps(versions),
                run_id=None if run_id is None else str(run_id),
                blobs=blobs,
            )
        )
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes after the config's checkpoint, in one transaction. Saving the same
        (task, index) again keeps the first; writes to special channels (errors, interrupts) replace."""
        self._bind()
        conf = _configurable(config)
        thread_id, ns = _thread(conf)
        checkpoint_id = _checkpoint_id(conf)
        if checkpoint_id is None:
            raise InvalidConfig("config has no configurable.checkpoint_id: writes belong to a checkpoint")
        task_id = _text(task_id, "task_id")
        task_path = _text(task_path, "task_path", limit=4 * _MAX_NS_BYTES, allow_empty=True)
        rows = []
        for i, write in enumerate(writes):
            if not isinstance(write, tuple | list) or len(write) != 2:
                raise InvalidConfig(f"write {i} must be a (channel, value) pair, got {write!r}")
            channel = _text(write[0], f"channel of write {i}")
            rows.append(
                CheckpointWrite(
                    task_id=task_id,
                    idx=WRITES_IDX_MAP.get(channel, i),
                    channel=channel,
                    value=self._dump(write[1], f"write {i} to channel {channel!r}"),
                    task_path=task_path,
                )
            )
        replace = all(row.channel in WRITES_IDX_MAP for row in rows)
        await self.store.backend.put_checkpoint_writes(thread_id, ns, checkpoint_id, rows, replace=replace)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread (all namespaces)."""
        self._bind()
        await self.store.backend.delete_checkpoint_thread(_text(thread_id, "thread_id", coerce=True))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) made by these runs (metadata ``run_id``)."""
        self._bind()
        if isinstance(run_ids, str):
            raise InvalidConfig("run_ids must be a list of run ids, got a str")
        await self.store.backend.delete_checkpoint_runs([_text(r, "run id", coerce=True) for r in run_ids])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of a thread to another thread, in one transaction."""
        self._bind()
        await self.store.backend.copy_checkpoint_thread(
            _text(source_thread_id, "source_thread_id", coerce=True),
            _text(target_thread_id, "target_thread_id", coerce=True),
        )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only the newest checkpoint of each namespace of these threads (``"keep_latest"``), or
        delete them all (``"delete"``); values no remaining checkpoint uses are deleted too."""
        self._bind()
        if strategy not in ("keep_latest", "delete"):
            raise InvalidConfig(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        if isinstance(thread_ids, str):
            raise InvalidConfig("thread_ids must be a list of thread ids, got a str")
        await self.store.backend.prune_checkpoints(
            [_text(t, "thread_id", coerce=True) for t in thread_ids], keep_latest=strategy == "keep_latest"
        )

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """For LangGraph's ``DeltaChannel``: per channel, the writes stored along the parent chain of the
        config's checkpoint (oldest first) back to the nearest ancestor holding a value (the ``seed``).

        The same answer as the base class's walk, read in pages of ancestors (growing from 8) instead of
        one checkpoint per read.
        """
        self._bind()
        if not channels:
            return {}
        conf = _configurable(config)
        thread_id, ns = _thread(conf)
        wanted = [_text(ch, "channel name") for ch in channels]
        collected: dict[str, list[PendingWrite]] = {ch: [] for ch in wanted}
        seeds: dict[str, Any] = {}
        remaining = set(wanted)
        start, skip_target = _checkpoint_id(conf), True
        # Pages grow (8, 32, 128, 512 …): a snapshot a few steps back costs one small read, a long walk
        # a few reads.
        page = 8
        while remaining:
            line = await self.store.backend.checkpoint_lineage(thread_id, ns, start, wanted, limit=page)
            # The target's own writes are pending for its next step: the walk starts at its parent.
            for entry in line[1:] if skip_target else line:
                for w in reversed(entry.writes):
                    if w.channel in remaining:
                        collected[w.channel].append((w.task_id, w.channel, self._load(w.value)))
                for ch in [ch for ch in wanted if ch in remaining and ch in entry.values]:
                    seeds[ch] = self._load(entry.values[ch])
                    remaining.discard(ch)
                if not remaining:
                    break
            if len(line) < page or line[-1].parent_checkpoint_id is None:
                break
            start, skip_target = line[-1].parent_checkpoint_id, False
            page = min(page * 4, 512)
        result: dict[str, DeltaChannelHistory] = {}
        for ch in wanted:
            history: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
            if ch in seeds:
                history["seed"] = seeds[ch]
            result[ch] = history
        return result

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions ``<counter>.<random>``: increasing, and distinct between two branches forked from one
        checkpoint, so their values never share a blob."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # --- sync interface (LangGraph's sync API, from another thread) ----------------------------------

    def _loop_for_sync(self, method: str) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is not None and _loop_now() is loop:
            raise SyncCallRefused(
                f"StatekeelSaver.{method}() was called on the event loop the saver runs on, where it would "
                f"block forever; use `await saver.a{method}(...)` or `await graph.ainvoke(...)`"
            )
        if loop is None or loop.is_closed() or not loop.is_running():
            raise SyncCallRefused(
                f"StatekeelSaver.{method}() runs on the saver's event loop, which is not running; call it "
                "from another thread while the loop that opened the store runs"
            )
        return loop

    def _sync(self, method: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self._loop_for_sync(method)
        return asyncio.run_coroutine_threadsafe(make(), loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync("get_tuple", lambda: self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        loop = self._loop_for_sync("list")
        items = self.alist(config, filter=filter, before=before, limit=limit)
        while True:
            try:
                yield asyncio.run_coroutine_threadsafe(_next(items), loop).result()
            except StopAsyncIteration:
                return

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._sync("put", lambda: self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._sync("put_writes", lambda: self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync("delete_thread", lambda: self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync("delete_for_runs", lambda: self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync("copy_thread", lambda: self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync("prune", lambda: self.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._sync(
            "get_delta_channel_history",
            lambda: self.aget_delta_channel_history(config=config, channels=channels),
        )


async def _next(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


class _SaverOpener:
    """What ``StatekeelSaver.from_url`` returns: await it, or use it as ``async with``."""

    def __init__(
        self,
        cls: type[StatekeelSaver],
        url: str,
        serde: SerializerProtocol | None,
        options: dict[str, Any],
    ) -> None:
        self._cls = cls
        self._serde = serde
        self._opener = open_store(url, **options)  # a bad URL or option fails here, at the call
        self._saver: StatekeelSaver | None = None

    async def _open(self) -> StatekeelSaver:
        store = await self._opener
        try:
            saver = self._cls(store, serde=self._serde)
        except BaseException:
            await store.close()
            raise
        saver._owns_store = True
        return saver

    def __await__(self) -> Generator[Any, None, StatekeelSaver]:
        return self._open().__await__()

    def __enter__(self) -> StatekeelSaver:
        """``with StatekeelSaver.from_url(url) as saver:`` for a sync graph (``graph.invoke``,
        ``get_state``, ``get_state_history``): the store runs on an event loop of its own, on a thread the
        block ends with the store."""
        thread = LoopThread("statekeel-saver")
        try:
            saver = blocking(self._open(), thread.loop, "StatekeelSaver.from_url")
        except BaseException:
            thread.stop()
            raise
        saver.loop = thread.loop
        saver._thread = thread
        self._saver = saver
        return saver

    def __exit__(self, *exc: object) -> None:
        if self._saver is not None:
            self._saver.close()

    async def __aenter__(self) -> StatekeelSaver:
        self._saver = await self._open()
        return self._saver

    async def __aexit__(self, *exc: object) -> None:
        if self._saver is not None:
            await self._saver.aclose()


__all__ = ["StatekeelSaver"]
