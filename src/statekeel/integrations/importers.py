"""Importing what other frameworks' own stores hold: ``statekeel import --from SOURCE PATH``.

- ``openai-agents-sqlite``: the database of the OpenAI Agents SDK's ``SQLiteSession`` (its
  ``agent_sessions`` and ``agent_messages`` tables). Each SDK session becomes the statekeel session of
  the same key — what ``StatekeelSession(session_id, url)`` reads — with its items unchanged and in order.
- ``langgraph-sqlite``: the database of LangGraph's ``SqliteSaver`` (its ``checkpoints`` and ``writes``
  tables). Every checkpoint, with its parent, metadata, channel values and pending writes, is stored
  through :class:`~statekeel.integrations.langgraph.StatekeelSaver`.

The source is opened read-only and checked whole before anything is written: a file that is not a
database of that shape, or an item statekeel cannot store, raises
:class:`~statekeel.errors.InvalidImportSource` and writes nothing. An import may be run again, also after a
session went on in statekeel (or recovery answered a call left waiting): per session, the items the store
holds are skipped and those new in the source are added after them; a session whose history in the store
diverged from the source's is left as it is and reported as a conflict (``SourceImportReport.sessions``),
while the others are imported. The items are checked against the source afterwards.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.sql import load_queries
from ..errors import (
    ConflictError,
    InvalidArgument,
    InvalidImportSource,
    InvalidKey,
    SerializationError,
)
from ..store import Store
from ..transcripts import normalize_item
from ..validation import check_key

SOURCES = ("openai-agents-sqlite", "langgraph-sqlite")
Progress = Callable[[int, int], None]  # (done, total)

_QUERIES = load_queries("statekeel.integrations")
_AGENTS_TABLES = {"agent_sessions": {"session_id"}, "agent_messages": {"id", "session_id", "message_data"}}
_LANGGRAPH_TABLES = {
    "checkpoints": {
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
        "parent_checkpoint_id",
        "type",
        "checkpoint",
        "metadata",
    },
    "writes": {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "type", "value"},
}


@dataclass(frozen=True, slots=True)
class SourceImportReport:
    """What an import did. ``units`` are sessions (Agents SDK) or threads (LangGraph); ``records`` items or
    checkpoints; ``added`` the records written by this run, ``skipped`` those the store held already;
    ``writes`` the pending writes of LangGraph checkpoints stored (new or already there)."""

    source: str
    path: str
    units: int
    records: int
    added: int
    skipped: int
    writes: int = 0
    # Agents SDK: what the import did with each session, in key order.
    sessions: tuple[SessionImport, ...] = ()

    @property
    def conflicts(self) -> list[SessionImport]:
        """The sessions left as they were because the store's history and the source's diverged."""
        return [s for s in self.sessions if s.outcome == "conflict"]


@dataclass(frozen=True, slots=True)
class SessionImport:
    """What an import did with one SDK session: ``outcome`` ``"imported"`` (``added`` items new in the
    source, after those the store held), ``"skipped"`` (the store holds every item of the source: as it
    was, or continued since in statekeel) or ``"conflict"`` (the two histories diverged: nothing written
    to it; ``reason`` says where)."""

    key: str
    outcome: str
    added: int
    held: int
    reason: str = ""


def _noop(done: int, total: int) -> None:
    return None


def _read(
    path: str | Path, source: str, tables: dict[str, set[str]], queries: Iterable[tuple[str, tuple[Any, ...]]]
) -> list[list[Any]]:
    """Run ``queries`` on the SQLite database at ``path``, opened read-only, after checking its tables."""
    file = Path(path)
    if not file.is_file():
        raise InvalidImportSource(f"{source}: {file} is not a file", path=str(file))
    try:
        conn = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise InvalidImportSource(f"{source}: cannot open {file} read-only: {exc}", path=str(file)) from None
    try:
        found = {row[0] for row in conn.execute(_QUERIES["source_tables"])}
        for table, columns in tables.items():
            if table not in found:
                raise InvalidImportSource(
                    f"{source}: {file} has no {table!r} table, so it is not the database of that store "
                    f"(tables: {', '.join(sorted(found)) or 'none'})",
                    path=str(file),
                )
            have = {row[0] for row in conn.execute(_QUERIES["source_columns"], (table,))}
            missing = columns - have
            if missing:
                raise InvalidImportSource(
                    f"{source}: table {table!r} of {file} lacks the columns {', '.join(sorted(missing))}",
                    path=str(file),
                )
        results = []
        for name, args in queries:
            if name == "langgraph_writes":
                have = {row[0] for row in conn.execute(_QUERIES["source_columns"], ("writes",))}
                if "task_path" not in have:
                    name = "langgraph_writes_without_path"
            results.append(conn.execute(_QUERIES[name], args).fetchall())
        return results
    except sqlite3.DatabaseError as exc:
        raise InvalidImportSource(
            f"{source}: {file} is not a SQLite database ({exc})", path=str(file)
        ) from None
    finally:
        conn.close()


# --- the OpenAI Agents SDK's SQLiteSession ---------------------------------------------------------------


def _agents_source(path: str | Path, session_id: str | None) -> list[tuple[str, list[dict[str, Any]]]]:
    source = "openai-agents-sqlite"
    (ids,) = _read(path, source, _AGENTS_TABLES, [("agents_session_ids", ())])
    wanted = [row[0] for row in ids]
    if session_id is not None:
        if session_id not in wanted:
            raise InvalidImportSource(f"{source}: {path} holds no items of session {session_id!r}")
        wanted = [session_id]
    found = []
    for sid in wanted:
        try:
            key = check_key(sid, "session_id")
        except InvalidKey as exc:
            raise InvalidImportSource(f"{source}: {exc.message}", session_id=sid) from None
        (rows,) = _read(path, source, _AGENTS_TABLES, [("agents_items", (sid,))])
        items = []
        for n, (data,) in enumerate(rows):
            try:
                item = json.loads(data)
            except (TypeError, ValueError):
                continue  # SQLiteSession skips an item it cannot decode, and so does the import
            try:
                items.append(normalize_item(item))
            except InvalidArgument as exc:
                raise InvalidImportSource(
                    f"{source}: item {n} of session {sid!r} cannot be stored: {exc.message}", session_id=sid
                ) from None
        found.append((key, items))
    return found


async def import_openai_agents_sqlite(
    store: Store, path: str | Path, *, session_id: str | None = None, progress: Progress | None = None
) -> SourceImportReport:
    """Copy the sessions of a ``SQLiteSession`` database (only ``session_id`` when given) into ``store``;
    see the module docstring. ``progress(done, total)`` is called after each session."""
    tick = progress or _noop
    sessions = await asyncio.to_thread(_agents_source, path, session_id)
    plans = []
    for key, items in sessions:  # every session checked before any is written
        for i, item in enumerate(items):
            try:
                store.codec.encode(item, where=f"item {i} of session {key!r}")
            except SerializationError as exc:
                raise InvalidImportSource(exc.message, session_id=key) from None
        # The whole history (compressed items too): a session cleared or compressed in statekeel since
        # still starts with what was imported.
        stored = await store.sessions.load(key, include_archived=True, repair=False)
        have = [] if stored is None else stored.messages
        plans.append((key, items, have))
    outcomes: list[SessionImport] = []
    added = skipped = 0
    tick(0, len(plans))
    for n, (key, items, have) in enumerate(plans, 1):
        outcome = _compare(key, items, have)
        if outcome.outcome == "imported":
            async with store.sessions.open(key, repair=False) as session:
                if session.head_seq != len(have):
                    outcome = SessionImport(key, "conflict", 0, len(have), "it changed while it was imported")
                else:
                    for item in items[len(have) :]:
                        session.add_item(item, strict=False)
                    await store.sessions.save(session)
        if outcome.outcome != "conflict":
            skipped += outcome.held
            added += outcome.added
        outcomes.append(outcome)
        tick(n, len(plans))
    for outcome, (key, items, _) in zip(outcomes, plans, strict=True):  # checked against the source
        if outcome.outcome == "conflict":
            continue
        loaded = await store.sessions.load(key, include_archived=True, repair=False)
        if loaded is None or loaded.messages[: len(items)] != items:
            raise ConflictError(
                f"session {key!r} does not hold what the source has after the import", key=key, hint=""
            )
    total = sum(len(items) for _, items, _ in plans)
    return SourceImportReport(
        "openai-agents-sqlite", str(path), len(plans), total, added, skipped, sessions=tuple(outcomes)
    )


def _compare(key: str, items: list[Any], have: list[dict[str, Any]]) -> SessionImport:
    """What to do with one session: the store's history ``have`` against the source's ``items``."""
    common = 0
    for mine, theirs in zip(have, items, strict=False):
        if mine != theirs:
            break
        common += 1
    if common == len(have):
        new = len(items) - common
        return SessionImport(key, "imported" if new else "skipped", new, common)
    if common == len(items):
        return SessionImport(key, "skipped", 0, common)  # the store went on after the source's last item
    return SessionImport(
        key,
        "conflict",
        0,
        common,
        f"diverged at item {common}: the store and the source each hold {common} item(s) in common, then "
        f"the store {len(have) - common} and the source {len(items) - common} other item(s); nothing was "
        "written to it (import it into another store, or delete the session there first)",
    )


# --- LangGraph's SqliteSaver ----------------------------------------------------------------------------


async def import_langgraph_sqlite(
    store: Store, path: str | Path, *, serde: Any = None, progress: Progress | None = None
) -> SourceImportReport:
    """Copy every checkpoint (and its pending writes) of a ``SqliteSaver`` database into ``store``; see
    the module docstring. ``serde`` is the serializer the source was written with (LangGraph's default
    when None). ``progress(done, total)`` is called after each checkpoint."""
    from .langgraph import StatekeelSaver  # LangGraph is needed for this source only

    source = "langgraph-sqlite"
    tick = progress or _noop
    checkpoints, writes = await asyncio.to_thread(
        _read, path, source, _LANGGRAPH_TABLES, [("langgraph_checkpoints", ()), ("langgraph_writes", ())]
    )
    saver = StatekeelSaver(store, serde=serde)
    decoded = []
    try:  # everything decoded before anything is written
        for thread_id, ns, cid, parent, kind, blob, meta in checkpoints:
            checkpoint = saver.serde.loads_typed((kind, blob))
            metadata = json.loads(meta) if meta is not None else {}
            decoded.append((thread_id, ns, cid, parent, checkpoint, metadata))
        pending: dict[tuple[str, str, str, str, str], list[tuple[str, Any]]] = {}
        for thread_id, ns, cid, task_id, task_path, _idx, channel, kind, value in writes:
            key = (thread_id, ns, cid, task_id, task_path)
            pending.setdefault(key, []).append((channel, saver.serde.loads_typed((kind, value))))
    except Exception as exc:
        raise InvalidImportSource(f"{source}: {path} holds a value that does not decode: {exc}") from exc
    added = skipped = 0
    tick(0, len(decoded))
    for n, (thread_id, ns, cid, parent, checkpoint, metadata) in enumerate(decoded, 1):
        if await store.backend.get_checkpoint(thread_id, ns, cid) is not None:
            skipped += 1
        else:
            conf = {"thread_id": thread_id, "checkpoint_ns": ns}
            if parent is not None:
                conf["checkpoint_id"] = parent
            versions = dict(checkpoint.get("channel_versions", {}))
            await saver.aput({"configurable": conf}, checkpoint, metadata, versions)  # type: ignore[arg-type]
            added += 1
        tick(n, len(decoded))
    for (thread_id, ns, cid, task_id, task_path), items in pending.items():
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}
        await saver.aput_writes(config, items, task_id, task_path)  # keeps what is there already
    for thread_id, ns, cid, *_ in decoded:  # the counts, checked against the source
        if await store.backend.get_checkpoint(thread_id, ns, cid) is None:
            raise ConflictError(f"checkpoint {cid!r} of thread {thread_id!r} is missing after the import")
    threads = len({row[0] for row in decoded})
    return SourceImportReport(source, str(path), threads, len(decoded), added, skipped, len(writes))


async def import_from(
    store: Store,
    source: str,
    path: str | Path,
    *,
    session_id: str | None = None,
    progress: Progress | None = None,
) -> SourceImportReport:
    """Import ``path`` written by ``source`` (one of :data:`SOURCES`) into ``store``."""
    if source == "openai-agents-sqlite":
        return await import_openai_agents_sqlite(store, path, session_id=session_id, progress=progress)
    if session_id is not None:
        raise InvalidImportSource(f"--session applies to openai-agents-sqlite, not to {source!r}")
    if source == "langgraph-sqlite":
        return await import_langgraph_sqlite(store, path, progress=progress)
    raise InvalidImportSource(f"unknown import source {source!r}; use one of {', '.join(SOURCES)}")


__all__ = [
    "SOURCES",
    "SourceImportReport",
    "import_from",
    "import_langgraph_sqlite",
    "import_openai_agents_sqlite",
]
