"""Faults and bad input on the MariaDB backend: values the server cannot take, connections it drops, a
server that is not there, deadlocks, and a COMMIT whose answer is lost.

What users depend on: a typed statekeel error saying what was wrong, nothing half written, and a store
that goes on working without a restart.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

import statekeel
from helpers import mariadb_raw
from statekeel.backends.sql import Tx

Store = statekeel.Store


def _msgs(session: Any) -> list[Any]:
    assert session is not None
    return list(session.messages)


async def _session_rows(url: str) -> int:
    return int((await mariadb_raw(url, "SELECT count(*) FROM sessions"))[0][0])


async def test_keys_and_content_with_four_byte_characters_round_trip(my_migrated: str) -> None:
    key = "🔑" * 128  # 512 bytes of UTF-8: the longest key statekeel accepts
    text = "emoji 😀, math \U0001d538, CJK ext. B 𠀀, and a NUL-free mix of \u00e9\u0301"
    async with statekeel.open_store(my_migrated) as store:
        async with store.sessions.open(key) as session:
            session.add_message("user", text)
        loaded = await store.sessions.load(key)
        assert [m["content"] for m in loaded.messages] == [text]
        assert [s.key for s in (await store.sessions.list()).items] == [key]
        memory = await store.memory.put("user", "k-\U0001d538", {"note": text}, scope="scope-😀")
        assert (await store.memory.get(memory.id)).content == {"note": text}
    # Stored as the characters themselves (utf8mb4), not as replacement marks.
    rows = await mariadb_raw(my_migrated, "SELECT `key` FROM sessions")
    assert rows == [(key,)]


async def test_keys_differing_only_in_case_are_different_keys(my_migrated: str) -> None:
    async with statekeel.open_store(my_migrated) as store:
        for key in ("Agent", "agent", "AGENT"):
            async with store.sessions.open(key) as session:
                session.add_message("user", key)
        assert sorted(s.key for s in (await store.sessions.list()).items) == ["AGENT", "Agent", "agent"]
        assert [m["content"] for m in (await store.sessions.load("agent")).messages] == ["agent"]


async def test_a_value_over_max_allowed_packet_is_payload_too_large_and_nothing_is_written(
    my_migrated: str,
) -> None:
    async with statekeel.open_store(my_migrated) as store:
        packet = store.backend.max_packet  # type: ignore[attr-defined]
        async with store.sessions.open("s") as session:
            session.add_message("user", "before")
        with pytest.raises(statekeel.PayloadTooLarge, match="max_allowed_packet"):
            async with store.sessions.open("s") as session:
                session.add_message("user", "x" * (packet - 1000))
        # Nothing of the refused save reached the database, and the store goes on.
        assert (await mariadb_raw(my_migrated, "SELECT count(*) FROM messages"))[0][0] == 1
        async with store.sessions.open("t") as other:
            other.add_message("user", "after")
    async with statekeel.open_store(my_migrated) as store:
        assert [m["content"] for m in _msgs(await store.sessions.load("s"))] == ["before"]
        assert [m["content"] for m in _msgs(await store.sessions.load("t"))] == ["after"]


async def test_a_key_longer_than_the_column_allows_is_invalid_key_and_nothing_is_written(
    my_migrated: str,
) -> None:
    async with statekeel.open_store(my_migrated) as store:
        await store.tasks.create("t", status="queued")
        task = await store.tasks.claim("w")
        assert task is not None
        called = []
        # 300 characters: within statekeel's 512-byte key limit, over this backend's 255 for a step key.
        with pytest.raises(statekeel.InvalidKey, match="step_key"):
            await store.tasks.step(task.id, "s" * 300, lambda: called.append(1))
        assert called == []
        assert await store.tasks.steps(task.id) == []
        assert await store.tasks.step(task.id, "s" * 255, lambda: "ok") == "ok"


async def test_connections_killed_by_the_server_are_replaced_and_reads_and_writes_go_on(
    my_migrated: str,
) -> None:
    database = my_migrated.rsplit("/", 1)[1]
    async with statekeel.open_store(my_migrated + "?pool_min_size=3&pool_max_size=3") as store:
        async with store.sessions.open("s") as session:
            session.add_message("user", "one")
        # Connections idle in the pool, killed behind the store's back (a server restart looks the same).
        ids = await mariadb_raw(
            my_migrated,
            "SELECT id FROM information_schema.processlist WHERE db = ?1 AND id <> CONNECTION_ID()",
            database,
        )
        assert ids
        for (conn_id,) in ids:
            await mariadb_raw(my_migrated, f"KILL CONNECTION {int(conn_id)}")
        assert [m["content"] for m in (await store.sessions.load("s")).messages] == ["one"]
        for (conn_id,) in await mariadb_raw(
            my_migrated,
            "SELECT id FROM information_schema.processlist WHERE db = ?1 AND id <> CONNECTION_ID()",
            database,
        ):
            await mariadb_raw(my_migrated, f"KILL CONNECTION {int(conn_id)}")
        async with store.sessions.open("s") as session:
            session.add_message("user", "two")
        assert [m["content"] for m in (await store.sessions.load("s")).messages] == ["one", "two"]
        assert await _session_rows(my_migrated) == 1


async def test_a_server_that_is_not_there_is_backend_unavailable_naming_host_and_database() -> None:
    url = "mariadb://root@127.0.0.1:1/nowhere?connect_timeout=2"
    with pytest.raises(statekeel.BackendUnavailable) as info:
        await statekeel.open_store(url)
    assert "127.0.0.1" in str(info.value) and info.value.fields["database"] == "nowhere"


async def test_a_missing_database_is_backend_unavailable_saying_how_to_create_it(my_migrated: str) -> None:
    url = my_migrated.rsplit("/", 1)[0] + "/sk_never_created"
    with pytest.raises(statekeel.BackendUnavailable, match="CREATE DATABASE"):
        await statekeel.open_store(url)


async def test_a_lost_commit_answer_raises_unknown_outcome_and_a_re_read_settles_it(
    my_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncmy.connection

    async with statekeel.open_store(my_migrated) as store:
        real_commit = asyncmy.connection.Connection.commit
        lose = {"armed": True}

        async def commit_then_lose_the_answer(self: Any) -> None:
            await real_commit(self)  # the server has committed
            if lose.pop("armed", False):
                raise ConnectionResetError("connection reset while reading the COMMIT answer")

        monkeypatch.setattr(asyncmy.connection.Connection, "commit", commit_then_lose_the_answer)
        with pytest.raises(statekeel.BackendUnavailable) as info:
            await store.tasks.create("landed anyway")
        assert info.value.fields["outcome"] == "unknown"
        monkeypatch.setattr(asyncmy.connection.Connection, "commit", real_commit)
        assert [t.title for t in (await store.tasks.list()).items] == ["landed anyway"]


def _deadlock_queries(store: Store) -> None:
    from statekeel.backends.mysql.queries import compile_query

    scripts = store.backend._scripts  # type: ignore[attr-defined]
    scripts["test_lock_a"] = compile_query(
        "test_lock_a", "SELECT 1 FROM statekeel_locks WHERE name = 'a' FOR UPDATE"
    )
    scripts["test_lock_b"] = compile_query(
        "test_lock_b", "SELECT 1 FROM statekeel_locks WHERE name = 'b' FOR UPDATE"
    )
    scripts["test_note"] = compile_query("test_note", "INSERT INTO statekeel_locks (name) VALUES ($1)")


async def _until_a_transaction_waits_for_a_lock(url: str) -> None:
    """Return once the server reports a transaction waiting for a row lock (polled, bounded)."""
    for _ in range(500):
        rows = await mariadb_raw(
            url, "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
        )
        if rows[0][0]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no transaction started waiting for a lock")


async def test_a_deadlocked_write_is_retried_once_and_both_writes_land(my_migrated: str) -> None:
    await mariadb_raw(my_migrated, "INSERT INTO statekeel_locks (name) VALUES ('a'), ('b')")
    async with statekeel.open_store(my_migrated) as store:
        _deadlock_queries(store)
        first_locked, second_locked = asyncio.Event(), asyncio.Event()
        attempts = {"one": 0, "two": 0}

        async def one(tx: Tx) -> None:
            attempts["one"] += 1
            await tx.fetchone("test_lock_a")
            if attempts["one"] == 1:
                first_locked.set()
                await second_locked.wait()
            await tx.fetchone("test_lock_b")
            await tx.execute("test_note", f"one-{attempts['one']}")

        async def two(tx: Tx) -> None:
            attempts["two"] += 1
            await tx.fetchone("test_lock_b")
            if attempts["two"] == 1:
                second_locked.set()
                await first_locked.wait()
            await tx.fetchone("test_lock_a")
            await tx.execute("test_note", f"two-{attempts['two']}")

        await asyncio.gather(store.backend._write(one), store.backend._write(two))  # type: ignore[attr-defined]
    # InnoDB chose one of them as the victim and rolled it back; it ran once more and landed.
    assert sorted(attempts.values()) == [1, 2]
    notes = {r[0] for r in await mariadb_raw(my_migrated, "SELECT name FROM statekeel_locks")}
    assert notes - {"a", "b", "audit"} == {
        f"one-{attempts['one']}",
        f"two-{attempts['two']}",
    }


async def test_a_write_that_deadlocks_again_after_its_retry_is_a_conflict_error_and_writes_nothing(
    my_migrated: str,
) -> None:
    await mariadb_raw(my_migrated, "INSERT INTO statekeel_locks (name) VALUES ('a'), ('b')")
    async with statekeel.open_store(my_migrated) as store:
        _deadlock_queries(store)
        attempts = 0

        async def victim(tx: Tx) -> None:
            nonlocal attempts
            attempts += 1
            await tx.execute("test_note", f"victim-{attempts}")
            await tx.fetchone("test_lock_a")
            partner_locked = asyncio.Event()

            async def partner(ptx: Tx) -> None:
                # More rows changed than the victim: InnoDB rolls back the transaction with fewer.
                for n in range(5):
                    await ptx.execute("test_note", f"partner-{attempts}-{n}")
                await ptx.fetchone("test_lock_b")
                partner_locked.set()
                await ptx.fetchone("test_lock_a")  # waits for the victim: the cycle closes below

            partners.append(asyncio.ensure_future(store.backend._write(partner)))  # type: ignore[attr-defined]
            await partner_locked.wait()
            await _until_a_transaction_waits_for_a_lock(my_migrated)
            await tx.fetchone("test_lock_b")

        partners: list[asyncio.Future[Any]] = []
        with pytest.raises(statekeel.ConflictError, match="concurrent transaction"):
            await store.backend._write(victim)  # type: ignore[attr-defined]
        assert attempts == 2
        await asyncio.gather(*partners)  # each partner went on once the victim was rolled back
    notes = {r[0] for r in await mariadb_raw(my_migrated, "SELECT name FROM statekeel_locks")}
    assert not {n for n in notes if n.startswith("victim")}
    assert len({n for n in notes if n.startswith("partner")}) == 10


async def test_a_deadlock_inside_an_atomic_block_is_a_conflict_error_and_rolls_the_whole_block_back(
    my_migrated: str,
) -> None:
    await mariadb_raw(my_migrated, "INSERT INTO statekeel_locks (name) VALUES ('a'), ('b')")
    async with statekeel.open_store(my_migrated) as store:
        _deadlock_queries(store)
        partner_locked = asyncio.Event()

        async def partner(ptx: Tx) -> None:
            for n in range(20):  # more rows changed than the block: InnoDB rolls the block back
                await ptx.execute("test_note", f"partner-{n}")
            await ptx.fetchone("test_lock_b")
            partner_locked.set()
            await ptx.fetchone("test_lock_a")

        async def deadlocking(tx: Tx) -> None:
            await tx.fetchone("test_lock_a")
            # Another caller's write: outside this task's atomic() block (a fresh context).
            write = store.backend._write(partner)  # type: ignore[attr-defined]
            partners.append(asyncio.create_task(write, context=contextvars.Context()))
            await partner_locked.wait()
            await _until_a_transaction_waits_for_a_lock(my_migrated)
            await tx.fetchone("test_lock_b")

        partners: list[asyncio.Future[Any]] = []
        with pytest.raises(statekeel.ConflictError, match="concurrent transaction"):
            async with store.backend.atomic():  # type: ignore[attr-defined]
                await store.tasks.create("written in the block")
                await store.backend._write(deadlocking)  # type: ignore[attr-defined]
                await store.tasks.create("never reached")
        await asyncio.gather(*partners)
        assert (await store.tasks.list()).items == []
        # The store goes on: a new block commits.
        async with store.backend.atomic():  # type: ignore[attr-defined]
            await store.tasks.create("after")
        assert [t.title for t in (await store.tasks.list()).items] == ["after"]


class _Deadlocks:
    """Makes each of a store's next ``rounds`` write transactions a real deadlock victim: at its first
    query it locks row 'a', a partner transaction (heavier: InnoDB rolls back the one with fewer changed
    rows) locks 'b' and waits for 'a', and the victim then asks for 'b'."""

    def __init__(self, store: Store, url: str, rounds: int, monkeypatch: pytest.MonkeyPatch) -> None:
        from statekeel.backends.mysql.tx import MyTx

        _deadlock_queries(store)
        self.rounds = rounds
        self.victims = 0
        self.partners: list[asyncio.Task[Any]] = []
        backend: Any = store.backend
        deadlocks = self
        writing: contextvars.ContextVar[bool] = contextvars.ContextVar("writing", default=False)
        real_write = backend._write

        async def write(op: Any, *args: Any) -> Any:
            token = writing.set(True)
            try:
                return await real_write(op, *args)
            finally:
                writing.reset(token)

        class DeadlockingTx(MyTx):
            __slots__ = ("started",)

            async def _run(self, name: str, args: Any) -> Any:
                if writing.get() and not getattr(self, "started", False) and not name.startswith("test_"):
                    self.started = True
                    if deadlocks.rounds > 0:
                        deadlocks.rounds -= 1
                        await deadlocks.close_the_cycle(self)
                return await super()._run(name, args)

        def tx(conn: Any) -> MyTx:
            return DeadlockingTx(conn, backend.codec, backend._scripts, backend.max_packet)

        async def partner(ptx: Tx, n: int, locked: asyncio.Event) -> None:
            for i in range(5):
                await ptx.execute("test_note", f"partner-{n}-{i}")
            await ptx.fetchone("test_lock_b")
            locked.set()
            await ptx.fetchone("test_lock_a")  # waits for the victim: the cycle closes below

        async def close_the_cycle(victim: Tx) -> None:
            self.victims += 1
            await victim.fetchone("test_lock_a")
            locked = asyncio.Event()
            partnering = real_write(partner, self.victims, locked)
            self.partners.append(asyncio.create_task(partnering, context=contextvars.Context()))
            await locked.wait()
            await _until_a_transaction_waits_for_a_lock(url)
            await victim.fetchone("test_lock_b")

        self.close_the_cycle = close_the_cycle
        monkeypatch.setattr(backend, "_tx", tx)
        monkeypatch.setattr(backend, "_write", write)

    async def partners_done(self) -> None:
        await asyncio.gather(*self.partners)


async def test_an_unconditional_write_chosen_as_a_deadlock_victim_again_and_again_lands_once(
    my_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await mariadb_raw(my_migrated, "INSERT INTO statekeel_locks (name) VALUES ('a'), ('b')")
    async with statekeel.open_store(my_migrated) as store:
        deadlocks = _Deadlocks(store, my_migrated, 3, monkeypatch)
        memory = await store.memory.put("semantic", "k", {"v": 1}, scope="s")
        assert deadlocks.victims == 3 and deadlocks.rounds == 0
        deadlocks.rounds = 3
        forgotten = await store.memory.forget(memory.id, reason="test", actor="t")
        assert deadlocks.victims == 6 and deadlocks.rounds == 0
        await deadlocks.partners_done()
        # Each ran its four attempts and landed once: one memory, one ADD and one DELETE in its history.
        assert (memory.version, forgotten.version) == (1, 2)
        assert [e.event for e in await store.memory.history(memory.id)] == ["ADD", "DELETE"]
        assert await store.backend.count_rows("memories") == 1
    notes = {r[0] for r in await mariadb_raw(my_migrated, "SELECT name FROM statekeel_locks")}
    assert len({n for n in notes if n.startswith("partner")}) == 6 * 5  # every partner committed


async def test_a_conditional_write_deadlocked_twice_is_a_conflict_error_and_writes_nothing(
    my_migrated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await mariadb_raw(my_migrated, "INSERT INTO statekeel_locks (name) VALUES ('a'), ('b')")
    async with statekeel.open_store(my_migrated) as store:
        async with store.sessions.open("conditional") as session:
            session.add_message("user", "first")
        deadlocks = _Deadlocks(store, my_migrated, 2, monkeypatch)
        session = await store.sessions.load("conditional")
        assert session is not None
        session.add_message("user", "second")
        with pytest.raises(statekeel.ConflictError, match="concurrent transaction"):
            await store.sessions.save(session)
        assert deadlocks.victims == 2  # its one retry was a victim too; no third attempt
        await deadlocks.partners_done()
    async with statekeel.open_store(my_migrated) as store:
        loaded = await store.sessions.load("conditional")
        assert [m["content"] for m in _msgs(loaded)] == ["first"]
