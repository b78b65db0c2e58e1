"""Import an export file into any store: ``await statekeel.import_store(store, path)``.

    report = await statekeel.import_store(store, "agent.export.jsonl")
    print(report.counts)

Two passes over the file. The first writes nothing: it checks the header (format name, a format version
this code reads, a schema version not newer than the store's, columns the store has), then reads every
record, counting them per kind and hashing the body; a file whose counts, size or hash differ from its
header (truncated, edited, damaged) raises ``ExportCorrupt``, a newer format ``ExportTooNew``. The second
pass inserts the rows verbatim (page by page through the row access ``copy_store`` uses) inside one
transaction, hashing the body again: either the whole file is in the store or none of it is — a process
killed during an import leaves the store as it was, and running the import again completes it.

``on_conflict="fail"`` (the only mode): a record whose key the store holds already (a session of the same
key, an audit entry of the same sequence number) raises ``ConflictError`` and nothing is imported.

Audit entries keep their sequence numbers, hashes and MACs, so the imported chain verifies as it did in
the source (with the same ``audit_key`` if the source had one). They can therefore only go into a store
whose audit log is empty: otherwise the import is refused before anything is written. Encrypted values
stay sealed; the store they are imported into needs the source's key to read them.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

import orjson

from .backends.base import CopyTableInfo, StorageBackend
from .errors import ConflictError, ExportCorrupt, ExportTooNew, InvalidArgument
from .export import FORMAT, FORMAT_VERSION, ProgressCallback
from .validation import check_int

ON_CONFLICT = ("fail",)


def _open_calls_before_9(row: dict[str, Any]) -> Any:
    # Migration 0009 marked a session with live messages "count unknown" (-1), counted again once read.
    return -1 if (row.get("head_seq") or 0) > (row.get("last_consolidated") or 0) else 0


# The columns a migration added to a table that existed before it: (table, column) -> (the schema version
# that added it, what that migration gave the rows already there: a value, or a function of the row). A
# file exported before that version lacks the column; its rows get what the migration would have given
# them, so an old export imports as the upgraded store of its time would hold it. Any other column a file
# lacks is one its schema version had: such a file is refused.
ADDED_COLUMNS: dict[tuple[str, str], tuple[int, Any]] = {
    ("audit_log", "mac"): (8, None),
    ("sessions", "open_calls"): (9, _open_calls_before_9),
    ("sessions", "calls_owner"): (9, None),
    ("sessions", "write_id"): (12, None),
    ("sessions", "parent_key"): (13, None),
    ("sessions", "parent_seq"): (13, None),
    ("sessions", "rewinds"): (13, 0),
    ("compressions", "kind"): (13, "compression"),
    ("messages", "usage"): (13, None),
    ("message_archive", "usage"): (13, None),
    ("memory_episodes", "rewinds"): (17, None),
    # Schema 18 added it, but its exports left it out: they carry it from 19.
    ("task_steps", "attempt_id"): (19, None),
    ("tasks", "transition_id"): (19, None),
    ("tasks", "not_before"): (20, None),
}
# A header line longer than this is not one of ours (it names columns and counts, not data).
_MAX_HEADER = 16 << 20
_LINES_PER_READ = 2000


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What :func:`import_store` loaded: records per kind (table), verified against the file's header,
    and the SHA-256 of the file's body."""

    path: str
    counts: dict[str, int]
    records: int
    sha256: str
    schema_version: int
    format_version: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Header:
    fields: dict[str, Any]
    columns: dict[str, list[tuple[str, str]]]
    counts: dict[str, int]
    body_bytes: int
    sha256: str
    # Per kind, the store's columns the file lacks (added by a later migration), filled on import.
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _corrupt(path: str, what: str, **fields: Any) -> ExportCorrupt:
    return ExportCorrupt(f"{path} is not a sound statekeel export: {what}", path=path, **fields)


