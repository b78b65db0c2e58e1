"""The stores under test, each behind the same small async interface.

Every adapter writes one turn (four messages) per ``append_turn`` call (one save) and reads a whole session
back with ``load``. Each is driven through its own public API:

- ``statekeel``: ``store.sessions.get_or_create`` / ``Session.add_message`` / ``sessions.save`` / ``load``.
- ``baseline``: the physical limit — stdlib ``sqlite3``, WAL, one transaction per append with
  ``executemany`` of orjson-encoded rows, no thread hop, no session row.
- ``original``: the design statekeel replaces, emulated — the whole session JSON (stdlib ``json``)
  rewritten with ``INSERT OR REPLACE`` on each save, through aiosqlite with its default settings.
- ``openai-agents``: ``agents.memory.SQLiteSession.add_items`` / ``get_items``.
- ``langgraph``: ``AsyncSqliteSaver.aput`` of one checkpoint per turn holding the message list.

The peers run with their own defaults, which are WAL (or a rollback journal) with ``synchronous=FULL``:
the durability of ``statekeel-full``, not of statekeel's default.
"""

from __future__ import annotations

import abc
import json
import os
import sqlite3
import time
from typing import Any

import orjson


class Adapter(abc.ABC):
    """One store: open it in a directory, append turns to sessions, load sessions back."""

    name: str
    durability: str  # what the store's commits guarantee here: "normal" (WAL, no fsync) or "full"

    @abc.abstractmethod
    async def open(self, directory: str) -> None: ...

    @abc.abstractmethod
    async def start(self, key: str) -> Any:
        """A handle for session ``key`` (created on the first append)."""

    @abc.abstractmethod
    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        """Persist one turn's messages: one save, committed when this returns."""

    @abc.abstractmethod
    async def load(self, key: str) -> list[Any]:
        """Every message of session ``key``, in order, decoded."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    def db_bytes(self, directory: str) -> int:
        """Bytes on disk of everything the store wrote in ``directory`` (database, WAL)."""
        total = 0
        for entry in os.scandir(directory):
            if entry.is_file():
                total += entry.stat().st_size
        return total


class StatekeelSessions(Adapter):
    """Turns through the public session API; subclasses open ``self.store`` on their backend."""

    store: Any = None

    async def start(self, key: str) -> Any:
        return await self.store.sessions.get_or_create(key)

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            fields = {k: v for k, v in m.items() if k not in ("role", "content")}
            handle.add_message(m["role"], m["content"], **fields)
        await self.store.sessions.save(handle)

    async def load(self, key: str) -> list[Any]:
        session = await self.store.sessions.load(key)
        assert session is not None
        return list(session.messages)


class Statekeel(StatekeelSessions):
    def __init__(self, durability: str = "normal") -> None:
        self.durability = durability
        self.name = "statekeel" if durability == "normal" else "statekeel-full"
        self.store: Any = None

    async def open(self, directory: str) -> None:
        import statekeel

        self.store = await statekeel.open_store(
            f"sqlite:///{os.path.join(directory, 'statekeel.db')}", durability=self.durability
        )

    async def close(self) -> None:
        await self.store.close()


class Baseline(Adapter):
    """Plain sqlite3: what the hardware and SQLite can do, with nothing on top."""

    def __init__(self, durability: str = "normal") -> None:
        self.durability = durability
        self.name = "sqlite3" if durability == "normal" else "sqlite3-full"
        self.conn: sqlite3.Connection | None = None

    async def open(self, directory: str) -> None:
        conn = sqlite3.connect(os.path.join(directory, "baseline.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = " + ("FULL" if self.durability == "full" else "NORMAL"))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS messages (session_key TEXT NOT NULL, seq INTEGER NOT NULL, "
            "role TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL, "
            "PRIMARY KEY (session_key, seq)) WITHOUT ROWID"
        )
        self.conn = conn

    async def start(self, key: str) -> Any:
        return [key, 0]

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        assert self.conn is not None
        key, head = handle
        now = time.time_ns() // 1000
        rows = [(key, head + i, m["role"], orjson.dumps(m).decode(), now) for i, m in enumerate(messages)]
        self.conn.execute("BEGIN")
        self.conn.executemany(
            "INSERT INTO messages (session_key, seq, role, payload, created_at) VALUES (?, ?, ?, ?, ?)", rows
        )
        self.conn.execute("COMMIT")
        handle[1] = head + len(messages)

    async def load(self, key: str) -> list[Any]:
        assert self.conn is not None
        rows = self.conn.execute(
            "SELECT payload FROM messages WHERE session_key = ? ORDER BY seq", (key,)
        ).fetchall()
        return [orjson.loads(r[0]) for r in rows]

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Original(Adapter):
    """The original design, emulated: every save rewrites the whole session as one JSON document.

    As that design ran it: stdlib ``json`` and aiosqlite's defaults (rollback journal, synchronous=FULL).
    """

    name = "original-design"
    durability = "full"

    def __init__(self) -> None:
        self.conn: Any = None

    async def open(self, directory: str) -> None:
        import aiosqlite

        self.conn = await aiosqlite.connect(os.path.join(directory, "original.db"))
        await self.conn.execute(
            "CREATE TABLE IF NOT EXISTS sessions (key TEXT PRIMARY KEY, data TEXT NOT NULL)"
        )
        await self.conn.commit()

    async def start(self, key: str) -> Any:
        return {"key": key, "messages": [], "metadata": {}}

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        handle["messages"].extend(messages)
        await self.conn.execute(
            "INSERT OR REPLACE INTO sessions (key, data) VALUES (?, ?)",
            (handle["key"], json.dumps(handle)),
        )
        await self.conn.commit()

    async def load(self, key: str) -> list[Any]:
        async with self.conn.execute("SELECT data FROM sessions WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        assert row is not None
        return list(json.loads(row[0])["messages"])

    async def close(self) -> None:
        await self.conn.close()


class OpenAIAgents(Adapter):
    """openai-agents' ``SQLiteSession``: its defaults (WAL, synchronous=FULL, one thread hop per call)."""

    name = "openai-agents"
    durability = "full"

    def __init__(self) -> None:
        self.path = ""
        self.sessions: dict[str, Any] = {}

    async def open(self, directory: str) -> None:
        self.path = os.path.join(directory, "openai_agents.db")
        self.sessions = {}

    def _session(self, key: str) -> Any:
        from agents.memory import SQLiteSession

        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = SQLiteSession(key, self.path)
        return session

    async def start(self, key: str) -> Any:
        return self._session(key)

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        await handle.add_items(messages)

    async def load(self, key: str) -> list[Any]:
        items: list[Any] = await self._session(key).get_items()
        return items

    async def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.sessions = {}


