"""Memory: the storage half of what an agent knows — typed, scoped, versioned, with history.

    m = await store.memory.put("user", "drink", "tea", scope="user:42", actor="agent-7")
    m = await store.memory.put("user", "drink", "coffee", scope="user:42", reason="said so today")
    [e.event for e in await store.memory.history(m.id)]        # ["ADD", "UPDATE"]
    page = await store.memory.query(scope="user:42", min_confidence=0.5)

A memory is one of the types in :data:`MEMORY_TYPES`, lives in a ``scope`` (default "global") and may have
a ``key``: a put with the key of a live memory of the same type and scope updates it in place (a put with
exactly the stored values changes nothing), ``key=None`` always adds. Every change — ADD, UPDATE, DELETE
(``forget``), SUPERSEDE — bumps the memory's ``version`` and writes its history event in the same
transaction; concurrent puts of one key, from any number of processes, are each applied once, in turn.

Around the memories: episodes (summaries of session ranges), a graph whose edges hold from ``valid_from``
until ``unrelate`` ends them (never deleted, so ``relations(entity, at=...)`` answers what was true then),
contradictions between memories (resolved once; an open one is never purged), and an access log.

The access log is the buffered tier (:class:`~statekeel.buffer.WriteBuffer`): ``record_access`` only
queues the entry in a bounded in-process buffer (10,000 entries; when it is full the oldest entry is
dropped and counted in ``accesses_dropped``). A background task writes the buffer in batches of 500, each
its own transaction, 250 ms after the first entry at most, at once when a batch is full, on
``await memory.flush()`` and on ``store.close()``. Entries not yet written are lost if the process dies.

Storage never extracts, embeds or decides: which facts to keep is the agent's policy.
"""

from __future__ import annotations

import builtins
import datetime as dt
import math
import uuid
from collections.abc import Iterable
from typing import Any

from .backends.base import (
    MEMORY_TYPES,
    Contradiction,
    Episode,
    Memory,
    MemoryAccess,
    MemoryEvent,
    MemoryPut,
    Page,
    Relation,
    StorageBackend,
)
from .buffer import WriteBuffer
from .codec import Codec
from .errors import InvalidArgument
from .validation import check_aware, check_bool, check_int, check_key, check_text

ACCESS_BUFFER = 10_000
ACCESS_BATCH = 500
FLUSH_INTERVAL_S = 0.25
# What a queued access costs besides its query text, towards the buffer's byte budget.
_ACCESS_OVERHEAD = 128


class _Clock:
    """Wall-clock UTC time that never repeats or goes back within a process, so that "newest first"
    follows the order of the calls even when two fall into the same microsecond."""

    def __init__(self) -> None:
        self._last = dt.datetime.min.replace(tzinfo=dt.UTC)

    def now(self) -> dt.datetime:
        now = dt.datetime.now(dt.UTC)
        if now <= self._last:
            now = self._last + dt.timedelta(microseconds=1)
        self._last = now
        return now


def _check_type(value: Any) -> str:
    if builtins.type(value) is not str or value not in MEMORY_TYPES:
        raise InvalidArgument(
            f"unknown memory type {value!r}; use one of {', '.join(MEMORY_TYPES)}", memory_type=value
        )
    return value


def _check_fraction(value: Any, what: str) -> float:
    """A number in [0, 1] (NaN refused), as a float."""
    if builtins.type(value) not in (int, float) or not 0.0 <= value <= 1.0:
        raise InvalidArgument(f"{what} must be a number in [0, 1], got {value!r}", value=value)
    return float(value)


def _optional_text(value: Any, what: str) -> str | None:
    return None if value is None else check_text(value, what)


def _optional_time(value: Any, what: str) -> dt.datetime | None:
    return None if value is None else check_aware(value, what)