def _read_header(path: str, fh: IO[bytes]) -> _Header:
    line = fh.readline(_MAX_HEADER)
    if not line.endswith(b"\n"):
        raise _corrupt(path, "its first line (the header) is incomplete")
    try:
        header = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _corrupt(path, "its first line is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _corrupt(path, f"its header does not name the format {FORMAT!r}")
    version = header.get("format_version")
    if type(version) is not int or version < 1:
        raise _corrupt(path, f"its format_version is {version!r}")
    if version > FORMAT_VERSION:
        raise ExportTooNew(
            f"{path} is in export format {version}; this statekeel reads format {FORMAT_VERSION} and older",
            path=path,
            format_version=version,
        )
    columns, counts = header.get("columns"), header.get("counts")
    size, sha = header.get("body_bytes"), header.get("body_sha256")
    if not isinstance(columns, dict) or not isinstance(counts, dict) or set(columns) != set(counts):
        raise _corrupt(path, "its header's columns and counts do not name the same kinds")
    if type(size) is not int or not isinstance(sha, str) or type(header.get("schema_version")) is not int:
        raise _corrupt(path, "its header lacks body_bytes, body_sha256 or schema_version")
    parsed: dict[str, list[tuple[str, str]]] = {}
    for kind, cols in columns.items():
        if not isinstance(cols, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in cols
        ):
            raise _corrupt(path, f"its header's columns of {kind!r} are malformed")
        parsed[kind] = [(c[0], c[1]) for c in cols]
        if type(counts[kind]) is not int or counts[kind] < 0:
            raise _corrupt(path, f"its header's count of {kind!r} is {counts[kind]!r}")
    return _Header(header, parsed, dict(counts), size, sha)


def decode_value(kind: str, value: Any) -> Any:
    """A value of the export file back as ``copy_store``'s portable row value; ``ValueError`` if it does
    not fit its column's kind."""
    if value is None:
        return None
    if kind == "ts":
        if not isinstance(value, str):
            raise ValueError(f"a timestamp must be a string, got {value!r}")
        when = dt.datetime.fromisoformat(value)
        if when.tzinfo is None:
            raise ValueError(f"timestamp {value!r} has no time zone")
        return when.astimezone(dt.UTC)
    if kind == "json":
        return orjson.dumps(value).decode("utf-8")
    if kind == "bytes":
        if not isinstance(value, str):
            raise ValueError(f"bytes must be a base64 string, got {type(value).__name__}")
        return base64.b64decode(value, validate=True)
    if kind == "int" and (type(value) is not int):
        raise ValueError(f"expected an integer, got {value!r}")
    if kind == "float" and (type(value) not in (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    if kind == "text" and not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    if kind == "bool" and not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


class _Records:
    """The records of an export body, line by line, hashed and counted as they are read."""

    def __init__(self, path: str, header: _Header, tables: dict[str, CopyTableInfo]) -> None:
        self.path = path
        self.header = header
        self.tables = tables
        self.digest = hashlib.sha256()
        self.size = 0
        self.counts = dict.fromkeys(header.counts, 0)
        self.line = 1

    def rows(self, fh: IO[bytes]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        """Each record as (table, row in the store's column order)."""
        for raw in fh:
            self.line += 1
            self.digest.update(raw)
            self.size += len(raw)
            if not raw.endswith(b"\n"):
                raise _corrupt(self.path, f"line {self.line} is cut short (the file is truncated)")
            yield self._parse(raw)

    def _parse(self, raw: bytes) -> tuple[str, tuple[Any, ...]]:
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _corrupt(self.path, f"line {self.line} is not JSON", line=self.line) from None
        kind = record.get("kind") if isinstance(record, dict) else None
        row = record.get("row") if isinstance(record, dict) else None
        if kind not in self.header.columns or not isinstance(row, dict):
            raise _corrupt(self.path, f"line {self.line} is not a record of a kind its header names")
        columns = self.header.columns[kind]
        if set(row) != {c for c, _ in columns}:
            raise _corrupt(self.path, f"line {self.line} does not hold the columns of {kind}", line=self.line)
        self.counts[kind] += 1
        try:
            values = {c: decode_value(k, row[c]) for c, k in columns}
        except (ValueError, TypeError) as exc:
            raise _corrupt(self.path, f"line {self.line}: {exc}", line=self.line) from None
        for column in self.header.missing.get(kind, ()):
            fill = ADDED_COLUMNS[(kind, column)][1]
            values[column] = fill(values) if callable(fill) else fill
        return kind, tuple(values[c] for c, _ in self.tables[kind].columns)

    def verify(self) -> None:
        """After the last line: counts, size and hash as the header says."""
        header = self.header
        for kind, n in header.counts.items():
            if self.counts[kind] != n:
                raise _corrupt(
                    self.path,
                    f"it holds {self.counts[kind]} records of {kind}, its header says {n}",
                    kind=kind,
                )
        if self.size != header.body_bytes or self.digest.hexdigest() != header.sha256:
            raise _corrupt(self.path, "the SHA-256 of its body differs from its header's (edited or damaged)")


def _check_columns(path: str, header: _Header, tables: dict[str, CopyTableInfo]) -> None:
    """Every column of the file is one the store has; every column the file lacks was added after the
    file's schema version (``ADDED_COLUMNS``), and is recorded in ``header.missing`` to be filled."""
    schema = header.fields["schema_version"]
    for kind, columns in header.columns.items():
        info = tables.get(kind)
        if info is None:
            raise _corrupt(path, f"it holds records of {kind!r}, a kind this store does not have")
        ours = dict(info.columns)
        for column, col_kind in columns:
            if ours.get(column) != col_kind:
                raise _corrupt(path, f"column {kind}.{column} ({col_kind}) is not one this store has")
        theirs = {c for c, _ in columns}
        missing = tuple(c for c, _ in info.columns if c not in theirs)
        for column in missing:
            added = ADDED_COLUMNS.get((kind, column))
            if added is None or added[0] <= schema:
                raise _corrupt(
                    path,
                    f"its records of {kind} lack the column {column}, which a store of schema version "
                    f"{schema} (the file's) has",
                    kind=kind,
                    column=column,
                )
        if missing:
            header.missing[kind] = missing


def _first_pass(path: str, tables: dict[str, CopyTableInfo], schema: int) -> _Header:
    with open(path, "rb", buffering=1 << 20) as fh:
        header = _read_header(path, fh)
        if header.fields["schema_version"] > schema:
            raise ExportTooNew(
                f"{path} was exported from schema version {header.fields['schema_version']}; this store is "
                f"at {schema}",
                path=path,
                schema_version=header.fields["schema_version"],
            )
        _check_columns(path, header, tables)
        records = _Records(path, header, tables)
        for _ in records.rows(fh):
            pass
        records.verify()
    return header


class _Chunks:
    """Batches of rows of one kind, read from the file in a worker thread a few thousand lines at a time."""

    def __init__(self, path: str, header: _Header, tables: dict[str, CopyTableInfo]) -> None:
        self.fh = open(path, "rb", buffering=1 << 20)  # noqa: SIM115  (closed by close())
        _read_header(path, self.fh)
        self.records = _Records(path, header, tables)
        self._rows = self.records.rows(self.fh)

    def read(self) -> list[tuple[str, tuple[Any, ...]]]:
        out = []
        for item in self._rows:
            out.append(item)
            if len(out) >= _LINES_PER_READ:
                break
        return out

    def close(self) -> None:
        self.fh.close()


async def _load(
    backend: StorageBackend,
    path: str,
    header: _Header,
    tables: dict[str, CopyTableInfo],
    batch_size: int,
    on_batch: ProgressCallback | None,
    only: frozenset[str] | None = None,
) -> None:
    """One pass over the body: insert every row (``only=None``), or set the links of the tables in
    ``only``; raises ``ExportCorrupt`` when the file changed since the first pass."""
    chunks = _Chunks(path, header, tables)
    done: dict[str, int] = {}
    pending: list[tuple[Any, ...]] = []
    kind_of_pending = ""

    async def flush() -> None:
        nonlocal pending
        if not pending:
            return
        if only is None:
            try:
                await backend.import_rows(kind_of_pending, pending)
            except ConflictError as exc:
                # The database's own reason says which: a key held already, a missing parent row, a
                # value its column refuses. Nothing else is known here; guessing misled users.
                raise ConflictError(
                    f"a record of {kind_of_pending} was refused by this store ({exc.message}); nothing "
                    "was imported",
                    kind=kind_of_pending,
                    hint="",
                ) from exc
            done[kind_of_pending] = done.get(kind_of_pending, 0) + len(pending)
            if on_batch is not None:
                on_batch(kind_of_pending, done[kind_of_pending])
        else:
            await backend.link_rows(kind_of_pending, pending)
        pending = []

    try:
        while items := await asyncio.to_thread(chunks.read):
            for kind, row in items:
                if only is not None and kind not in only:
                    continue
                if kind != kind_of_pending or len(pending) >= batch_size:
                    await flush()
                    kind_of_pending = kind
                pending.append(row)
        await flush()
        chunks.records.verify()
    finally:
        chunks.close()


@runtime_checkable
class Importable(Protocol):
    """What an import writes into (a :class:`statekeel.Store` has it): the store's backend."""

    @property
    def backend(self) -> StorageBackend: ...


async def import_store(
    store: Importable,
    path: str | os.PathLike[str],
    *,
    on_conflict: str = "fail",
    batch_size: int = 1000,
    on_batch: ProgressCallback | None = None,
) -> ImportReport:
    """Load the export file ``path`` into ``store`` (see the module documentation): all of it, in one
    transaction, or nothing. ``on_batch(kind, records_so_far)`` is called after each batch inserted.

    Raises, before anything is written: ``ExportCorrupt`` (not an export, truncated, edited),
    ``ExportTooNew`` (newer format or schema), ``ConflictError`` (audit entries into a store that has
    some); and ``ConflictError`` for a record whose key the store already holds (nothing imported).
    """
    if not isinstance(store, Importable):
        raise InvalidArgument(f"store must be an open statekeel Store, got {type(store).__name__}")
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"path must be a file path, got {type(path).__name__}")
    if on_conflict not in ON_CONFLICT:
        raise InvalidArgument(
            f"on_conflict must be one of {', '.join(map(repr, ON_CONFLICT))}, got {on_conflict!r}",
            on_conflict=on_conflict,
        )
    check_int(batch_size, "batch_size", minimum=1)
    if on_batch is not None and not callable(on_batch):
        raise InvalidArgument(f"on_batch must be callable, got {type(on_batch).__name__}")
    target = os.path.abspath(os.fspath(path))  # noqa: ASYNC240  (no I/O: a path computation)
    if not await asyncio.to_thread(os.path.isfile, target):
        raise InvalidArgument(f"{target} is not a file; name an export file", path=target)
    began = time.monotonic()
    backend = store.backend
    tables = {info.name: info for info in await backend.copy_tables()}
    schema = await backend.schema_version()
    header = await asyncio.to_thread(_first_pass, target, tables, schema)
    if header.counts.get("audit_log"):
        held = await backend.count_rows("audit_log")
        if held:
            raise ConflictError(
                f"{target} holds audit entries and this store's audit log has {held} already; imported "
                "entries keep their sequence numbers and hashes, so they go only into a store without any: "
                "import into a new store, or export without the audit kind",
                path=target,
                rows=held,
                hint="",
            )
    links = frozenset(k for k, n in header.counts.items() if n and tables[k].links)
    async with backend.atomic():
        await _load(backend, target, header, tables, batch_size, on_batch)
        if links:
            await _load(backend, target, header, tables, batch_size, None, only=links)
    return ImportReport(
        path=target,
        counts=dict(header.counts),
        records=sum(header.counts.values()),
        sha256=header.sha256,
        schema_version=header.fields["schema_version"],
        format_version=header.fields["format_version"],
        seconds=time.monotonic() - began,
    )


__all__ = ["ImportReport", "Importable", "import_store"]
