"""A SQLite WAL file deleted before its commits reached the database, then a kill: SQLite opens the older
database silently; statekeel notices (the shared-memory index still says how many frames were committed)
and keeps reporting it — ``recover()``, ``info()`` — until someone acknowledges it. A crash with the WAL in
place, or a WAL in use by a live process, is never taken for a loss. A WAL deleted (or replaced) under a
live writer is noticed by the writer itself, which checkpoints at once and records it: a kill after that
loses nothing it acknowledged."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import statekeel
from helpers import exists, sqlite_url
from statekeel.backends.sqlite.writer import WalWatch

WRITER = """
import asyncio, sys
import statekeel

async def main(url, n):
    async with statekeel.open_store(url) as store:
        for i in range(n):
            session = await store.sessions.get_or_create(f"s{i}")
            session.add_message("user", "x" * 200)
            await store.sessions.save(session)
        print("saved", flush=True)
        await asyncio.sleep(120)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _writer(url: str, sessions: int) -> subprocess.Popen[str]:
    """A process that saves ``sessions`` sessions, says so, and waits (its commits not checkpointed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(sessions)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "saved"
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


async def _one_saved_session(url: str) -> None:
    """Some state checkpointed into the database file itself (a clean close checkpoints the WAL)."""
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create("before")
        session.add_message("user", "checkpointed")
        await store.sessions.save(session)


async def test_a_wal_deleted_before_a_kill_is_reported_until_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    url = sqlite_url(path)
    await _one_saved_session(url)
    proc = _writer(url, 40)
    # Frozen first: a running writer would notice the deletion and checkpoint (the tests below); this is
    # the kill that comes before it could.
    proc.send_signal(signal.SIGSTOP)
    os.unlink(f"{path}-wal")  # an operator "cleaning up"
    _kill(proc)

    async with statekeel.open_store(url) as store:
        report = await store.recover()
        assert not report.ok
        [incident] = report.incidents
        assert incident.kind == "wal_lost" and incident.detail["frames_lost"] > 0
        assert incident.detail["wal_found"] == "missing"
        assert any("acknowledge_incident" in advice for advice in report.advice)
        # What the loss cost is plain: the acknowledged sessions are not there, the checkpointed one is.
        assert await store.sessions.load("s0") is None
        assert await store.sessions.load("before") is not None
        info = await store.info()
        assert info.incidents == (incident,) and not info.ok
    async with statekeel.open_store(url) as store:  # reported again, not once
        assert [i.id for i in (await store.recover()).incidents] == [incident.id]
        done = await store.acknowledge_incident(incident.id, "oncall")
        assert done.acknowledged_by == "oncall" and done.acknowledged_at is not None
        assert (await store.recover()).ok
        assert (await store.info()).incidents == ()
        assert [i.id for i in await store.incidents(include_acknowledged=True)] == [incident.id]
        with pytest.raises(statekeel.NotFound):
            await store.acknowledge_incident(incident.id, "oncall")


async def test_a_wal_cut_short_before_a_kill_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    url = sqlite_url(path)
    proc = _writer(url, 40)
    wal = f"{path}-wal"
    os.truncate(wal, os.stat(wal).st_size // 2)
    _kill(proc)
    async with statekeel.open_store(url) as store:
        [incident] = await store.incidents()
        assert "bytes of the" in incident.detail["wal_found"]


async def test_a_kill_with_the_wal_in_place_loses_nothing_and_reports_nothing(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    url = sqlite_url(path)
    proc = _writer(url, 40)
    _kill(proc)
    assert exists(f"{path}-wal") and exists(f"{path}-shm")
    async with statekeel.open_store(url) as store:
        report = await store.recover()
        assert report.ok and report.incidents == []
        assert all([await store.sessions.load(f"s{i}") for i in range(40)])


async def test_a_wal_in_use_by_a_live_process_is_not_taken_for_a_loss(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    url = sqlite_url(path)
    proc = _writer(url, 40)
    try:
        async with statekeel.open_store(url) as store:
            assert await store.incidents() == []
            assert await store.sessions.load("s39") is not None
            # Two live writers on one WAL: neither takes the other's for a removed one.
            session = await store.sessions.get_or_create("second-process")
            session.add_message("user", "hello")
            await store.sessions.save(session)
            assert await store.incidents() == []
    finally:
        _kill(proc)
    async with statekeel.open_store(url) as store:
        assert await store.incidents() == []


# --- The WAL deleted under a live writer: noticed, checkpointed at once, recorded; a kill after that loses
# nothing acknowledged.

LIVE_WRITER = """
import asyncio, sys
import statekeel

