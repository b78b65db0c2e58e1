"""Export a store to one self-describing JSONL file: ``await statekeel.export_store(store, path)``.

    report = await statekeel.export_store(store, "agent.export.jsonl")
    report = await statekeel.export_store(store, "alice.jsonl", sessions=["user:alice"])
    report = await statekeel.export_store(store, "memory.jsonl", kinds=["memory"])

The file's first line is a header (format name ``statekeel-export``, format version, the store's schema
version, the columns of every kind it holds, the record count per kind, and the SHA-256 of the body); each
following line is one record: ``{"kind": <table>, "row": {<column>: <value>, ...}}``, rows exactly as the
store holds them (sequence numbers, versions, timestamps, hashes), so an import behaves like the source.
``docs/export-format.md`` specifies it for other tools.

Tables are streamed page by page through the verbatim row access ``copy_store`` uses (parents first, in
primary-key order), so memory stays constant in the store's size. ``sessions=[keys]`` keeps only the
records that belong to those sessions (their messages, summaries, archive, tool calls, episodes and file
ledger records); ``kinds`` names the kinds to export (groups such as ``"sessions"`` or ``"memory"``, or
single tables). The store should be quiet while it is exported (as for ``copy_store``): pages are read one
after the other, not on one snapshot.

The file is written under a temporary name next to ``path`` (owner-only, 0600), flushed, fsynced and only
then given its name: a crash leaves no file at ``path`` (at most a ``.<name>.*.partial`` file next to it,
which can be deleted). An existing ``path`` is refused unless ``overwrite=True``.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

from .backends.base import CopyTableInfo, StorageBackend
from .errors import InvalidArgument, StorageCorrupt, Unsupported
from .validation import check_bool, check_int

if TYPE_CHECKING:
    from .memory import MemoryStore
    from .traces import TraceLog

FORMAT = "statekeel-export"
FORMAT_VERSION = 1

# The kinds a caller names, and the tables (record kinds) each one stands for, parents first.
KIND_GROUPS: dict[str, tuple[str, ...]] = {
    "sessions": (
        "sessions",
        "messages",
        "compressions",
        "message_archive",
        "rewound_messages",
        "session_steps",
    ),
    "tasks": ("workflows", "tasks", "workflow_steps", "task_steps"),
    "schedules": ("schedules",),
    "audit": ("audit_log", "approvals"),
    "memory": (
        "memories",
        "memory_events",
        "memory_episodes",
        "memory_relations",
        "memory_contradictions",
        "memory_accesses",
    ),
    "files": ("file_changes",),
    "traces": ("traces", "trace_counters"),
    "vectors": ("vector_models", "vectors", "vector_sources", "vector_cursors"),
    "checkpoints": ("checkpoints", "checkpoint_blobs", "checkpoint_writes"),
}

# The tables whose rows belong to one session, and the column that names it.
SESSION_COLUMN: dict[str, str] = {
    "sessions": "key",
    "messages": "session_key",
    "compressions": "session_key",
    "message_archive": "session_key",
    "rewound_messages": "session_key",
    "session_steps": "session_key",
    "memory_episodes": "session_key",
    "file_changes": "session_key",
}
# Tables whose primary key starts with the session key: read from (key, floor) on, not scanned whole.
_SEEK_FLOOR: dict[str, Any] = {"messages": -1, "compressions": "", "message_archive": -1, "session_steps": ""}

ProgressCallback = Callable[[str, int], object]


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What :func:`export_store` wrote: records per kind (table), the file's size and the SHA-256 of its
    body (as in its header), the schema version of the store it came from."""

    path: str
    counts: dict[str, int]
    records: int
    bytes: int
    sha256: str
    schema_version: int
    format_version: int
    seconds: float


def encode_value(kind: str, value: Any) -> Any:
    """A column value as the export file holds it (see ``docs/export-format.md``)."""
    if value is None:
        return None
    if kind == "ts":
        return value.astimezone(dt.UTC).isoformat()
    if kind == "json":
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise StorageCorrupt(f"a JSON column holds text that does not parse ({exc})", hint="") from None
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    return value


