"""Memories under several OS processes (SQLite and PostgreSQL): concurrent puts of one key leave one
memory whose history holds every change; a put that returned survives ``kill -9`` with its event."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import statekeel
from helpers import run_together

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


async def test_concurrent_puts_of_one_key_from_four_processes_keep_every_change(shared_url: str) -> None:
    async with statekeel.open_store(shared_url):
        pass  # migrate once, before the workers race to open it
    outputs = run_together(
        [[sys.executable, "-c", PUTTER, shared_url, f"w{i}", str(PER_WORKER)] for i in range(WORKERS)],
        timeout=180,
    )
    returned = [line.split() for out in outputs for line in out.splitlines() if line and line != "done"]
    total = WORKERS * PER_WORKER
    assert len(returned) == total
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
    proc = subprocess.Popen(
        [sys.executable, "-c", PUTTER, shared_url, "victim", "100000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: list[tuple[str, int]] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.stdin.write("go\n")
        proc.stdin.flush()
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
