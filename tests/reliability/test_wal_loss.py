"""A SQLite WAL file deleted before its commits reached the database, then a kill: SQLite opens the older
database silently; statekeel notices (the shared-memory index still says how many frames were committed)
and keeps reporting it — ``recover()``, ``info()`` — until someone acknowledges it. A crash with the WAL in
place, or a WAL in use by a live process, is never taken for a loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import statekeel
from helpers import exists, sqlite_url

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
    finally:
        _kill(proc)
    async with statekeel.open_store(url) as store:
        assert await store.incidents() == []