class LangGraph(Adapter):
    """langgraph's ``AsyncSqliteSaver``: one checkpoint per turn whose state is the message list."""

    name = "langgraph"
    durability = "full"

    def __init__(self) -> None:
        self.saver: Any = None
        self._cm: Any = None

    async def open(self, directory: str) -> None:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        self._cm = AsyncSqliteSaver.from_conn_string(os.path.join(directory, "langgraph.db"))
        self.saver = await self._cm.__aenter__()
        await self.saver.setup()

    async def start(self, key: str) -> Any:
        return {
            "config": {"configurable": {"thread_id": key, "checkpoint_ns": ""}},
            "messages": [],
            "step": 0,
        }

    async def append_turn(self, handle: Any, messages: list[dict[str, Any]]) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        handle["messages"] = [*handle["messages"], *messages]
        handle["step"] += 1
        step = handle["step"]
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": handle["messages"]}
        checkpoint["channel_versions"] = {"messages": step}
        handle["config"] = await self.saver.aput(
            handle["config"], checkpoint, {"source": "loop", "step": step, "parents": {}}, {"messages": step}
        )

    async def load(self, key: str) -> list[Any]:
        found = await self.saver.aget_tuple({"configurable": {"thread_id": key, "checkpoint_ns": ""}})
        assert found is not None
        return list(found.checkpoint["channel_values"]["messages"])

    async def close(self) -> None:
        await self._cm.__aexit__(None, None, None)


_PEER_MODULES = {
    "original-design": "aiosqlite",
    "openai-agents": "agents.memory",
    "langgraph": "langgraph.checkpoint.sqlite.aio",
}


def all_adapters(*, peers: bool = True) -> tuple[list[Adapter], dict[str, str]]:
    """The stores to run, and the peers left out with the reason (not installed: ``pip install -e
    '.[bench]'``)."""
    import importlib

    out: list[Adapter] = [Statekeel("normal"), Baseline("normal"), Statekeel("full"), Baseline("full")]
    missing: dict[str, str] = {}
    if peers:
        for adapter in (Original(), OpenAIAgents(), LangGraph()):
            try:
                importlib.import_module(_PEER_MODULES[adapter.name])
            except ImportError as exc:
                missing[adapter.name] = f"cannot import {_PEER_MODULES[adapter.name]}: {exc}"
                continue
            out.append(adapter)
    return out, missing
