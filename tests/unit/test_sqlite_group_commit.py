"""The SQLite writer thread: group commit, per-operation rollback, ordering of queued jobs.

Writes queued while the writer is busy run as one transaction with one COMMIT; an operation that fails
rolls back alone (its savepoint, or its whole transaction when it ran alone), and its caller gets the
error; jobs of other kinds queued between writes run in queue order.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import message
from statekeel.backends.sqlite.backend import SqliteBackend


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'g.db'}" if request.param == "sqlite" else "memory://"
    async with statekeel.open_store(url) as s:
        yield s


async def _trace(store: statekeel.Store) -> list[str]:
    """Record every statement the writer connection runs from now on."""
    backend = store.backend
    assert isinstance(backend, SqliteBackend) and backend._writer is not None
    seen: list[str] = []
    await backend._call(backend._writer, lambda c: c.set_trace_callback(seen.append))
    return seen


async def _hold_writer(store: statekeel.Store) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Keep the writer busy inside an atomic block until the returned event is set."""
    release = asyncio.Event()
    started = asyncio.Event()

    async def hold() -> None:
        async with store.backend.atomic():
            started.set()
            await release.wait()

    task = asyncio.create_task(hold())
    await asyncio.wait_for(started.wait(), 5)
    return release, task


async def test_writes_queued_behind_a_busy_writer_share_one_commit(store: statekeel.Store) -> None:
    seen = await _trace(store)
    release, holder = await _hold_writer(store)
    writes = [
        asyncio.create_task(store.backend.append_messages(f"s{i}", 0, [message(store, str(i))], create=True))
        for i in range(20)
    ]
    await asyncio.sleep(0)  # let every task submit its job while the writer is held
    release.set()
    await holder
    records = await asyncio.wait_for(asyncio.gather(*writes), 10)
    assert [r.head_seq for r in records] == [1] * 20
    # One COMMIT for the atomic block, one for the whole group of 20 writes; no job failed, so no
    # savepoints were needed.
    assert sum(1 for s in seen if s.strip().upper() == "COMMIT") == 2
    assert not [s for s in seen if s.upper().startswith("SAVEPOINT")]
    for i in range(20):
        rows = await store.backend.read_messages(f"s{i}")
        assert [r.payload["content"] for r in rows] == [str(i)]


async def test_failing_write_in_a_group_rolls_back_alone(store: statekeel.Store) -> None:
    seen = await _trace(store)
    release, holder = await _hold_writer(store)

    def good(i: int) -> asyncio.Task[Any]:
        return asyncio.create_task(
            store.backend.append_messages(f"ok{i}", 0, [message(store, "x")], create=True)
        )

    before = [good(i) for i in range(3)]
    # Creates its session row, then fails its head check: the row must not survive.
    bad = asyncio.create_task(store.backend.append_messages("bad", 7, [message(store, "y")], create=True))
    after = [good(i) for i in range(3, 6)]
    await asyncio.sleep(0)
    release.set()
    await holder
    with pytest.raises(statekeel.ConflictError):
        await bad
    assert [r.head_seq for r in await asyncio.gather(*before, *after)] == [1] * 6
    assert await store.backend.load_session("bad") is None
    # Jobs that ran before the failure were rolled back and run again: each message is there once.
    for i in range(6):
        assert len(await store.backend.read_messages(f"ok{i}")) == 1
    assert [s for s in seen if s.upper().startswith("ROLLBACK TO")]


async def test_failing_write_alone_rolls_back_and_the_store_stays_usable(store: statekeel.Store) -> None:
    seen = await _trace(store)
    with pytest.raises(statekeel.ConflictError):
        await store.backend.append_messages("bad", 3, [message(store, "y")], create=True)
    assert "ROLLBACK" in [s.strip().upper() for s in seen]
    assert await store.backend.load_session("bad") is None
    rec = await store.backend.append_messages("bad", 0, [message(store, "z")], create=True)
    assert rec.head_seq == 1


