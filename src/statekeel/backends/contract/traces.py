"""Trace spans (the buffered tier)."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from statekeel.backends.contract.store import Page

__all__ = [
    "SPAN_STATUSES",
    "NewSpan",
    "Span",
    "TraceBackend",
]


SPAN_STATUSES = ("unset", "ok", "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One span of a trace: a tool call, an LLM call, an agent turn … Fields map onto OpenTelemetry.

    ``kind`` and ``status`` are lower-case names (see :mod:`statekeel.traces` for the accepted kinds;
    statuses are OpenTelemetry's ``unset``, ``ok``, ``error``). ``ended_at`` is None while the span is
    open; ``started_at`` defaults to the time the Span is made. Times are timezone-aware; spans read back
    from a store are in UTC, to the microsecond.

        Span(trace_id="t-1", span_id="s-1", name="read_file", kind="tool", started_at=start, ended_at=end)
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None = None
    name: str
    kind: str = "internal"
    status: str = "unset"
    attributes: dict[str, Any] = field(default_factory=dict)
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    ended_at: dt.datetime | None = None

    @property
    def duration(self) -> dt.timedelta | None:
        """``ended_at - started_at``, or None while the span is open."""
        return None if self.ended_at is None else self.ended_at - self.started_at


class NewSpan(NamedTuple):
    """A validated span to write: ``attributes`` codec-encoded, times aware UTC.

    A named tuple rather than a frozen dataclass: one is built on every ``traces.record`` call, and a
    tuple costs a fifth of the caller's time a frozen dataclass does."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    status: str
    attributes: bytes
    started_at: dt.datetime
    ended_at: dt.datetime | None


class TraceBackend(abc.ABC):
    """Spans (the buffered tier): written in batches, read by trace and by start time."""

    @abc.abstractmethod
    async def write_spans(self, spans: Sequence[NewSpan], *, dropped: int = 0) -> None:
        """Upsert ``spans`` by ``(trace_id, span_id)`` in order (a later span replaces an earlier one with
        the same ids) and add ``dropped`` to the store's count of spans lost to buffer overflow, in one
        transaction."""

    @abc.abstractmethod
    async def read_trace(self, trace_id: str) -> list[Span]:
        """A trace's spans in start order (then by ``span_id``); empty when there are none."""

    @abc.abstractmethod
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
        """Spans with ``since <= started_at < until``, newest first (by ``started_at``, then trace and
        span id, descending), cursor-paginated."""

    @abc.abstractmethod
    async def session_traces(self, session_key: str, *, limit: int) -> list[str]:
        """The ids of the traces of a session — the trace named after it and the traces with a span whose
        attributes' ``session_key`` or ``session.id`` is that key (a string) — the most recently started
        span's first, at most ``limit``."""

    @abc.abstractmethod
    async def spans_dropped(self) -> int:
        """The total ``dropped`` recorded by :meth:`write_spans` over the life of the store."""
