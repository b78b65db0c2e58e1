"""Inline writes (durability "normal"): a write that finds the writer idle runs on the caller's thread.

What users depend on: the event loop is never blocked waiting for another process's write lock (such a
write goes to the writer thread, which waits for it), the WAL stays bounded because the writer thread
checkpoints, and at durability "full" every write still goes through the thread (group commit).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path

import statekeel
from helpers import message
from statekeel.backends.sqlite.backend import SqliteBackend


async def test_a_write_blocked_by_another_process_lock_does_not_block_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with statekeel.open_store(f"sqlite:///{path}", busy_timeout_ms=10_000) as store:
        await store.backend.append_messages("s", 0, [message(store, "a")], create=True)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds SQLite's write lock
        try:
            started = time.monotonic()
            write = asyncio.create_task(store.backend.append_messages("s", 1, [message(store, "b")]))
            for _ in range(50):
                await asyncio.sleep(0)  # the loop keeps turning while the write waits
            assert time.monotonic() - started < 2.0
            assert not write.done()
        finally:
            other.execute("COMMIT")
            other.close()
        record = await asyncio.wait_for(write, 10)
        assert record.head_seq == 2
        assert [m.payload["content"] for m in await store.backend.read_messages("s")] == ["a", "b"]


async def test_inline_writes_keep_the_wal_bounded(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    payload = "x" * 3000
    async with statekeel.open_store(f"sqlite:///{path}") as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend) and backend.inline_writes
        for i in range(1500):
            await backend.append_messages("s", i, [message(store, payload)], create=i == 0)
        await backend.load_session("s")  # a read after the last checkpoint job was queued
        wal = (await asyncio.to_thread(os.stat, f"{path}-wal")).st_size
        # Measured here: ~46 MB of WAL for these 1,500 commits without checkpoints, ~6 MB with them.
        assert wal < 16 * 1024 * 1024, wal
        assert len(await backend.read_messages("s")) == 1500


async def test_durability_full_sends_every_write_through_the_writer_thread(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'f.db'}", durability="full") as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend) and not backend.inline_writes
        assert backend._writer is not None
        threads: list[str] = []

        def note(_stmt: str) -> None:
            threads.append(threading.current_thread().name)

        await backend._call(backend._writer, lambda c: c.set_trace_callback(note))
        await backend.append_messages("s", 0, [message(store, "a")], create=True)
        assert threads and set(threads) == {"statekeel-sqlite-writer"}


async def test_at_normal_an_idle_writer_runs_the_write_on_the_callers_thread(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'n.db'}") as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend) and backend._writer is not None
        threads: list[str] = []
        await backend._call(
            backend._writer,
            lambda c: c.set_trace_callback(lambda _s: threads.append(threading.current_thread().name)),
        )
        # The thread marks itself idle just after settling the job above: wait for that (bounded).
        deadline = time.monotonic() + 5
        while not backend._writer._idle and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        await backend.append_messages("s", 0, [message(store, "a")], create=True)
        assert threads and set(threads) == {threading.current_thread().name}
        assert [m.seq for m in await backend.read_messages("s")] == [0]


async def test_writes_issued_in_one_event_loop_turn_share_one_commit(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'g.db'}") as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend) and backend._writer is not None
        statements: list[str] = []
        await backend._call(backend._writer, lambda c: c.set_trace_callback(statements.append))
        records = await asyncio.gather(
            *(backend.append_messages(f"s{i}", 0, [message(store, str(i))], create=True) for i in range(20))
        )
        assert [r.head_seq for r in records] == [1] * 20
        assert sum(1 for s in statements if s.strip().upper() == "COMMIT") == 1
        for i in range(20):
            assert [m.payload["content"] for m in await backend.read_messages(f"s{i}")] == [str(i)]


async def test_a_failing_write_in_a_loop_turn_group_rolls_back_alone(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'g.db'}") as store:
        backend = store.backend
        await backend.append_messages("taken", 0, [message(store, "first")], create=True)
        results = await asyncio.gather(
            backend.append_messages("a", 0, [message(store, "a")], create=True),
            backend.append_messages("taken", 0, [message(store, "stale head")]),  # conflicts
            backend.append_messages("b", 0, [message(store, "b")], create=True),
            return_exceptions=True,
        )
        assert isinstance(results[1], statekeel.ConflictError)
        assert [type(r).__name__ for r in (results[0], results[2])] == ["SessionRecord", "SessionRecord"]
        assert [m.payload["content"] for m in await backend.read_messages("taken")] == ["first"]
        assert len(await backend.read_messages("a")) == len(await backend.read_messages("b")) == 1


async def test_a_write_cancelled_before_its_turn_ends_is_not_written(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'c.db'}") as store:
        backend = store.backend
        task = asyncio.create_task(backend.append_messages("s", 0, [message(store, "never")], create=True))
        await asyncio.sleep(0)  # the task queues its write for the end of this turn
        task.cancel()
        done = asyncio.create_task(backend.append_messages("other", 0, [message(store, "x")], create=True))
        await done
        assert task.cancelled()
        assert await backend.load_session("s") is None


async def test_close_writes_what_was_accepted_before_it(tmp_path: Path) -> None:
    path = tmp_path / "close.db"
    store = await statekeel.open_store(f"sqlite:///{path}")
    write = asyncio.create_task(store.backend.append_messages("s", 0, [message(store, "kept")], create=True))
    await asyncio.sleep(0)  # the write is waiting for the end of the turn
    await store.close()
    assert (await write).head_seq == 1
    async with statekeel.open_store(f"sqlite:///{path}") as again:
        assert [m.payload["content"] for m in await again.backend.read_messages("s")] == ["kept"]
