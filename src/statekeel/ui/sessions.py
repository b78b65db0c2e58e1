"""The transcript page's reads: messages with their times and usage, the session's branches (its parent
and fork point, its forks, its siblings), its traces — and, for the trace page, the sessions a trace
belongs to.

A store whose backend keeps no branches or usage (a plain ``nats://`` store raises ``Unsupported`` for
them) gets a page that says so in their place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..backends.base import Branch, SessionRecord, Span
from ..errors import InvalidArgument, Unsupported
from ..store import Store
from ..usage import ModelUsage, Usage
from ..validation import check_key
from .page import PageError, Ui
from .transcript import build_transcript

TRACES_SHOWN = 20
SESSIONS_OF_A_TRACE = 20
# The span attributes that name the session a span belongs to (those the adapters and store.erase use).
SESSION_ATTRIBUTES = ("session_key", "session.id")


@dataclasses.dataclass(frozen=True, slots=True)
class Branching:
    """Where a session sits among its branches: ``parent`` and ``fork_seq`` for a fork (its messages
    before ``fork_seq`` are read from its ancestors), the forks made from it (``children``, and by fork
    point in ``forks_at``) and the other forks of its parent (``siblings``)."""

    parent: str | None
    fork_seq: int | None
    children: list[Branch]
    siblings: list[Branch]

    @property
    def forks_at(self) -> dict[int, list[Branch]]:
        marks: dict[int, list[Branch]] = {}
        for b in self.children:
            marks.setdefault(b.at_seq, []).append(b)
        return marks

    @property
    def any(self) -> bool:
        return self.parent is not None or bool(self.children)


async def branching(store: Store, record: SessionRecord) -> Branching | None:
    """The session's branches, or None when the store keeps none (``Unsupported``)."""
    try:
        children = await store.sessions.branches(record.key)
        siblings: list[Branch] = []
        if record.parent_key is not None:
            siblings = [b for b in await store.sessions.branches(record.parent_key) if b.key != record.key]
    except Unsupported:
        return None
    return Branching(record.parent_key, record.parent_seq, children, siblings)


async def usage_of(store: Store, key: str) -> tuple[Usage, dict[int, ModelUsage]] | None:
    """The session's usage totals and each message's, or None when the store keeps none."""
    try:
        return await store.sessions.usage(key), await store.sessions.message_usage(key)
    except Unsupported:
        return None


async def session_page(ui: Ui, request: Request, key: str) -> Response:
    """The transcript of session ``key`` with its times, usage, branches and traces."""
    store = ui.store
    # The backend's snapshot, not sessions.load(): load() merges fallback files and caches the result,
    # and a cached session with unsaved fallback messages would be saved when evicted — a write.
    loaded = await store.backend.load_session_payloads(key, include_archived=True)
    if loaded is None:
        raise PageError(404, "Session not found", f"There is no session with the key {key!r} in this store.")
    fallback = store.sessions.fallback
    waiting = fallback is not None and fallback.exists(key)
    transcript = build_transcript(loaded.messages, first_seq=loaded.first_seq, summaries=loaded.summaries)
    # When each message was stored (a second read: a message appended meanwhile has no time shown).
    timed = await store.backend.load_session_with_messages(key, include_archived=True)
    times = {} if timed is None else {m.seq: m.created_at for m in timed[1]}
    traces = await store.traces.of_session(key, limit=TRACES_SHOWN) if store.holds("traces") else None
    return ui.render(
        request,
        "session.html",
        title=f"Session {key}",
        record=loaded.record,
        transcript=transcript,
        times=times,
        fallback_waiting=waiting,
        branches=await branching(store, loaded.record),
        usage=await usage_of(store, key),
        traces=traces,
        traces_shown=TRACES_SHOWN,
        section="/sessions",
    )


def _named(spans: Sequence[Span], trace_id: str) -> list[str]:
    """The session keys a trace names, in order: its own id, then the spans' session attributes."""
    names: list[str] = [trace_id]
    for span in spans:
        attributes: Any = span.attributes
        if isinstance(attributes, dict):
            names += [v for a in SESSION_ATTRIBUTES if isinstance(v := attributes.get(a), str)]
    return list(dict.fromkeys(names))


async def trace_sessions(store: Store, trace_id: str, spans: Sequence[Span]) -> list[str]:
    """The keys of the stored sessions trace ``trace_id`` belongs to (see :meth:`TraceLog.of_session`)."""
    if not store.holds("sessions"):
        return []
    found: list[str] = []
    for name in _named(spans, trace_id)[:SESSIONS_OF_A_TRACE]:
        try:
            check_key(name)
        except InvalidArgument:
            continue  # not a string a session key can be, so no session of that key
        if await store.backend.load_session(name) is not None:
            found.append(name)
    return found


__all__ = ["Branching", "branching", "session_page", "trace_sessions", "usage_of"]
