"""``store.traces`` (:class:`TraceLog`): spans of tool and LLM calls, the buffered tier.

``record`` validates a span and queues it; it never waits and never raises on I/O. A background task
writes queued spans in batches, one transaction each: at most 100 ms after a span is recorded, at once
when 1,000 spans wait, on ``await traces.flush()`` and on ``store.close()``. A ``kill -9`` loses at most
the spans recorded since the last write; every span recorded before a ``flush()`` that returned is stored.

The buffer holds 10,000 spans (or 64 MiB of attributes); when it is full — the database is down or
slower than the agent — the oldest spans not yet written are dropped and counted: ``traces.dropped`` in
this process, and ``store.recover()`` reports the store's total (``RecoveryReport.traces_dropped``).

A span is identified by ``(trace_id, span_id)``; recording one again replaces it (the last record
wins), so a span can be recorded when it starts (``ended_at=None``) and again when it ends.

    start = datetime.now(UTC)
    store.traces.record("trace-1", {"span_id": "s-1", "name": "read_file", "kind": "tool",
                                    "started_at": start, "attributes": {"path": "a.txt"}})
    ...
    store.traces.record("trace-1", {"span_id": "s-1", "name": "read_file", "kind": "tool",
                                    "started_at": start, "ended_at": datetime.now(UTC), "status": "ok"})
    await store.traces.flush()
    spans = await store.traces.get("trace-1")

Fields map onto OpenTelemetry's: ``trace_id``, ``span_id``, ``parent_span_id``, ``name``, ``kind``,
``status`` (status code), ``attributes``, ``started_at`` / ``ended_at`` (start / end time). Kinds are
:data:`SPAN_KINDS`: OpenTelemetry's five and the kinds of agent work.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from .backends.base import SPAN_STATUSES, NewSpan, Page, Span, StorageBackend
from .buffer import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CAPACITY,
    DEFAULT_INTERVAL_S,
    DEFAULT_MAX_BYTES,
    WriteBuffer,
)
from .codec import Codec
from .errors import InvalidArgument
from .validation import check_aware, check_int, check_key

# OpenTelemetry's span kinds, then the kinds of work an agent does (OpenInference and the agent SDKs name
# the same things).
OTEL_SPAN_KINDS = ("internal", "server", "client", "producer", "consumer")
AGENT_SPAN_KINDS = (
    "agent",
    "llm",
    "generation",
    "response",
    "tool",
    "function",
    "chain",
    "retriever",
    "embedding",
    "reranker",
    "guardrail",
    "evaluator",
    "handoff",
    "workflow",
    "task",
    "step",
    "custom",
)
SPAN_KINDS = frozenset(OTEL_SPAN_KINDS + AGENT_SPAN_KINDS)
_STATUSES = frozenset(SPAN_STATUSES)
SPAN_FIELDS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "status",
    "attributes",
    "started_at",
    "ended_at",
)
_FIELDS = frozenset(SPAN_FIELDS)
_REQUIRED = ("span_id", "name")
# What a queued span costs besides its attributes, towards the buffer's byte budget.
_SPAN_OVERHEAD = 256


def _choice(value: Any, allowed: frozenset[str], what: str) -> str:
    if type(value) is str:
        if value in allowed:
            return value
        if value.lower() in allowed:
            return value.lower()
    raise InvalidArgument(f"{what} must be one of {', '.join(sorted(allowed))}; got {value!r}", value=value)


def _utc(value: Any, what: str) -> dt.datetime:
    check_aware(value, what)
    if value.tzinfo is dt.UTC:
        return value  # type: ignore[no-any-return]
    try:
        return value.astimezone(dt.UTC)  # type: ignore[no-any-return]
    except OverflowError:
        raise InvalidArgument(f"{what} {value!r} is out of range in UTC", value=value) from None


class TraceLog:
    """Records spans through a bounded buffer; reads them by trace and by start time.

    ``capacity`` (spans held before the oldest is dropped), ``batch_size`` (spans per transaction and the
    count that triggers a write at once), ``interval`` (seconds a recorded span waits at most) and
    ``max_bytes`` (encoded attributes held) bound the buffer.
    """

    def __init__(
        self,
        backend: StorageBackend,
        codec: Codec,
        *,
        capacity: int = DEFAULT_CAPACITY,
        batch_size: int = DEFAULT_BATCH_SIZE,
        interval: float = DEFAULT_INTERVAL_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.backend = backend
        self.codec = codec
        self._buffer: WriteBuffer[NewSpan] = WriteBuffer(
            self._write,
            name="spans",
            capacity=capacity,
            batch_size=batch_size,
            interval=interval,
            max_bytes=max_bytes,
        )

    async def _write(self, spans: list[NewSpan], dropped: int) -> None:
        await self.backend.write_spans(spans, dropped=dropped)

    def record(self, trace_id: str, span: Span | Mapping[str, Any]) -> None:
        """Queue ``span`` of trace ``trace_id`` for writing. Never waits; never raises on I/O.

        ``span`` is a :class:`Span` or a mapping with its fields: ``span_id`` and ``name`` are required;
        ``trace_id`` may be left out (it must equal ``trace_id`` when given); ``parent_span_id`` (None),
        ``kind`` ("internal"), ``status`` ("unset"), ``attributes`` ({}), ``started_at`` (now) and
        ``ended_at`` (None: the span is still open) have defaults. Raises ``InvalidArgument`` (or a
        subclass) before queueing anything for an empty or non-text id, an unknown field, kind or status,
        a naive datetime, a span that ends before it starts, or attributes the codec refuses.
        """
        check_key(trace_id, "trace_id")
        attributes: Any
        started: Any
        if isinstance(span, Span):
            if span.trace_id != trace_id:
                raise InvalidArgument(
                    f"span.trace_id {span.trace_id!r} differs from trace_id {trace_id!r}", value=span.trace_id
                )
            span_id, parent, name = span.span_id, span.parent_span_id, span.name
            kind, status, attributes = span.kind, span.status, span.attributes
            started, ended = span.started_at, span.ended_at
        elif type(span) is dict or isinstance(span, Mapping):
            if not _FIELDS.issuperset(span.keys()):
                unknown = span.keys() - _FIELDS
                raise InvalidArgument(
                    f"span has unknown fields {sorted(map(repr, unknown))}; its fields are "
                    f"{', '.join(SPAN_FIELDS)}",
                    fields=sorted(map(repr, unknown)),
                )
            for required in _REQUIRED:
                if required not in span:
                    raise InvalidArgument(f"span has no {required}; {', '.join(_REQUIRED)} are required")
            if "trace_id" in span and span["trace_id"] != trace_id:
                raise InvalidArgument(
                    f"span's trace_id {span['trace_id']!r} differs from trace_id {trace_id!r}",
                    value=span["trace_id"],
                )
            get = span.get
            span_id, parent, name = span["span_id"], get("parent_span_id"), span["name"]
            kind, status, attributes = get("kind", "internal"), get("status", "unset"), get("attributes")
            started, ended = get("started_at"), get("ended_at")
            if started is None:
                started = dt.datetime.now(dt.UTC)
        else:
            raise InvalidArgument(f"span must be a statekeel.Span or a mapping, got {type(span).__name__}")
        check_key(span_id, "span_id")
        if parent is not None:
            check_key(parent, "parent_span_id")
            if parent == span_id:
                raise InvalidArgument(f"span {span_id!r} names itself as its parent", value=parent)
        check_key(name, "name")
        kind = _choice(kind, SPAN_KINDS, "kind")
        status = _choice(status, _STATUSES, "status")
        started = _utc(started, "started_at")
        if ended is not None:
            ended = _utc(ended, "ended_at")
            if ended < started:
                raise InvalidArgument(
                    f"span {span_id!r} ends ({ended.isoformat()}) before it starts ({started.isoformat()})",
                    started_at=started,
                    ended_at=ended,
                )
        if attributes is None:
            attributes = {}
        elif not isinstance(attributes, Mapping):
            raise InvalidArgument(f"attributes must be a mapping, got {type(attributes).__name__}")
        raw = self.codec.encode(
            attributes if type(attributes) is dict else dict(attributes), where="attributes"
        )
        self._buffer.put(
            NewSpan(trace_id, span_id, parent, name, kind, status, raw, started, ended),
            len(raw) + _SPAN_OVERHEAD,
        )

    @property
    def dropped(self) -> int:
        """Spans this TraceLog dropped because its buffer was full (or recorded after close)."""
        return self._buffer.dropped

    @property
    def pending(self) -> int:
        """Spans recorded and not written yet."""
        return self._buffer.pending

    async def flush(self) -> None:
        """Write every span recorded before this call; returns once they are committed.

        Raises the storage error (``BackendUnavailable`` …) when the write fails: the spans stay buffered
        and are retried. Not inside ``backend.atomic()``: the write would wait for that very block.
        """
        if self.backend.in_atomic():
            raise InvalidArgument(
                "traces.flush() inside backend.atomic() would wait for the block's own transaction; "
                "call it after the block"
            )
        await self._buffer.flush()

    async def _flush_for_read(self) -> None:
        # Reads include what this process recorded; inside an atomic() block a flush would wait for it.
        if not self.backend.in_atomic():
            await self._buffer.flush()

    async def get(self, trace_id: str) -> list[Span]:
        """The spans of ``trace_id`` in start order (then by span_id); empty when there are none.

        Spans this TraceLog recorded are flushed first (except inside ``atomic()``).
        """
        check_key(trace_id, "trace_id")
        await self._flush_for_read()
        return await self.backend.read_trace(trace_id)

    async def query(
        self,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        name: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Spans that started in ``[since, until)``, optionally with this ``name`` and ``status``, newest
        first (by ``started_at``, then trace_id and span_id, descending). Pass ``next_cursor`` on with the
        same filters for the next page.

        page = await store.traces.query(since=an_hour_ago, status="error", limit=50)
        """
        if since is not None:
            since = _utc(since, "since")
        if until is not None:
            until = _utc(until, "until")
        if since is not None and until is not None and since > until:
            raise InvalidArgument(f"since ({since.isoformat()}) is after until ({until.isoformat()})")
        if name is not None:
            check_key(name, "name")
        if status is not None:
            status = _choice(status, _STATUSES, "status")
        check_int(limit, "limit", minimum=1)
        if cursor is not None and type(cursor) is not str:
            raise InvalidArgument(f"cursor must be a str returned by query, got {type(cursor).__name__}")
        await self._flush_for_read()
        return await self.backend.query_spans(
            since=since, until=until, name=name, status=status, limit=limit, cursor=cursor
        )

    async def of_session(self, session_key: str, *, limit: int = 20) -> list[str]:
        """The ids of the traces of session ``session_key``, the most recently active first: the trace
        named after the session, and each trace with a span whose attributes' ``session_key`` or
        ``session.id`` is the key (the attributes the adapters and ``store.erase`` go by). At most
        ``limit``; spans this TraceLog recorded are flushed first (except inside ``atomic()``).

            for trace_id in await store.traces.of_session("chat-42"):
                spans = await store.traces.get(trace_id)
        """
        check_key(session_key, "session_key")
        check_int(limit, "limit", minimum=1)
        await self._flush_for_read()
        return await self.backend.session_traces(session_key, limit=limit)

    async def total_dropped(self) -> int:
        """Spans lost to a full buffer over the life of the store: the count stored with earlier writes
        (by every process) plus this process's drops not written yet."""
        return await self.backend.spans_dropped() + self._buffer.unreported

    async def close(self) -> None:
        """Write the buffered spans and stop the background task (``store.close()`` calls this).

        Raises ``BackendUnavailable`` with ``lost`` when the last write fails: those spans are lost.
        """
        await self._buffer.close()


__all__ = ["AGENT_SPAN_KINDS", "OTEL_SPAN_KINDS", "SPAN_FIELDS", "SPAN_KINDS", "Span", "TraceLog"]
