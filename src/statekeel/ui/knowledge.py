"""The pages of what agents know and made: memories (by type and scope, with history and
contradictions), the file ledger (with drift against ``--root``) and the vector index (sources and lag).

Each reads through the store's public API — or the backend's reading methods where the API's own call
writes (``vectors.lagging()`` first reads the memories' latest changes into the sources table) — and
shows a page saying so when the store's backend does not hold the kind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..backends.base import MEMORY_TYPES, Contradiction, Drift, FileRecord, Memory
from ..validation import check_key
from .page import PageError, Ui

MEMORIES_SHOWN = 50
SCOPES_SHOWN = 100
CONTRADICTIONS_SHOWN = 200
FILES_SHOWN = 100
LAG_SHOWN = 200

Page = Callable[[Request], Coroutine[Any, Any, Response]]


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value else None


def _checked(value: str | None, name: str) -> str | None:
    """A key-like parameter checked as the library checks it: a bad one is a 400 page, not a 500."""
    return None if value is None else check_key(value, name)


def unheld(ui: Ui, request: Request, title: str, what: str, detail: str | None = None) -> Response:
    """The page of a kind the store's backend does not hold (a plain ``nats://`` store's memories …);
    ``detail``: the error the store raised, when there was one."""
    return ui.render(request, "unheld.html", title=title, what=what, detail=detail)


def memory_state(memory: Memory, now: dt.datetime) -> str:
    """``live``, ``forgotten``, ``superseded`` or ``expired``."""
    if memory.forgotten:
        return "forgotten"
    if memory.superseded:
        return "superseded"
    return "expired" if memory.expired(now) else "live"


@dataclasses.dataclass(frozen=True, slots=True)
class FileRow:
    """A path's last record and how its file under the root compares: ``changed``, ``missing``,
    ``unreadable``, ``unchanged`` (also a recorded deletion whose file is still gone), or None without
    a root."""

    record: FileRecord
    state: str | None
    drift: Drift | None


def file_rows(records: list[FileRecord], drifts: list[Drift] | None) -> list[FileRow]:
    """Each record with its state on disk (``drifts`` from ``files.compare``; None: no root given)."""
    if drifts is None:
        return [FileRow(r, None, None) for r in records]
    by_path = {d.path: d for d in drifts}
    return [
        FileRow(r, by_path[r.path].kind if r.path in by_path else "unchanged", by_path.get(r.path))
        for r in records
    ]


def memory_pages(ui: Ui) -> list[tuple[str, Page]]:
    """``/memories`` (a type's and a scope's memories, the scopes, open contradictions) and ``/memory``
    (one memory, its versions and its contradictions)."""

    async def memories(request: Request) -> Response:
        store = ui.store
        if not store.holds("memory"):
            return unheld(ui, request, "Memories", "memories")
        kind = _param(request, "type")
        if kind is not None and kind not in MEMORY_TYPES:
            raise PageError(
                400, "Bad request", f"type must be one of {', '.join(MEMORY_TYPES)}; got {kind!r}."
            )
        scope = _checked(_param(request, "scope"), "scope")
        prefix = _checked(_param(request, "prefix"), "prefix")
        everything = _param(request, "all") is not None
        cursor = _param(request, "cursor")
        page = await store.memory.query(
            type=kind,
            scope=scope,
            scope_prefix=prefix if scope is None else None,
            include_forgotten=everything,
            include_superseded=everything,
            include_expired=everything,
            limit=MEMORIES_SHOWN,
            cursor=cursor,
        )
        scopes = await store.memory.scopes(prefix, type=kind, limit=SCOPES_SHOWN)
        contradictions = await store.memory.open_contradictions(limit=CONTRADICTIONS_SHOWN)
        return ui.render(
            request,
            "memories.html",
            title="Memories",
            page=page,
            kind=kind,
            types=MEMORY_TYPES,
            scope=scope,
            prefix=prefix,
            everything=everything,
            paged=cursor is not None,
            scopes=scopes,
            contradictions=contradictions,
            now=dt.datetime.now(dt.UTC),
            state=memory_state,
            limits=(SCOPES_SHOWN, CONTRADICTIONS_SHOWN),
        )

    async def memory(request: Request) -> Response:
        store = ui.store
        if not store.holds("memory"):
            return unheld(ui, request, "Memory", "memories")
        memory_id = _param(request, "id")
        if memory_id is None:
            raise PageError(400, "Bad request", "This page needs the memory id: add ?id=... to the address.")
        found = await store.memory.get(check_key(memory_id, "id"), include_forgotten=True)
        if found is None:
            raise PageError(
                404, "Memory not found", f"There is no memory with the id {memory_id!r} in this store."
            )
        history = await store.memory.history(found.id)
        open_ones: list[Contradiction] = [
            c
            for c in await store.memory.open_contradictions(limit=CONTRADICTIONS_SHOWN)
            if found.id in (c.memory_a, c.memory_b)
        ]
        return ui.render(
            request,
            "memory.html",
            title=f"Memory {found.key or found.id}",
            memory=found,
            history=history,
            contradictions=open_ones,
            state=memory_state(found, dt.datetime.now(dt.UTC)),
            section="/memories",
        )

    return [("/memories", memories), ("/memory", memory)]


def ledger_pages(ui: Ui) -> list[tuple[str, Page]]:
    """``/files``: each path's last record, compared with the file under ``--root`` when given; with
    ``?path=``, every record of that path."""

    async def files(request: Request) -> Response:
        store = ui.store
        if not store.holds("files"):
            return unheld(ui, request, "Files", "the file ledger")
        path = _param(request, "path")
        if path is not None:
            history = await store.files.list(path=path)
            drifts = None
            if history and ui.files_root is not None:
                drifts = await store.files.compare(ui.files_root, history[-1:])
            return ui.render(
                request,
                "file.html",
                title=f"File {path}",
                file_path=path,
                history=history,
                current=file_rows(history[-1:], drifts)[0] if history else None,
                root=ui.files_root,
                section="/files",
            )
        after = _param(request, "after") or ""
        records = await store.files.latest(after_path=after, limit=FILES_SHOWN)
        drifts = None if ui.files_root is None else await store.files.compare(ui.files_root, records)
        rows = file_rows(records, drifts)
        counts: dict[str, int] = {}
        for row in rows:
            if row.state is not None:
                counts[row.state] = counts.get(row.state, 0) + 1
        return ui.render(
            request,
            "files.html",
            title="Files",
            rows=rows,
            counts=counts,
            root=ui.files_root,
            after=after,
            next_after=records[-1].path if len(records) == FILES_SHOWN else None,
        )

    return [("/files", files)]


def vector_pages(ui: Ui) -> list[tuple[str, Page]]:
    """``/vectors``: the models, the sources whose vectors lag (as of the last sync: reading the
    memories' latest changes into the sources table is a write, which the viewer never makes) and,
    with ``?source=``, one source's vectors."""

    async def vectors(request: Request) -> Response:
        store = ui.store
        if not store.holds("vectors"):
            return unheld(ui, request, "Vectors", "vectors")
        source = _checked(_param(request, "source"), "source")
        models = await store.backend.vector_models()
        lagging = await store.backend.lagging_sources(limit=LAG_SHOWN)
        total = await store.vectors.count_lagging(sync=False)
        found = None if source is None else await store.vectors.by_source(source)
        return ui.render(
            request,
            "vectors.html",
            title="Vectors",
            models=models,
            lagging=lagging,
            lag_total=total,
            source=source,
            found=found,
            limit=LAG_SHOWN,
        )

    return [("/vectors", vectors)]


def knowledge_pages(ui: Ui) -> list[tuple[str, Page]]:
    """Every page of this module, with its path."""
    return [*memory_pages(ui), *ledger_pages(ui), *vector_pages(ui)]


__all__ = ["FileRow", "file_rows", "knowledge_pages", "memory_state", "unheld"]
