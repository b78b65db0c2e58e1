"""Graph checkpoints: the operations every SQL dialect shares.

A checkpoint row holds the serialized checkpoint without its channel values; each channel's value is a
blob stored once per (thread, namespace, channel, version), and a checkpoint finds its values through its
``channel_versions``. A checkpoint that did not change a channel therefore costs nothing for it: a thread
grows with what changed. Pending writes are keyed by (checkpoint, task, idx), so saving them again is a
no-op (or, for special channels, a replacement).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import InvalidArgument
from ..base import (
    CheckpointBackend,
    CheckpointLineage,
    CheckpointRecord,
    CheckpointThread,
    CheckpointWrite,
    NewCheckpoint,
    TypedBlob,
)
from . import Row, SqlBackend, Tx, utcnow

Key = tuple[str, str, str]


def _blob(value: Any) -> bytes | None:
    # asyncpg returns bytes, sqlite3 bytes; a memoryview can come from either driver's buffers.
    return None if value is None else bytes(value)


def _write(row: Row) -> CheckpointWrite:
    return CheckpointWrite(
        task_id=row["task_id"],
        idx=row["idx"],
        channel=row["channel"],
        value=TypedBlob(row["type"], _blob(row["blob"])),
        task_path=row["task_path"],
    )


def _key(row: Row) -> Key:
    return (row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"])


async def _records(tx: Tx, rows: Sequence[Row]) -> list[CheckpointRecord]:
    """Whole records for checkpoint rows: their channel values and pending writes, two queries in all."""
    if not rows:
        return []
    keys = orjson.dumps([list(_key(row)) for row in rows]).decode("utf-8")
    values: dict[Key, dict[str, TypedBlob]] = {}
    for b in await tx.fetchall("checkpoint_blobs_for", keys):
        values.setdefault(_key(b), {})[b["channel"]] = TypedBlob(b["type"], _blob(b["blob"]))
    writes: dict[Key, list[CheckpointWrite]] = {}
    for w in await tx.fetchall("checkpoint_writes_for", keys):
        writes.setdefault(_key(w), []).append(_write(w))
    out = []
    for row in rows:
        key = _key(row)
        out.append(
            CheckpointRecord(
                thread_id=key[0],
                checkpoint_ns=key[1],
                checkpoint_id=key[2],
                parent_checkpoint_id=row["parent_checkpoint_id"],
                checkpoint=TypedBlob(row["type"], _blob(row["checkpoint"])),
                metadata=tx.json_out(row["metadata"]),
                channel_values=values.get(key, {}),
                pending_writes=tuple(writes.get(key, ())),
                created_at=tx.ts_out(row["created_at"]),
            )
        )
    return out


async def op_put_checkpoint(tx: Tx, cp: NewCheckpoint) -> None:
    await tx.execute(
        "checkpoint_upsert",
        cp.thread_id,
        cp.checkpoint_ns,
        cp.checkpoint_id,
        cp.parent_checkpoint_id,
        cp.run_id,
        cp.checkpoint.type,
        cp.checkpoint.data,
        tx.json_in(cp.metadata),
        tx.json_in(cp.channel_versions),
        tx.ts_in(utcnow()),
    )
    if cp.blobs:
        await tx.executemany(
            "checkpoint_blob_insert",
            [
                (cp.thread_id, cp.checkpoint_ns, b.channel, b.version, b.value.type, b.value.data)
                for b in cp.blobs
            ],
        )


async def op_put_checkpoint_writes(
    tx: Tx,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    writes: Sequence[CheckpointWrite],
    replace: bool,
) -> None:
    await tx.executemany(
        "checkpoint_write_upsert" if replace else "checkpoint_write_insert",
        [
            (
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                w.task_id,
                w.idx,
                w.channel,
                w.value.type,
                w.value.data,
                w.task_path,
            )
            for w in writes
        ],
    )


async def op_get_checkpoint(
    tx: Tx, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
) -> CheckpointRecord | None:
    if checkpoint_id is None:
        row = await tx.fetchone("checkpoint_latest", thread_id, checkpoint_ns)
    else:
        row = await tx.fetchone("checkpoint_get", thread_id, checkpoint_ns, checkpoint_id)
    if row is None:
        return None
    return (await _records(tx, [row]))[0]


async def op_list_checkpoints(
    tx: Tx,
    thread_id: str | None,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    metadata_filter: str | None,
    after: Key | None,
    limit: int,
) -> list[CheckpointRecord]:
    a_id, a_thread, a_ns = after if after is not None else (None, None, None)
    if thread_id is not None and checkpoint_ns is not None:
        rows = await tx.fetchall(
            "checkpoint_list_ns", thread_id, checkpoint_ns, checkpoint_id, metadata_filter, a_id, limit
        )
    elif thread_id is not None:
        rows = await tx.fetchall(
            "checkpoint_list_thread", thread_id, checkpoint_id, metadata_filter, a_id, a_ns, limit
        )
    else:
        rows = await tx.fetchall("checkpoint_list_all", metadata_filter, a_id, a_thread, a_ns, limit)
    return await _records(tx, rows)


async def op_checkpoint_lineage(
    tx: Tx, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, channels: Sequence[str], limit: int
) -> list[CheckpointLineage]:
    if checkpoint_id is None:
        latest = await tx.fetchone("checkpoint_latest", thread_id, checkpoint_ns)
        if latest is None:
            return []
        checkpoint_id = latest["checkpoint_id"]
    line = await tx.fetchall("checkpoint_lineage", thread_id, checkpoint_ns, checkpoint_id, limit)
    if not line:
        return []
    wanted = set(channels)
    versions = [
        {ch: v for ch, v in tx.json_out(row["channel_versions"]).items() if ch in wanted} for row in line
    ]
    pairs = sorted({(ch, v) for vs in versions for ch, v in vs.items()})
    blobs = (
        {
            (b["channel"], b["version"]): TypedBlob(b["type"], _blob(b["blob"]))
            for b in await tx.fetchall(
                "checkpoint_lineage_blobs", thread_id, checkpoint_ns, orjson.dumps(pairs).decode("utf-8")
            )
        }
        if pairs
        else {}
    )
    ids = orjson.dumps([row["checkpoint_id"] for row in line]).decode("utf-8")
    writes: dict[str, list[CheckpointWrite]] = {}
    for w in await tx.fetchall(
        "checkpoint_lineage_writes",
        thread_id,
        checkpoint_ns,
        ids,
        orjson.dumps(sorted(wanted)).decode("utf-8"),
    ):
        writes.setdefault(w["checkpoint_id"], []).append(_write(w))
    return [
        CheckpointLineage(
            checkpoint_id=row["checkpoint_id"],
            parent_checkpoint_id=row["parent_checkpoint_id"],
            values={ch: blobs[(ch, v)] for ch, v in vs.items() if (ch, v) in blobs},
            writes=tuple(writes.get(row["checkpoint_id"], ())),
        )
        for row, vs in zip(line, versions, strict=True)
    ]


async def _drop_unused_blobs(tx: Tx, thread_ids: Sequence[str]) -> None:
    for thread_id in thread_ids:
        await tx.execute("checkpoint_blobs_unused_delete", thread_id)


async def op_list_checkpoint_threads(tx: Tx, limit: int) -> list[CheckpointThread]:
    return [
        CheckpointThread(
            thread_id=row["thread_id"],
            checkpoints=int(row["checkpoints"]),
            namespaces=int(row["namespaces"]),
            latest_checkpoint_id=row["latest_checkpoint_id"],
            latest_at=tx.ts_out(row["latest_at"]),
        )
        for row in await tx.fetchall("checkpoint_threads", limit)
    ]


async def op_delete_checkpoint_thread(tx: Tx, thread_id: str) -> int:
    await tx.execute("checkpoint_thread_writes_delete", thread_id)
    await tx.execute("checkpoint_thread_blobs_delete", thread_id)
    return await tx.execute("checkpoint_thread_delete", thread_id)


async def op_delete_checkpoint_runs(tx: Tx, run_ids: str) -> int:
    threads = [row["thread_id"] for row in await tx.fetchall("checkpoint_runs_threads", run_ids)]
    await tx.execute("checkpoint_runs_writes_delete", run_ids)
    deleted = await tx.execute("checkpoint_runs_delete", run_ids)
    await _drop_unused_blobs(tx, threads)
    return deleted


async def op_copy_checkpoint_thread(tx: Tx, source: str, target: str) -> int:
    copied = await tx.execute("checkpoint_thread_copy", source, target)
    await tx.execute("checkpoint_thread_blobs_copy", source, target)
    await tx.execute("checkpoint_thread_writes_copy", source, target)
    return copied


async def op_prune_checkpoints(tx: Tx, thread_ids: Sequence[str], keep_latest: bool) -> int:
    deleted = 0
    for thread_id in thread_ids:
        if not keep_latest:
            deleted += await op_delete_checkpoint_thread(tx, thread_id)
            continue
        await tx.execute("checkpoint_prune_writes_delete", thread_id)
        deleted += await tx.execute("checkpoint_prune_delete", thread_id)
    if keep_latest:
        await _drop_unused_blobs(tx, thread_ids)
    return deleted


class SqlCheckpoints(SqlBackend, CheckpointBackend):
    """The checkpoint contract over the shared operations above."""

    async def put_checkpoint(self, checkpoint: NewCheckpoint) -> None:
        await self._write(op_put_checkpoint, checkpoint)

    async def put_checkpoint_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool = False,
    ) -> None:
        if writes:
            await self._write(
                op_put_checkpoint_writes, thread_id, checkpoint_ns, checkpoint_id, tuple(writes), replace
            )

    async def get_checkpoint(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None = None
    ) -> CheckpointRecord | None:
        return await self._read(op_get_checkpoint, thread_id, checkpoint_ns, checkpoint_id)

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
        filter_text = None if metadata_filter is None else metadata_filter.decode("utf-8")
        return await self._read(
            op_list_checkpoints, thread_id, checkpoint_ns, checkpoint_id, filter_text, after, limit
        )

    async def checkpoint_lineage(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        channels: Sequence[str],
        *,
        limit: int = 100,
    ) -> list[CheckpointLineage]:
        return await self._read(
            op_checkpoint_lineage, thread_id, checkpoint_ns, checkpoint_id, tuple(channels), limit
        )

    async def list_checkpoint_threads(self, *, limit: int = 100) -> list[CheckpointThread]:
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(f"limit must be an int >= 1, got {limit!r}", value=limit)
        return await self._read(op_list_checkpoint_threads, limit)

    async def delete_checkpoint_thread(self, thread_id: str) -> int:
        return await self._write(op_delete_checkpoint_thread, thread_id)

    async def delete_checkpoint_runs(self, run_ids: Sequence[str]) -> int:
        if not run_ids:
            return 0
        return await self._write(op_delete_checkpoint_runs, orjson.dumps(list(run_ids)).decode("utf-8"))

    async def copy_checkpoint_thread(self, source_thread_id: str, target_thread_id: str) -> int:
        return await self._write(op_copy_checkpoint_thread, source_thread_id, target_thread_id)

    async def prune_checkpoints(self, thread_ids: Sequence[str], *, keep_latest: bool) -> int:
        if not thread_ids:
            return 0
        return await self._write(op_prune_checkpoints, tuple(thread_ids), keep_latest)
