"""Fallback: with the database unwritable (SQLite's write lock held by another connection), saves go to
fallback files, loads see them, and replay moves them into the database with nothing lost. A file the
backend will not take is reported and kept without stopping the others (nor ``recover()``); a file whose
header would write bad values, or whose session was deleted and created again, is quarantined."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import statekeel
from helpers import contents, database_write_locked
from statekeel.fallback import FallbackDir, file_stem

NASTY_KEYS = ["a:b", "a_b", "a/b", "../x", "é", "k" * 500]


@pytest.fixture
def paths(tmp_path: Path) -> tuple[str, Path, Path]:
    db = tmp_path / "agent.db"
    return f"sqlite:///{db}", db, tmp_path / "fallback"


def read_bytes(path: str | Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


async def write_fallbacks(url: str, db: Path, fb: Path, contents_by_key: dict[str, str]) -> None:
    """Sessions created during an outage: each one only in its fallback file."""
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        with database_write_locked(db):
            for key, content in contents_by_key.items():
                s = await store.sessions.get_or_create(key)
                s.add_message("user", content)
                await store.sessions.save(s)
    assert len(os.listdir(fb)) == len(contents_by_key)


@contextlib.asynccontextmanager
async def two_processes(url: str, fb: Path) -> AsyncIterator[tuple[statekeel.Store, statekeel.Store]]:
    """Two stores on one SQLite file and fallback directory, standing for two processes (their own
    connections, caches, locks and lease owners); a write blocked by the database lock falls back fast."""
    async with (
        statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as one,
        statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as two,
    ):
        yield one, two


async def save_then_fall_back(
    store: statekeel.Store, db: Path, key: str, saved: str, fallen_back: str, *, role: str = "user"
) -> statekeel.Session:
    """A session with one message in the database and a second one only in its fallback file."""
    s = await store.sessions.get_or_create(key)
    s.add_message("user", saved)
    await store.sessions.save(s)
    with database_write_locked(db):
        s.add_message(role, fallen_back)
        await store.sessions.save(s)
    return s


async def recreate_elsewhere(url: str, key: str, content: str) -> None:
    """Another machine (no fallback directory) deletes the session and creates it again."""
    async with statekeel.open_store(url) as other:
        assert await other.sessions.delete(key)
        fresh = await other.sessions.get_or_create(key)
        fresh.add_message("user", content)
        await other.sessions.save(fresh)


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
    await write_fallbacks(url, db, fb, {"new": "only in the fallback"})
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
    await write_fallbacks(url, db, fb, {key: key for key in ("good-1", "bad", "good-2")})
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
        await save_then_fall_back(store, db, "s", "a", "b")
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
        await save_then_fall_back(store, db, "s", "a", "fallback only")
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
            # It says this save was not written, and claims nothing it cannot know.
            assert "was not saved" in str(info.value) and "acknowledged" not in str(info.value)
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
        await save_then_fall_back(store, db, "s", "in the database", "in the file")
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
        report = await store.recover()  # a failed replay is reported, not raised
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
        await save_then_fall_back(
            store, db, "s", "old conversation", "old reply, only in the fallback", role="assistant"
        )
    await recreate_elsewhere(url, "s", "new conversation")  # same head 1 as the file's base
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as store:
        loaded = await store.sessions.load("s")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["new conversation"]
        assert not loaded.is_dirty()
        report = await store.sessions.replay_fallback()
        assert report.replayed == {} and len(report.quarantined) == 1
        assert await contents(store, "s") == ["new conversation"]
    # Same, found by the replay rather than a load.
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        await save_then_fall_back(store, db, "r", "old", "old reply", role="assistant")
    await recreate_elsewhere(url, "r", "new")
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
    async with two_processes(url, fb) as (holder, restarted):
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
        # The holder's save on exit writes everything: the replay appended nothing under it.
        assert await contents(holder, "s") == ["before", "during the outage", "after"]
        assert os.listdir(fb) == []
        report = await restarted.sessions.replay_fallback()
        assert report.ok and report.replayed == {}


# --- fallback files, the cache, atomic() and other writers: no acknowledged write lost ---------------------

HOLDER_FALLING_BACK = """
import asyncio, sys
import statekeel

