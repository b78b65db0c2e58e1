"""OpenTelemetry spans into a statekeel store: :class:`StatekeelSpanExporter`, an OpenTelemetry SDK
``SpanExporter`` writing into ``store.traces`` (``pip install 'statekeel[otel]'``)::

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from statekeel.integrations.otel import StatekeelSpanExporter

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(StatekeelSpanExporter(store)))

Any instrumentation that emits OpenTelemetry spans (an LLM client's, a framework's, your own) then lands
in the store next to the agent's sessions and tasks, without changing the agent's code.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id
except ImportError as exc:  # an optional extra
    raise ImportError(
        f"statekeel.integrations.otel needs the OpenTelemetry SDK: pip install 'statekeel[otel]' ({exc})"
    ) from exc

from ..store import Store
from ._spans import SinkOwner, SpanSink, utc_from_ns

log = logging.getLogger("statekeel.integrations.otel")

# The GenAI semantic conventions' operation names as statekeel span kinds.
_OPERATIONS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
}
_STATUS = {StatusCode.UNSET: "unset", StatusCode.OK: "ok", StatusCode.ERROR: "error"}


def _kind(span: ReadableSpan) -> str:
    operation = (span.attributes or {}).get("gen_ai.operation.name")
    if isinstance(operation, str) and operation in _OPERATIONS:
        return _OPERATIONS[operation]
    return span.kind.name.lower() if isinstance(span.kind, SpanKind) else "internal"


def _values(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    # OpenTelemetry keeps sequences as tuples; stored as lists, as they read back.
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    attributes = _values(span.attributes)
    if span.status.description:
        attributes["otel.status_description"] = span.status.description
    if span.events:
        attributes["otel.events"] = [
            {
                "name": e.name,
                "at": utc_from_ns(e.timestamp),
                "attributes": _values(e.attributes),
            }
            for e in span.events
        ]
    scope = span.instrumentation_scope
    if scope is not None:
        attributes["otel.scope.name"] = scope.name
    return attributes


class StatekeelSpanExporter(SinkOwner, SpanExporter):
    """An OpenTelemetry ``SpanExporter`` into ``store.traces``.

    Each finished span becomes a statekeel span: trace and span ids as OpenTelemetry's hex text, the
    parent's span id, name, status (``unset``/``ok``/``error``), start and end times to the microsecond,
    attributes (with the events under ``otel.events``). The kind is the GenAI operation when the span has
    ``gen_ai.operation.name`` (``chat`` → llm, ``execute_tool`` → tool, ``invoke_agent`` → agent,
    ``embeddings`` → embedding), else OpenTelemetry's kind (internal, client, server …).

    ``export`` never raises into the instrumented code: it returns ``SpanExportResult.FAILURE`` when
    statekeel refused a span (logged; the others of the batch are still recorded) or the exporter was
    shut down. Spans are recorded into the buffered tier and committed within 100 ms;
    ``force_flush(timeout_millis)`` waits for the commit when called from another thread than the
    store's event loop (as OpenTelemetry's batch processor does). ``shutdown()`` flushes and leaves the
    store open: the application closes it.
    """

    def __init__(self, store: Store) -> None:
        self._sink = SpanSink(store, "StatekeelSpanExporter")
        self._shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shut_down:
            log.warning("StatekeelSpanExporter: export after shutdown; %d spans not recorded", len(spans))
            return SpanExportResult.FAILURE
        ok = True
        for span in spans:
            try:
                context = span.context
                if context is None:
                    raise ValueError("the span has no context (no trace and span id)")
                record = {
                    "span_id": format_span_id(context.span_id),
                    "parent_span_id": None if span.parent is None else format_span_id(span.parent.span_id),
                    "name": span.name,
                    "kind": _kind(span),
                    "status": _STATUS.get(span.status.status_code, "unset"),
                    "attributes": _attributes(span),
                    "started_at": utc_from_ns(span.start_time),
                    "ended_at": utc_from_ns(span.end_time),
                }
                trace_id = format_trace_id(context.trace_id)
            except Exception as exc:  # a span we cannot read: count it, keep exporting the others
                name = getattr(span, "name", None)
                log.warning("StatekeelSpanExporter: span %r cannot be read: %s", name, exc)
                self._sink.count_refused()
                ok = False
                continue
            if record["started_at"] is None:
                del record["started_at"]
            ok = self._sink.record(trace_id, record) and ok
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait (at most ``timeout_millis``) for the recorded spans to be committed; True when they are.
        True at once on the store's own event loop, where waiting would block it."""
        return self._sink.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Flush, then refuse further exports (``FAILURE``); the store stays open."""
        self._sink.flush(30.0)
        self._shut_down = True


__all__ = ["StatekeelSpanExporter"]
