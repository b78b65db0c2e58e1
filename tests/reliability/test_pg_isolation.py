"""statekeel's PostgreSQL write transactions run at read committed whatever the server's default isolation.

Under repeatable read (a common server setting) a transaction that waited for the audit chain's lock
would read a head older than the lock it holds; pinned to read committed, concurrent audit appends,
approvals and claims behave as on a default server.
"""

from __future__ import annotations

import asyncio

import pytest

import statekeel

pytestmark = pytest.mark.postgres


async def _with_default_isolation(url: str, level: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        name = await conn.fetchval("SELECT current_database()")
        await conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{level}'")
    finally:
        await conn.close()


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
async def test_concurrent_audit_appends_all_land_in_one_chain_whatever_the_server_isolation(
    pg_database: str, level: str
) -> None:
    await _with_default_isolation(pg_database, level)
    async with statekeel.open_store(pg_database) as store:
        entries = await asyncio.gather(
            *(store.audit.append("tool.call", f"w{i % 4}", "task:1", {"i": i}) for i in range(40))
        )
        assert sorted(e.seq for e in entries) == list(range(1, 41))
        report = await store.audit.verify()
        assert (report.ok, report.count) == (True, 40)


async def test_concurrent_approval_requests_all_succeed_under_repeatable_read(pg_database: str) -> None:
    await _with_default_isolation(pg_database, "repeatable read")
    async with statekeel.open_store(pg_database) as store:
        made = await asyncio.gather(
            *(store.approvals.request("task:1", "shell", {"n": i}, "agent") for i in range(20))
        )
        assert len({a.id for a in made}) == 20
        assert len(await store.approvals.pending()) == 20
        assert (await store.audit.verify()).count == 20
