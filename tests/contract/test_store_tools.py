"""The library calls the ``statekeel`` command is built on, on every backend: ``store.backup()``,
``store.health()``, ``sessions.snapshot()``, ``tasks.iter()`` and ``store.purge(on_batch=...)``."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sqlite3
from pathlib import Path

import pytest

import statekeel
from statekeel.retention import purge

Store = statekeel.Store


async def test_backup_writes_an_owner_only_sqlite_copy_of_every_kind(store: Store, tmp_path: Path) -> None:
    async with store.sessions.open("chat") as session:
        session.add_message("user", "hello")
    task = await store.tasks.create("build")
    await store.audit.append("note", "tester", "chat", {"n": 1})
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "backup.db"
    report = await store.backup(dest)
    assert report.path == str(dest) and report.bytes == dest.stat().st_size > 0
    assert dest.stat().st_mode & 0o777 == 0o600
    assert os.listdir(out) == ["backup.db"]  # one self-contained file: no -wal or -shm left
    async with statekeel.open_store(f"sqlite:///{dest}", migrate=False) as copy:
        loaded = await copy.sessions.snapshot("chat")
        assert loaded is not None and loaded.messages == [{"role": "user", "content": "hello"}]
        assert (await copy.tasks.get(task.id)) is not None
        assert (await copy.audit.verify()).count == 1


async def test_backup_never_overwrites_a_file_and_leaves_nothing_when_it_fails(
    store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "taken.db"
    dest.write_bytes(b"mine")
    with pytest.raises(statekeel.InvalidArgument, match="already exists"):
        await store.backup(dest)
    assert dest.read_bytes() == b"mine"
    with pytest.raises(statekeel.InvalidArgument, match="does not exist"):
        await store.backup(out / "no-such-dir" / "b.db")
    with pytest.raises(statekeel.InvalidArgument):
        await store.backup("")
    if store.url.startswith("sqlite:"):
        with pytest.raises(statekeel.InvalidArgument, match="already exists"):
            await store.backup(store.url.removeprefix("sqlite:///"))  # its own file
    assert os.listdir(out) == ["taken.db"]


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


async def test_snapshot_reads_a_session_as_stored_without_repairing_it(store: Store) -> None:
    assert await store.sessions.snapshot("nobody") is None
    async with store.sessions.open("chat") as session:
        for i in range(4):
            session.add_message("user", f"turn {i}")
    await store.sessions.compress("chat", 2, "two turns")
    loaded = await store.sessions.snapshot("chat")
    assert loaded is not None
    assert loaded.first_seq == 0 and len(loaded.messages) == 4
    assert [s[1:] for s in loaded.summaries] == [(0, 2, "two turns")]
    live = await store.sessions.snapshot("chat", include_archived=False)
    assert live is not None and live.first_seq == 2 and len(live.messages) == 2
    assert store.sessions.cached("chat") is None or store.sessions.cached("chat") is not loaded
    with pytest.raises(statekeel.InvalidKey):
        await store.sessions.snapshot("")


async def test_tasks_iter_pages_through_every_task_in_order(store: Store) -> None:
    made = [await store.tasks.create(f"task {i}") for i in range(7)]
    wf = await store.workflows.create(
        "release", [{"name": "build"}, {"name": "ship", "depends_on": ["build"]}]
    )
    every = [t.id async for t in store.tasks.iter(page_size=2)]
    assert every[:7] == [t.id for t in made] and len(every) == 9
    pending = [t.title async for t in store.tasks.iter(status="pending", page_size=3)]
    assert pending[:7] == [f"task {i}" for i in range(7)]
    assert sorted([t.title async for t in store.tasks.iter(workflow_id=wf.id)]) == ["build", "ship"]
    with pytest.raises(statekeel.InvalidArgument):
        store.tasks.iter(status="napping")
    with pytest.raises(statekeel.InvalidArgument):
        store.tasks.iter(page_size=0)


async def test_purge_reports_each_batch_to_on_batch(store: Store) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i in range(5):
        store.traces.record("old", {"span_id": f"s{i}", "name": "step", "started_at": t0, "ended_at": t0})
    await store.traces.flush()
    seen: list[dict[str, int]] = []
    retention = statekeel.Retention(
        traces=dt.timedelta(days=1), tasks=None, sessions=None, memories=None, batch_size=2
    )
    report = await purge(store, retention, t0 + dt.timedelta(days=2), False, seen.append)
    assert report.traces == 5
    assert [c["traces"] for c in seen] == [2, 4, 5, 5][: len(seen)] and seen[-1]["traces"] == 5
    assert report.batches == len(seen)
    with pytest.raises(statekeel.InvalidArgument):
        await store.purge(on_batch="print")  # type: ignore[arg-type]


def test_open_store_without_a_url_reads_statekeel_url_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STATEKEEL_URL", f"sqlite:///{tmp_path / 'env.db'}")

    async def open_default() -> str:
        async with statekeel.open_store() as store:
            return store.url

    assert asyncio.run(open_default()) == f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.delenv("STATEKEEL_URL")
    assert asyncio.run(open_default()) == "sqlite:///statekeel.db"
    assert (tmp_path / "statekeel.db").exists()
    conn = sqlite3.connect(tmp_path / "statekeel.db")
    try:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] > 0
    finally:
        conn.close()


def test_a_sqlalchemy_postgresql_url_is_read_as_postgresql() -> None:
    from statekeel.store import resolve_url

    assert resolve_url("postgresql+asyncpg://me@db:5432/agents") == "postgresql://me@db:5432/agents"
    assert resolve_url("postgres+asyncpg://me@db/agents") == "postgresql://me@db/agents"
    assert resolve_url("sqlite:///a.db") == "sqlite:///a.db"
    assert os.environ.get("STATEKEEL_URL") is None or resolve_url(None) == os.environ["STATEKEEL_URL"]