async def main(url, n, more):
    async with statekeel.open_store(url) as store:
        for i in range(n):
            session = await store.sessions.get_or_create(f"s{i}")
            session.add_message("user", "x" * 200)
            await store.sessions.save(session)
        print("saved", flush=True)
        assert sys.stdin.readline().strip() == "deleted"
        if more:  # writes after the deletion: each one acknowledged only once it is in the database file
            for i in range(n, n + more):
                session = await store.sessions.get_or_create(f"s{i}")
                session.add_message("user", "y" * 200)
                await store.sessions.save(session)
        else:  # no write: the idle writer notices by itself, and records it
            async with asyncio.timeout(10):
                while not await store.incidents():
                    await asyncio.sleep(0.01)
            # One write after it: the writer thread has finished with the incident (its checkpoint too).
            session = await store.sessions.get_or_create("after")
            session.add_message("user", "z")
            await store.sessions.save(session)
        print("done", flush=True)
        await asyncio.sleep(120)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def _live_writer(url: str, sessions: int, more: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, url, str(sessions), str(more)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "saved"
    return proc


@pytest.mark.parametrize("more", [0, 25], ids=["idle-writer", "writes-after-the-deletion"])
async def test_a_wal_deleted_under_a_live_writer_is_checkpointed_and_a_kill_then_loses_nothing(
    tmp_path: Path, more: int
) -> None:
    path = tmp_path / "agent.db"
    url = sqlite_url(path)
    await _one_saved_session(url)
    proc = _live_writer(url, 40, more)
    os.unlink(f"{path}-wal")  # an operator "cleaning up" under a running agent
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("deleted\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    proc.stdin.close()
    _kill(proc)  # right after: whatever it acknowledged must be in the database file now

    async with statekeel.open_store(url) as store:
        for i in range(40 + more):
            session = await store.sessions.load(f"s{i}")
            assert session is not None and len(session.messages) == 1, f"s{i} lost"
        assert await store.sessions.load("before") is not None
        report = await store.recover()
        assert not report.ok
        [incident] = report.incidents  # the removal, recorded by the writer; no frames lost on reopen
        assert incident.kind == "wal_removed" and incident.detail["wal_found"] == "missing"
        assert incident.detail["checkpoint_complete"] is True
        assert incident.detail["frames_checkpointed"] > 0
        await store.acknowledge_incident(incident.id, "oncall")
        assert (await store.recover()).ok


async def test_a_wal_replaced_under_a_live_writer_is_noticed_and_checkpointed(tmp_path: Path) -> None:
    """In process: the WAL's name now names another file (deleted, then created again by someone else)."""
    path = tmp_path / "agent.db"
    url = sqlite_url(path)
    async with statekeel.open_store(url) as store:
        session = await store.sessions.get_or_create("a")
        session.add_message("user", "first")
        await store.sessions.save(session)
        wal = f"{path}-wal"
        os.unlink(wal)
        with open(wal, "wb"):  # another file under the WAL's name
            pass
        session.add_message("user", "second")
        await store.sessions.save(session)  # acknowledged only after the checkpoint
        [incident] = await store.incidents()
        assert incident.kind == "wal_removed" and incident.detail["wal_found"] == "replaced"
    for leftover in (f"{path}-wal", f"{path}-shm"):  # if the close left the stray file, it is not ours
        if exists(leftover):
            os.unlink(leftover)
    async with statekeel.open_store(url) as store:  # everything is in the database file itself
        loaded = await store.sessions.load("a")
        assert loaded is not None and [m["content"] for m in loaded.messages] == ["first", "second"]


def test_a_wal_the_store_never_committed_into_may_go_away_without_an_incident(tmp_path: Path) -> None:
    """Another process closing what it takes for the last connection checkpoints the WAL and deletes it:
    a store that has not committed since it opened loses nothing then, and must not cry wolf (a viewer or
    a read-only command beside a finished agent); once it has committed, the same removal is noticed."""
    path = tmp_path / "agent.db"
    wal = f"{path}-wal"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode = WAL")
    other.execute("CREATE TABLE t (x)")
    other.execute("INSERT INTO t VALUES (1)")
    found: list[dict[str, object]] = []
    watch = WalWatch(wal, lambda conn, detail: found.append(detail))
    watch.check(other, committed=False)  # idle: a WAL is there, written by someone else
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.unlink(wal)
    watch.check(other, committed=False)
    assert watch.removed is None and found == []
    other.close()

    mine = sqlite3.connect(path, isolation_level=None)
    mine.execute("INSERT INTO t VALUES (2)")
    watch = WalWatch(wal, lambda conn, detail: found.append(detail))
    watch.check(mine, committed=True)  # armed by its own COMMIT
    os.unlink(wal)
    watch.check(mine, committed=False)
    assert watch.removed == "missing" and [d["wal_found"] for d in found] == ["missing"]
    mine.close()
