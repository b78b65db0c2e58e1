"""A session lease held by a process that died on this host is taken over at once, not at its expiry.

An agent killed with ``kill -9`` and restarted resumes its sessions (and ``recover()`` repairs their
orphaned tool calls) immediately; a live holder in another process keeps its lease.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import statekeel
from statekeel import holders
from statekeel.holders import holder_is_dead, new_owner_id

HOLDER = textwrap.dedent(
    """
    import asyncio, sys, statekeel

    async def main(url):
        async with statekeel.open_store(url) as store:
            lock = store.sessions.lock("agent")
            await lock.acquire()
            session = await store.sessions.get_or_create("agent")
            session.add_message("user", "run the tests")
            session.add_message("assistant", None, tool_calls=[{"id": "c1", "type": "function"}])
            await store.sessions.save(session)
            print("held", flush=True)
            await asyncio.sleep(3600)  # holds the lease (renewed) until killed

    asyncio.run(main(sys.argv[1]))
    """
)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the holder and reap it (closing its pipes)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)


def _start_holder(url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "held":
        _stop(proc)
        raise AssertionError(f"holder did not start: {line!r}")
    return proc


async def test_a_restarted_agent_resumes_a_session_whose_holder_was_killed(shared_url: str) -> None:
    proc = _start_holder(shared_url)
    _stop(proc)  # kill -9, as a crash would
    async with statekeel.open_store(shared_url) as store:
        lease = await store.backend.read_session_lease("agent")
        assert lease is not None and lease.expires_at.timestamp() > time.time() + 10  # not expired
        report = await store.recover()
        assert report.sessions_busy == []
        assert report.orphaned_tool_calls == {"agent": ["c1"]}
        started = time.monotonic()
        async with store.sessions.open("agent", timeout=5) as session:
            assert session.messages[-1]["tool_call_id"] == "c1"
        assert time.monotonic() - started < 5


async def test_a_live_holder_in_another_process_keeps_its_lease(shared_url: str) -> None:
    proc = _start_holder(shared_url)
    try:
        async with statekeel.open_store(shared_url) as store:
            with pytest.raises(statekeel.ConflictError):
                async with store.sessions.open("agent", timeout=0.3):
                    pass
            report = await store.recover()
            assert report.sessions_busy == ["agent"]
            assert report.orphaned_tool_calls == {}
    finally:
        _stop(proc)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid  # reaped: no process has this pid now (until it is reused, with another start time)


def test_only_a_gone_process_of_this_host_counts_as_dead() -> None:
    mine = new_owner_id()
    host, ns, pid, start, rand = mine.split("|")
    assert not holder_is_dead(mine)  # this process
    assert not holder_is_dead(None) and not holder_is_dead("") and not holder_is_dead("host:123:abcd")
    assert not holder_is_dead("|".join(("another-host", ns, str(_dead_pid()), start, rand)))
    assert not holder_is_dead("|".join((host, "", str(_dead_pid()), start, rand)))  # namespace unknown
    assert holder_is_dead("|".join((host, ns, str(_dead_pid()), start, rand)))
    assert holder_is_dead("|".join((host, ns, pid, str(int(start) + 1), rand)))  # pid reused by another


async def test_a_live_holder_whose_process_cannot_be_inspected_keeps_its_lease(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _start_holder(shared_url)
    try:
        # /proc mounted with hidepid: another user's /proc/PID/stat cannot be read, though it runs.
        real = holders._start_time
        monkeypatch.setattr(holders, "_start_time", lambda pid: real(pid) if pid == os.getpid() else None)
        async with statekeel.open_store(shared_url) as store:
            with pytest.raises(statekeel.ConflictError):
                async with store.sessions.open("agent", timeout=0.3):
                    pass
            lease = await store.backend.read_session_lease("agent")
            assert lease is not None and lease.owner != store.sessions.owner_id
    finally:
        _stop(proc)
    # Once it is gone, that is proven without reading its start time: taken over at once.
    async with statekeel.open_store(shared_url) as store, store.sessions.open("agent", timeout=5) as session:
        assert session.messages[0]["content"] == "run the tests"


def test_a_holder_is_dead_only_when_that_is_proven(monkeypatch: pytest.MonkeyPatch) -> None:
    host, ns, _, start, rand = new_owner_id().split("|")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(holders, "_start_time", lambda pid: None)  # nothing readable in /proc
        assert not holder_is_dead("|".join((host, ns, str(live.pid), start, rand)))  # unknown: alive
        assert holder_is_dead("|".join((host, ns, str(_dead_pid()), start, rand)))  # no such process
    finally:
        live.kill()
        live.wait()