class MemoryStore:
    """Memories, their history, episodes, the temporal graph, contradictions and the access log.

    See the module documentation; every method checks its arguments before anything is written and
    raises a typed error (``InvalidArgument``, ``InvalidKey``, ``SerializationError``, ``NotFound``).
    """

    def __init__(self, backend: StorageBackend, codec: Codec, *, access_buffer: int = ACCESS_BUFFER) -> None:
        check_int(access_buffer, "access_buffer", minimum=ACCESS_BUFFER)
        self.backend = backend
        self.codec = codec
        self._clock = _Clock()
        self._accesses: WriteBuffer[MemoryAccess] = WriteBuffer(
            self._write_accesses,
            name="memory accesses",
            capacity=access_buffer,
            batch_size=ACCESS_BATCH,
            interval=FLUSH_INTERVAL_S,
        )

    # --- memories ---------------------------------------------------------------------------------------

    async def put(
        self,
        type: str,
        key: str | None,
        content: Any,
        *,
        scope: str = "global",
        data: Any = None,
        confidence: float = 1.0,
        source: str | None = None,
        expires_at: dt.datetime | None = None,
        actor: str | None = None,
        reason: str | None = None,
    ) -> Memory:
        """Add a memory, or update the live one with the same (type, scope, key) in place.

        An update replaces content, data, confidence, source and expires_at, records the old and new
        values in the history (UPDATE) and bumps ``version``; a put of exactly the stored values returns
        the memory unchanged and writes nothing. ``key=None`` always adds a new memory (ADD).
        ``content`` and ``data`` are any values the codec stores (``content`` not None).
        """
        if content is None:
            raise InvalidArgument("content must not be None; forget() a memory to remove it")
        put = MemoryPut(
            id=uuid.uuid4().hex,
            type=_check_type(type),
            scope=check_key(scope, "scope"),
            key=None if key is None else check_key(key, "key"),
            content=self.codec.encode(content, where="content"),
            data=None if data is None else self.codec.encode(data, where="data"),
            confidence=_check_fraction(confidence, "confidence"),
            source=_optional_text(source, "source"),
            expires_at=_optional_time(expires_at, "expires_at"),
            actor=_optional_text(actor, "actor"),
            reason=_optional_text(reason, "reason"),
            at=self._clock.now(),
        )
        memory, _event = await self.backend.put_memory(put)
        return memory

    async def get(self, memory_id: str, *, include_forgotten: bool = False) -> Memory | None:
        """The memory (also when superseded or expired), or None if unknown — or forgotten, unless
        ``include_forgotten``."""
        check_key(memory_id, "memory_id")
        memory = await self.backend.get_memory(memory_id)
        if memory is None or (memory.forgotten and not include_forgotten):
            return None
        return memory

    async def query(
        self,
        type: str | None = None,
        scope: str | None = None,
        key: str | None = None,
        *,
        min_confidence: float | None = None,
        include_forgotten: bool = False,
        include_superseded: bool = False,
        include_expired: bool = False,
        limit: int = 100,
        cursor: str | None = None,
        scope_prefix: str | None = None,
    ) -> Page:
        """Memories matching every given filter, newest change first; ``Page.next_cursor`` continues.

        Forgotten, superseded and expired memories are left out unless asked for. ``scope_prefix``
        (instead of ``scope``) keeps the memories whose scope starts with it — ``"user:42/"`` matches
        ``"user:42/notes"`` but not ``"user:420"`` — reading only those from the scope index, whatever
        the size of the store.
        """
        for flag, what in (
            (include_forgotten, "include_forgotten"),
            (include_superseded, "include_superseded"),
            (include_expired, "include_expired"),
        ):
            check_bool(flag, what)
        check_int(limit, "limit", minimum=1)
        if cursor is not None and builtins.type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str from a previous page, got {cursor!r}")
        if scope is not None and scope_prefix is not None:
            raise InvalidArgument(
                f"give scope ({scope!r}) or scope_prefix ({scope_prefix!r}), not both",
                scope=scope,
                scope_prefix=scope_prefix,
            )
        return await self.backend.query_memories(
            type=None if type is None else _check_type(type),
            scope=None if scope is None else check_key(scope, "scope"),
            scope_prefix=None if scope_prefix is None else check_key(scope_prefix, "scope_prefix"),
            key=None if key is None else check_key(key, "key"),
            min_confidence=None
            if min_confidence is None
            else _check_fraction(min_confidence, "min_confidence"),
            include_forgotten=include_forgotten,
            include_superseded=include_superseded,
            live_at=None if include_expired else dt.datetime.now(dt.UTC),
            limit=limit,
            cursor=cursor,
        )

    async def scopes(
        self,
        prefix: str | None = None,
        *,
        type: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """The distinct scopes that hold a memory neither forgotten, superseded nor expired (of ``type``
        when given), starting with ``prefix`` when given, in code point order; ``Page.next_cursor``
        continues. Reads only the memories under the prefix (from the scope index), whatever the size of
        the store."""
        check_int(limit, "limit", minimum=1)
        if cursor is not None and builtins.type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str from a previous page, got {cursor!r}")
        return await self.backend.memory_scopes(
            prefix=None if prefix is None else check_key(prefix, "prefix"),
            type=None if type is None else _check_type(type),
            live_at=dt.datetime.now(dt.UTC),
            limit=limit,
            cursor=cursor,
        )

    async def changed(
        self, since: dt.datetime | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> Page:
        """Every memory changed at or after ``since`` — forgotten and superseded ones too — oldest
        change first, for whatever follows the memories (an index, a cache, a replica).

        Pair it with ``version`` (which grows at every change) rather than with time alone: clocks of
        different machines disagree.
        """
        if since is not None:
            check_aware(since, "since")
        check_int(limit, "limit", minimum=1)
        if cursor is not None and builtins.type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str from a previous page, got {cursor!r}")
        return await self.backend.changed_memories(since=since, limit=limit, cursor=cursor)

    async def forget(self, memory_id: str, *, reason: str | None, actor: str | None) -> Memory:
        """Forget a memory (soft delete, history DELETE); returns it. Forgetting it again changes
        nothing. ``NotFound`` for an unknown id."""
        check_key(memory_id, "memory_id")
        return await self.backend.forget_memory(
            memory_id,
            actor=_optional_text(actor, "actor"),
            reason=_optional_text(reason, "reason"),
            at=self._clock.now(),
        )

    async def supersede(self, old_id: str, new_id: str, *, reason: str | None, actor: str | None) -> Memory:
        """Mark ``old_id`` as replaced by ``new_id`` (history SUPERSEDE); returns the old memory.

        ``NotFound`` for an unknown id; ``InvalidTransition`` unless both are live (a retried call
        that already happened changes nothing).
        """
        check_key(old_id, "old_id")
        check_key(new_id, "new_id")
        if old_id == new_id:
            raise InvalidArgument(f"a memory cannot supersede itself ({old_id!r})", memory_id=old_id)
        return await self.backend.supersede_memory(
            old_id,
            new_id,
            actor=_optional_text(actor, "actor"),
            reason=_optional_text(reason, "reason"),
            at=self._clock.now(),
        )

    async def history(self, memory_id: str) -> list[MemoryEvent]:
        """Every change of the memory, in order (``version`` 1, 2, 3 …). ``NotFound`` for an unknown id."""
        check_key(memory_id, "memory_id")
        return await self.backend.memory_history(memory_id)

    # --- episodes -----------------------------------------------------------------------------------------

    async def add_episode(
        self,
        session_key: str,
        summary: str,
        *,
        first_seq: int | None = None,
        upto_seq: int | None = None,
        entities: Iterable[str] = (),
        importance: float = 0.5,
    ) -> Episode:
        """Record what happened in a session: a summary of its messages ``first_seq`` to ``upto_seq``
        (sequence numbers, either may be None), the entities involved and an importance in [0, 1]."""
        check_key(session_key, "session_key")
        check_text(summary, "summary")
        for value, what in ((first_seq, "first_seq"), (upto_seq, "upto_seq")):
            if value is not None:
                check_int(value, what, minimum=0)
        if first_seq is not None and upto_seq is not None and upto_seq < first_seq:
            raise InvalidArgument(f"upto_seq {upto_seq} is before first_seq {first_seq}")
        if isinstance(entities, str | bytes) or not isinstance(entities, Iterable):
            raise InvalidArgument(f"entities must be a list of names, got {entities!r}")
        names = tuple(check_key(e, "entity") for e in entities)
        episode = Episode(
            id=uuid.uuid4().hex,
            session_key=session_key,
            summary=summary,
            first_seq=first_seq,
            upto_seq=upto_seq,
            entities=names,
            importance=_check_fraction(importance, "importance"),
            created_at=self._clock.now(),
        )
        return await self.backend.add_episode(episode)

    async def episodes(self, session_key: str | None = None, *, limit: int = 100) -> list[Episode]:
        """Episodes newest first, of one session or of all."""
        if session_key is not None:
            check_key(session_key, "session_key")
        check_int(limit, "limit", minimum=1)
        return await self.backend.list_episodes(session_key=session_key, limit=limit)

    # --- the graph ----------------------------------------------------------------------------------------

    async def relate(
        self,
        subject: str,
        relation: str,
        obj: str,
        *,
        weight: float = 1.0,
        valid_from: dt.datetime | None = None,
        valid_to: dt.datetime | None = None,
        source_memory_id: str | None = None,
    ) -> Relation:
        """Add the edge ``subject -relation-> obj``, true from ``valid_from`` (default: now) until
        ``valid_to`` (default: until ``unrelate``). ``source_memory_id`` names the memory it came from
        (``NotFound`` if unknown)."""
        check_key(subject, "subject")
        check_key(relation, "relation")
        check_key(obj, "obj")
        if builtins.type(weight) not in (int, float) or not math.isfinite(weight):
            raise InvalidArgument(f"weight must be a finite number, got {weight!r}", value=weight)
        now = self._clock.now()
        start = now if valid_from is None else check_aware(valid_from, "valid_from")
        end = _optional_time(valid_to, "valid_to")
        if end is not None and end < start:
            raise InvalidArgument(
                f"valid_to {end.isoformat()} is before valid_from {start.isoformat()}: a relation cannot "
                "end before it starts"
            )
        if source_memory_id is not None:
            check_key(source_memory_id, "source_memory_id")
        edge = Relation(
            id=uuid.uuid4().hex,
            subject=subject,
            relation=relation,
            object=obj,
            weight=float(weight),
            valid_from=start,
            valid_to=end,
            source_memory_id=source_memory_id,
            created_at=now,
        )
        return await self.backend.add_relation(edge)

    async def unrelate(self, relation_id: str, *, at: dt.datetime | None = None) -> Relation:
        """End an edge at ``at`` (default: now) by setting its ``valid_to``; it stays in the graph's
        past. ``NotFound`` for an unknown id, ``InvalidTransition`` if it already ended,
        ``InvalidArgument`` if ``at`` is before it started."""
        check_key(relation_id, "relation_id")
        when = self._clock.now() if at is None else check_aware(at, "at")
        return await self.backend.end_relation(relation_id, when)

    async def relations(
        self, entity: str, *, relation: str | None = None, at: dt.datetime | None = None
    ) -> list[Relation]:
        """Edges with ``entity`` as subject or object that are true now — or were true at ``at``."""
        check_key(entity, "entity")
        if relation is not None:
            check_key(relation, "relation")
        when = self._clock.now() if at is None else check_aware(at, "at")
        return await self.backend.relations_at(entity, relation=relation, at=when)

    # --- contradictions -----------------------------------------------------------------------------------

    async def record_contradiction(self, memory_a: str, memory_b: str, description: str) -> Contradiction:
        """Record that two memories disagree; open until resolved. ``NotFound`` for an unknown memory."""
        check_key(memory_a, "memory_a")
        check_key(memory_b, "memory_b")
        if memory_a == memory_b:
            raise InvalidArgument(f"a memory cannot contradict itself ({memory_a!r})", memory_id=memory_a)
        check_text(description, "description")
        contradiction = Contradiction(
            id=uuid.uuid4().hex,
            memory_a=memory_a,
            memory_b=memory_b,
            description=description,
            resolution=None,
            created_at=self._clock.now(),
            resolved_at=None,
        )
        return await self.backend.add_contradiction(contradiction)

    async def resolve_contradiction(self, contradiction_id: str, resolution: str) -> Contradiction:
        """Resolve an open contradiction, once. ``NotFound`` for an unknown id, ``ConflictError`` if it
        was resolved already."""
        check_key(contradiction_id, "contradiction_id")
        check_text(resolution, "resolution")
        return await self.backend.resolve_contradiction(contradiction_id, resolution, self._clock.now())

    async def open_contradictions(self, *, limit: int = 1000) -> list[Contradiction]:
        """Unresolved contradictions, oldest first."""
        check_int(limit, "limit", minimum=1)
        return await self.backend.open_contradictions(limit=limit)

    # --- the access log (buffered) ----------------------------------------------------------------------

    def record_access(self, memory_id: str, context_query: str | None = None) -> None:
        """Note that a memory was used (for ``context_query``, if given). Never waits: the entry joins a
        bounded buffer that a background task writes in batches (after close it is dropped and counted).
        A bad id or query text raises at once."""
        check_key(memory_id, "memory_id")
        if context_query is not None:
            check_text(context_query, "context_query", allow_empty=True)
        size = _ACCESS_OVERHEAD + (0 if context_query is None else len(context_query))
        self._accesses.put(MemoryAccess(uuid.uuid4().hex, memory_id, self._clock.now(), context_query), size)

    async def _write_accesses(self, accesses: list[MemoryAccess], dropped: int) -> None:
        # The overflow count is kept in this process (accesses_dropped), not in the store.
        await self.backend.record_accesses(accesses)

    @property
    def accesses_pending(self) -> int:
        """Access log entries recorded but not written yet."""
        return self._accesses.pending

    @property
    def accesses_dropped(self) -> int:
        """Access log entries dropped because the buffer was full (or recorded after close)."""
        return self._accesses.dropped

    async def flush(self) -> None:
        """Write every access recorded before this call; raise the error of a write that failed (its
        entries stay buffered and are retried).

        Not inside ``atomic()``: the entries are written in transactions of their own, which wait for
        the block to end.
        """
        if self.backend.in_atomic():
            raise InvalidArgument(
                "memory.flush() cannot run inside atomic(): the access log is written in its own "
                "transactions, which wait for the block; call it after the block"
            )
        await self._accesses.flush()

    async def accesses(self, memory_id: str, *, limit: int = 100) -> list[MemoryAccess]:
        """The memory's logged accesses, newest first. What this process recorded is written first
        (except inside ``atomic()``, where that write would wait for the block)."""
        check_key(memory_id, "memory_id")
        check_int(limit, "limit", minimum=1)
        if not self.backend.in_atomic():
            await self._accesses.flush()
        return await self.backend.list_accesses(memory_id, limit=limit)

    async def close(self) -> None:
        """Write what is buffered and stop the background task. Idempotent; ``BackendUnavailable`` (with
        ``lost``) if entries could not be written."""
        await self._accesses.close()


__all__ = [
    "ACCESS_BUFFER",
    "MEMORY_TYPES",
    "Contradiction",
    "Episode",
    "Memory",
    "MemoryAccess",
    "MemoryEvent",
    "MemoryStore",
    "Relation",
]
