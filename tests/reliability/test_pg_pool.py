"""The PostgreSQL pool: parallel calls, PgBouncer mode, and recovery from connections the server killed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg
import pytest

import statekeel
from helpers import message
from statekeel.backends.base import SessionRecord
from statekeel.backends.postgres.backend import PostgresBackend

pytestmark = pytest.mark.postgres

T = TypeVar("T")


def _pg(store: statekeel.Store) -> PostgresBackend:
    assert isinstance(store.backend, PostgresBackend)
    return store.backend


async def _wait_for(condition: Any, *, deadline_s: float = 10.0) -> None:
    """Poll an async condition until it holds, failing the test past the deadline."""
    end = time.monotonic() + deadline_s
    while not await condition():
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {deadline_s}s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _blocked_on_row_lock(
    db_url: str, key: str, write: Callable[[], Coroutine[Any, Any, T]]
) -> AsyncIterator[tuple[asyncio.Task[T], asyncpg.transaction.Transaction]]:
    """Start ``write()`` while another connection holds session ``key``'s row lock; yield once it waits for
    that lock: the write's task, and the holder's transaction (roll it back to release the lock)."""
    other = await asyncpg.connect(db_url)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM sessions WHERE key = $1 FOR UPDATE", key)
        blocked = asyncio.create_task(write())

        async def waiting_on_lock() -> bool:
            n = await other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            return bool(n)

        await _wait_for(waiting_on_lock)
        yield blocked, tx
    finally:
        await other.close()


async def _terminate_all(db_url: str) -> int:
    """End every server connection to the test database but this admin one (waiting until they are gone)."""
    admin = await asyncpg.connect(db_url.rsplit("/", 1)[0] + "/postgres")
    try:
        db = db_url.rsplit("/", 1)[1].split("?")[0]
        rows = await admin.fetch(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            db,
        )
        return len(rows)
    finally:
        await admin.close()


@pytest.fixture
async def pg_store(pg_migrated: str) -> AsyncIterator[statekeel.Store]:
    store = await statekeel.open_store(pg_migrated + "?pool_min_size=3&pool_max_size=4")
    try:
        yield store
    finally:
        await store.close()


async def test_pool_sizes_come_from_the_url(pg_store: statekeel.Store) -> None:
    pool = _pg(pg_store).pool
    assert (pool.get_min_size(), pool.get_max_size()) == (3, 4)


async def _prepared_statements(store: statekeel.Store) -> int:
    async with _pg(store).pool.acquire() as conn:
        return int(await conn.fetchval("SELECT count(*) FROM pg_prepared_statements"))


async def _round_trip(store: statekeel.Store) -> None:
    b = store.backend
    await b.create_session("rt", metadata=store.codec.encode({"a": 1}))
    await b.append_messages("rt", 0, [message(store, "one"), message(store, "two"), message(store, "three")])
    rec = await b.update_session("rt", expected_version=2, metadata=store.codec.encode({"a": 2}))
    assert rec.metadata == {"a": 2}
    await b.archive_messages("rt", compression_id="c1", upto_seq=2, summary="s", expected_consolidated=0)
    loaded = await b.load_session_with_messages("rt")
    assert loaded is not None and [m.payload["content"] for m in loaded[1]] == ["three"]
    assert [a.payload["content"] for a in await b.read_archive("rt")] == ["one", "two"]
    assert [s.key for s in (await b.list_sessions()).items] == ["rt"]
    async with b.atomic():
        await b.append_messages("rt", 3, [message(store, "four")])
        await b.update_session("rt", status="expired")
    assert await b.delete_session("rt")


async def test_pgbouncer_mode_round_trips_without_named_prepared_statements(pg_migrated: str) -> None:
    # One connection, so every statement of the round trip ran on the connection we inspect.
    async with statekeel.open_store(pg_migrated + "?pgbouncer=true&pool_min_size=1&pool_max_size=1") as store:
        await _round_trip(store)
        assert await _prepared_statements(store) == 0
    # The same round trip in the default mode does cache statements (so the check above can fail).
    async with statekeel.open_store(pg_migrated + "?pool_min_size=1&pool_max_size=1") as store:
        await _round_trip(store)
        assert await _prepared_statements(store) > 0


@contextlib.asynccontextmanager
async def _statements_sent(store: statekeel.Store) -> AsyncIterator[list[str]]:
    """The statements sent to the server (BEGIN and COMMIT included) while the block runs, on a store
    whose pool holds one connection."""
    pool = _pg(store).pool
    assert pool.get_max_size() == 1
    sent: list[str] = []

    def logged(record: Any) -> None:
        sent.append(" ".join(record.query.split()))

    async with pool.acquire() as conn:
        conn.add_query_logger(logged)
    try:
        yield sent
    finally:
        async with pool.acquire() as conn:
            conn.remove_query_logger(logged)


async def test_a_session_save_is_one_statement_prepared_once_per_connection(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated + "?pool_min_size=1&pool_max_size=1") as store:
        session = await store.sessions.get_or_create("one-trip")
        session.add_message("user", "first")
        await store.sessions.save(session)  # creates the row: a transaction of its own
        session.add_message("user", "warm")
        await store.sessions.save(session)
        prepared = await _prepared_statements(store)
        for turn in range(3):
            async with _statements_sent(store) as sent:
                session.add_message("user", f"q{turn}")
                session.add_message("assistant", f"a{turn}")
                await store.sessions.save(session)
            # No BEGIN, no COMMIT, no second statement: one round trip per save.
            assert len(sent) == 1, sent
            assert "WITH fence AS" in sent[0] and "INSERT INTO messages" in sent[0]
        # The statement was prepared by the first save that ran it and reused since.
        assert await _prepared_statements(store) == prepared
        loaded = await store.sessions.load("one-trip")
        contents = [m["content"] for m in loaded.messages]
        assert contents == ["first", "warm", "q0", "a0", "q1", "a1", "q2", "a2"]
        assert loaded.head_seq == 8


async def test_a_conflicting_save_in_one_statement_writes_nothing_and_says_why(pg_migrated: str) -> None:
    async with statekeel.open_store(pg_migrated + "?pool_min_size=1&pool_max_size=1") as store:
        b = store.backend
        await b.append_messages("c", 0, [message(store, "kept")], create=True)
        first = await b.append_messages("c", 1, [message(store, "first writer")], write_id="w1")
        async with _statements_sent(store) as sent:
            with pytest.raises(statekeel.ConflictError) as info:
                await b.append_messages("c", 1, [message(store, "x"), message(store, "y")], write_id="w2")
        assert info.value.current == 2  # type: ignore[attr-defined]
        assert "another writer appended first" in str(info.value)
        # The save itself, then the read that says why it changed nothing.
        assert "WITH fence AS" in sent[0] and len(sent) == 2
        # Same head, stale version: refused by the same statement.
        with pytest.raises(statekeel.ConflictError, match="not the expected 1"):
            await b.append_messages("c", 2, [message(store, "z")], expected_version=1)
        # A lease taken over: the fenced save is refused with LeaseLost, before any conflict.
        stale = await b.acquire_session_lease("c", "holder-a", 30)
        taken = await b.acquire_session_lease("c", "holder-b", 30, take_over=stale)
        with pytest.raises(statekeel.LeaseLost):
            await b.append_messages("c", 2, [message(store, "fenced")], lease=stale)
        rec = await b.append_messages("c", 2, [message(store, "holder")], lease=taken)
        assert rec.head_seq == 3
        found = await b.load_session("c")
        assert found is not None and found.write_id is None and found.version == first.version + 1
        contents = [m.payload["content"] for m in await b.read_messages("c")]
        assert contents == ["kept", "first writer", "holder"]


async def test_a_blocked_session_does_not_block_other_sessions(
    pg_store: statekeel.Store, pg_migrated: str
) -> None:
    b = pg_store.backend
    for key in ("a", "b"):
        await b.append_messages(key, 0, [message(pg_store, "x")], create=True)

    def write() -> Coroutine[Any, Any, SessionRecord]:
        return b.append_messages("a", 1, [message(pg_store, "y")])

    async with _blocked_on_row_lock(pg_migrated, "a", write) as (blocked, tx):
        # No instance-wide lock: another session's write completes while "a" waits.
        rec = await asyncio.wait_for(b.append_messages("b", 1, [message(pg_store, "y")]), timeout=10)
        assert rec.head_seq == 2
        assert not blocked.done()
        await tx.rollback()
        assert (await asyncio.wait_for(blocked, timeout=10)).head_seq == 2


async def test_pool_reconnects_after_pg_terminate_backend_and_loses_nothing(
    pg_store: statekeel.Store, pg_migrated: str
) -> None:
    b = pg_store.backend
    head = 0
    for round_ in range(3):
        await b.append_messages("s", head, [message(pg_store, f"before-{round_}")], create=True)
        head += 1
        assert await _terminate_all(pg_migrated) >= 1
        # A read and a write right after: both go through on fresh connections, no error surfaces.
        loaded = await b.load_session_with_messages("s")
        assert loaded is not None and loaded[0].head_seq == head
        rec = await b.append_messages("s", head, [message(pg_store, f"after-{round_}")])
        head += 1
        assert rec.head_seq == head
        await _terminate_all(pg_migrated)
        async with b.atomic():  # a transaction block also starts on a fresh connection
            await b.update_session("s", metadata=pg_store.codec.encode({"round": round_}))
    messages = await b.read_messages("s")
    assert [m.seq for m in messages] == list(range(6))
    assert [m.payload["content"] for m in messages] == [
        f"{when}-{r}" for r in range(3) for when in ("before", "after")
    ]


@pytest.mark.parametrize("in_atomic", [False, True])
async def test_commit_lost_with_the_connection_raises_unknown_outcome_and_is_not_retried(
    pg_store: statekeel.Store, pg_migrated: str, monkeypatch: pytest.MonkeyPatch, in_atomic: bool
) -> None:
    b = pg_store.backend
    await b.append_messages("s", 0, [message(pg_store, "kept")], create=True)
    original = asyncpg.transaction.Transaction.commit
    commits: list[int] = []

    async def commit_then_lose_connection(self: Any) -> None:
        # The server ends the connection just as COMMIT is sent: the client cannot know the outcome.
        commits.append(1)
        pid = self._connection.get_server_pid()
        admin = await asyncpg.connect(pg_migrated)
        try:
            await admin.execute("SELECT pg_terminate_backend($1, 5000)", pid)
        finally:
            await admin.close()
        await original(self)

    monkeypatch.setattr(asyncpg.transaction.Transaction, "commit", commit_then_lose_connection)
    with pytest.raises(statekeel.BackendUnavailable) as info:
        if in_atomic:
            async with b.atomic():
                await b.append_messages("s", 1, [message(pg_store, "lost")])
        else:
            # A change in a transaction of its own (a save outside atomic() commits with its one
            # statement, without a COMMIT: test_connection_faults loses that statement's answer).
            await b.update_session("s", metadata=pg_store.codec.encode({"lost": True}))
    monkeypatch.setattr(asyncpg.transaction.Transaction, "commit", original)
    assert info.value.outcome == "unknown"  # type: ignore[attr-defined]
    assert "re-read" in str(info.value)
    assert commits == [1]  # not retried blindly
    # The store is usable right away and holds exactly what was acknowledged.
    assert [m.payload["content"] for m in await b.read_messages("s")] == ["kept"]
    rec = await b.append_messages("s", 1, [message(pg_store, "next")])
    assert rec.head_seq == 2


async def test_cancelled_and_failed_operations_leave_the_pooled_connection_clean(pg_migrated: str) -> None:
    # One pooled connection: whatever a failed or cancelled operation left on it, the next one inherits.
    async with statekeel.open_store(pg_migrated + "?pool_min_size=1&pool_max_size=1") as store:
        b = store.backend
        await b.append_messages("s", 0, [message(store, "one")], create=True)
        with pytest.raises(statekeel.ConflictError):
            await b.append_messages("s", 0, [message(store, "stale")])

        def write() -> Coroutine[Any, Any, SessionRecord]:
            return b.append_messages("s", 1, [message(store, "cancelled")])

        async with _blocked_on_row_lock(pg_migrated, "s", write) as (blocked, tx):
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
            await tx.rollback()
        rec = await asyncio.wait_for(b.append_messages("s", 1, [message(store, "two")]), timeout=10)
        assert rec.head_seq == 2
        assert [m.payload["content"] for m in await b.read_messages("s")] == ["one", "two"]
        async with _pg(store).pool.acquire() as conn:
            assert not conn.is_in_transaction()
