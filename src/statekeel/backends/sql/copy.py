"""Verbatim table access for ``statekeel.copy_store``, shared by the SQL dialects.

Rows travel between dialects in a portable form: timestamps as aware UTC datetimes, JSON columns as JSON
text, booleans as bool, everything else as is. Each table is paged in primary-key order with text keys
compared bytewise in both dialects, so a destination filled batch by batch always holds a prefix of its
source — the last key it holds is where an interrupted copy resumes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidArgument
from ..base import CopyBackend, CopyTableInfo, RowPage
from . import SqlBackend, Tx


@dataclass(frozen=True, slots=True)
class CopyTable:
    """A copyable table: its columns with their portable kinds, and its primary key."""

    name: str
    columns: tuple[tuple[str, str], ...]  # (column, kind): text, int, float, json, ts, bool, bytes
    key: tuple[str, ...]
    links: tuple[str, ...] = ()  # self-references, set by a second pass (parents may come later)
    append_only: bool = False

    def index(self, names: tuple[str, ...]) -> tuple[int, ...]:
        columns = [c for c, _ in self.columns]
        return tuple(columns.index(n) for n in names)

    def info(self) -> CopyTableInfo:
        json = tuple(i for i, (_, kind) in enumerate(self.columns) if kind == "json")
        return CopyTableInfo(self.name, self.key, self.links, self.append_only, json, self.columns)


def _table(name: str, columns: str, key: str, *, links: str = "", append_only: bool = False) -> CopyTable:
    cols = tuple((c.split(":")[0], c.split(":")[1]) for c in columns.split())
    return CopyTable(name, cols, tuple(key.split()), tuple(links.split()), append_only)


# Parents before children (foreign keys). Leases and heartbeats are locks, not state, and incidents belong
# to the physical store they happened to: none of them is copied. Nor is the audit outbox of a store paired
# with NATS: its entries belong to the chain there, relayed before a copy reads it (backends/composite.py).
# Nor are SQLite's sealed segments: copies of message rows, sealed again by the destination's later saves.
TABLES: tuple[CopyTable, ...] = (
    _table(
        "sessions",
        "key:text status:text metadata:json last_consolidated:int head_seq:int version:int "
        "created_at:ts updated_at:ts open_calls:int calls_owner:text write_id:text parent_key:text "
        "parent_seq:int rewinds:int",
        "key",
    ),
    _table(
        "messages",
        "session_key:text seq:int role:text payload:json created_at:ts usage:json",
        "session_key seq",
    ),
    _table(
        "compressions",
        "session_key:text compression_id:text first_seq:int upto_seq:int summary:text created_at:ts "
        "kind:text",
        "session_key compression_id",
    ),
    _table(
        "message_archive",
        "session_key:text compression_id:text seq:int role:text payload:json created_at:ts usage:json",
        "session_key seq",
    ),
    _table(
        "rewound_messages",
        "session_key:text compression_id:text seq:int role:text payload:json created_at:ts usage:json",
        "session_key compression_id seq",
    ),
    _table(
        "workflows",
        "id:text name:text status:text metadata:json version:int created_at:ts updated_at:ts started_at:ts "
        "completed_at:ts",
        "id",
    ),
    _table(
        "tasks",
        "id:text workflow_id:text parent_task_id:text title:text description:text status:text priority:int "
        "result:json error:json retry_count:int max_retries:int metadata:json version:int lease_owner:text "
        "lease_expires_at:ts lease_epoch:int idempotency_key:text created_at:ts updated_at:ts "
        "started_at:ts completed_at:ts transition_id:text not_before:ts",
        "id",
        links="parent_task_id",
    ),
    _table(
        "workflow_steps",
        "workflow_id:text name:text position:int task_id:text depends_on:json",
        "workflow_id name",
    ),
    _table(
        "task_steps",
        "task_id:text step_key:text status:text attempt:int result:json error:json started_at:ts "
        "first_started_at:ts finished_at:ts attempt_id:text",
        "task_id step_key",
    ),
    # After tasks: last_task_id names one (no foreign key: a purged task leaves the id behind).
    _table(
        "schedules",
        "id:text name:text cron:text every_seconds:int timezone:text task:json catch_up:text "
        "catch_up_window:float overlap:text paused:bool fired_through:ts next_fire_at:ts last_slot:ts "
        "last_task_id:text version:int created_at:ts updated_at:ts",
        "id",
    ),
    _table(
        "session_steps",
        "session_key:text call_id:text status:text attempt:int owner:text result_seq:int error:json "
        "started_at:ts finished_at:ts",
        "session_key call_id",
    ),
    # The audit chain is copied byte for byte (data is canonical JSON text, hashed as such).
    _table(
        "audit_log",
        "seq:int kind:text actor:text subject:text data:text created_at:ts prev_hash:text hash:text mac:text",
        "seq",
        append_only=True,
    ),
    _table(
        "approvals",
        "id:text subject:text action:text args:json args_hash:text status:text requested_by:text "
        "requested_at:ts expires_at:ts decided_by:text decided_at:ts reason:text consumed_by:text "
        "consumed_at:ts version:int",
        "id",
        append_only=True,
    ),
    _table(
        "memories",
        "id:text type:text scope:text key:text content:json data:json confidence:float source:text "
        "created_at:ts updated_at:ts expires_at:ts superseded_by:text deleted_at:ts version:int",
        "id",
    ),
    _table(
        "memory_events",
        "memory_id:text version:int event:text state:json actor:text reason:text at:ts",
        "memory_id version",
    ),
    _table(
        "memory_episodes",
        "id:text session_key:text summary:text first_seq:int upto_seq:int entities:json importance:float "
        "created_at:ts rewinds:int",
        "id",
    ),
    _table(
        "memory_relations",
        "id:text subject:text relation:text object:text weight:float valid_from:ts valid_to:ts "
        "source_memory_id:text created_at:ts",
        "id",
    ),
    # An unresolved contradiction is never deleted, so overwrite=True cannot empty this table.
    _table(
        "memory_contradictions",
        "id:text memory_a:text memory_b:text description:text resolution:text created_at:ts resolved_at:ts",
        "id",
        append_only=True,
    ),
    _table("memory_accesses", "id:text memory_id:text at:ts context_query:text", "id"),
    _table(
        "file_changes",
        "path:text seq:int checksum:text size:int action:text task_id:text session_key:text recorded_at:ts",
        "path seq",
    ),
    _table(
        "traces",
        "trace_id:text span_id:text parent_span_id:text name:text kind:text status:text attributes:json "
        "started_at:ts ended_at:ts",
        "trace_id span_id",
    ),
    _table("trace_counters", "name:text value:int", "name"),
    _table("vector_models", "model:text dim:int generation:int removals:int created_at:ts", "model"),
    _table(
        "vectors",
        "vec_id:text model:text source_id:text source_version:int embedding:bytes metadata:json "
        "generation:int updated_at:ts",
        "vec_id",
    ),
    _table(
        "vector_sources",
        "source_id:text kind:text version:int indexed_version:int changed_at:ts gone_at:ts",
        "source_id",
    ),
    _table("vector_cursors", "name:text at:ts id:text", "name"),
    _table(
        "checkpoints",
        "thread_id:text checkpoint_ns:text checkpoint_id:text parent_checkpoint_id:text run_id:text "
        "type:text checkpoint:bytes metadata:json channel_versions:json created_at:ts",
        "thread_id checkpoint_ns checkpoint_id",
    ),
    _table(
        "checkpoint_blobs",
        "thread_id:text checkpoint_ns:text channel:text version:text type:text blob:bytes",
        "thread_id checkpoint_ns channel version",
    ),
    _table(
        "checkpoint_writes",
        "thread_id:text checkpoint_ns:text checkpoint_id:text task_id:text idx:int channel:text type:text "
        "blob:bytes task_path:text",
        "thread_id checkpoint_ns checkpoint_id task_id idx",
    ),
)
_BY_NAME = {t.name: t for t in TABLES}


def table_spec(name: str) -> CopyTable:
    spec = _BY_NAME.get(name) if isinstance(name, str) else None
    if spec is None:
        raise InvalidArgument(
            f"{name!r} is not a copyable table; copyable tables: {', '.join(_BY_NAME)}", table=name
        )
    return spec


def _out(tx: Tx, kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "ts":
        return tx.ts_out(value)
    if kind == "json":
        return (
            bytes(value).decode("utf-8") if isinstance(value, bytes | bytearray | memoryview) else str(value)
        )
    if kind == "bool":
        return bool(value)
    if kind == "bytes":
        return bytes(value)
    return value


def _in(tx: Tx, kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "ts":
        return tx.ts_in(value)
    if kind == "json":
        return tx.json_in(value.encode("utf-8"))
    return value


async def op_copy_tables(tx: Tx) -> list[CopyTableInfo]:
    found = []
    for spec in TABLES:
        row = await tx.fetchone("copy_table_exists", spec.name)
        if row is not None and row["n"]:
            found.append(spec.info())
    return found


async def op_count_rows(tx: Tx, spec: CopyTable) -> int:
    row = await tx.fetchone(f"copy_{spec.name}_count")
    assert row is not None
    return int(row["n"])


async def op_export_rows(tx: Tx, spec: CopyTable, after: Sequence[Any] | None, limit: int) -> RowPage:
    if after is None:
        rows = await tx.fetchall(f"copy_{spec.name}_first", limit)
    else:
        rows = await tx.fetchall(f"copy_{spec.name}_after", *after, limit)
    out = [tuple(_out(tx, kind, row[i]) for i, (_, kind) in enumerate(spec.columns)) for row in rows]
    last = tuple(out[-1][i] for i in spec.index(spec.key)) if out else None
    return RowPage(rows=out, last_key=last)


async def op_last_key(tx: Tx, spec: CopyTable) -> tuple[Any, ...] | None:
    row = await tx.fetchone(f"copy_{spec.name}_last")
    return None if row is None else tuple(row[i] for i in range(len(spec.key)))


def _check_width(spec: CopyTable, rows: Sequence[Sequence[Any]]) -> None:
    for row in rows:
        if len(row) != len(spec.columns):
            raise InvalidArgument(
                f"a row for {spec.name} has {len(row)} values, expected {len(spec.columns)}", table=spec.name
            )


async def op_import_rows(tx: Tx, spec: CopyTable, rows: Sequence[Sequence[Any]]) -> int:
    links = set(spec.index(spec.links))
    converted = [
        tuple(None if i in links else _in(tx, kind, row[i]) for i, (_, kind) in enumerate(spec.columns))
        for row in rows
    ]
    if converted:
        await tx.executemany(f"copy_{spec.name}_insert", converted)
    return len(converted)


async def op_link_rows(tx: Tx, spec: CopyTable, rows: Sequence[Sequence[Any]]) -> int:
    if not spec.links:
        return 0
    links = spec.index(spec.links)
    wanted = spec.index(spec.key) + links
    kinds = [spec.columns[i][1] for i in wanted]
    args = [
        tuple(_in(tx, kind, row[i]) for kind, i in zip(kinds, wanted, strict=True))
        for row in rows
        if any(row[i] is not None for i in links)
    ]
    if args:
        await tx.executemany(f"copy_{spec.name}_link", args)
    return len(args)


async def op_clear_rows(tx: Tx, spec: CopyTable) -> int:
    return await tx.execute(f"copy_{spec.name}_clear")


async def op_store_identity(tx: Tx) -> str | None:
    row = await tx.fetchone("copy_store_identity")
    return None if row is None or row["id"] is None else str(row["id"])


class SqlCopy(SqlBackend, CopyBackend):
    """The copy contract over the shared operations above."""

    async def copy_tables(self) -> list[CopyTableInfo]:
        return await self._read(op_copy_tables)

    async def count_rows(self, table: str) -> int:
        return await self._read(op_count_rows, table_spec(table))

    async def export_rows(
        self, table: str, *, after: Sequence[Any] | None = None, limit: int = 1000
    ) -> RowPage:
        spec = table_spec(table)
        if type(limit) is not int or not 1 <= limit <= 100_000:
            raise InvalidArgument(f"limit must be an int in [1, 100000], got {limit!r}")
        if after is not None and len(after) != len(spec.key):
            raise InvalidArgument(
                f"after must hold the {len(spec.key)} key values ({', '.join(spec.key)}) of {table}"
            )
        return await self._read(op_export_rows, spec, None if after is None else tuple(after), limit)

    async def last_key(self, table: str) -> tuple[Any, ...] | None:
        return await self._read(op_last_key, table_spec(table))

    async def import_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> int:
        spec = table_spec(table)
        _check_width(spec, rows)
        return await self._write(op_import_rows, spec, rows)

    async def link_rows(self, table: str, rows: Sequence[Sequence[Any]]) -> int:
        spec = table_spec(table)
        _check_width(spec, rows)
        return await self._write(op_link_rows, spec, rows)

    async def clear_rows(self, table: str) -> int:
        return await self._write(op_clear_rows, table_spec(table))

    async def store_identity(self) -> str | None:
        return await self._read(op_store_identity)
