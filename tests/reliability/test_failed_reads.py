"""Invariant 7: a failed load is an error, never "not found"; after a dead connection the SQLite backend
reconnects by itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import statekeel
from helpers import sqlite_url
from statekeel.backends.sqlite.backend import SqliteBackend


async def write_session(path: Path, key: str = "agent", n: int = 6, size: int = 10) -> None:
    async with statekeel.open_store(sqlite_url(path)) as store:
        session = await store.sessions.get_or_create(key)
        for i in range(n):
            session.add_message("user", f"m{i} " + "x" * size)
        await store.sessions.save(session)


async def test_load_on_a_dead_connection_raises_then_reconnects(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await write_session(path)
    async with statekeel.open_store(sqlite_url(path)) as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        assert await backend.load_session("warm-up") is None  # the reader connects lazily
        reader = backend._reader
        assert reader is not None and reader._conn is not None
        reader._conn.close()  # the connection dies under the running store
        with pytest.raises(statekeel.BackendUnavailable):
            await store.sessions.load("agent")
        # The next read reconnects and sees everything.
        session = await store.sessions.load("agent")
        assert session is not None
        assert [m["content"][:2] for m in session.messages] == ["m0", "m1", "m2", "m3", "m4", "m5"]
        assert reader._conn is not None


async def test_write_on_a_dead_connection_raises_then_reconnects(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await write_session(path, n=1)
    async with statekeel.open_store(sqlite_url(path)) as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend)
        writer = backend._writer
        assert writer is not None and writer._conn is not None
        session = await store.sessions.load("agent")
        assert session is not None
        writer._conn.close()
        with pytest.raises(statekeel.StatekeelError):
            await backend.append_messages("agent", 1, [])
        session.add_message("user", "after reconnect")
        await store.sessions.save(session)
        rows = await backend.read_messages("agent")
        assert [r.payload["content"] for r in rows][1:] == ["after reconnect"]


async def test_load_of_a_session_whose_table_vanished_is_storage_corrupt_not_none(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await write_session(path)
    async with statekeel.open_store(sqlite_url(path)) as store:
        other = sqlite3.connect(path)
        other.execute("DROP TABLE messages")
        other.commit()
        other.close()
        with pytest.raises(statekeel.StorageCorrupt):
            await store.sessions.load("agent")


async def test_load_of_an_undecodable_message_raises_not_none(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await write_session(path)
    other = sqlite3.connect(path)
    other.execute("UPDATE messages SET payload = '{not json' WHERE seq = 3")
    other.commit()
    other.close()
    async with statekeel.open_store(sqlite_url(path)) as store:
        with pytest.raises(statekeel.SerializationError):
            await store.sessions.load("agent")
        with pytest.raises(statekeel.SerializationError):
            await store.sessions.get_or_create("agent")  # never a fresh, empty session over the history
        assert (await store.backend.load_session("agent")) is not None


async def test_load_from_damaged_pages_raises_storage_corrupt_not_none(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await write_session(path, n=300, size=1500)  # the messages fill pages after every table's root page
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    last_root = conn.execute("SELECT max(rootpage) FROM sqlite_master").fetchone()[0]
    page_count = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    assert page_count > last_root + 20
    with open(path, "r+b") as fh:
        fh.seek(last_root * page_size)  # pages are numbered from 1: this is page last_root + 1
        fh.write(b"\xa5" * (page_size * (page_count - last_root)))
    with pytest.raises(statekeel.StorageCorrupt):
        async with statekeel.open_store(sqlite_url(path)) as store:
            await store.sessions.load("agent")
