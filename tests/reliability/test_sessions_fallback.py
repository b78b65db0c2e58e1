"""Fallback: with the database unwritable (SQLite's write lock held by another connection), saves go to
fallback files, loads see them, and replay moves them into the database with nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statekeel
from statekeel.fallback import FallbackDir, file_stem

NASTY_KEYS = ["a:b", "a_b", "a/b", "../x", "é", "k" * 500]


@contextlib.contextmanager
def database_write_locked(db: Path) -> Iterator[None]:
    """Hold SQLite's write lock from another connection: every write of the store fails after its
    busy timeout with BackendUnavailable (reads still work: WAL)."""
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


def read_bytes(path: str | Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


async def contents(store: statekeel.Store, key: str) -> list[Any]:
    found = await store.backend.load_session_with_messages(key)
    assert found is not None
    record, rows = found
    assert [r.seq for r in rows] == list(range(record.last_consolidated, record.head_seq))
    return [r.payload["content"] for r in rows]


async def test_saves_go_to_fallback_loads_see_them_and_replay_loses_nothing(
    paths: tuple[str, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        sm = store.sessions
        s = await sm.get_or_create("s")
        s.add_message("user", "before the outage")
        await sm.save(s)
        with database_write_locked(db), caplog.at_level(logging.WARNING, "statekeel.sessions"):
            s.add_message("assistant", "during 1", blob=b"\x00\x01")
            await sm.save(s)  # does not raise: written to the fallback file
            s.metadata["topic"] = "outage"
            s.add_message("user", "during 2")
            await sm.save(s)
            assert "fallback" in caplog.text
            assert await contents(store, "s") == ["before the outage"]  # the database is unchanged
            files = os.listdir(fb)
            assert files == [file_stem("s") + ".jsonl"]
            assert stat.S_IMODE(os.stat(fb / files[0]).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(fb).st_mode) == 0o700
            # Another manager (no cache) loads the database state merged with the newer fallback file.
            other = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)
            seen = await other.load("s")
            assert seen is not None
            assert [m["content"] for m in seen.messages] == ["before the outage", "during 1", "during 2"]
            assert seen.messages[1]["blob"] == b"\x00\x01" and seen.metadata == {"topic": "outage"}
            report = await sm.replay_fallback()
            assert "s" in report.failed and os.listdir(fb) == files  # still down: the file stays
        report = await sm.replay_fallback()
        assert report.replayed == {"s": 2} and report.ok
        assert os.listdir(fb) == []
        assert await contents(store, "s") == ["before the outage", "during 1", "during 2"]
        assert (await store.backend.load_session("s")).metadata == {"topic": "outage"}  # type: ignore[union-attr]
        s.add_message("assistant", "after")  # the cached session continues where the replay left it
        await sm.save(s)
        assert await contents(store, "s") == ["before the outage", "during 1", "during 2", "after"]


async def test_a_session_created_during_the_outage_survives_a_restart_and_is_replayed(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        with database_write_locked(db):
            s = await store.sessions.get_or_create("new")
            s.add_message("user", "only in the fallback")
            await store.sessions.save(s)
    # A new process: the load sees the fallback; the next save writes it to the database.
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        s2 = await store.sessions.load("new")
        assert s2 is not None and [m["content"] for m in s2.messages] == ["only in the fallback"]
        assert await store.backend.load_session("new") is None
        s2.add_message("assistant", "back online")
        await store.sessions.save(s2)
        assert await contents(store, "new") == ["only in the fallback", "back online"]
        assert os.listdir(fb) == []


async def test_tricky_keys_get_distinct_fallback_files_inside_the_directory(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        with database_write_locked(db):
            for key in NASTY_KEYS:
                s = await store.sessions.get_or_create(key)
                s.add_message("user", f"content of {key}")
                await store.sessions.save(s)
            assert len(os.listdir(fb)) == len(NASTY_KEYS)
            assert sorted(os.listdir(fb.parent)) == sorted(
                ["agent.db", "agent.db-shm", "agent.db-wal", "fallback"]
            )
            fresh = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)
            for key in NASTY_KEYS:
                s = await fresh.load(key)
                assert s is not None and [m["content"] for m in s.messages] == [f"content of {key}"]
        report = await store.sessions.replay_fallback()
        assert report.replayed == {key: 1 for key in NASTY_KEYS}
        for key in NASTY_KEYS:
            assert await contents(store, key) == [f"content of {key}"]


async def test_a_corrupt_fallback_file_is_quarantined_without_stopping_the_others(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        with database_write_locked(db):
            for key in ("good-1", "bad", "good-2"):
                s = await store.sessions.get_or_create(key)
                s.add_message("user", key)
                await store.sessions.save(s)
    bad = fb / (file_stem("bad") + ".jsonl")
    bad.write_bytes(bad.read_bytes().replace(b'"content":"bad"', b'"content":"bad'))
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        report = await store.sessions.replay_fallback()
        assert report.replayed == {"good-1": 1, "good-2": 1}
        assert len(report.quarantined) == 1
        (quarantined,) = report.quarantined
        assert os.listdir(fb) == [os.path.basename(quarantined)]  # renamed aside; the good ones are gone
        assert await contents(store, "good-1") == ["good-1"]
        assert await store.backend.load_session("bad") is None


async def test_a_fallback_already_replayed_before_a_crash_is_not_applied_twice(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "a")
        await store.sessions.save(s)
        with database_write_locked(db):
            s.add_message("user", "b")
            await store.sessions.save(s)
        kept = (fb / (file_stem("s") + ".jsonl")).read_bytes()
        assert (await store.sessions.replay_fallback()).replayed == {"s": 1}
    # The process died after the commit but before deleting the file: put it back.
    (fb / (file_stem("s") + ".jsonl")).write_bytes(kept)
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        loaded = await store.sessions.load("s")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["a", "b"]
        assert os.listdir(fb) == []  # recognised as already in the database
        (fb / (file_stem("s") + ".jsonl")).write_bytes(kept)
        fresh = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)
        report = await fresh.replay_fallback()
        assert report.stale == ["s"] and report.replayed == {}
        assert await contents(store, "s") == ["a", "b"]


async def test_a_fallback_that_conflicts_with_another_writer_is_quarantined_not_merged(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "a")
        await store.sessions.save(s)
        with database_write_locked(db):
            s.add_message("user", "fallback only")
            await store.sessions.save(s)
        # Another machine (with its own fallback directory) appended meanwhile.
        other = statekeel.SessionManager(store.backend, store.codec)
        theirs = await other.load("s")
        assert theirs is not None
        theirs.add_message("user", "other writer")
        await other.save(theirs)
        fresh = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)
        report = await fresh.replay_fallback()
        assert report.replayed == {} and len(report.quarantined) == 1
        (path,) = report.quarantined
        assert b"fallback only" in read_bytes(path)  # kept for a human, never lost
        assert await contents(store, "s") == ["a", "other writer"]


async def test_save_raises_only_when_both_the_backend_and_the_fallback_fail(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with statekeel.open_store(
        f"sqlite:///{db}", fallback_dir=os.fspath(blocker / "fallback"), busy_timeout_ms=50
    ) as store:
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "saved")
        await store.sessions.save(s)
        with database_write_locked(db):
            s.add_message("user", "nowhere to go")
            with pytest.raises(statekeel.BackendUnavailable) as info:
                await store.sessions.save(s)
            assert "fallback" in str(info.value)
        assert await contents(store, "s") == ["saved"]
        await store.sessions.save(s)  # the unsaved message is still in the session: saved now
        assert await contents(store, "s") == ["saved", "nowhere to go"]


async def test_a_conflict_raises_and_never_falls_back(paths: tuple[str, Path, Path]) -> None:
    url, _db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        a = await store.sessions.get_or_create("s")
        other = statekeel.SessionManager(store.backend, store.codec)
        b = await other.get_or_create("s")
        b.add_message("user", "b")
        await other.save(b)
        a.add_message("user", "a")
        with pytest.raises(statekeel.ConflictError):
            await store.sessions.save(a)
        assert not fb.exists() or os.listdir(fb) == []


async def test_the_backend_coming_back_replays_other_sessions_in_the_background(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        with database_write_locked(db):
            s = await store.sessions.get_or_create("down")
            s.add_message("user", "during")
            await store.sessions.save(s)
        store.sessions._cache.clear()  # the session is not held in memory any more: only the file has it
        t = await store.sessions.get_or_create("up")
        t.add_message("user", "after")
        await store.sessions.save(t)  # works: triggers the replay of "down"
        async with asyncio.timeout(10):
            while os.listdir(fb):
                await asyncio.sleep(0.01)
        assert await contents(store, "down") == ["during"]


KILLED_WRITER = """
import datetime as dt, sys
from statekeel.codec import Codec
from statekeel.fallback import FallbackDir, FallbackSnapshot
d = FallbackDir(sys.argv[1], Codec())
now = dt.datetime.now(dt.UTC)
messages = []
for i in range(100000):
    messages.append({"role": "user", "content": i, "pad": "x" * 200})
    d.write(FallbackSnapshot("s", 0, False, "active", {}, False, False, 0, now, now, messages))
    print(i, flush=True)
