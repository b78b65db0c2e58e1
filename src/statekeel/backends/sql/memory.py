"""Memories, their history, episodes, the temporal graph, contradictions and the access log: the
operations every SQL dialect shares.

Every change of a memory is one conditional UPDATE on the version it was decided from (or an INSERT that
the live-key unique index may refuse), followed by its history event in the same transaction. When another
writer got there first the operation reads again and decides again, so concurrent puts of one key from
many processes leave one memory whose history holds every change, with versions 1, 2, 3 … without gaps.
On PostgreSQL forget and supersede also lock the row they read (``FOR UPDATE``), so that writers queue
instead of retrying; a put does not, so that a put of unchanged values writes nothing at all.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import ConflictError, InvalidArgument, InvalidTransition, NotFound
from ...validation import MAX_KEY_BYTES
from ..base import (
    Contradiction,
    Episode,
    Memory,
    MemoryAccess,
    MemoryBackend,
    MemoryEvent,
    MemoryPut,
    Page,
    Relation,
)
from . import Row, SqlBackend, Tx, from_micros, to_micros, unconditional
from .sessions import decode_cursor, encode_cursor
from .tasks import ts_in_or_none, ts_or_none

# Code points: the last one, and the surrogate range UTF-8 cannot encode.
_LAST_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
# A writer that keeps losing the race this many times in one call gives up with ConflictError.
_TRIES = 100
# Newest-first listings start before this (updated_at, id); oldest-first ones after the epoch.
_NEWEST = (dt.datetime(9999, 12, 31, tzinfo=dt.UTC), "")
_OLDEST = (from_micros(0), "")


def memory_from_row(tx: Tx, row: Row) -> Memory:
    data = row["data"]
    memory_id = row["id"]
    return Memory(
        id=memory_id,
        type=row["type"],
        scope=row["scope"],
        key=row["key"],
        content=tx.sealed_out(row["content"], "memory", memory_id, "content"),
        data=None if data is None else tx.sealed_out(data, "memory", memory_id, "data"),
        confidence=float(row["confidence"]),
        source=row["source"],
        created_at=tx.ts_out(row["created_at"]),
        updated_at=tx.ts_out(row["updated_at"]),
        expires_at=ts_or_none(tx, row["expires_at"]),
        superseded_by=row["superseded_by"],
        deleted_at=ts_or_none(tx, row["deleted_at"]),
        version=row["version"],
    )


def _raw(value: Any) -> bytes:
    """A stored JSON column as bytes (SQLite TEXT, PostgreSQL JSONB text)."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _micros(tx: Tx, value: Any) -> int | None:
    return None if value is None else to_micros(tx.ts_out(value))


def _state(
    content: bytes,
    data: bytes | None,
    confidence: float,
    source: str | None,
    expires_at: int | None,
    superseded_by: str | None,
    deleted_at: int | None,
) -> bytes:
    """A memory's changeable fields as one JSON object (timestamps in microseconds). The content and data
    are spliced in as already encoded: no decode and re-encode on the write path."""
    rest = orjson.dumps(
        {
            "confidence": confidence,
            "source": source,
            "expires_at": expires_at,
            "superseded_by": superseded_by,
            "deleted_at": deleted_at,
        }
    )
    return b'{"content":' + content + b',"data":' + (b"null" if data is None else data) + b"," + rest[1:]


def _row_state(tx: Tx, row: Row) -> bytes:
    data = row["data"]
    return _state(
        _raw(row["content"]),
        None if data is None else _raw(data),
        float(row["confidence"]),
        row["source"],
        _micros(tx, row["expires_at"]),
        row["superseded_by"],
        _micros(tx, row["deleted_at"]),
    )


def _same_json(stored: Any, new: bytes | None) -> bool:
    if stored is None or new is None:
        return stored is None and new is None
    raw = _raw(stored)
    if raw == new:
        return True
    # PostgreSQL's JSONB reorders keys and respaces: compare the values, with ints and floats kept apart.
    return orjson.dumps(orjson.loads(raw), option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        orjson.loads(new), option=orjson.OPT_SORT_KEYS
    )