def select_tables(infos: Sequence[CopyTableInfo], kinds: Iterable[str] | None) -> list[CopyTableInfo]:
    """The tables of ``infos`` that ``kinds`` (group names or table names; None: all) stands for, in
    ``infos``' order. Unknown names raise ``InvalidArgument``."""
    if kinds is None:
        return list(infos)
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise InvalidArgument(
            f"kinds must be a list of kind names (e.g. ['sessions', 'memory']), got {kinds!r}", kinds=kinds
        )
    present = {info.name for info in infos}
    wanted: set[str] = set()
    for name in kinds:
        if isinstance(name, str) and name in KIND_GROUPS:
            wanted.update(KIND_GROUPS[name])
        elif isinstance(name, str) and name in present:
            wanted.add(name)
        else:
            raise InvalidArgument(
                f"unknown kind {name!r}; kinds: {', '.join(KIND_GROUPS)} (or a single table: "
                f"{', '.join(sorted(present))})",
                kind=name,
            )
    if not wanted:
        raise InvalidArgument("kinds names no kind; pass None to export every kind")
    return [info for info in infos if info.name in wanted]


def _session_keys(sessions: Iterable[str] | None) -> list[str] | None:
    if sessions is None:
        return None
    if isinstance(sessions, str) or not isinstance(sessions, Iterable):
        raise InvalidArgument(
            f"sessions must be a list of session keys, got {sessions!r}; for one session pass [key]",
            sessions=sessions,
        )
    keys = list(sessions)
    for key in keys:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"a session key must be a non-empty str, got {key!r}", key=key)
    if not keys:
        raise InvalidArgument("sessions is empty; pass None to export every session")
    return sorted(set(keys))


async def table_rows(
    backend: StorageBackend, info: CopyTableInfo, keys: Sequence[str] | None, batch_size: int
) -> AsyncIterator[list[tuple[Any, ...]]]:
    """The rows of one table page by page in key order (only those of the sessions ``keys``, if given)."""
    if keys is not None and info.name in _SEEK_FLOOR:
        for key in keys:
            after: tuple[Any, ...] | None = (key, _SEEK_FLOOR[info.name])
            while True:
                page = await backend.export_rows(info.name, after=after, limit=batch_size)
                mine = [row for row in page.rows if row[0] == key]
                if mine:
                    yield mine
                if len(mine) < len(page.rows) or len(page.rows) < batch_size:
                    break
                after = page.last_key
        return
    index = None
    if keys is not None:
        names = [c for c, _ in info.columns]
        index = names.index(SESSION_COLUMN[info.name])
    wanted = frozenset(keys or ())
    after = None
    while True:
        page = await backend.export_rows(info.name, after=after, limit=batch_size)
        rows = page.rows if index is None else [row for row in page.rows if row[index] in wanted]
        if rows:
            yield rows
        if len(page.rows) < batch_size:
            return
        after = page.last_key


def _check_target(path: str, overwrite: bool) -> str:
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise InvalidArgument(f"{path} is a directory; name the export file", path=path)
    if not os.path.isdir(os.path.dirname(target)):
        raise InvalidArgument(f"the directory of {path} does not exist; create it first", path=path)
    if os.path.exists(target) and not overwrite:
        raise InvalidArgument(
            f"{path} exists; nothing was written: pass overwrite=True (statekeel export --force) to replace "
            "it, or choose another path",
            path=path,
            hint="",
        )
    return target


@runtime_checkable
class Exportable(Protocol):
    """What an export reads of a store (a :class:`statekeel.Store` has it): its backend, and the buffered
    tiers it flushes first."""

    @property
    def backend(self) -> StorageBackend: ...
    @property
    def traces(self) -> TraceLog: ...
    @property
    def memory(self) -> MemoryStore: ...


