"""Invariant 8 on PostgreSQL: refusals write nothing, a failed migration rolls back, concurrent openers
(serialized by an advisory lock) all succeed and each migration runs once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from migration_support import open_concurrently

import statekeel
from statekeel.backends.postgres.backend import PostgresBackend, migrations_shipped
from statekeel.backends.sql.migrations import Migration
from statekeel.codec import Codec

pytestmark = pytest.mark.postgres

SHIPPED = migrations_shipped()
CURRENT = len(SHIPPED)

BROKEN = Migration(
    CURRENT + 1,
    "broken",
    "UPDATE sessions SET status = 'archived';\n"
    "DELETE FROM messages;\n"
    "CREATE TABLE added_by_broken (a INTEGER);\n"
    "SELECT * FROM no_such_table;\n",
)


async def _fetch(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(sql, *args)]
    finally:
        await conn.close()


async def _execute(url: str, sql: str, *args: Any) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def dump(url: str) -> dict[str, Any]:
    tables = [
        r[0]
        for r in await _fetch(
            url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
    ]
    rows = {t: sorted(await _fetch(url, f'SELECT * FROM "{t}"'), key=repr) for t in tables}
    return {"tables": tables, "rows": rows}


async def versions(url: str) -> list[tuple[Any, ...]]:
    return await _fetch(
        url, "SELECT version, count(*) FROM schema_migrations GROUP BY version ORDER BY version"
    )


async def make_store_with_data(url: str) -> None:
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create("a")
        session.add_message("user", "a0")
        session.add_message("user", "a1")
        await store.sessions.save(session)


async def test_new_database_gets_every_shipped_migration_once(pg_database: str) -> None:
    async with statekeel.open_store(pg_database) as store:
        assert [m.version for m in await store.backend.migrations()] == list(range(1, CURRENT + 1))
    assert await versions(pg_database) == [(v, 1) for v in range(1, CURRENT + 1)]


async def test_failed_migration_rolls_back_and_leaves_database_unchanged(pg_database: str) -> None:
    await make_store_with_data(pg_database)
    before = await dump(pg_database)
    backend = PostgresBackend(pg_database, codec=Codec(), migrations=[*SHIPPED, BROKEN])
    with pytest.raises(statekeel.MigrationError) as info:
        await backend.initialize()
    assert info.value.version == CURRENT + 1
    assert await dump(pg_database) == before
    async with statekeel.open_store(pg_database) as store:
        rows = await store.backend.read_messages("a")
        assert [r.payload["content"] for r in rows] == ["a0", "a1"]


async def test_database_newer_than_the_code_is_refused_and_not_modified(pg_database: str) -> None:
    await make_store_with_data(pg_database)
    await _execute(
        pg_database,
        "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
        "VALUES ($1, 'future', 'x', now())",
        CURRENT + 3,
    )
    before = await dump(pg_database)
    with pytest.raises(statekeel.SchemaTooNew) as info:
        await statekeel.open_store(pg_database)
    assert (info.value.found, info.value.supported) == (CURRENT + 3, CURRENT)
    assert await dump(pg_database) == before


async def test_applied_migration_with_a_different_checksum_is_migration_error(pg_database: str) -> None:
    await make_store_with_data(pg_database)
    await _execute(pg_database, "UPDATE schema_migrations SET checksum = 'feedface' WHERE version = 1")
    before = await dump(pg_database)
    with pytest.raises(statekeel.MigrationError) as info:
        await statekeel.open_store(pg_database)
    assert info.value.version == 1
    assert await dump(pg_database) == before


async def test_concurrent_openers_in_one_process_all_succeed(pg_database: str) -> None:
    async def open_one() -> int:
        async with statekeel.open_store(pg_database) as store:
            return await store.backend.schema_version()

    assert await asyncio.gather(*(open_one() for _ in range(4))) == [CURRENT] * 4
    assert await versions(pg_database) == [(v, 1) for v in range(1, CURRENT + 1)]


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
async def test_openers_that_wait_for_each_others_migrations_succeed_under_any_default_isolation(
    pg_database: str, isolation: str
) -> None:
    """Migrations run at read committed whatever the database's default: an opener that waited for the
    migration lock reads the migrations another one applied meanwhile instead of applying them again."""
    import asyncpg

    from statekeel.backends.postgres.schema import MIGRATION_LOCK_ID

    admin = await asyncpg.connect(pg_database)
    try:
        name = await admin.fetchval("SELECT current_database()")
        # Names are ours (sk_test_<hex>), the isolation one of two literals: no user data in the SQL.
        await admin.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{isolation}'")
        await admin.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_ID)

        async def open_one() -> int:
            async with statekeel.open_store(pg_database) as store:
                return await store.backend.schema_version()

        openers = [asyncio.create_task(open_one()) for _ in range(3)]
        async with asyncio.timeout(30):  # until every opener waits for the lock this test holds
            while await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            ) < len(openers):
                await asyncio.sleep(0.01)
        level = await _fetch(pg_database, "SHOW transaction_isolation")
        assert level == [(isolation,)]  # the default the openers' transactions would get
        await admin.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_ID)
        assert await asyncio.gather(*openers) == [CURRENT] * 3
    finally:
        await admin.close()
    assert await versions(pg_database) == [(v, 1) for v in range(1, CURRENT + 1)]


def test_processes_opening_a_new_database_at_once_all_succeed_and_migrate_once(pg_database: str) -> None:
    assert open_concurrently(pg_database, 3) == [f"ok {CURRENT}"] * 3
    assert asyncio.run(versions(pg_database)) == [(v, 1) for v in range(1, CURRENT + 1)]
    keys = asyncio.run(_fetch(pg_database, "SELECT key FROM sessions ORDER BY key"))
    assert keys == [("opener-0",), ("opener-1",), ("opener-2",)]


async def test_sessions_written_before_tool_calls_were_counted_are_counted_once_after_the_upgrade(
    pg_database: str,
) -> None:
    tool_calls = next(m.version for m in SHIPPED if m.name == "session_tool_calls")
    backend = PostgresBackend(pg_database, codec=Codec(), migrations=SHIPPED[: tool_calls - 1])
    await backend.initialize()
    await backend.close()
    # Written by the old code: a session whose last turn asks for a tool that never answered.
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c9", "type": "function"}]}
    await _execute(
        pg_database,
        "INSERT INTO sessions (key, head_seq, created_at, updated_at) VALUES ('cut', 2, now(), now())",
    )
    for seq, message in enumerate([{"role": "user", "content": "go"}, call]):
        await _execute(
            pg_database,
            "INSERT INTO messages (session_key, seq, role, payload, created_at) "
            "VALUES ('cut', $1, $2, $3, now())",
            seq,
            message["role"],
            json.dumps(message),
        )
    async with statekeel.open_store(pg_database) as store:
        assert [(s.key, s.open_calls) for s in await store.backend.sessions_with_open_calls()] == [
            ("cut", -1)
        ]
        report = await store.recover()
        assert report.orphaned_tool_calls == {"cut": ["c9"]}
        assert await store.backend.sessions_with_open_calls() == []
