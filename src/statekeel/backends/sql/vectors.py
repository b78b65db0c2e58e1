"""Vectors and the sources they follow: the operations every SQL dialect shares.

A model's row holds its dimension and two change counters; every write of a vector bumps ``generation``
(and stamps the vector with it), every deletion also bumps ``removals``. On PostgreSQL the bump locks the
model's row until COMMIT, so generations become visible in order: a reader that sees generation *g* sees
every vector written at *g* or before, and an in-process cache brought up to *g* needs only the vectors
stamped after it — unless ``removals`` moved, when it reloads.

Sources (memories, and sources announced with ``source_changed``) carry their version and
``indexed_version``, the newest ``source_version`` among their vectors, kept up to date by every write and
deletion of a vector. A source lags while ``indexed_version`` is missing or older: a partial index lists
exactly those, so ``lagging()`` never reads the sources that are up to date. Memories reach the table by
``sync``: the memories changed since a stored cursor (less an overlap, for clocks of other writers that
run behind), read through ``memories_by_updated``; a memory's own writes never touch vectors.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Sequence
from typing import Any

from ...errors import DimensionMismatch, InvalidArgument
from ..base import Lag, Vector, VectorBackend, VectorModelState, VectorRows, VectorWrite
from . import Row, SqlBackend, Tx, from_micros

_MEMORIES = "memories"
_START = (from_micros(0), "")


def _bytes(value: Any) -> bytes:
    return value if type(value) is bytes else bytes(value)


def _json(tx: Tx, value: Any) -> dict[str, Any]:
    decoded = tx.json_out(value)
    return decoded if isinstance(decoded, dict) else {}


def model_state(row: Row) -> VectorModelState:
    return VectorModelState(row["model"], int(row["dim"]), int(row["generation"]), int(row["removals"]))


def vector_from_row(tx: Tx, row: Row) -> Vector:
    raw = _bytes(row["embedding"])
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    version = row["source_version"]
    return Vector(
        vec_id=row["vec_id"],
        model=row["model"],
        source_id=row["source_id"],
        source_version=None if version is None else int(version),
        embedding=values,
        metadata=_json(tx, row["metadata"]),
        updated_at=tx.ts_out(row["updated_at"]),
    )


async def _model(tx: Tx, model: str, dim: int, at: dt.datetime) -> None:
    """Create the model on its first vector; refuse a vector of another dimension."""
    row = await tx.fetchone("vector_model_get", model)
    if row is None:
        await tx.execute("vector_model_insert", model, dim, tx.ts_in(at))
        row = await tx.fetchone("vector_model_get", model)
        assert row is not None
    if int(row["dim"]) != dim:
        raise DimensionMismatch(
            f"model {model!r} holds vectors of dimension {row['dim']}, got one of dimension {dim}",
            model=model,
            expected=int(row["dim"]),
            got=dim,
        )


async def _bump(tx: Tx, model: str, removed: int) -> int:
    row = await tx.fetchone("vector_model_bump", model, removed)
    assert row is not None
    return int(row["generation"])


async def _reindex(tx: Tx, source_ids: set[str]) -> None:
    for source_id in sorted(source_ids):  # sorted: concurrent writers lock rows in the same order
        await tx.execute("vector_source_indexed", source_id)


async def _target(tx: Tx, write: VectorWrite, removed: dict[str, int]) -> tuple[str, Any]:
    """The id a rebuilt vector takes and the metadata it keeps: the source's first vector in the model
    (its other ones are deleted), else the source id — or ``model:source`` if that id is taken."""
    existing = await tx.fetchall("vector_by_source_model", write.source_id, write.model)
    if existing:
        for extra in existing[1:]:
            await tx.execute("vector_delete", extra["vec_id"])
            removed[write.model] = removed.get(write.model, 0) + 1
        return existing[0]["vec_id"], existing[0]["metadata"]
    for candidate in (write.source_id, f"{write.model}:{write.source_id}"):
        if await tx.fetchone("vector_get", candidate) is None:
            return candidate, None
    raise InvalidArgument(
        f"no free id for the rebuilt vector of source {write.source_id!r} in model {write.model!r}: "
        f"{write.source_id!r} and {write.model}:{write.source_id} are both vectors of other sources",
        source_id=write.source_id,
    )


async def op_upsert_vectors(tx: Tx, writes: Sequence[VectorWrite], at: dt.datetime) -> list[str]:
    # Every check first: a refused batch writes nothing (the transaction rolls back on any raise, too).
    for model, dim in sorted({(w.model, w.dim) for w in writes}):
        await _model(tx, model, dim, at)
    removed: dict[str, int] = {}
    touched: set[str] = set()
    planned: list[tuple[VectorWrite, str, Any]] = []
    for write in writes:
        if write.vec_id is None:
            vec_id, kept = await _target(tx, write, removed)
        else:
            vec_id, kept = write.vec_id, None
            old = await tx.fetchone("vector_get", vec_id)
            if old is not None:
                if old["model"] != write.model:
                    raise InvalidArgument(
                        f"vector {vec_id!r} belongs to model {old['model']!r}, not {write.model!r}; delete "
                        "it first or give the vector of the other model another id",
                        vec_id=vec_id,
                    )
                touched.add(old["source_id"])
                kept = old["metadata"]
        planned.append((write, vec_id, kept))
    models = sorted({w.model for w in writes})
    generations = {model: await _bump(tx, model, removed.get(model, 0)) for model in models}
    ts = tx.ts_in(at)
    rows = []
    for write, vec_id, kept in planned:
        # A caller's metadata replaces the stored one; a rebuild's is only a default for a new vector.
        if kept is not None and (write.metadata is None or write.vec_id is None):
            metadata = kept if isinstance(kept, str) else tx.json_in(_raw_json(kept))
        else:
            metadata = tx.json_in(write.metadata if write.metadata is not None else b"{}")
        rows.append(
            (vec_id, write.model, write.source_id, write.source_version, write.embedding, metadata,
             generations[write.model], ts)
        )  # fmt: skip
        touched.add(write.source_id)
    await tx.executemany("vector_upsert", rows)
    await _reindex(tx, touched)
    return [r[0] for r in rows]


def _raw_json(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


async def op_delete_vector(tx: Tx, vec_id: str) -> bool:
    row = await tx.fetchone("vector_delete", vec_id)
    if row is None:
        return False
    await _bump(tx, row["model"], 1)
    await _reindex(tx, {row["source_id"]})
    return True


def _per_model(rows: list[Row]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["model"]] = counts.get(row["model"], 0) + 1
    return counts


async def _remove_source(tx: Tx, source_id: str, gone_before: Any | None) -> int | None:
    """Delete every vector of a source and its row; the vectors deleted. With ``gone_before``, only while
    the source is still gone since before it (checked under the row's lock): None when it is not.

    The models of its vectors are locked (bumped, in name order) before anything else, then the source:
    the order a vector upsert takes them in (models, vectors, sources), so a purge and a rebuild of the
    same source wait for each other instead of deadlocking."""
    per_model = _per_model(await tx.fetchall("vector_by_source", source_id))
    for model in sorted(per_model):
        await _bump(tx, model, per_model[model])
    if (
        gone_before is not None
        and await tx.fetchone("purge_vector_source_lock", source_id, gone_before) is None
    ):
        return None  # announced again since it was listed: it stays, with its vectors
    rows = await tx.fetchall("vector_by_source", source_id)
    late = _per_model(rows)
    for model in sorted(set(late) - set(per_model)):  # a vector of another model written meanwhile
        await _bump(tx, model, late[model])
    if rows:
        await tx.execute("vector_delete_source", source_id)
    if gone_before is None:
        await tx.execute("vector_source_delete", source_id)
    else:
        await tx.execute("purge_vector_source_delete", source_id, gone_before)
    return len(rows)


async def delete_source_vectors(tx: Tx, source_id: str, dry_run: bool) -> int:
    """Delete (or count) every vector of a source, bumping each model's removals; its source row goes too.
    Called under the lock of what the source follows (a memory being purged)."""
    if dry_run:
        return len(await tx.fetchall("vector_by_source", source_id))
    removed = await _remove_source(tx, source_id, None)
    assert removed is not None  # no condition to fail
    return removed


async def purge_gone_source(tx: Tx, source_id: str, cutoff: Any) -> int:
    """Delete the vectors and the row of a source gone before ``cutoff`` — only while it still is gone:
    a source announced again (``source_changed``, an upsert) keeps its row and its vectors. Returns the
    vectors deleted."""
    return await _remove_source(tx, source_id, cutoff) or 0


async def op_vectors_by_source(tx: Tx, source_id: str) -> list[Vector]:
    return [vector_from_row(tx, r) for r in await tx.fetchall("vector_by_source", source_id)]


async def op_vector_models(tx: Tx) -> list[VectorModelState]:
    return [model_state(r) for r in await tx.fetchall("vector_model_list")]


async def op_vector_model(tx: Tx, model: str) -> VectorModelState | None:
    row = await tx.fetchone("vector_model_get", model)
    return None if row is None else model_state(row)


async def op_load_vectors(tx: Tx, model: str, after: tuple[int, int] | None) -> VectorRows:
    row = await tx.fetchone("vector_model_get", model)
    if row is None:
        return VectorRows(None, True, [])
    state = model_state(row)
    full = after is None or after[1] != state.removals or after[0] > state.generation
    if full:
        found = await tx.fetchall("vector_load_all", model)
    else:
        assert after is not None
        found = await tx.fetchall("vector_load_since", model, after[0])
    rows = [
        (r["vec_id"], r["source_id"], _bytes(r["embedding"]), _json(tx, r["metadata"]), int(r["generation"]))
        for r in found
    ]
    return VectorRows(state, full, rows)


async def op_source_changed(tx: Tx, source_id: str, version: int, at: dt.datetime) -> None:
    await tx.execute("vector_source_external", source_id, version, tx.ts_in(at))


async def op_sources_gone(tx: Tx, source_ids: Sequence[str], at: dt.datetime) -> int:
    ts = tx.ts_in(at)
    return sum([await tx.execute("vector_source_gone", source_id, ts) for source_id in source_ids])


async def op_sync_sources(
    tx: Tx, overlap: dt.timedelta, start: tuple[dt.datetime, str] | None, limit: int
) -> tuple[int, tuple[dt.datetime, str] | None]:
    if start is None:
        row = await tx.fetchone("vector_cursor_get", _MEMORIES)
        start = _START if row is None else (max(tx.ts_out(row["at"]) - overlap, _START[0]), "")
    changes = await tx.fetchall("vector_memory_changes", tx.ts_in(start[0]), start[1], limit)
    # By id: the order every writer of the sources table locks its rows in (no deadlock on PostgreSQL).
    for m in sorted(changes, key=lambda row: row["id"]):
        gone = m["deleted_at"]
        if gone is None and m["superseded_by"] is not None:
            gone = m["updated_at"]
        await tx.execute("vector_source_memory", m["id"], int(m["version"]), m["updated_at"], gone)
    # The cursor moves to the newest change once all are read; the overlap covers writers still in flight.
    last = changes[-1] if len(changes) == limit else await tx.fetchone("vector_memory_newest")
    if last is not None:
        await tx.execute("vector_cursor_set", _MEMORIES, last["updated_at"], last["id"])
    if not changes:
        return 0, None
    return len(changes), (tx.ts_out(changes[-1]["updated_at"]), changes[-1]["id"])


def lag_from_row(tx: Tx, row: Row) -> Lag:
    indexed = row["indexed_version"]
    return Lag(
        source_id=row["source_id"],
        kind=row["kind"],
        version=int(row["version"]),
        indexed_version=None if indexed is None else int(indexed),
        changed_at=tx.ts_out(row["changed_at"]),
    )


async def op_lagging(tx: Tx, limit: int, after: tuple[dt.datetime, str] | None) -> list[Lag]:
    key = _START if after is None else after
    rows = await tx.fetchall("vector_lagging", tx.ts_in(key[0]), key[1], limit)
    return [lag_from_row(tx, r) for r in rows]


async def op_count_lagging(tx: Tx) -> int:
    row = await tx.fetchone("vector_lagging_count")
    assert row is not None
    return int(row["n"])


class SqlVectors(SqlBackend, VectorBackend):
    """The vector contract over the shared operations above."""

    async def upsert_vectors(self, writes: Sequence[VectorWrite], *, at: dt.datetime) -> list[str]:
        if not writes:
            return []
        return await self._write(op_upsert_vectors, list(writes), at)

    async def delete_vector(self, vec_id: str) -> bool:
        return await self._write(op_delete_vector, vec_id)

    async def vectors_by_source(self, source_id: str) -> list[Vector]:
        return await self._read(op_vectors_by_source, source_id)

    async def vector_models(self) -> list[VectorModelState]:
        return await self._read(op_vector_models)

    async def vector_model(self, model: str) -> VectorModelState | None:
        return await self._read(op_vector_model, model)

    async def load_vectors(self, model: str, *, since: tuple[int, int] | None = None) -> VectorRows:
        return await self._read(op_load_vectors, model, since)

    async def source_changed(self, source_id: str, version: int, *, at: dt.datetime) -> None:
        await self._write(op_source_changed, source_id, version, at)

    async def sources_gone(self, source_ids: Sequence[str], *, at: dt.datetime) -> int:
        if not source_ids:
            return 0
        return await self._write(op_sources_gone, list(source_ids), at)

    async def sync_vector_sources(
        self, *, overlap: dt.timedelta, start: tuple[dt.datetime, str] | None, limit: int
    ) -> tuple[int, tuple[dt.datetime, str] | None]:
        return await self._write(op_sync_sources, overlap, start, limit)

    async def lagging_sources(self, *, limit: int, after: tuple[dt.datetime, str] | None = None) -> list[Lag]:
        return await self._read(op_lagging, limit, after)

    async def count_lagging(self) -> int:
        return await self._read(op_count_lagging)
