"""Review findings on approvals: what was approved cannot be changed in the database behind statekeel's
back (a grant re-pointed at other arguments, a rewritten decision, a pending approval marked consumed),
on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pytest

import statekeel


class _Raw:
    """A raw connection to the store's database that bypasses statekeel."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def execute(self, sql: str, *args: Any) -> None:
        if self.url.startswith("postgresql"):
            import asyncpg

            conn = await asyncpg.connect(self.url)
            try:
                await conn.execute(sql.replace("?", "$1") if args else sql, *args)
            finally:
                await conn.close()
            return
        conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute(sql, args)
        finally:
            conn.close()


def _refused() -> tuple[type[BaseException], ...]:
    import asyncpg

    return (sqlite3.IntegrityError, asyncpg.RestrictViolationError)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{os.path.join(os.fspath(tmp_path), 'store.db')}"
    return str(request.getfixturevalue("pg_migrated"))


@pytest.fixture
async def store(url: str, tmp_path: os.PathLike[str]) -> AsyncIterator[statekeel.Store]:
    s = await statekeel.open_store(url, fallback_dir=os.path.join(os.fspath(tmp_path), "fallback"))
    try:
        yield s
    finally:
        await s.close()


async def _granted(store: statekeel.Store) -> statekeel.Approval:
    approval = await store.approvals.request("task:1", "shell", {"cmd": "rm -rf build"}, "agent")
    return await store.approvals.decide(approval.id, True, "alice", reason="build dir only")


async def test_a_grant_cannot_be_repointed_at_other_arguments_in_the_database(
    store: statekeel.Store, url: str
) -> None:
    granted = await _granted(store)
    forged = {"cmd": "rm -rf /"}
    raw = _Raw(url)
    with pytest.raises(_refused()):
        await raw.execute(
            f"UPDATE approvals SET args_hash = ? WHERE id = '{granted.id}'", store.approvals.args_hash(forged)
        )
    for change in ("subject = 'task:2'", "action = 'http'", "expires_at = requested_at"):
        with pytest.raises(_refused()):
            await raw.execute(f"UPDATE approvals SET {change} WHERE id = '{granted.id}'")
    assert await store.approvals.check("task:1", "shell", forged) is None
    assert await store.approvals.get(granted.id) == granted
    assert await store.approvals.check("task:1", "shell", {"cmd": "rm -rf build"}) == granted


async def test_a_decision_cannot_be_rewritten_nor_a_pending_approval_marked_consumed(
    store: statekeel.Store, url: str
) -> None:
    granted = await _granted(store)
    raw = _Raw(url)
    for column in ("decided_by", "reason"):
        with pytest.raises(_refused()):
            await raw.execute(f"UPDATE approvals SET {column} = ? WHERE id = '{granted.id}'", "mallory")
    pending = await store.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
    with pytest.raises(_refused()):
        await raw.execute(
            f"UPDATE approvals SET consumed_by = ?, consumed_at = requested_at WHERE id = '{pending.id}'",
            "agent",
        )
    assert await store.approvals.get(granted.id) == granted
    assert await store.approvals.get(pending.id) == pending
    # The legal paths still work: decide a pending one, consume a granted one.
    await store.approvals.decide(pending.id, False, "alice")
    consumed = await store.approvals.consume(granted.id, "agent")
    assert consumed.consumed_by == "agent"
