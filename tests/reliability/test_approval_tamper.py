"""Tampering with approvals directly in the database: what was approved cannot be changed behind
statekeel's back (a grant re-pointed at other arguments, a rewritten decision, a pending approval marked
consumed), on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest

import statekeel
from helpers import RawDb, granted_approval


def _refused() -> tuple[type[BaseException], ...]:
    import asyncmy
    import asyncpg

    # MariaDB: a trigger's SIGNAL arrives as error 1644 (OperationalError).
    return (sqlite3.IntegrityError, asyncpg.RestrictViolationError, asyncmy.errors.OperationalError)


@pytest.fixture
def store_url(shared_url: str) -> str:
    """``store`` opens a SQLite file or a PostgreSQL or MariaDB database: places a raw connection can
    reach."""
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


async def test_arguments_rewritten_alone_in_the_database_are_never_honoured(
    store: statekeel.Store, store_url: str
) -> None:
    # The triggers let an update change the stored arguments alone (key rotation re-encrypts them in
    # place); what was approved stays fixed by args_hash, which every use checks the arguments against.
    granted = await granted_approval(store, "task:1", {"cmd": "rm -rf build"}, "agent")
    await RawDb(store_url).execute(
        f"UPDATE approvals SET args = '{{\"cmd\": \"rm -rf /\"}}' WHERE id = '{granted.id}'"
    )
    assert await store.approvals.check("task:1", "shell", {"cmd": "rm -rf /"}) is None
    with pytest.raises(statekeel.AuditTampered, match="do not match their recorded hash"):
        await store.approvals.check("task:1", "shell", {"cmd": "rm -rf build"})
    with pytest.raises(statekeel.AuditTampered):
        await store.approvals.consume(granted.id, "agent")


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


# Behind the triggers (dropped or disabled): each change below is refused when the approval would be
# honoured, and found by verify() and recover(), because the approval no longer matches the row digest its
# latest audit entry recorded.


async def _refused_and_found(store: statekeel.Store, approval_id: str, why: str) -> None:
    """``check`` of the deploy approval raises, naming ``why``; verify() and recover() find it."""
    with pytest.raises(statekeel.AuditTampered) as info:
        await store.approvals.check("task:1", "deploy", {"env": "prod"})
    assert why in str(info.value)
    await _assert_found(store, approval_id)


async def _assert_found(store: statekeel.Store, approval_id: str) -> None:
    report = await store.audit.verify()
    assert not report.ok and report.bad_approvals == (approval_id,)
    with pytest.raises(statekeel.AuditTampered):
        report.raise_if_tampered()
    recovered = await store.recover()
    assert recovered.audit is not None and not recovered.audit.ok and not recovered.ok
    assert any("audit log does not verify" in advice for advice in recovered.advice)


async def test_a_grant_repointed_behind_the_triggers_is_refused_and_found(
    store: statekeel.Store, store_url: str
) -> None:
    granted = await granted_approval(store, "task:1", {"cmd": "rm -rf build"}, "agent")
    forged = {"cmd": "rm -rf /"}
    raw = RawDb(store_url)
    await raw.execute(
        f"UPDATE approvals SET args = ? WHERE id = '{granted.id}'",
        '{"cmd": "rm -rf /"}',
        unguarded="approvals",
    )
    await raw.execute(
        f"UPDATE approvals SET args_hash = ? WHERE id = '{granted.id}'",
        store.approvals.args_hash(forged),
        unguarded="approvals",
    )
    with pytest.raises(statekeel.AuditTampered) as info:
        await store.approvals.check("task:1", "shell", forged)
    assert info.value.approval_id == granted.id  # type: ignore[attr-defined]
    with pytest.raises(statekeel.AuditTampered):
        await store.approvals.consume(granted.id, "agent")
    after = await store.approvals.get(granted.id)
    assert after is not None and after.consumed_at is None  # not used up either
    assert await store.approvals.check("task:1", "shell", {"cmd": "rm -rf build"}) is None
    await _assert_found(store, granted.id)


async def test_a_grant_inserted_behind_the_triggers_is_refused_and_found(
    store: statekeel.Store, store_url: str
) -> None:
    pending = await store.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
    await RawDb(store_url).execute(
        "INSERT INTO approvals (id, subject, action, args, args_hash, status, requested_by, requested_at, "
        "decided_by, decided_at, version) "
        "SELECT 'forged-1', subject, action, args, args_hash, 'granted', requested_by, requested_at, "
        f"'mallory', requested_at, 2 FROM approvals WHERE id = '{pending.id}'",
        unguarded="approvals",
    )
    await _refused_and_found(store, "forged-1", "no audit entry")
    with pytest.raises(statekeel.AuditTampered):
        await store.approvals.consume("forged-1", "agent")


async def test_a_pending_approval_marked_granted_behind_the_triggers_is_refused_and_found(
    store: statekeel.Store, store_url: str
) -> None:
    pending = await store.approvals.request("task:1", "deploy", {"env": "prod"}, "agent")
    await RawDb(store_url).execute(
        "UPDATE approvals SET status = 'granted', decided_by = 'mallory', decided_at = requested_at "
        f"WHERE id = '{pending.id}'",
        unguarded="approvals",
    )
    await _refused_and_found(store, pending.id, "approval.requested")


async def test_an_untouched_approval_is_honoured_and_verifies_through_its_life(
    store: statekeel.Store,
) -> None:
    granted = await granted_approval(store, "task:1", {"cmd": "ls"}, "agent")
    denied = await store.approvals.request("task:1", "shell", {"cmd": "rm"}, "agent")
    await store.approvals.decide(denied.id, False, "alice")
    await store.approvals.request("task:1", "shell", {"cmd": "pwd"}, "agent")
    assert await store.approvals.check("task:1", "shell", {"cmd": "ls"}) == granted
    await store.approvals.consume(granted.id, "agent")
    report = await store.audit.verify()
    assert report.ok and report.approvals == 3 and report.bad_approvals == ()
