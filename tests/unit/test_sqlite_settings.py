"""The SQLite backend's connection settings: WAL, foreign keys, busy_timeout, synchronous."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import statekeel
from statekeel.backends.sqlite.backend import SqliteBackend


async def pragma(store: statekeel.Store, name: str) -> Any:
    backend = store.backend
    assert isinstance(backend, SqliteBackend) and backend._writer is not None
    return await backend._call(backend._writer, lambda c: c.execute(f"PRAGMA {name}").fetchone()[0])


async def test_file_store_uses_wal_foreign_keys_and_default_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        assert await pragma(store, "journal_mode") == "wal"
        assert await pragma(store, "foreign_keys") == 1
        assert await pragma(store, "busy_timeout") == 5000
        assert await pragma(store, "synchronous") == 1  # NORMAL
    # WAL is recorded in the file itself, for every later connection.
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


@pytest.mark.parametrize(("durability", "level"), [("normal", 1), ("full", 2)])
async def test_durability_sets_synchronous(tmp_path: Path, durability: str, level: int) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path}/s.db", durability=durability) as store:
        assert await pragma(store, "synchronous") == level


async def test_memory_store_is_sqlite_in_memory_with_foreign_keys() -> None:
    async with statekeel.open_store("memory://") as store:
        assert await pragma(store, "journal_mode") == "memory"
        assert await pragma(store, "foreign_keys") == 1


async def test_write_blocked_past_busy_timeout_is_backend_unavailable_and_store_recovers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with statekeel.open_store(f"sqlite:///{path}", busy_timeout_ms=50) as store:
        await store.backend.create_session("a")
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
        try:
            with pytest.raises(statekeel.BackendUnavailable) as info:
                await store.backend.create_session("b")
            assert "locked" in str(info.value)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await store.backend.load_session("b") is None
        await store.backend.create_session("b")
        assert await store.backend.load_session("b") is not None


async def test_write_waits_for_a_lock_released_within_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        # Holding the lock for a moment is the scenario itself, well inside the 5 s busy_timeout.
        release = threading.Timer(0.3, lambda: (blocker.execute("COMMIT"), blocker.close()))
        release.start()
        try:
            await store.backend.create_session("waited")
        finally:
            release.join()
        assert await store.backend.load_session("waited") is not None
