"""Trace spans on a JetStream stream: one subject per span, keeping its last message.

A span is published to ``<prefix>.span.<trace>.<span>`` (ids as subject tokens) on a stream that keeps
one message per subject, so recording a span again replaces it (the contract's upsert by
``(trace_id, span_id)``). A batch is checked whole against the server's ``max_payload`` before anything
is published, and its publishes are pipelined. The count of spans lost to buffer overflow is the last
message of ``<prefix>.traces_dropped`` (on the ``<prefix>_meta`` stream), a running total advanced by a
conditional publish (``Nats-Expected-Last-Subject-Sequence``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

import orjson

import nats.js.errors

from ...codec import Codec
from ...errors import InvalidArgument, StorageCorrupt
from ..base import NewSpan, Page, PurgeBatch, Span, TraceBackend
from .client import (
    WRONG_LAST_SEQUENCE,
    NatsConnection,
    StreamSpec,
    checked_subject,
    encode_token,
    from_micros,
    micros,
)

__all__ = ["NatsTraces", "traces_spec"]

_FAR_FUTURE = dt.datetime.max.replace(tzinfo=dt.UTC)


def traces_spec(prefix: str) -> StreamSpec:
    return StreamSpec(f"{prefix}_traces", (f"{prefix}.span.*.*",), max_msgs_per_subject=1)


def _cursor(span: Span) -> str:
    return base64.urlsafe_b64encode(
        orjson.dumps([micros(span.started_at), span.trace_id, span.span_id])
    ).decode()


def _after(cursor: str) -> tuple[int, str, str]:
    try:
        at, trace_id, span_id = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        if type(at) is not int or type(trace_id) is not str or type(span_id) is not str:
            raise ValueError
        return at, trace_id, span_id
    except (ValueError, TypeError, UnicodeEncodeError, orjson.JSONDecodeError):
        raise InvalidArgument(
            f"cursor {cursor!r} is not one that traces.query returned", cursor=cursor
        ) from None


class NatsTraces(TraceBackend):
    """The trace contract on the ``<prefix>_traces`` stream."""

    conn: NatsConnection
    prefix: str
    codec: Codec

    @property
    def _traces_stream(self) -> str:
        return f"{self.prefix}_traces"

    @property
    def _meta_stream(self) -> str:
        return f"{self.prefix}_meta"

    def _span_subject(self, trace_id: str, span_id: str) -> str:
        return checked_subject(
            f"{self.prefix}.span.{encode_token(trace_id)}.{encode_token(span_id)}",
            "trace or span id",
            span_id,
        )

    def _span(self, seq: int, data: bytes) -> Span:
        try:
            f: dict[str, Any] = orjson.loads(data)
            return Span(
                trace_id=f["trace_id"],
                span_id=f["span_id"],
                parent_span_id=f["parent_span_id"],
                name=f["name"],
                kind=f["kind"],
                status=f["status"],
                attributes=self.codec.decode(f["attributes"]),
                started_at=from_micros(int(f["started_at"])),
                ended_at=None if f["ended_at"] is None else from_micros(int(f["ended_at"])),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise StorageCorrupt(
                f"message {seq} of the NATS stream {self._traces_stream} is not a span: {exc}"
            ) from None

    async def write_spans(self, spans: Sequence[NewSpan], *, dropped: int = 0) -> None:
        latest: dict[tuple[str, str], NewSpan] = {}
        for span in spans:  # a later span replaces an earlier one with the same ids
            latest.pop((span.trace_id, span.span_id), None)
            latest[(span.trace_id, span.span_id)] = span
        out: list[tuple[str, bytes]] = []
        for span in latest.values():
            payload = orjson.dumps(
                {
                    "trace_id": span.trace_id,
                    "span_id": span.span_id,
                    "parent_span_id": span.parent_span_id,
                    "name": span.name,
                    "kind": span.kind,
                    "status": span.status,
                    "attributes": span.attributes.decode("utf-8"),
                    "started_at": micros(span.started_at),
                    "ended_at": None if span.ended_at is None else micros(span.ended_at),
                }
            )
            subject = self._span_subject(span.trace_id, span.span_id)
            # Every span is checked before the first is published: a batch is refused whole.
            self.conn.check_size(subject, payload, {}, f"span {span.span_id!r} of trace {span.trace_id!r}")
            out.append((subject, payload))
        stream = self._traces_stream
        for start in range(0, len(out), 256):
            await asyncio.gather(
                *(
                    self.conn.publish(s, p, stream=stream, headers={}, what="writing a span")
                    for s, p in out[start : start + 256]
                )
            )
        if dropped:
            await self._add_dropped(dropped)

    async def _add_dropped(self, dropped: int) -> None:
        subject = f"{self.prefix}.traces_dropped"
        while True:
            last = await self.conn.last(self._meta_stream, subject)
            total = 0 if last is None or last.data is None else int(orjson.loads(last.data))
            seq = 0 if last is None or last.seq is None else last.seq
            try:
                await self.conn.publish(
                    subject,
                    orjson.dumps(total + dropped),
                    stream=self._meta_stream,
                    headers={"Nats-Expected-Last-Subject-Sequence": str(seq)},
                    what="counting dropped spans",
                )
                return
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise StorageCorrupt(
                        f"the NATS stream {self._meta_stream} refused: {exc.description}"
                    ) from exc

    async def _all_spans(self, subjects: str) -> list[tuple[int, Span]]:
        return [
            (seq, self._span(seq, data))
            async for seq, _, data, _ in self.conn.scan(self._traces_stream, subjects)
        ]

    async def read_trace(self, trace_id: str) -> list[Span]:
        subjects = f"{self.prefix}.span.{encode_token(trace_id)}.*"
        spans = [s for _, s in await self._all_spans(subjects)]
        spans.sort(key=lambda s: (s.started_at, s.span_id))
        return spans

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
        before = (micros(until or _FAR_FUTURE), "", "") if cursor is None else _after(cursor)
        low = None if since is None else micros(since)
        chosen: list[tuple[tuple[int, str, str], Span]] = []
        for _, span in await self._all_spans(f"{self.prefix}.span.*.*"):
            key = (micros(span.started_at), span.trace_id, span.span_id)
            if key >= before or (low is not None and key[0] < low):
                continue
            if (name is not None and span.name != name) or (status is not None and span.status != status):
                continue
            chosen.append((key, span))
        chosen.sort(key=lambda item: item[0], reverse=True)
        items = [s for _, s in chosen[:limit]]
        return Page(items=items, next_cursor=_cursor(items[-1]) if len(chosen) > limit else None)

    async def session_traces(self, session_key: str, *, limit: int) -> list[str]:
        latest: dict[str, int] = {}
        for _, span in await self._all_spans(f"{self.prefix}.span.*.*"):
            attributes = span.attributes if isinstance(span.attributes, dict) else {}
            if span.trace_id == session_key or session_key in (
                v for k in ("session_key", "session.id") if isinstance(v := attributes.get(k), str)
            ):
                started = micros(span.started_at)
                latest[span.trace_id] = max(latest.get(span.trace_id, started), started)
        ordered = sorted(latest.items(), key=lambda item: (-item[1], item[0]))
        return [trace_id for trace_id, _ in ordered[:limit]]

    async def spans_dropped(self) -> int:
        last = await self.conn.last(self._meta_stream, f"{self.prefix}.traces_dropped")
        return 0 if last is None or last.data is None else int(orjson.loads(last.data))

    async def span_count(self) -> int:
        return await self.conn.count(self._traces_stream)

    async def purge_traces(self, before: dt.datetime, *, limit: int, dry_run: bool) -> PurgeBatch:
        began = time.perf_counter()
        old = [
            (seq, s) for seq, s in await self._all_spans(f"{self.prefix}.span.*.*") if s.started_at < before
        ]
        if dry_run:
            return PurgeBatch({"traces": len(old)}, None, time.perf_counter() - began)
        done = 0
        for seq, span in old[:limit]:
            # Up to the message read, not beyond: a span recorded again since then stays.
            await self.conn.purge(
                self._traces_stream, self._span_subject(span.trace_id, span.span_id), before_seq=seq + 1
            )
            done += 1
        return PurgeBatch({"traces": done}, None if done < limit else (), time.perf_counter() - began)