"""


@pytest.mark.slow
def test_kill_9_while_writing_fallback_files_leaves_the_last_acknowledged_or_a_newer_whole_file(
    tmp_path: Path,
) -> None:
    from statekeel.codec import Codec

    for _ in range(3):
        fb = tmp_path / f"fb{_}"
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_WRITER, os.fspath(fb)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        acknowledged = -1
        for line in proc.stdout:
            acknowledged = int(line)
            if acknowledged >= 20 + 15 * _:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        snap = FallbackDir(fb, Codec()).read("s")
        assert snap is not None
        assert [m["content"] for m in snap.messages] == list(range(len(snap.messages)))
        assert len(snap.messages) >= acknowledged + 1


async def test_a_lock_that_cannot_record_its_lease_raises_and_is_not_left_held(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        lock = store.sessions.lock("s")
        with database_write_locked(db), pytest.raises(statekeel.BackendUnavailable):
            async with store.sessions.open("s"):
                pass
        assert not lock.locked() and "s" not in store.sessions._held
        async with store.sessions.open("s") as s:  # the store stays usable
            s.add_message("user", "after")
        assert await contents(store, "s") == ["after"]


async def test_load_quarantines_a_corrupt_fallback_file_and_returns_the_database_version(
    paths: tuple[str, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        s = await store.sessions.get_or_create("s")
        s.add_message("user", "in the database")
        await store.sessions.save(s)
        with database_write_locked(db):
            s.add_message("user", "in the file")
            await store.sessions.save(s)
    name = file_stem("s") + ".jsonl"
    with open(fb / name, "ab") as fh:
        fh.write(b'{"role": "user", "content": "torn')  # a torn last line
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        with caplog.at_level(logging.WARNING, "statekeel.fallback"):
            loaded = await store.sessions.load("s")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["in the database"]
        (aside,) = os.listdir(fb)
        assert aside.startswith(name + ".corrupt-") and "quarantined" in caplog.text
        report = await store.sessions.replay_fallback()
        assert list(report.quarantined) == [os.fspath(fb / aside)]  # reported by the next replay
