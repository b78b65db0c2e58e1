"""Tampering with approvals directly in the database: what was approved cannot be changed behind
statekeel's back (a grant re-pointed at other arguments, a rewritten decision, a pending approval marked
consumed), on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest

import statekeel
from helpers import RawDb, granted_approval


def _refused() -> tuple[type[BaseException], ...]:
    import asyncpg

    return (sqlite3.IntegrityError, asyncpg.RestrictViolationError)


@pytest.fixture
def store_url(shared_url: str) -> str:
    """``store`` opens a SQLite file or a PostgreSQL database: places a raw connection can reach."""
    return shared_url


async def test_a_grant_cannot_be_repointed_at_other_arguments_in_the_database(
    store: statekeel.Store, store_url: str
) -> None:
    granted = await granted_approval(store, "task:1", {"cmd": "rm -rf build"}, "agent")
    forged = {"cmd": "rm -rf /"}
    raw = RawDb(store_url)
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
    store: statekeel.Store, store_url: str
) -> None:
    granted = await granted_approval(store, "task:1", {"cmd": "rm -rf build"}, "agent")
    raw = RawDb(store_url)
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
