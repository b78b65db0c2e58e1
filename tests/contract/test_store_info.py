"""``store.info()``: schema and health facts of a store, the same on every backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import statekeel
from statekeel.backends.base import SESSION_STATUSES, TASK_STATUSES, WORKFLOW_STATUSES
from statekeel.backends.mysql.backend import migrations_shipped as mysql_migrations
from statekeel.backends.postgres.backend import migrations_shipped as pg_migrations
from statekeel.backends.sqlite.backend import migrations_shipped as sqlite_migrations

Store = statekeel.Store


def _kind(store: Store) -> str:
    return "postgresql" if store.url.startswith("postgres") else urlsplit(store.url).scheme


async def test_a_new_store_reports_its_schema_and_no_state(store: Store) -> None:
    info = await store.info()
    shipped = {"postgresql": pg_migrations, "mariadb": mysql_migrations, "mysql": mysql_migrations}.get(
        _kind(store), sqlite_migrations
    )()
    assert info.backend == _kind(store)
    assert info.schema_version == len(shipped)
    assert [(m.version, m.name, m.checksum) for m in info.migrations] == [
        (m.version, m.name, m.checksum) for m in shipped
    ]
    assert all(m.applied_at.tzinfo is not None for m in info.migrations)
    assert info.pending_migrations == ()
    assert info.counts is not None
    assert info.counts.sessions == dict.fromkeys(SESSION_STATUSES, 0)
    assert info.counts.tasks == dict.fromkeys(TASK_STATUSES, 0)
    assert info.counts.workflows == dict.fromkeys(WORKFLOW_STATUSES, 0)
    assert (info.counts.approvals_pending, info.counts.audit_entries) == (0, 0)
    assert info.integrity == ()
    assert info.fallback_files == 0
    assert info.ok


async def test_counts_follow_each_state_kind_by_status(store: Store) -> None:
    for key in ("a", "b", "c", "d"):
        await store.backend.create_session(key)
    await store.backend.update_session("c", status="expired")
    await store.backend.update_session("d", status="archived")
    first = await store.tasks.create("one")
    await store.tasks.create("two")
    await store.tasks.transition(first.id, "queued")
    await store.workflows.create("release", [{"name": "build"}, {"name": "ship", "depends_on": ["build"]}])
    kept = await store.approvals.request("task:1", "shell", {"cmd": "ls"}, "agent")
    decided = await store.approvals.request("task:1", "shell", {"cmd": "rm"}, "agent")
    await store.approvals.decide(decided.id, False, "alice")
    now = dt.datetime.now(dt.UTC)
    # Expired before anyone decided it: no longer pending (what approvals.pending() lists).
    await store.backend.create_approval(
        "expired-1",
        subject="task:1",
        action="shell",
        args=b"{}",
        args_hash="0" * 64,
        requested_by="agent",
        expires_at=now - dt.timedelta(minutes=1),
    )
    await store.audit.append("note", "tester", "s", {})

    counts = (await store.info()).counts
    assert counts is not None
    assert counts.sessions == {"active": 2, "expired": 1, "archived": 1}
    assert counts.tasks["queued"] == 1
    assert counts.tasks["pending"] == 3  # "two" and the workflow's two steps
    assert sum(counts.tasks.values()) == 4
    assert counts.workflows == {**dict.fromkeys(WORKFLOW_STATUSES, 0), "pending": 1}
    assert counts.approvals_pending == 1 == len(await store.approvals.pending())
    assert [a.id for a in await store.approvals.pending()] == [kept.id]
    # Four tasks created and one transition, two requests and a decision were audited with the changes,
    # then one entry appended by hand.
    entries = await store.audit.query(limit=1000)
    assert counts.audit_entries == len(entries) == entries[-1].seq == 9


async def test_counts_include_live_memories_open_contradictions_and_file_changes(store: Store) -> None:
    a = await store.memory.put("user", "drink", "tea")
    await store.memory.put("user", "drink", "coffee")  # an update: still one memory
    b = await store.memory.put("user", None, "b")
    gone = await store.memory.put("user", None, "gone")
    await store.memory.forget(gone.id, reason="r", actor="x")
    await store.memory.record_contradiction(a.id, b.id, "open")
    done = await store.memory.record_contradiction(a.id, b.id, "settled")
    await store.memory.resolve_contradiction(done.id, "ok")
    await store.files.record("a.txt", "0" * 64, 0)
    await store.files.record("a.txt", "1" * 64, 1)
    counts = (await store.info()).counts
    assert counts is not None
    assert (counts.memories, counts.contradictions_open, counts.file_changes) == (2, 1, 2)


async def test_integrity_can_be_skipped_and_info_never_writes(store: Store) -> None:
    before = await store.info()
    info = await store.info(check_integrity=False)
    assert info.integrity is None and not info.ok
    assert info.migrations == before.migrations and info.counts == before.counts
    with pytest.raises(statekeel.InvalidArgument, match="check_integrity"):
        await store.info(check_integrity="yes")  # type: ignore[arg-type]
    assert (await store.info()).counts == before.counts


async def test_files_are_reported_for_a_sqlite_file_only(store: Store) -> None:
    await store.backend.create_session("s")
    files = (await store.info()).files
    if _kind(store) != "sqlite":
        assert files is None
        return
    assert files is not None
    assert files.path == urlsplit(store.url).path[1:]
    assert (files.database_bytes, files.wal_bytes) == _sizes(files.path)
    assert files.database_bytes > 0


def _sizes(path: str) -> tuple[int, int]:
    wal = Path(path + "-wal")
    return Path(path).stat().st_size, wal.stat().st_size if wal.exists() else 0


async def test_a_closed_store_has_no_info(store_url: str) -> None:
    store = await statekeel.open_store(store_url)
    await store.close()
    with pytest.raises(statekeel.BackendUnavailable):
        await store.info()


@pytest.mark.postgres
async def test_the_url_of_a_postgres_store_is_reported_without_its_password(pg_migrated: str) -> None:
    parts = urlsplit(pg_migrated)
    # The test server trusts local connections: the password is accepted and ignored.
    url = urlunsplit(parts._replace(netloc=f"{parts.username}:s3cret@{parts.hostname}:{parts.port}"))
    async with statekeel.open_store(url + "?connect_timeout=5") as store:
        info = await store.info()
    assert "s3cret" not in info.url and f"{parts.username}:***@" in info.url
    assert info.backend == "postgresql" and info.ok


async def test_fallback_files_waiting_for_replay_are_counted(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    fallback = tmp_path / "fallback"
    async with statekeel.open_store(
        f"sqlite:///{db}", fallback_dir=os.fspath(fallback), busy_timeout_ms=50
    ) as store:
        session = await store.sessions.get_or_create("s")
        session.add_message("user", "before")
        await store.sessions.save(session)
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            blocker.execute("BEGIN EXCLUSIVE")  # every write now fails: the save goes to a fallback file
            session.add_message("user", "during the outage")
            await store.sessions.save(session)
            info = await store.info()
            assert (info.fallback_files, info.fallback_dir) == (1, os.fspath(fallback))
            assert not info.ok and info.integrity == ()
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert (await store.sessions.replay_fallback()).ok
        info = await store.info()
        assert info.fallback_files == 0 and info.ok


async def test_a_memory_store_without_a_fallback_directory_reports_none() -> None:
    async with statekeel.open_store("memory://") as store:
        info = await store.info()
    assert (info.url, info.backend, info.files, info.fallback_dir, info.fallback_files) == (
        "memory://",
        "memory",
        None,
        None,
        0,
    )


@pytest.mark.postgres
async def test_a_damaged_schema_is_reported_by_the_integrity_check_not_counted(pg_migrated: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg_migrated)
    try:
        await conn.execute("DROP TABLE approvals")
    finally:
        await conn.close()
    async with statekeel.open_store(pg_migrated, migrate=False) as store:
        info = await store.info()
        assert info.integrity == ("table approvals is missing",)
        assert info.counts is None and not info.ok
        with pytest.raises(statekeel.StorageCorrupt):
            await store.info(check_integrity=False)  # nothing says why counting failed: it raises


async def test_health_finds_problems_writes_nothing_and_says_what_to_do(store: Store) -> None:
    healthy = await store.health()
    assert healthy.ok and healthy.findings == () and "audit" in healthy.checks
    task = await store.tasks.create("long build")
    await store.tasks.transition(task.id, "queued")
    claimed = await store.tasks.claim("worker-gone", lease_seconds=0.001)
    assert claimed is not None
    await asyncio.sleep(0.01)
    report = await store.health()
    assert not report.ok
    [finding] = report.problems
    assert finding.check == "leases" and "statekeel recover" in finding.advice
    # Checking is not repairing: the task still runs under its lapsed lease.
    still = await store.tasks.get(task.id)
    assert still is not None and still.status == "running"
