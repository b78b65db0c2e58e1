"""Memories under several OS processes (SQLite and PostgreSQL): concurrent puts of one key leave one
memory whose history holds every change; a put that returned survives ``kill -9`` with its event."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import statekeel

WORKERS = 4
PER_WORKER = 25

PUTTER = """
import asyncio, sys
import statekeel

async def main(url: str, name: str, n: int) -> None:
    async with statekeel.open_store(url) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(n):
            m = await store.memory.put("user", "shared", f"{name}:{i}", scope="race", actor=name)
            print(m.id, m.version, flush=True)
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'memory.db'}"
    return str(request.getfixturevalue("pg_migrated"))


def _spawn(url: str, name: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PUTTER, url, name, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _start(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()


async def test_concurrent_puts_of_one_key_from_four_processes_keep_every_change(shared_url: str) -> None:
    async with statekeel.open_store(shared_url):
        pass  # migrate once, before the workers race to open it
    procs = [_spawn(shared_url, f"w{i}", PER_WORKER) for i in range(WORKERS)]
    try:
        _start(procs)
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            outputs.append(out.split("\n"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    returned = [line.split() for out in outputs for line in out if line and line != "done"]
    assert len(returned) == WORKERS * PER_WORKER
    total = WORKERS * PER_WORKER
    async with statekeel.open_store(shared_url) as store:
        page = await store.memory.query(scope="race", include_forgotten=True, include_superseded=True)
        [memory] = page.items
        assert {memory_id for memory_id, _ in returned} == {memory.id}
        # Each call got its own version: every put was applied exactly once.
        assert sorted(int(v) for _, v in returned) == list(range(1, total + 1))
        assert memory.version == total
        events = await store.memory.history(memory.id)
        assert [e.version for e in events] == list(range(1, total + 1))
        assert [e.event for e in events] == ["ADD"] + ["UPDATE"] * (total - 1)
        assert sorted(e.new for e in events) == sorted(
            f"w{w}:{i}" for w in range(WORKERS) for i in range(PER_WORKER)
        )
        for w in range(WORKERS):  # each writer's changes in the order it made them
            mine = [e.new for e in events if e.actor == f"w{w}"]
            assert mine == [f"w{w}:{i}" for i in range(PER_WORKER)]
        assert await store.backend.count_rows("memories") == 1


async def test_a_put_that_returned_survives_kill_9_with_its_history(shared_url: str) -> None:
    async with statekeel.open_store(shared_url):
        pass
    proc = _spawn(shared_url, "victim", 100_000)
    acked: list[tuple[str, int]] = []
    try:
        _start([proc])
        assert proc.stdout is not None
        while len(acked) < 40:
            line = proc.stdout.readline().split()
            acked.append((line[0], int(line[1])))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)  # reaps it and closes the pipes
    assert proc.returncode == -signal.SIGKILL
    memory_id = acked[0][0]
    async with statekeel.open_store(shared_url) as store:
        memory = await store.memory.get(memory_id)
        assert memory is not None and memory.version >= acked[-1][1]
        events = await store.memory.history(memory_id)
        # Dense versions: every change that committed has its event, and nothing else was written.
        assert [e.version for e in events] == list(range(1, memory.version + 1))
        assert [e.new for e in events][: len(acked)] == [f"victim:{i}" for i in range(len(acked))]
        assert events[-1].new == memory.content
        assert (await store.recover()).integrity_problems == []