async def export_store(
    store: Exportable,
    path: str | os.PathLike[str],
    *,
    sessions: Iterable[str] | None = None,
    kinds: Iterable[str] | None = None,
    overwrite: bool = False,
    batch_size: int = 1000,
    on_batch: ProgressCallback | None = None,
) -> ExportReport:
    """Write the state of ``store`` to the new JSONL file ``path`` (see the module documentation).

    ``sessions``: only those sessions' records; ``kinds``: only those kinds (``sessions``, ``tasks``,
    ``audit``, ``memory``, ``files``, ``traces``, ``vectors``, ``checkpoints``, or table names).
    ``on_batch(kind, records_so_far)`` is called after each page written (for a progress display).
    Raises ``InvalidArgument`` for bad arguments and an existing ``path`` (unless ``overwrite``), and
    ``Unsupported`` for a store with state on NATS (``docs/nats.md``), before anything is written.
    """
    # First: a plain NATS store has no store.memory, which the isinstance check below would touch.
    held = getattr(getattr(store, "backend", None), "kinds", None)
    if isinstance(held, frozenset) and "copy" not in held:
        # A plain or paired NATS store: what it keeps on NATS is no table rows (docs/nats.md); a paired one
        # names the kinds it keeps there.
        front = getattr(store.backend, "front_kinds", None) or ()
        on_nats = ", ".join(k for k in ("sessions", "audit", "traces") if k in front)
        where = (
            f"the {on_nats} of {getattr(store.backend, 'url', 'this store')} are on NATS"
            if on_nats
            else "this store keeps state on NATS"
        )
        raise Unsupported(
            f"{where}, which is not rows: an export (like backup and copy_store) "
            "is refused, no file written. Back the NATS streams up with NATS's own tools; the SQL store "
            "of a paired one (?rest=) exports on its own URL",
            kind="copy",
            hint="",
        )
    if not isinstance(store, Exportable):
        raise InvalidArgument(f"store must be an open statekeel Store, got {type(store).__name__}")
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"path must be a file path, got {type(path).__name__}")
    check_bool(overwrite, "overwrite")
    check_int(batch_size, "batch_size", minimum=1)
    if on_batch is not None and not callable(on_batch):
        raise InvalidArgument(f"on_batch must be callable, got {type(on_batch).__name__}")
    keys = _session_keys(sessions)
    target = _check_target(os.fspath(path), overwrite)
    began = time.monotonic()
    backend = store.backend
    # Buffered tiers first: what the process holds belongs in the export.
    await store.traces.flush()
    await store.memory.flush()
    infos = select_tables(await backend.copy_tables(), kinds)
    if keys is not None:
        infos = [info for info in infos if info.name in SESSION_COLUMN]
    schema = await backend.schema_version()
    directory, name = os.path.split(target)
    temps: list[str] = []
    try:
        body_fd, body_path = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".body.partial")
        temps.append(body_path)
        digest = hashlib.sha256()
        counts: dict[str, int] = {}
        size = 0
        with os.fdopen(body_fd, "wb") as body:
            for info in infos:
                counts[info.name] = 0
                async for rows in table_rows(backend, info, keys, batch_size):
                    chunk = _records(info, rows)
                    digest.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(body.write, chunk)
                    counts[info.name] += len(rows)
                    if on_batch is not None:
                        on_batch(info.name, counts[info.name])
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "schema_version": schema,
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "selection": {"sessions": keys, "kinds": [info.name for info in infos]},
            "columns": {info.name: [list(c) for c in info.columns] for info in infos},
            "counts": counts,
            "records": sum(counts.values()),
            "body_bytes": size,
            "body_sha256": digest.hexdigest(),
        }
        head = orjson.dumps(header) + b"\n"
        final_fd, final_path = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".partial")
        temps.append(final_path)
        await asyncio.to_thread(_assemble, final_fd, head, body_path)
        await asyncio.to_thread(_publish, final_path, target, overwrite)
        temps.remove(final_path)
    finally:
        for temp in temps:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
    return ExportReport(
        path=target,
        counts=counts,
        records=sum(counts.values()),
        bytes=len(head) + size,
        sha256=header["body_sha256"],  # type: ignore[arg-type]
        schema_version=schema,
        format_version=FORMAT_VERSION,
        seconds=time.monotonic() - began,
    )


def _records(info: CopyTableInfo, rows: list[tuple[Any, ...]]) -> bytes:
    columns = info.columns
    out = bytearray()
    for row in rows:
        values = {c: encode_value(kind, v) for (c, kind), v in zip(columns, row, strict=True)}
        out += orjson.dumps({"kind": info.name, "row": values})
        out += b"\n"
    return bytes(out)


def _assemble(fd: int, head: bytes, body_path: str) -> None:
    with os.fdopen(fd, "wb") as out, open(body_path, "rb") as body:
        out.write(head)
        shutil.copyfileobj(body, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())


def _publish(temp: str, target: str, overwrite: bool) -> None:
    """Give the finished file its name: atomically, and never over a file that appeared meanwhile unless
    ``overwrite``."""
    if overwrite:
        os.replace(temp, target)
    else:
        try:
            os.link(temp, target)
        except FileExistsError:
            raise InvalidArgument(
                f"{target} was created by someone else during the export; nothing was written there",
                path=target,
            ) from None
        os.unlink(temp)
    fd = os.open(os.path.dirname(target), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FORMAT", "FORMAT_VERSION", "KIND_GROUPS", "ExportReport", "Exportable", "export_store"]
