"""What the trace adapters share: recording a framework's spans into ``store.traces`` without ever
raising into the agent, and flushing from the framework's synchronous hooks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
import threading
from collections.abc import Mapping
from typing import Any

import orjson

from ..errors import InvalidArgument, InvalidKey, StatekeelError
from ..store import Store

log = logging.getLogger("statekeel.integrations.traces")

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _plain(value: Any) -> Any:
    """``value`` as JSON types (anything else as its text): for attributes the codec refused."""
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


class SpanSink:
    """Records spans into a store's ``traces`` for a tracing hook that must not fail its caller.

    ``record`` returns False (and logs, and counts ``refused``) instead of raising when a span is refused;
    attributes the codec refuses are stored once more as JSON with their other values as text.
    ``flush(timeout)`` waits for the spans to be committed when called outside the store's event loop
    while that loop runs; on the loop itself (where waiting would block it) it returns at once, the
    background writer commits them within 100 ms.
    """

    def __init__(self, store: Store, owner: str) -> None:
        if not isinstance(store, Store):
            raise InvalidArgument(f"{owner} needs an open statekeel Store, got {type(store).__name__}")
        self.store = store
        self.owner = owner
        self.refused = 0
        self._count_lock = threading.Lock()
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    def bind(self) -> None:
        """Remember the event loop the store runs on, when called on it."""
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                pass

    def count_refused(self) -> None:
        with self._count_lock:
            self.refused += 1

    def record(self, trace_id: str, span: Mapping[str, Any]) -> bool:
        try:
            try:
                self.store.traces.record(trace_id, span)
            except InvalidArgument as exc:
                attributes = span.get("attributes")
                if not attributes or isinstance(exc, InvalidKey):
                    raise
                self.store.traces.record(trace_id, {**span, "attributes": _plain(attributes)})
            return True
        except Exception as exc:  # a tracing hook must never fail the agent
            self.count_refused()
            name = span.get("name")
            log.warning("%s: span %r of trace %r was not recorded: %s", self.owner, name, trace_id, exc)
            return False

    def flush(self, timeout: float | None) -> bool:
        """Wait (at most ``timeout`` seconds) for the recorded spans to be committed; True when they are.
        True at once on the store's own loop (see the class docstring)."""
        loop = self.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop is None or current is loop:
            return True
        if loop.is_closed() or not loop.is_running():
            return False
        future = asyncio.run_coroutine_threadsafe(self.store.traces.flush(), loop)
        try:
            future.result(timeout)
        except (concurrent.futures.TimeoutError, StatekeelError) as exc:
            log.warning("%s: flushing spans failed: %s", self.owner, exc)
            return False
        return True


class SinkOwner:
    """What a trace adapter shows of its sink: the store it writes to and how many spans were refused."""

    _sink: SpanSink

    @property
    def store(self) -> Store:
        """The store the spans go to."""
        return self._sink.store

    @property
    def refused(self) -> int:
        """How many spans statekeel refused (logged, never raised)."""
        return self._sink.refused


def utc_from_iso(value: Any) -> dt.datetime | None:
    """An ISO 8601 time (as the Agents SDK gives) as an aware datetime; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def utc_from_ns(value: int | None) -> dt.datetime | None:
    """Nanoseconds since the epoch (as OpenTelemetry gives) as an aware datetime."""
    if value is None:
        return None
    return _EPOCH + dt.timedelta(microseconds=value // 1000)
