"""Trace spans: the operations every SQL dialect shares.

A flush is one transaction: every span of the batch is upserted by ``(trace_id, span_id)`` in order, and
the count of spans the buffer dropped since the last flush is added to ``trace_counters``. Listings page on
the key ``(started_at, trace_id, span_id)``, which an index serves with and without a name or status.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import InvalidArgument
from ..base import NewSpan, Page, Span, TraceBackend
from . import Row, SqlBackend, Tx, from_micros, to_micros
from .tasks import ts_in_or_none, ts_or_none

_DROPPED = "dropped"
# The bounds of an open range: every datetime lies within them.
_FAR_PAST = dt.datetime.min.replace(tzinfo=dt.UTC)
_FAR_FUTURE = dt.datetime.max.replace(tzinfo=dt.UTC)


def span_from_row(tx: Tx, row: Row) -> Span:
    return Span(
        trace_id=row["trace_id"],
        span_id=row["span_id"],
        parent_span_id=row["parent_span_id"],
        name=row["name"],
        kind=row["kind"],
        status=row["status"],
        attributes=tx.json_out(row["attributes"]),
        started_at=tx.ts_out(row["started_at"]),
        ended_at=ts_or_none(tx, row["ended_at"]),
    )


def encode_span_cursor(span: Span) -> str:
    """An opaque cursor after ``span`` in the listing order."""
    key = [to_micros(span.started_at), span.trace_id, span.span_id]
    return base64.urlsafe_b64encode(orjson.dumps(key)).decode("ascii")


def decode_span_cursor(cursor: Any) -> tuple[dt.datetime, str, str]:
    try:
        micros, trace_id, span_id = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        if type(micros) is not int or type(trace_id) is not str or type(span_id) is not str:
            raise ValueError
        return from_micros(micros), trace_id, span_id
    except Exception:
        raise InvalidArgument(
            f"cursor {cursor!r} is not one that traces.query returned", cursor=cursor
        ) from None


async def op_write_spans(tx: Tx, spans: Sequence[NewSpan], dropped: int) -> None:
    if spans:
        await tx.executemany(
            "trace_span_upsert",
            [
                (
                    s.trace_id,
                    s.span_id,
                    s.parent_span_id,
                    s.name,
                    s.kind,
                    s.status,
                    tx.json_in(s.attributes),
                    tx.ts_in(s.started_at),
                    ts_in_or_none(tx, s.ended_at),
                )
                for s in spans
            ],
        )
    if dropped:
        await tx.execute("trace_counter_add", _DROPPED, dropped)


async def op_read_trace(tx: Tx, trace_id: str) -> list[Span]:
    return [span_from_row(tx, r) for r in await tx.fetchall("trace_get", trace_id)]


async def op_query_spans(
    tx: Tx,
    since: dt.datetime | None,
    until: dt.datetime | None,
    name: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> Page:
    # No cursor: start just below (until, "", ""), which excludes exactly the spans at or after ``until``
    # (every id is non-empty).
    before = (until or _FAR_FUTURE, "", "") if cursor is None else decode_span_cursor(cursor)
    low = tx.ts_in(since or _FAR_PAST)
    key = (tx.ts_in(before[0]), before[1], before[2])
    if name is None and status is None:
        rows = await tx.fetchall("trace_query", low, *key, limit + 1)
    elif status is None:
        rows = await tx.fetchall("trace_query_name", low, *key, limit + 1, name)
    elif name is None:
        rows = await tx.fetchall("trace_query_status", low, *key, limit + 1, status)
    else:
        rows = await tx.fetchall("trace_query_name_status", low, *key, limit + 1, name, status)
    items = [span_from_row(tx, r) for r in rows[:limit]]
    next_cursor = encode_span_cursor(items[-1]) if len(rows) > limit else None
    return Page(items=items, next_cursor=next_cursor)


async def op_session_traces(tx: Tx, session_key: str, limit: int) -> list[str]:
    return [r["trace_id"] for r in await tx.fetchall("trace_ids_of_session", session_key, limit)]


async def op_spans_dropped(tx: Tx) -> int:
    row = await tx.fetchone("trace_counter_get", _DROPPED)
    return 0 if row is None else int(row["value"])


class SqlTraces(SqlBackend, TraceBackend):
    """The trace contract over the shared operations above."""

    async def write_spans(self, spans: Sequence[NewSpan], *, dropped: int = 0) -> None:
        await self._write(op_write_spans, spans, dropped)

    async def read_trace(self, trace_id: str) -> list[Span]:
        return await self._read(op_read_trace, trace_id)

    async def query_spans(
        self,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        name: str | None = None,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        return await self._read(op_query_spans, since, until, name, status, limit, cursor)

    async def session_traces(self, session_key: str, *, limit: int) -> list[str]:
        return await self._read(op_session_traces, session_key, limit)

    async def spans_dropped(self) -> int:
        return await self._read(op_spans_dropped)
