"""A SQLite file with one damaged page: ``recover()`` names the table and the keys that no longer read,
recovers everything else (it raises only when nothing can be read), says what to do, and rebuilds a
damaged index, which loses nothing.

Pages are damaged for real: one page of the file, found with SQLite's ``dbstat`` table, is overwritten.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import statekeel
from helpers import RawDb, sqlite_url

SESSIONS, MESSAGES, TASKS, ENTRIES = 30, 20, 80, 80
# The audit log holds the entries appended by hand, each task's creation and the claim.
AUDITED = ENTRIES + TASKS + 1


async def _fill(path: Path) -> dict[str, Any]:
    """Sessions, tasks (one left running under an expired lease), audit entries and an orphaned tool
    call in the last session: what recovery has to deal with besides the damage."""
    async with statekeel.open_store(sqlite_url(path)) as store:
        for i in range(SESSIONS):
            session = await store.sessions.get_or_create(f"s{i:02d}")
            for j in range(MESSAGES):
                session.add_message("user", f"m{j} " + "x" * 300)
            await store.sessions.save(session)
        last = await store.sessions.get_or_create("zz-orphan")
        last.add_message("assistant", "", tool_calls=[{"id": "call-1", "type": "function"}])
        await store.sessions.save(last)
        ids = [
            (await store.tasks.create(f"task {i}", status="queued", description="d" * 300)).id
            for i in range(TASKS)
        ]
        leased = await store.tasks.claim("worker", lease_seconds=1)
        assert leased is not None
        for i in range(ENTRIES):
            await store.audit.append("tool.call", "agent", f"task:{i}", {"i": i, "pad": "y" * 200})
    return {"task_ids": ids, "leased": leased.id}


def _pages(path: Path, name: str, pagetype: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        try:
            rows = conn.execute(
                "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY pageno", (name, pagetype)
            ).fetchall()
        except sqlite3.OperationalError as exc:
            pytest.skip(f"this SQLite has no dbstat table to find pages with: {exc}")
    finally:
        conn.close()
    return [r[0] for r in rows]


def _damage(path: Path, page: int) -> None:
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(path, "r+b") as fh:
        fh.seek((page - 1) * page_size)
        fh.write(b"\xa5" * page_size)


async def _filled_file(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A filled store with everything in the database file itself (the damage is done to the file, not
    the WAL)."""
    path = tmp_path / "agent.db"
    filled = await _fill(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path, filled


async def _recover(path: Path) -> statekeel.recovery.RecoveryReport:
    async with statekeel.open_store(sqlite_url(path)) as store:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        return await store.recover(now=later)


async def test_a_damaged_message_page_names_the_unreadable_messages_and_recovers_the_rest(
    tmp_path: Path,
) -> None:
    path, filled = await _filled_file(tmp_path)
    leaves = _pages(path, "messages", "leaf")
    _damage(path, leaves[len(leaves) // 2])

    report = await _recover(path)  # does not raise

    assert not report.ok
    assert [d.table for d in report.damage] == ["messages"]
    damage = report.damage[0]
    assert not damage.index_only and damage.complete
    assert damage.unreadable, "a damaged leaf holds rows"
    # One page holds one stretch of keys, in key order; every other message still reads.
    keys = list(damage.unreadable)
    assert keys == sorted(keys)
    assert damage.readable + len(keys) == SESSIONS * MESSAGES + 1
    hit = sorted({key for key, _ in keys})
    # recover() reads only the sessions with tool calls waiting for a result (here the one left
    # zz-orphan, which reads): the damage report is what names the sessions that lost messages.
    assert report.sessions_failed == {}
    async with statekeel.open_store(sqlite_url(path)) as store:
        for i in range(SESSIONS):
            key = f"s{i:02d}"
            if key in hit:
                with pytest.raises(statekeel.StorageCorrupt):
                    await store.sessions.load(key)
            else:
                session = await store.sessions.load(key)
                assert session is not None and len(session.messages) == MESSAGES
    # Recovery went on with what reads: the expired lease, the orphaned tool call, the audit log.
    assert [t.id for t in report.interrupted_tasks] == [filled["leased"]]
    assert report.orphaned_tool_calls == {"zz-orphan": ["call-1"]}
    assert report.audit is not None and report.audit.ok and report.audit.count == AUDITED
    assert report.skipped == {}
    advice = " ".join(report.advice)
    assert "messages" in advice and ".recover" in advice and "backup" in advice


async def test_health_gives_damage_advice_to_the_integrity_check_and_audit_advice_to_the_audit_check(
    tmp_path: Path,
) -> None:
    path, _ = await _filled_file(tmp_path)
    await RawDb(sqlite_url(path)).execute(
        "UPDATE audit_log SET actor = 'mallory' WHERE seq = 5", unguarded="audit_log"
    )
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    leaves = _pages(path, "messages", "leaf")
    _damage(path, leaves[len(leaves) // 2])

    async with statekeel.open_store(sqlite_url(path), migrate=False) as store:
        report = await store.health()
    by_check = {f.check: f for f in report.problems}
    integrity, audit = by_check["integrity"], by_check["audit"]
    assert "messages" in integrity.advice and "backup" in integrity.advice
    assert "audit" not in integrity.advice and "untrusted" not in integrity.advice
    assert "untrusted" in audit.advice and "backup" in audit.advice
    assert report.recovery.audit is not None and not report.recovery.audit.ok


async def test_a_damaged_task_page_names_the_unreadable_task_ids(tmp_path: Path) -> None:
    path, filled = await _filled_file(tmp_path)
    leaves = _pages(path, "tasks", "leaf")
    assert len(leaves) > 2
    _damage(path, leaves[1])

    report = await _recover(path)

    damage = {d.table: d for d in report.damage}["tasks"]
    assert damage.complete and damage.unreadable
    lost = {key for (key,) in damage.unreadable}
    assert lost < set(filled["task_ids"])
    assert damage.readable + len(lost) == TASKS
    async with statekeel.open_store(sqlite_url(path)) as store:
        for task_id in filled["task_ids"]:
            if task_id in lost:
                with pytest.raises(statekeel.StorageCorrupt):
                    await store.tasks.get(task_id)
            else:
                assert await store.tasks.get(task_id) is not None


async def test_a_damaged_audit_page_names_the_unreadable_entries_and_skips_verification(
    tmp_path: Path,
) -> None:
    path, _ = await _filled_file(tmp_path)
    leaves = _pages(path, "audit_log", "leaf")
    _damage(path, leaves[len(leaves) // 2])

    report = await _recover(path)

    damage = {d.table: d for d in report.damage}["audit_log"]
    seqs = [seq for (seq,) in damage.unreadable]
    assert seqs and seqs == list(range(seqs[0], seqs[-1] + 1))  # a stretch of the chain
    assert damage.readable + len(seqs) == AUDITED
    assert "audit" in report.skipped  # the chain cannot be walked past the hole
    assert report.orphaned_tool_calls == {"zz-orphan": ["call-1"]}  # the rest still ran


def _garble_index_entry(path: Path, index: str, task_id: str) -> None:
    """Change one character of ``task_id`` inside an index page: the page stays well formed, but the
    index no longer matches the table (the kind of damage a bad write or a buggy tool leaves)."""
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    needle = task_id.encode()
    with open(path, "r+b") as fh:
        for page in _pages(path, index, "leaf"):
            fh.seek((page - 1) * page_size)
            data = fh.read(page_size)
            at = data.find(needle)
            if at >= 0:
                fh.seek((page - 1) * page_size + at)
                fh.write(b"#")
                return
    raise AssertionError(f"{task_id} not found in the pages of {index}")


async def test_an_inconsistent_index_is_rebuilt_in_place_and_nothing_is_lost(tmp_path: Path) -> None:
    path, filled = await _filled_file(tmp_path)
    _garble_index_entry(path, "tasks_by_created", filled["task_ids"][40])

    async with statekeel.open_store(sqlite_url(path)) as store:
        looked = await store.recover(repair=False)
        assert [(d.table, d.index_only) for d in looked.damage] == [("tasks", True)]
        assert looked.damage[0].readable == TASKS
        assert looked.indexes_rebuilt == [] and not looked.ok
        assert any("rebuilds" in a for a in looked.advice)

        report = await store.recover()
        assert report.indexes_rebuilt == ["tasks"] and report.rebuilt_copy is None
        assert report.integrity_problems == [] and report.damage == []
        listed = [t.id for t in (await store.tasks.list(limit=1000)).items]
        assert sorted(listed) == sorted(filled["task_ids"])
        again = await store.recover()
        assert again.ok, again.summary()


async def test_an_index_page_that_cannot_be_freed_gets_a_rebuilt_copy_of_the_database(
    tmp_path: Path,
) -> None:
    path, filled = await _filled_file(tmp_path)
    _damage(path, _pages(path, "tasks_by_created", "leaf")[0])

    report = await _recover(path)

    assert [(d.table, d.index_only) for d in report.damage] == [("tasks", True)]
    assert report.rebuilt_copy is not None and not report.ok
    copy = Path(report.rebuilt_copy)
    assert copy.parent == tmp_path and (os.stat(copy).st_mode & 0o777) == 0o600
    assert any(report.rebuilt_copy in a for a in report.advice)
    async with statekeel.open_store(sqlite_url(copy)) as rebuilt:
        healthy = await rebuilt.recover()
        assert healthy.integrity_problems == [] and healthy.damage == []
        listed = [t.id for t in (await rebuilt.tasks.list(limit=1000)).items]
        assert sorted(listed) == sorted(filled["task_ids"])
        assert (await rebuilt.audit.verify()).ok
        assert len(await rebuilt.audit.query(kind="tool.call", limit=1000)) == ENTRIES


async def test_an_unreadable_schema_still_raises(tmp_path: Path) -> None:
    path, _ = await _filled_file(tmp_path)
    _damage(path, 1)  # the header and the schema table
    with pytest.raises(statekeel.StorageCorrupt):
        async with statekeel.open_store(sqlite_url(path)) as store:
            await store.recover()
