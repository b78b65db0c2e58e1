"""Review of fallback replay: one file the backend will not take must not stop the others, nor recover();
and a fallback file whose header would write bad values is quarantined, not replayed."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import statekeel
from statekeel.fallback import file_stem


@contextlib.contextmanager
def database_write_locked(db: Path) -> Iterator[None]:
    """Hold SQLite's write lock from another connection: the store's writes fail with BackendUnavailable."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@pytest.fixture
def paths(tmp_path: Path) -> tuple[str, Path, Path]:
    db = tmp_path / "agent.db"
    return f"sqlite:///{db}", db, tmp_path / "fallback"


async def contents(store: statekeel.Store, key: str) -> list[Any]:
    found = await store.backend.load_session_with_messages(key)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.last_consolidated, record.head_seq))
    return [r.payload["content"] for r in rows]


async def write_fallbacks(url: str, db: Path, fb: Path, contents_by_key: dict[str, str]) -> None:
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        with database_write_locked(db):
            for key, content in contents_by_key.items():
                s = await store.sessions.get_or_create(key)
                s.add_message("user", content)
                await store.sessions.save(s)
    assert len(os.listdir(fb)) == len(contents_by_key)


async def test_a_file_over_a_lowered_record_limit_is_reported_and_the_others_still_replay(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    await write_fallbacks(url, db, fb, {"a": "small", "big": "x" * 5000, "z": "small too"})
    # Reopened with a smaller max_record_bytes: the big message can no longer be written.
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), max_record_bytes=1024) as store:
        report = await store.sessions.replay_fallback()
        assert report.replayed == {"a": 1, "z": 1}
        assert list(report.failed) == ["big"] and "max_record_bytes" in report.failed["big"]
        assert not report.ok
        assert os.listdir(fb) == [file_stem("big") + ".jsonl"]  # kept for a retry with a higher limit
        assert await contents(store, "a") == ["small"]
        assert await contents(store, "z") == ["small too"]
        assert await store.backend.load_session("big") is None
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        report = await store.sessions.replay_fallback()
        assert report.replayed == {"big": 1} and report.ok
        assert await contents(store, "big") == ["x" * 5000]


async def test_recover_reports_an_unreplayable_fallback_file_and_finishes_its_other_work(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    await write_fallbacks(url, db, fb, {"big": "x" * 5000})
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        s = await store.sessions.get_or_create("tools")
        s.add_message("assistant", None, tool_calls=[{"id": "c1", "name": "run"}])
        await store.sessions.save(s)
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), max_record_bytes=1024) as store:
        report = await store.recover()  # used to raise PayloadTooLarge and stop here
        assert report.fallback is not None and "big" in report.fallback.failed
        assert not report.ok
        assert report.orphaned_tool_calls == {"tools": ["c1"]}  # the rest of recovery still ran


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "bogus"),
        ("status_changed", "yes"),
        ("last_consolidated", "0"),
        ("created_at", "yesterday"),
    ],
)
async def test_a_fallback_header_with_unwritable_values_is_quarantined_not_loaded(
    paths: tuple[str, Path, Path], field: str, value: Any
) -> None:
    url, db, fb = paths
    await write_fallbacks(url, db, fb, {"edited": "kept aside", "good": "fine"})
    path = fb / (file_stem("edited") + ".jsonl")
    header, rest = path.read_bytes().split(b"\n", 1)
    fields = orjson.loads(header)
    fields[field] = value
    fields["status_changed"] = fields["status_changed"] if field == "status_changed" else True
    path.write_bytes(orjson.dumps(fields) + b"\n" + rest)
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        # A load does not take the bad header into the session (a later save would fail forever) ...
        loaded = await store.sessions.load("edited")
        assert loaded is None
        report = await store.sessions.replay_fallback()
        # ... and the replay quarantines it, reports it, and replays the others.
        assert report.replayed == {"good": 1}
        assert len(report.quarantined) == 1 and not report.ok
        (quarantined,) = report.quarantined
        assert os.path.basename(quarantined).startswith(file_stem("edited") + ".jsonl.corrupt-")
        assert await store.backend.load_session("edited") is None


async def test_a_fallback_of_a_session_deleted_and_created_again_is_quarantined_not_merged(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "old conversation")
        await store.sessions.save(s)
        with database_write_locked(db):
            s.add_message("assistant", "old reply, only in the fallback")
            await store.sessions.save(s)
    async with statekeel.open_store(url) as other:  # no fallback dir: another machine
        assert await other.sessions.delete("s")
        fresh = await other.sessions.get_or_create("s")
        fresh.add_message("user", "new conversation")  # same head 1 as the file's base
        await other.sessions.save(fresh)
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        loaded = await store.sessions.load("s")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["new conversation"]
        assert not loaded.is_dirty()
        report = await store.sessions.replay_fallback()
        assert report.replayed == {} and len(report.quarantined) == 1
        assert await contents(store, "s") == ["new conversation"]
    # Same, found by the replay rather than a load.
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        s = await store.sessions.get_or_create("r")
        s.add_message("user", "old")
        await store.sessions.save(s)
        with database_write_locked(db):
            s.add_message("assistant", "old reply")
            await store.sessions.save(s)
    async with statekeel.open_store(url) as other:
        assert await other.sessions.delete("r")
        fresh = await other.sessions.get_or_create("r")
        fresh.add_message("user", "new")
        await other.sessions.save(fresh)
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        report = await store.sessions.replay_fallback()
        assert report.replayed == {} and len(report.quarantined) == 1
        assert "created again" in next(iter(report.quarantined.values()))
        assert await contents(store, "r") == ["new"]


async def test_replay_leaves_alone_a_session_another_process_holds_and_its_holder_saves_it(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    # Two processes on one SQLite file share its fallback directory (two stores stand for them).
    async with (
        statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as holder,
        statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as restarted,
    ):
        async with holder.sessions.open("s") as s:
            s.add_message("user", "before")
            await holder.sessions.save(s)
            with database_write_locked(db):
                s.add_message("assistant", "during the outage")
                await holder.sessions.save(s)  # to the fallback file; the lock is still held
            # Another process restarts and recovers while the agent still works on "s".
            report = await restarted.sessions.replay_fallback()
            assert report.skipped == ["s"] and report.replayed == {}
            assert os.listdir(fb) == [file_stem("s") + ".jsonl"]
            assert await contents(holder, "s") == ["before"]
            s.add_message("user", "after")
        # The holder's save on exit wrote everything (it used to raise ConflictError: the replay had
        # appended the fallback's messages under it).
        assert await contents(holder, "s") == ["before", "during the outage", "after"]
        assert os.listdir(fb) == []
        report = await restarted.sessions.replay_fallback()
        assert report.ok and report.replayed == {}