async def test_a_read_queued_between_writes_sees_the_first_and_not_the_second() -> None:
    # In memory, reads run on the writer thread: a read taken off the queue while a group was being
    # formed must still run, and in its place in the queue.
    async with statekeel.open_store("memory://") as store:
        await store.backend.append_messages("s", 0, [message(store, "a")], create=True)
        release, holder = await _hold_writer(store)
        first = asyncio.create_task(store.backend.append_messages("s", 1, [message(store, "b")]))
        await asyncio.sleep(0)
        read = asyncio.create_task(store.backend.read_messages("s"))
        await asyncio.sleep(0)
        second = asyncio.create_task(store.backend.append_messages("s", 2, [message(store, "c")]))
        await asyncio.sleep(0)
        release.set()
        await holder
        rows = await asyncio.wait_for(read, 10)
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert [r.payload["content"] for r in rows] == ["a", "b"]
        assert [r.payload["content"] for r in await store.backend.read_messages("s")] == ["a", "b", "c"]


async def test_a_closed_connection_fails_the_write_with_a_typed_error(tmp_path: Path) -> None:
    async with statekeel.open_store(f"sqlite:///{tmp_path / 'c.db'}") as store:
        backend = store.backend
        assert isinstance(backend, SqliteBackend) and backend._writer is not None

        def close(conn: sqlite3.Connection) -> None:
            conn.close()

        await backend._call(backend._writer, close)
        with pytest.raises(statekeel.BackendUnavailable):
            await backend.append_messages("s", 0, [message(store, "a")], create=True)
        # The dead connection was dropped; the next write reconnects.
        rec = await backend.append_messages("s", 0, [message(store, "a")], create=True)
        assert rec.head_seq == 1


async def _disk_full_after(store: statekeel.Store, pages: int) -> None:
    """Let the writer's database grow by at most ``pages`` more pages: SQLite then fails with "database
    or disk is full", an error that rolls back the whole transaction, not only the statement."""
    backend = store.backend
    assert isinstance(backend, SqliteBackend) and backend._writer is not None

    def limit(conn: sqlite3.Connection) -> None:
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {count + pages}")

    await backend._call(backend._writer, limit)


async def test_an_error_that_rolls_back_the_whole_atomic_block_fails_it_with_that_error(
    store: statekeel.Store,
) -> None:
    b = store.backend
    await _disk_full_after(store, 4)
    async with asyncio.timeout(10):  # every call settles: nothing waits forever
        with pytest.raises(statekeel.BackendUnavailable, match="full"):
            async with b.atomic():
                await b.append_messages("small", 0, [message(store, "x")], create=True)
                with pytest.raises(statekeel.BackendUnavailable, match="full"):
                    await b.append_messages("big", 0, [message(store, "y" * 200_000)], create=True)
                # The transaction is gone: a later write must not run (and commit) outside it.
                with pytest.raises(statekeel.BackendUnavailable, match="full"):
                    await b.append_messages("after", 0, [message(store, "z")], create=True)
        await _disk_full_after(store, 10_000)
        for key in ("small", "big", "after"):
            assert await b.load_session(key) is None
        assert (await b.append_messages("after", 0, [message(store, "z")], create=True)).head_seq == 1


async def test_an_error_that_rolls_back_a_whole_group_fails_each_write_with_that_error(
    store: statekeel.Store,
) -> None:
    b = store.backend
    await _disk_full_after(store, 4)
    release, holder = await _hold_writer(store)
    writes = [
        asyncio.create_task(b.append_messages(f"s{i}", 0, [message(store, "x" * (i * 100_000))], create=True))
        for i in range(4)
    ]
    await asyncio.sleep(0)
    release.set()
    await holder
    async with asyncio.timeout(10):
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
    assert all(isinstance(o, statekeel.BackendUnavailable) and "full" in str(o) for o in outcomes), outcomes
    await _disk_full_after(store, 10_000)
    assert (await b.append_messages("s0", 0, [message(store, "x")], create=True)).head_seq == 1