async def main(url: str, fallback_dir: str) -> None:
    async with statekeel.open_store(url, fallback_dir=fallback_dir, busy_timeout_ms=50) as store:
        lock = store.sessions.lock("k")
        await lock.acquire()
        session = await store.sessions.get_or_create("k")
        print("locked", flush=True)
        sys.stdin.readline()  # the database is write-locked now
        session.add_message("assistant", "from the killed holder")
        await store.sessions.save(session)  # acknowledged: in its fallback file
        print("saved", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def run_holder_until_killed(url: str, db: Path, fb: Path) -> None:
    """Another process takes session "k", saves one message to its fallback file while the database is
    write-locked, and is killed (``kill -9``) holding the session."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER_FALLING_BACK, url, os.fspath(fb)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "locked"
        with database_write_locked(db):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "saved"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)


@pytest.mark.parametrize("our_save", ["fallback", "database"])
async def test_a_cached_session_taken_over_from_a_killed_holder_gets_its_fallback_file(
    paths: tuple[str, Path, Path], our_save: str
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        sm = store.sessions
        s = await sm.get_or_create("k")
        s.add_message("user", "base")
        await sm.save(s)  # cached here from now on
        await asyncio.to_thread(run_holder_until_killed, url, db, fb)
        lock = sm.lock("k")
        await lock.acquire(timeout=5)  # its holder is dead: taken over at once
        try:
            again = await sm.get_or_create("k")
            assert [m["content"] for m in again.messages] == ["base", "from the killed holder"]
            again.add_message("user", "after the takeover")
            if our_save == "fallback":
                with database_write_locked(db):
                    await sm.save(again)
                snap = FallbackDir(fb, store.codec).read("k")
                assert snap is not None  # the file grew; it was not replaced by ours alone
                written = [m["content"] for m in snap.messages]
                assert written == ["from the killed holder", "after the takeover"]
            await sm.save(again)
        finally:
            await lock.release()
        assert await contents(store, "k") == ["base", "from the killed holder", "after the takeover"]
        assert os.listdir(fb) == []  # merged and written, not quarantined
        assert (await sm.replay_fallback()).ok


async def pause_before(
    monkeypatch: pytest.MonkeyPatch, target: Any, name: str
) -> tuple[asyncio.Event, asyncio.Event]:
    """Make ``target.name`` wait, on its first call, until the second event is set; the first event
    tells that it is waiting."""
    reached, resume = asyncio.Event(), asyncio.Event()
    method = getattr(target, name)

    async def paused(*args: Any, **kwargs: Any) -> Any:
        if not reached.is_set():
            reached.set()
            await resume.wait()
        return await method(*args, **kwargs)

    monkeypatch.setattr(target, name, paused)
    return reached, resume


async def test_replay_writes_the_file_as_it_is_once_it_holds_the_session_not_as_first_read(
    paths: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, db, fb = paths
    async with two_processes(url, fb) as (writer, replayer):
        s = await save_then_fall_back(writer, db, "k", "base", "a")
        waiting, resume = await pause_before(monkeypatch, replayer.backend, "acquire_session_lease")
        replay = asyncio.create_task(replayer.sessions.replay_fallback())
        await waiting.wait()  # it has read the file ([a]) and waits for the session's lease
        with database_write_locked(db):
            s.add_message("user", "b")
            await writer.sessions.save(s)  # the file is now [a, b]
        resume.set()
        await replay
        await replayer.sessions.replay_fallback()
        assert await contents(writer, "k") == ["base", "a", "b"]
        assert os.listdir(fb) == []


async def test_replay_never_creates_again_a_session_deleted_while_it_waited(
    paths: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, db, fb = paths
    await write_fallbacks(url, db, fb, {"k": "written during the outage"})
    async with two_processes(url, fb) as (deleter, replayer):
        waiting, resume = await pause_before(monkeypatch, replayer.backend, "acquire_session_lease")
        replay = asyncio.create_task(replayer.sessions.replay_fallback())
        await waiting.wait()
        assert await deleter.sessions.delete("k")  # deletes its fallback file: the only copy
        resume.set()
        report = await replay
        assert report.replayed == {}
        assert await replayer.backend.load_session("k") is None
        assert os.listdir(fb) == []


async def test_load_never_deletes_a_fallback_file_written_while_it_read_the_backend(
    paths: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, db, fb = paths
    name = file_stem("k") + ".jsonl"
    async with two_processes(url, fb) as (store, other):
        s = await save_then_fall_back(store, db, "k", "a", "b")
        kept = (fb / name).read_bytes()
        await store.sessions.save(s)  # in the database now; the file is deleted
        theirs = await other.sessions.load("k")
        assert theirs is not None
        (fb / name).write_bytes(kept)  # a copy left by a process killed before it deleted it
        restarted = statekeel.SessionManager(store.backend, store.codec, fallback_dir=fb)
        waiting, resume = await pause_before(monkeypatch, store.backend, "read_messages")
        load = asyncio.create_task(restarted.load("k"))
        await waiting.wait()  # the load checks whether the backend has the old file's messages
        with database_write_locked(db):
            theirs.add_message("user", "c")
            await other.sessions.save(theirs)  # a new file, acknowledged
        resume.set()
        loaded = await load
        assert loaded is not None and [m["content"] for m in loaded.messages][:2] == ["a", "b"]
        assert os.listdir(fb) == [name]  # the new file is still there ...
        await store.sessions.replay_fallback()
        assert await contents(store, "k") == ["a", "b", "c"]  # ... and its message reaches the database
        assert os.listdir(fb) == []


async def test_a_second_writer_at_the_same_head_never_replaces_the_first_ones_fallback_file(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with two_processes(url, fb) as (first, second):
        a = await first.sessions.get_or_create("k")
        a.add_message("user", "base")
        await first.sessions.save(a)
        b = await second.sessions.load("k")
        assert b is not None
        with database_write_locked(db):
            a.add_message("user", "from the first")
            await first.sessions.save(a)  # acknowledged: in the fallback file
            b.add_message("user", "from the second")
            with pytest.raises(statekeel.ConflictError):
                await second.sessions.save(b)  # another writer saved at this head first
        with pytest.raises(statekeel.ConflictError):
            await second.sessions.save(b)  # nor once the database is back
        await first.sessions.save(a)
        assert await contents(first, "k") == ["base", "from the first"]
        assert os.listdir(fb) == []
        again = await second.sessions.load("k")
        assert again is not None and [m["content"] for m in again.messages] == ["base", "from the first"]


async def test_a_save_inside_a_rolled_back_atomic_block_keeps_the_fallback_file(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        s = await save_then_fall_back(store, db, "k", "saved", "in the file")
        with pytest.raises(RuntimeError):
            async with store.backend.atomic():
                await store.sessions.save(s)
                raise RuntimeError("the block fails")
        assert os.listdir(fb) == [file_stem("k") + ".jsonl"]
        assert [m["content"] for m in s.unsaved()] == ["in the file"]
        async with statekeel.open_store(url, fallback_dir=os.fspath(fb)) as restarted:
            loaded = await restarted.sessions.load("k")  # what a crash now would leave
            assert loaded is not None and [m["content"] for m in loaded.messages] == ["saved", "in the file"]
        await store.sessions.save(s)
        assert await contents(store, "k") == ["saved", "in the file"]
        assert os.listdir(fb) == []


async def test_a_replay_racing_the_sessions_own_save_neither_conflicts_nor_writes_twice(
    paths: tuple[str, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        sm = store.sessions
        s = await save_then_fall_back(store, db, "k", "saved", "in the file")
        s.add_message("user", "added after")
        append = store.backend.append_messages
        replay_writing, second_issued, first_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        calls = 0

        async def in_order(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:  # the replay writes the cached session
                replay_writing.set()
                # Unless saves of one session are serialized, the session's own save reaches the
                # backend now, at the same head; the bound only ends the wait where it cannot.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(second_issued.wait(), 0.5)
                try:
                    return await append(*args, **kwargs)
                finally:
                    first_done.set()
            second_issued.set()
            await first_done.wait()
            return await append(*args, **kwargs)

        monkeypatch.setattr(store.backend, "append_messages", in_order)
        replay = asyncio.create_task(sm.replay_fallback())
        await replay_writing.wait()
        await sm.save(s)  # must not raise: the replay wrote these very messages
        await replay
        assert await contents(store, "k") == ["saved", "in the file", "added after"]
        assert s.unsaved() == [] and os.listdir(fb) == []
        await sm.save(s)
        assert await contents(store, "k") == ["saved", "in the file", "added after"]


async def test_a_replay_started_inside_an_atomic_block_runs_in_its_own_transactions(
    store: statekeel.Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sm = store.sessions
    down = await sm.get_or_create("down")
    down.add_message("user", "during the outage")

    async def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise statekeel.BackendUnavailable("the database is down (simulated)")

    with monkeypatch.context() as patch:
        patch.setattr(store.backend, "append_messages", unavailable)
        await sm.save(down)  # to its fallback file
    up = await sm.get_or_create("up")
    up.add_message("user", "in a block that fails")
    with pytest.raises(RuntimeError):
        async with store.backend.atomic():
            await sm.save(up)  # the backend works again: "down" is replayed in the background
            raise RuntimeError("the caller's block fails")
    async with asyncio.timeout(10):
        while os.listdir(tmp_path / "fallback"):
            await asyncio.sleep(0.01)
    assert await contents(store, "down") == ["during the outage"]
    assert await store.backend.load_session("up") is None
    assert (await sm.replay_fallback()).ok  # later replays do not wait on the ended block


async def test_fallback_file_names_the_file_holding_the_last_save_and_none_once_it_reached_the_backend(
    paths: tuple[str, Path, Path],
) -> None:
    url, db, fb = paths
    async with statekeel.open_store(url, fallback_dir=os.fspath(fb), busy_timeout_ms=50) as store:
        sm = store.sessions
        s = await sm.get_or_create("s")
        assert s.fallback_file is None  # nothing saved yet
        s.add_message("user", "stored")
        await sm.save(s)
        assert s.fallback_file is None  # the backend took it
        with database_write_locked(db):
            s.add_message("user", "in the outage")
            await sm.save(s)  # no error: the caller learns where it went from fallback_file
            path = s.fallback_file
            assert path == os.path.join(fb, file_stem("s") + ".jsonl") and os.listdir(fb) == [
                file_stem("s") + ".jsonl"
            ]
            assert FallbackDir(fb, store.codec).read_path(path).messages == [
                {"role": "user", "content": "in the outage"}
            ]
        s.add_message("user", "after")
        await sm.save(s)
        assert s.fallback_file is None and os.listdir(fb) == []
        assert await contents(store, "s") == ["stored", "in the outage", "after"]