def _plain(tx: Tx, row: Row, column: str) -> Any:
    """A stored content or data column as its plaintext JSON (opened, when the store encrypts)."""
    stored = row[column]
    cipher = tx.codec.cipher
    if stored is None or cipher is None:
        return stored
    return cipher.open_raw(orjson.loads(stored), "memory", (row["id"], column))


def _unchanged(tx: Tx, row: Row, put: MemoryPut) -> bool:
    # SQLite stores a whole REAL as an integer, and RETURNING hands it back as one: compare as floats.
    return (
        float(row["confidence"]) == put.confidence
        and row["source"] == put.source
        and _micros(tx, row["expires_at"]) == (None if put.expires_at is None else to_micros(put.expires_at))
        and _same_json(_plain(tx, row, "content"), put.content)
        and _same_json(_plain(tx, row, "data"), put.data)
    )


def _not_before(tx: Tx, at: dt.datetime, row: Row) -> dt.datetime:
    # A memory's updated_at never goes back, even when this writer's clock is behind the last one's.
    return max(at, tx.ts_out(row["updated_at"]))


async def _event(
    tx: Tx, row: Row, event: str, actor: str | None, reason: str | None, at: dt.datetime
) -> None:
    await tx.execute(
        "memory_event_insert",
        row["id"],
        row["version"],
        event,
        tx.json_in(_row_state(tx, row)),
        actor,
        reason,
        tx.ts_in(at),
    )


@unconditional
async def op_put_memory(tx: Tx, put: MemoryPut) -> tuple[Memory, str | None]:
    expires = ts_in_or_none(tx, put.expires_at)

    def sealed(memory_id: str) -> tuple[Any, Any]:
        # Sealed under the row's id (new, or the live memory's); with a key ring, under its scope's key.
        content = tx.sealed_in(put.content, "memory", memory_id, "content", subject=put.scope)
        data = (
            None
            if put.data is None
            else tx.sealed_in(put.data, "memory", memory_id, "data", subject=put.scope)
        )
        return content, data

    for _ in range(_TRIES):
        row = None
        if put.key is not None:
            row = await tx.fetchone("memory_live_by_key", put.type, put.scope, put.key)
        if row is None:
            content, data = sealed(put.id)
            added = await tx.fetchone(
                "memory_insert",
                put.id,
                put.type,
                put.scope,
                put.key,
                content,
                data,
                put.confidence,
                put.source,
                tx.ts_in(put.at),
                expires,
            )
            if added is None:
                continue  # another writer added this key since we looked: update theirs
            await _event(tx, added, "ADD", put.actor, put.reason, put.at)
            return memory_from_row(tx, added), "ADD"
        if _unchanged(tx, row, put):
            return memory_from_row(tx, row), None
        at = _not_before(tx, put.at, row)
        content, data = sealed(row["id"])
        updated = await tx.fetchone(
            "memory_update",
            content,
            data,
            put.confidence,
            put.source,
            expires,
            tx.ts_in(at),
            row["id"],
            row["version"],
        )
        if updated is None:
            continue  # changed since we read it: decide again on what is there now
        await _event(tx, updated, "UPDATE", put.actor, put.reason, at)
        return memory_from_row(tx, updated), "UPDATE"
    raise ConflictError(
        f"memory ({put.type}, {put.scope}, {put.key}) kept changing under {_TRIES} attempts to write it",
        key=put.key,
    )


async def op_get_memory(tx: Tx, memory_id: str) -> Memory | None:
    row = await tx.fetchone("memory_get", memory_id)
    return None if row is None else memory_from_row(tx, row)


def _page(tx: Tx, rows: list[Row], limit: int) -> Page:
    items = [memory_from_row(tx, r) for r in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = items[-1]
        next_cursor = encode_cursor(last.updated_at, last.id)
    return Page(items=items, next_cursor=next_cursor)


async def op_query_memories(
    tx: Tx,
    type_: str | None,
    scope: str | None,
    key: str | None,
    min_confidence: float | None,
    include_forgotten: bool,
    include_superseded: bool,
    live_at: dt.datetime | None,
    limit: int,
    cursor: str | None,
    scope_prefix: str | None = None,
) -> Page:
    before, before_id = _NEWEST if cursor is None else decode_cursor(cursor)
    args: list[Any] = [
        type_,
        scope,
        key,
        min_confidence,
        include_forgotten,
        include_superseded,
        ts_in_or_none(tx, live_at),
        tx.ts_in(before),
        before_id,
        limit + 1,
    ]
    # One query per filter shape: each reads its index in order and stops at the page (a prefix: its range).
    if scope_prefix is not None:
        name = "memory_query_prefix" if type_ is None else "memory_query_type_prefix"
        args[1], upper = scope_range(scope_prefix)
        args.append(upper)
    elif key is not None:
        name = "memory_query_key"
    elif scope is not None:
        name = "memory_query_scope" if type_ is None else "memory_query_type_scope"
    else:
        name = "memory_query"
    rows = await tx.fetchall(name, *args)
    return _page(tx, rows, limit)


def scope_range(prefix: str) -> tuple[str, str]:
    """The bounds ``[lower, upper)`` of the scopes that start with ``prefix``, in code point order (which
    is UTF-8 byte order: SQLite's BINARY and PostgreSQL's "C" collation). ``upper`` is the prefix with its
    last character that can grow moved to the next code point; when none can (only U+10FFFF, or no
    character at all) it is a string above every scope, which holds at most MAX_KEY_BYTES bytes."""
    chars = list(prefix)
    while chars:
        following = ord(chars.pop()) + 1
        if following <= _LAST_CODE_POINT:
            if _SURROGATES[0] <= following <= _SURROGATES[1]:
                following = _SURROGATES[1] + 1  # never stored: not encodable as UTF-8
            return prefix, "".join(chars) + chr(following)
    return prefix, prefix + chr(_LAST_CODE_POINT) * MAX_KEY_BYTES


def _scopes_cursor(scope: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([scope])).decode("ascii")


def _scopes_after(cursor: Any) -> str:
    try:
        (scope,) = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        if type(scope) is not str:
            raise ValueError
        return scope
    except Exception:
        raise InvalidArgument(f"cursor {cursor!r} is not one that scopes returned", cursor=cursor) from None


async def op_memory_scopes(
    tx: Tx, prefix: str | None, type_: str | None, live_at: dt.datetime, limit: int, cursor: str | None
) -> Page:
    lower, upper = scope_range(prefix or "")
    inclusive = True
    if cursor is not None:
        after = _scopes_after(cursor)
        if after >= upper:
            return Page(items=[], next_cursor=None)
        if after >= lower:  # a cursor from this listing: go on after its last scope
            lower, inclusive = after, False
    name = "memory_scopes" if type_ is None else "memory_scopes_type"
    rows = await tx.fetchall(name, type_, lower, upper, inclusive, tx.ts_in(live_at), limit + 1)
    scopes = [row["scope"] for row in rows[:limit]]
    return Page(items=scopes, next_cursor=_scopes_cursor(scopes[-1]) if len(rows) > limit else None)


async def op_changed_memories(tx: Tx, since: dt.datetime | None, limit: int, cursor: str | None) -> Page:
    if cursor is not None:
        after, after_id = decode_cursor(cursor)
    else:
        after, after_id = _OLDEST if since is None else (since, "")
    rows = await tx.fetchall("memory_changed", tx.ts_in(after), after_id, limit + 1)
    return _page(tx, rows, limit)


async def _require(tx: Tx, query: str, memory_id: str) -> Row:
    row = await tx.fetchone(query, memory_id)
    if row is None:
        raise NotFound(f"memory {memory_id!r} does not exist", memory_id=memory_id)
    return row


@unconditional
async def op_forget_memory(
    tx: Tx, memory_id: str, actor: str | None, reason: str | None, at: dt.datetime
) -> Memory:
    for _ in range(_TRIES):
        row = await _require(tx, "memory_get_for_update", memory_id)
        if row["deleted_at"] is not None:
            return memory_from_row(tx, row)
        when = _not_before(tx, at, row)
        updated = await tx.fetchone("memory_forget", tx.ts_in(when), memory_id, row["version"])
        if updated is None:
            continue
        await _event(tx, updated, "DELETE", actor, reason, when)
        return memory_from_row(tx, updated)
    raise ConflictError(f"memory {memory_id!r} kept changing while forgetting it", memory_id=memory_id)


def _refuse_unless_live(memory_id: str, row: Row, role: str) -> None:
    if row["deleted_at"] is not None:
        raise InvalidTransition(
            f"{role} memory {memory_id!r} was forgotten; only live memories take part in a supersede",
            memory_id=memory_id,
        )
    if row["superseded_by"] is not None:
        raise InvalidTransition(
            f"{role} memory {memory_id!r} is already superseded by {row['superseded_by']!r}",
            memory_id=memory_id,
            superseded_by=row["superseded_by"],
        )


async def op_supersede_memory(
    tx: Tx, old_id: str, new_id: str, actor: str | None, reason: str | None, at: dt.datetime
) -> Memory:
    for _ in range(_TRIES):
        old = await _require(tx, "memory_get_for_update", old_id)
        new = await _require(tx, "memory_get_for_share", new_id)
        if old["superseded_by"] == new_id:
            return memory_from_row(tx, old)  # done already (a retried call)
        _refuse_unless_live(old_id, old, "the old")
        _refuse_unless_live(new_id, new, "the new")
        when = _not_before(tx, at, old)
        updated = await tx.fetchone("memory_supersede", new_id, tx.ts_in(when), old_id, old["version"])
        if updated is None:
            continue
        await _event(tx, updated, "SUPERSEDE", actor, reason, when)
        return memory_from_row(tx, updated)
    raise ConflictError(f"memory {old_id!r} kept changing while superseding it", memory_id=old_id)


def _event_state(tx: Tx, memory_id: str, stored: Any) -> dict[str, Any]:
    """A history event's stored state as values; its content and data are the memory's sealed columns."""
    cipher = tx.codec.cipher
    if cipher is None:
        state: dict[str, Any] = tx.json_out(stored)
        return state
    state = orjson.loads(stored)
    for column in ("content", "data"):
        if state.get(column) is not None:
            state[column] = cipher.decode(tx.codec, state[column], "memory", (memory_id, column))
    return state


def _fields(tx: Tx, state: dict[str, Any]) -> dict[str, Any]:
    out = dict(state)
    for name in ("expires_at", "deleted_at"):
        if out.get(name) is not None:
            out[name] = from_micros(out[name])
    return out


async def op_memory_history(tx: Tx, memory_id: str) -> list[MemoryEvent]:
    rows = await tx.fetchall("memory_event_list", memory_id)
    if not rows:
        await _require(tx, "memory_get", memory_id)
    events: list[MemoryEvent] = []
    before: dict[str, Any] | None = None
    for row in rows:
        after = _fields(tx, _event_state(tx, row["memory_id"], row["state"]))
        event = row["event"]
        events.append(
            MemoryEvent(
                memory_id=row["memory_id"],
                version=row["version"],
                event=event,
                old=None if before is None else before["content"],
                new=None if event == "DELETE" else after["content"],
                actor=row["actor"],
                reason=row["reason"],
                at=tx.ts_out(row["at"]),
                before=before,
                after=after,
            )
        )
        before = after
    return events


def episode_from_row(tx: Tx, row: Row) -> Episode:
    return Episode(
        id=row["id"],
        session_key=row["session_key"],
        summary=row["summary"],
        first_seq=row["first_seq"],
        upto_seq=row["upto_seq"],
        entities=tuple(tx.json_out(row["entities"])),
        importance=float(row["importance"]),
        created_at=tx.ts_out(row["created_at"]),
        rewinds=row["rewinds"],
    )


async def op_add_episode(tx: Tx, episode: Episode) -> Episode:
    row = await tx.fetchone(
        "episode_insert",
        episode.id,
        episode.session_key,
        episode.summary,
        episode.first_seq,
        episode.upto_seq,
        tx.json_in(orjson.dumps(list(episode.entities))),
        episode.importance,
        tx.ts_in(episode.created_at),
    )
    assert row is not None
    return episode_from_row(tx, row)


async def op_list_episodes(tx: Tx, session_key: str | None, limit: int) -> list[Episode]:
    if session_key is None:
        rows = await tx.fetchall("episode_list", limit)
    else:
        rows = await tx.fetchall("episode_list_session", session_key, limit)
    return [episode_from_row(tx, r) for r in rows]


def relation_from_row(tx: Tx, row: Row) -> Relation:
    return Relation(
        id=row["id"],
        subject=row["subject"],
        relation=row["relation"],
        object=row["object"],
        weight=float(row["weight"]),
        valid_from=tx.ts_out(row["valid_from"]),
        valid_to=ts_or_none(tx, row["valid_to"]),
        source_memory_id=row["source_memory_id"],
        created_at=tx.ts_out(row["created_at"]),
    )


async def op_add_relation(tx: Tx, rel: Relation) -> Relation:
    if rel.source_memory_id is not None:
        await _require(tx, "memory_get_for_share", rel.source_memory_id)
    row = await tx.fetchone(
        "relation_insert",
        rel.id,
        rel.subject,
        rel.relation,
        rel.object,
        rel.weight,
        tx.ts_in(rel.valid_from),
        ts_in_or_none(tx, rel.valid_to),
        rel.source_memory_id,
        tx.ts_in(rel.created_at),
    )
    assert row is not None
    return relation_from_row(tx, row)


async def op_end_relation(tx: Tx, relation_id: str, at: dt.datetime) -> Relation:
    row = await tx.fetchone("relation_get_for_update", relation_id)
    if row is None:
        raise NotFound(f"relation {relation_id!r} does not exist", relation_id=relation_id)
    current = relation_from_row(tx, row)
    if current.valid_to is not None:
        raise InvalidTransition(
            f"relation {relation_id!r} already ended at {current.valid_to.isoformat()}",
            relation_id=relation_id,
            valid_to=current.valid_to,
        )
    if at < current.valid_from:
        raise InvalidArgument(
            f"relation {relation_id!r} cannot end at {at.isoformat()}, before it starts "
            f"({current.valid_from.isoformat()})",
            relation_id=relation_id,
            valid_from=current.valid_from,
        )
    ended = await tx.fetchone("relation_end", tx.ts_in(at), relation_id)
    assert ended is not None  # locked (PostgreSQL) or single writer (SQLite): still open
    return relation_from_row(tx, ended)


async def op_relations_at(tx: Tx, entity: str, relation: str | None, at: dt.datetime) -> list[Relation]:
    rows = await tx.fetchall("relation_at", entity, relation, tx.ts_in(at))
    return [relation_from_row(tx, r) for r in rows]


def contradiction_from_row(tx: Tx, row: Row) -> Contradiction:
    return Contradiction(
        id=row["id"],
        memory_a=row["memory_a"],
        memory_b=row["memory_b"],
        description=row["description"],
        resolution=row["resolution"],
        created_at=tx.ts_out(row["created_at"]),
        resolved_at=ts_or_none(tx, row["resolved_at"]),
    )


async def op_add_contradiction(tx: Tx, c: Contradiction) -> Contradiction:
    await _require(tx, "memory_get_for_share", c.memory_a)
    await _require(tx, "memory_get_for_share", c.memory_b)
    row = await tx.fetchone(
        "contradiction_insert", c.id, c.memory_a, c.memory_b, c.description, tx.ts_in(c.created_at)
    )
    assert row is not None
    return contradiction_from_row(tx, row)


async def op_resolve_contradiction(
    tx: Tx, contradiction_id: str, resolution: str, at: dt.datetime
) -> Contradiction:
    row = await tx.fetchone("contradiction_resolve", resolution, tx.ts_in(at), contradiction_id)
    if row is not None:
        return contradiction_from_row(tx, row)
    existing = await tx.fetchone("contradiction_get", contradiction_id)
    if existing is None:
        raise NotFound(
            f"contradiction {contradiction_id!r} does not exist", contradiction_id=contradiction_id
        )
    done = contradiction_from_row(tx, existing)
    assert done.resolved_at is not None
    raise ConflictError(
        f"contradiction {contradiction_id!r} was already resolved at {done.resolved_at.isoformat()} "
        f"({done.resolution!r}); a resolution is final",
        contradiction_id=contradiction_id,
        resolution=done.resolution,
    )


async def op_open_contradictions(tx: Tx, limit: int) -> list[Contradiction]:
    return [contradiction_from_row(tx, r) for r in await tx.fetchall("contradiction_open", limit)]


async def op_record_accesses(tx: Tx, accesses: Sequence[MemoryAccess]) -> int:
    await tx.executemany(
        "access_insert", [(a.id, a.memory_id, tx.ts_in(a.at), a.context_query) for a in accesses]
    )
    return len(accesses)


async def op_list_accesses(tx: Tx, memory_id: str, limit: int) -> list[MemoryAccess]:
    rows = await tx.fetchall("access_list", memory_id, limit)
    return [MemoryAccess(r["id"], r["memory_id"], tx.ts_out(r["at"]), r["context_query"]) for r in rows]


class SqlMemory(SqlBackend, MemoryBackend):
    """The memory contract over the shared operations above."""

    async def put_memory(self, put: MemoryPut) -> tuple[Memory, str | None]:
        return await self._write(op_put_memory, put)

    async def get_memory(self, memory_id: str) -> Memory | None:
        return await self._read(op_get_memory, memory_id)

    async def query_memories(
        self,
        *,
        type: str | None = None,
        scope: str | None = None,
        key: str | None = None,
        min_confidence: float | None = None,
        include_forgotten: bool = False,
        include_superseded: bool = False,
        live_at: dt.datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
        scope_prefix: str | None = None,
    ) -> Page:
        return await self._read(
            op_query_memories,
            type,
            scope,
            key,
            min_confidence,
            include_forgotten,
            include_superseded,
            live_at,
            limit,
            cursor,
            scope_prefix,
        )

    async def memory_scopes(
        self,
        *,
        prefix: str | None = None,
        type: str | None = None,
        live_at: dt.datetime,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        return await self._read(op_memory_scopes, prefix, type, live_at, limit, cursor)

    async def changed_memories(
        self, *, since: dt.datetime | None = None, limit: int = 100, cursor: str | None = None
    ) -> Page:
        return await self._read(op_changed_memories, since, limit, cursor)

    async def forget_memory(
        self, memory_id: str, *, actor: str | None, reason: str | None, at: dt.datetime
    ) -> Memory:
        return await self._write(op_forget_memory, memory_id, actor, reason, at)

    async def supersede_memory(
        self, old_id: str, new_id: str, *, actor: str | None, reason: str | None, at: dt.datetime
    ) -> Memory:
        return await self._write(op_supersede_memory, old_id, new_id, actor, reason, at)

    async def memory_history(self, memory_id: str) -> list[MemoryEvent]:
        return await self._read(op_memory_history, memory_id)

    async def add_episode(self, episode: Episode) -> Episode:
        return await self._write(op_add_episode, episode)

    async def list_episodes(self, *, session_key: str | None = None, limit: int = 100) -> list[Episode]:
        return await self._read(op_list_episodes, session_key, limit)

    async def add_relation(self, relation: Relation) -> Relation:
        return await self._write(op_add_relation, relation)

    async def end_relation(self, relation_id: str, at: dt.datetime) -> Relation:
        return await self._write(op_end_relation, relation_id, at)

    async def relations_at(self, entity: str, *, relation: str | None, at: dt.datetime) -> list[Relation]:
        return await self._read(op_relations_at, entity, relation, at)

    async def add_contradiction(self, contradiction: Contradiction) -> Contradiction:
        return await self._write(op_add_contradiction, contradiction)

    async def resolve_contradiction(
        self, contradiction_id: str, resolution: str, at: dt.datetime
    ) -> Contradiction:
        return await self._write(op_resolve_contradiction, contradiction_id, resolution, at)

    async def open_contradictions(self, *, limit: int = 1000) -> list[Contradiction]:
        return await self._read(op_open_contradictions, limit)

    async def record_accesses(self, accesses: Sequence[MemoryAccess]) -> int:
        if not accesses:
            return 0
        return await self._write(op_record_accesses, list(accesses))

    async def list_accesses(self, memory_id: str, *, limit: int = 100) -> list[MemoryAccess]:
        return await self._read(op_list_accesses, memory_id, limit)
